"""Cluster benchmark: a name server and two brokers, each in its own process (the CLI's
``namesrv`` and ``broker --namesrv``), measured with both brokers up, with broker-b
crashed (SIGKILL, still in the routes until the name server's timeout) and once the name
server has dropped it::

    write      the writer's task path (sink.writer.write_rows, no Spark): 100-byte rows, the
               default batching; msgs/s and the slowest batch send (how long a batch aimed at
               the dead broker takes to land elsewhere)
    plan       the reader's planning per trigger (Planner.latestOffset work: data-loss check
               and next_end over every queue): ms per trigger; with a broker down it pays
               the client's bounded retries once per broker and trigger
    read       pulling every live queue to its end over remoting (client only): msgs/s

The phases are the table ``PHASES``: what is done to the cluster before each, then the same
three scenarios on a fresh topic.

``python -m benchmarks.cluster [--quick] [--rows N] [--results-dir DIR]``; results go to
``benchmarks/results/cluster.json`` and ``cluster.png`` (``cluster-quick.*`` with ``--quick``:
10,000 rows per phase, a 2 s name-server timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _plot, _report
from ._runs import median_of

CLI = [sys.executable, "-m", "rocketmq_spark.cli"]
BROKER_TIMEOUT_S = 6.0


def _start(args: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"{args[0]} exited before printing its addresses")
    return proc, json.loads(line)


def _write(ns: str, topic: str, rows: int) -> dict[str, Any]:
    import pyarrow as pa

    from rocketmq_spark.sink import WriterOptions
    from rocketmq_spark.sink.writer import write_rows

    opts = WriterOptions.parse({"namesrvAddr": ns, "topic": topic})
    body = b"x" * 100
    per = 4096
    batches = [pa.RecordBatch.from_pydict({"body": [body] * min(per, rows - i)}) for i in range(0, rows, per)]
    slowest = 0.0
    t0 = time.perf_counter()

    def timed() -> Any:
        nonlocal slowest
        last = time.perf_counter()
        for b in batches:
            yield b
            now = time.perf_counter()
            slowest = max(slowest, now - last)
            last = now

    report = write_rows(opts, timed(), None)
    elapsed = time.perf_counter() - t0
    assert report.rows == rows
    return {"msgs_per_s": round(rows / elapsed, 1), "elapsed_s": round(elapsed, 3),
            "slowest_input_batch_s": round(slowest, 3), "input_batch_rows": per}


def _plan(ns: str, topic: str, triggers: int) -> dict[str, Any]:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rocketmq_spark.source import Planner, ReaderOptions

    planner = Planner(ReaderOptions.parse({"namesrvAddr": ns, "topic": topic, "consumerGroup": "bench-cluster",
                                           "brokerDownTimeoutMs": "600000"}, stream=True))
    try:
        # fresh topics: every queue starts at 0 (initial() would wait for a down broker)
        start = {mq: 0 for mq in planner.queues()}
        times = []
        for _ in range(triggers):
            t = time.perf_counter()
            planner.next_end(planner.check_data_loss(start), ReadAllAvailable())
            times.append(time.perf_counter() - t)
        return {"ms_per_trigger_median": round(1000 * median_of(times, key=float), 1),
                "ms_per_trigger_max": round(1000 * max(times), 1), "triggers": triggers}
    finally:
        planner.client.close()


def _read(ns: str, topic: str) -> dict[str, Any]:
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.errors import ConnectionFailedError

    c = RemotingClient(ns)
    rows = 0
    try:
        t0 = time.perf_counter()
        dead: set[str] = set()
        for mq in c.message_queues(topic, refresh=True):
            if mq.broker in dead:
                continue  # as the reader does: one failed call per broker, not per queue
            try:
                hi = c.max_offset(mq)
            except ConnectionFailedError:
                dead.add(mq.broker)
                continue
            off = 0
            while off < hi:
                res = c.pull(mq, off, 1024)
                if res.status != "FOUND":
                    break
                rows += res.body.count(b"\xda\xa3\x20\xa7")  # records (V1 magic); enough for a rate
                off = res.next_offset
        elapsed = time.perf_counter() - t0
    finally:
        c.close()
    return {"msgs_per_s": round(rows / elapsed, 1) if elapsed else None, "messages": rows,
            "elapsed_s": round(elapsed, 3)}


@dataclass
class Cluster:
    """The name server and the two brokers' processes, and when broker-b was killed."""

    ns: str
    broker_timeout_s: float
    brokers: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    killed_at: float = 0.0

    def kill_b(self) -> None:
        """broker-b crashes (SIGKILL): it stays in the routes until the name server's timeout."""
        self.brokers["broker-b"].send_signal(signal.SIGKILL)
        self.brokers["broker-b"].wait()
        self.killed_at = time.monotonic()

    def wait_dropped(self) -> None:
        """Until the name server has dropped broker-b (its timeout, and 2 s more)."""
        left = self.broker_timeout_s + 2 - (time.monotonic() - self.killed_at)
        if left > 0:
            time.sleep(left)


