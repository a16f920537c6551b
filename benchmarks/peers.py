"""Peers benchmark: the official RocketMQ 5 Python SDK against our writer and reader, on the
embedded broker's gRPC endpoint (and our remoting transport beside them).

    send      official Producer.send loop (one synchronous send per message, as its examples do)
              vs our writer's task path (``sink.writer.write_rows``, no Spark: batched sends, 8
              in flight) over gRPC and over remoting; 100-byte bodies
    receive   official SimpleConsumer receive(32) + ack of every message vs our reader's
              partition path (``source.reader.read_range``, no Spark: pipelined pulls decoded to
              Arrow) over gRPC and over remoting, of the same messages

The scenarios are the table ``SCENARIOS``, run in its order. The SDK runs in a subprocess
(``benchmarks._rmq5_peer``; its protobuf descriptors clash with ours in one process) and times
its own loop, client start-up excluded. Spark is left out on both sides: spark_io measures what
Spark adds.

``python -m benchmarks.peers [--quick] [--messages N] [--results-dir DIR]``; results go to
``benchmarks/results/peers.json`` and ``peers.png`` (``peers-quick.*``: 300 messages).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _plot, _provenance, _report
from ._brokers import start_broker
from ._cpu import Clock

BODY_SIZE = 100


def sdk_available() -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", "import rocketmq"], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0


def _peer(*args: str, timeout: float) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "benchmarks._rmq5_peer", *args], cwd=_provenance.REPO,
                         capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"official SDK peer {args[0]} failed (rc {out.returncode}): {out.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return res


def _row(scenario: str, side: str, transport: str, n: int, elapsed: float, cpu: float | None,
         extra: dict[str, Any] | None = None) -> dict[str, Any]:
    row = {"scenario": scenario, "side": side, "transport": transport, "messages": n,
           "elapsed_s": round(elapsed, 4), "msgs_per_s": round(_report.per_s(n, elapsed), 1),
           "cpu_s": None if cpu is None else round(cpu, 3)}
    row.update(extra or {})
    return row


def our_send(namesrv: str, endpoint: str | None, topic: str, n: int) -> dict[str, Any]:
    import pyarrow as pa

    from rocketmq_spark.sink import WriterOptions
    from rocketmq_spark.sink.writer import write_rows

    opts = {"topic": topic, **({"endpoints": endpoint} if endpoint else {"namesrvAddr": namesrv})}
    body = b"o" * BODY_SIZE
    batches = [pa.RecordBatch.from_pydict({"body": [body] * min(4096, n - i)}) for i in range(0, n, 4096)]
    with Clock() as t:
        report = write_rows(WriterOptions.parse(opts), iter(batches), None)
    if report.rows != n:
        raise AssertionError(f"our writer sent {report.rows} of {n} rows")
    return _row("send", "ours: writer task", "gRPC" if endpoint else "remoting", n, t.wall, t.cpu)


def our_receive(namesrv: str, endpoint: str | None, topic: str, n: int) -> dict[str, Any]:
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.source import QueueRange, read_range

    c = RemotingClient(namesrv)
    try:
        qs = c.message_queues(topic, refresh=True)
        ends = {mq: c.max_offset(mq) for mq in qs}
    finally:
        c.close()
    parts = [QueueRange(mq, 0, end, (namesrv,), endpoint, "", "*", 1024 if endpoint is None else 32, True)
             for mq, end in ends.items() if end > 0]
    with Clock() as t:
        got = sum(b.num_rows for p in parts for b in read_range(p))
    if got != n:
        raise AssertionError(f"our reader read {got} of {n} messages")
    return _row("receive", "ours: reader partitions", "gRPC" if endpoint else "remoting", n, t.wall, t.cpu)


def sdk_send(ep: str, topic: str, n: int) -> dict[str, Any]:
    """The official Producer.send loop (in a subprocess, timed by itself)."""
    sdk = _peer("send", ep, topic, str(n), str(BODY_SIZE), timeout=600 + n / 10)
    return _row("send", "official Producer.send", "gRPC", sdk["messages"], sdk["elapsed_s"], sdk["cpu_s"],
                {"startup_s": round(sdk["startup_s"], 3)})


def sdk_receive(ep: str, topic: str, n: int) -> dict[str, Any]:
    """The official SimpleConsumer receiving and acking ``n`` messages (in a subprocess)."""
    sdk = _peer("receive", ep, topic, "bench-peers", str(n), "300", timeout=600 + n / 10)
    if sdk["messages"] != n:
        raise AssertionError(f"the official SimpleConsumer received {sdk['messages']} of {n}")
    return _row("receive", "official SimpleConsumer receive + ack", "gRPC", sdk["messages"], sdk["elapsed_s"],
                sdk["cpu_s"], {"startup_s": round(sdk["startup_s"], 3)})


@dataclass(frozen=True)
class Peers:
    """What the scenarios run against: the name server, the gRPC endpoint, messages per scenario."""

    ns: str
    ep: str
    n: int


#: the scenarios in the order they run: each sends to or receives from its topic (created with
#: 4 queues; the receivers all read PeerSdk, what the official Producer sent)
SCENARIOS: dict[str, Callable[[Peers], dict[str, Any]]] = {
    "send, official": lambda p: sdk_send(p.ep, "PeerSdk", p.n),
    "send, ours over gRPC": lambda p: our_send(p.ns, p.ep, "PeerGrpc", p.n),
    "send, ours over remoting": lambda p: our_send(p.ns, None, "PeerRemoting", p.n),
    "receive, official": lambda p: sdk_receive(p.ep, "PeerSdk", p.n),
    "receive, ours over gRPC": lambda p: our_receive(p.ns, p.ep, "PeerSdk", p.n),
    "receive, ours over remoting": lambda p: our_receive(p.ns, None, "PeerSdk", p.n),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="300 messages per scenario")
    p.add_argument("--messages", type=int, default=None, help="messages per scenario (default 5,000)")
    _report.add_results_dir(p)


def _create_topics(ns: str) -> None:
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.codec import BatchEntry

    c = RemotingClient(ns)
    try:
        for t in ("PeerSdk", "PeerGrpc", "PeerRemoting", "PeerWarmup"):
            c.create_topic(t, 4)
        # the broker loads its batch path (pyarrow, ~0.2 s) on its first batch send: not part of
        # any scenario's figure
        c.send_batch(c.message_queues("PeerWarmup")[0], [BatchEntry(b"w"), BatchEntry(b"w")])
    finally:
        c.close()


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows beside the official SDK's of their scenario (each row gains ratio_to_official)."""
    print()
    print(f"{'scenario':8} {'side':40} {'transport':9} {'messages':>9} {'msgs/s':>10} {'x official':>10}")
    base = {r["scenario"]: r["msgs_per_s"] for r in rows if r["side"].startswith("official")}
    for r in rows:
        ratio = r["msgs_per_s"] / base[r["scenario"]] if base.get(r["scenario"]) else float("nan")
        r["ratio_to_official"] = round(ratio, 2)
        print(f"{r['scenario']:8} {r['side']:40} {r['transport']:9} {r['messages']:>9,} {r['msgs_per_s']:>10,.0f} "
              f"{ratio:>10.2f}")