#: the phases in order: (name, topic, what is done to the cluster first); each writes, plans and
#: reads its own topic
PHASES: list[tuple[str, str, Callable[[Cluster], None] | None]] = [
    ("both brokers up", "bench-cl-up", None),
    ("broker-b crashed, still routed", "bench-cl-crashed", Cluster.kill_b),
    ("broker-b dropped from routes", "bench-cl-dropped", Cluster.wait_dropped),
]


def _phase(ns: str, topic: str, rows: int, triggers: int) -> dict[str, Any]:
    return {"write": _write(ns, topic, rows), "plan": _plan(ns, topic, triggers), "read": _read(ns, topic)}


def _start_cluster(cl: Cluster, work: str) -> None:
    """Both brokers registered with the name server, every topic created, the writer warmed up."""
    from rocketmq_spark.client import RemotingClient

    for name in ("broker-a", "broker-b"):
        cl.brokers[name], _ = _start(["broker", "--namesrv", cl.ns, "--broker-name", name, "--broker-port", "0",
                                      "--grpc-port", "-1", "--register-interval-ms", "1000",
                                      "--data-dir", os.path.join(work, name)])
    c = RemotingClient(cl.ns)
    for topic in ("bench-cl-warm", *(t for _, t, _ in PHASES)):
        c.create_topic(topic, 4)
    c.close()


def run_suite(rows: int, triggers: int, log: Any = print, broker_timeout_s: float = BROKER_TIMEOUT_S) -> dict[str, Any]:
    """Every phase of :data:`PHASES` on a fresh cluster."""
    work = tempfile.mkdtemp(prefix="bench-cluster-")
    ns_proc, info = _start(["namesrv", "--port", "0", "--broker-timeout", str(broker_timeout_s)])
    cl = Cluster(info["namesrv"], broker_timeout_s)
    try:
        _start_cluster(cl, work)
        _write(cl.ns, "bench-cl-warm", min(rows, 20_000))
        phases: dict[str, dict[str, Any]] = {}
        for name, topic, before in PHASES:
            if before is not None:
                before(cl)
            phases[name] = res = _phase(cl.ns, topic, rows, triggers)
            w, p, r = res["write"], res["plan"], res["read"]
            log(f"{name:<34} write {w['msgs_per_s']:>10,.0f} msgs/s (slowest batch {w['slowest_input_batch_s']:.2f}s)"
                f"   plan {p['ms_per_trigger_median']:>7.1f} ms/trigger   read {r['msgs_per_s'] or 0:>10,.0f} msgs/s")
        return {"rows": rows, "body_size": 100, "name_server_broker_timeout_s": broker_timeout_s, "phases": phases}
    finally:
        for proc in cl.brokers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        ns_proc.send_signal(signal.SIGTERM)
        ns_proc.wait(30)
        subprocess.run(["rm", "-rf", work], check=False)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="20,000 rows per phase")
    p.add_argument("--rows", type=int, default=None, help="rows written per phase (default 200,000)")
    _report.add_results_dir(p)


def run(args: argparse.Namespace) -> int:
    rows = args.rows or (10_000 if args.quick else 200_000)
    res = run_suite(rows, 5 if args.quick else 20, broker_timeout_s=2.0 if args.quick else BROKER_TIMEOUT_S)
    doc = {"benchmark": "cluster", "quick": bool(args.quick), **res}
    phases = res["phases"]
    _report.write_results(_report.results_path(args, "cluster"), doc, [
        _plot.Panel("write (writer task path, no Spark)", "msgs/s",
                      [_plot.Bar(k, v["write"]["msgs_per_s"], i == 0) for i, (k, v) in enumerate(phases.items())]),
        _plot.Panel("planning per trigger (median)", "ms",
                      [_plot.Bar(k, v["plan"]["ms_per_trigger_median"], i == 0)
                       for i, (k, v) in enumerate(phases.items())]),
        _plot.Panel("read of the live queues (client)", "msgs/s",
                      [_plot.Bar(k, v["read"]["msgs_per_s"] or 0.0, i == 0)
                       for i, (k, v) in enumerate(phases.items())]),
    ])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