def run(args: argparse.Namespace) -> int:
    n = args.messages or (300 if args.quick else 5_000)
    if not sdk_available():
        print("peers: the official SDK (pip install rocketmq-python-client) is not installed", file=sys.stderr)
        return 1
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as workdir, start_broker("cli", workdir) as h:
        if not h.grpc_endpoint:
            raise RuntimeError("the broker did not report a gRPC endpoint")
        peers = Peers(h.namesrv_addr, h.grpc_endpoint, n)
        print(f"peers: broker pid {h.pid}, name server {peers.ns}, gRPC {peers.ep}; {n:,} messages per scenario",
              flush=True)
        _create_topics(peers.ns)
        rows = [scenario(peers) for scenario in SCENARIOS.values()]
    total = time.perf_counter() - t_start
    print_table(rows)
    print(f"total {total:.1f}s")
    doc = {
        "benchmark": "peers",
        "created": _provenance.created(),
        "quick": bool(args.quick),
        "machine": _provenance.machine_info(),
        "setup": {"messages": n, "body_size": BODY_SIZE, "queues": 4, "broker": "cli child process",
                  "official_sdk": "rocketmq-python-client (subprocess; loop timed inside, start-up excluded)"},
        "results": rows,
        "total_elapsed_s": round(total, 2),
    }
    _report.write_results(_report.results_path(args, "peers"), doc, [
        _plot.Panel(f"{scenario}: official SDK (grey) vs ours", "msgs/s",
                    [_plot.Bar(f"{r['side']} ({r['transport']})", r["msgs_per_s"], r["side"].startswith("official"))
                     for r in rows if r["scenario"] == scenario], log=True)
        for scenario in ("send", "receive")
    ])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
