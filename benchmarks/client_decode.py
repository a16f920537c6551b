"""Client decode benchmark: pull bodies already in memory -> Arrow RecordBatches, on one core.

Records have 100-byte bodies and typical properties (TAGS, KEYS, UNIQ_KEY, one or two user
properties), IPv4 hosts (8 producers, one broker): about 300 bytes per stored record. They are
laid out in pull bodies ("chunks") of 1024 records (the most a pull returns here) or of 32 (a
real broker's cap), and decoded with ``decode_to_batch(chunks, broker)`` a given number of
records per call (the reader's partition path passes several pull bodies a call). The decoders
are the table ``DECODERS``; the run loops over the (chunk, records per call) pairs of ``PLAN``
with each::

    fast        codec.arrow.decode_to_batch: the vectorised numpy + pyarrow decoder
    reference   codec.arrow.decode_to_batch_reference: the per-record Python loop (on a subset)
    read        the floor: the same bytes copied once per call (bytes join of the call's chunks,
                bytearray(chunk) for one chunk per call), no decoding at all

and end to end, against an embedded broker in a child process holding the same number of
messages (one queue, the same properties and body size)::

    pull + decode   the reader's partition path without Spark (``rocketmq_spark.source.read_range``:
                    pipelined pulls of 1024, several pull bodies per decode call) over the queue
    socket          the limit: the same bytes the pulls carried, sent by a forked child over a
                    loopback TCP socket and received with recv_into into one buffer

Before timing, the fast decoder's batches are checked equal to the reference's.

``python -m benchmarks.client_decode [--quick] [--messages N] [--repeat R] [--results-dir DIR]``;
results go to ``benchmarks/results/client_decode.json`` and ``client_decode.png``
(``client_decode-quick.*`` with ``--quick``: 50,000 messages in memory, three decode plans,
10,000 end to end). Times are wall clock, the best of R
runs (the median is kept too), with the process CPU time beside them: on a shared machine
cpu/wall < 1 means the core was taken by others part of the time.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rocketmq_spark.codec import BatchEntry, encode_properties, encode_record
from rocketmq_spark.codec.arrow import (
    ARROW_SCHEMA,
    SMALL_INPUT_BYTES,
    decode_to_batch,
    decode_to_batch_reference,
)

from . import _plot, _provenance, _report
from ._brokers import start_broker
from ._cpu import Clock, steal_ticks

BODY_SIZE = 100
UNIQUE = 4096  # distinct records encoded; the rest are copies with their own queue/physical offsets
BROKER = "broker-a"
MAX_PULL = 1024
TARGET = 1_000_000  # messages/s on one core


def build_records(n: int, seed: int = 7) -> tuple[bytes, np.ndarray]:
    """n encoded records end to end (queue offsets 0..n-1) and the start of each (plus the end)."""
    rnd = random.Random(seed)
    recs = []
    for i in range(min(n, UNIQUE)):
        props: dict[str, str] = {
            "TAGS": ("TagA", "TagB", "TagC")[i % 3],
            "KEYS": f"order-{rnd.randrange(10**9)}",
            "UNIQ_KEY": f"0A000001{rnd.randrange(16**24):024X}",
            "region": "eu-west-1",
        }
        if i % 2:
            props["traceId"] = f"{rnd.randrange(16**16):016x}"
        recs.append(encode_record(
            topic="BenchTopic", queue_id=3, queue_offset=i, body=rnd.randbytes(BODY_SIZE),
            properties=encode_properties(props), physical_offset=0,
            born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_003 + i,
            born_host=f"10.0.0.{1 + i % 8}:{50000 + i % 8}", store_host="10.0.1.1:10911",
        ))
    sizes = np.array([len(r) for r in recs] * (n // len(recs) + 1), np.int64)[:n]
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    template = b"".join(recs)
    copies, rest = divmod(n, len(recs))
    ba = bytearray(template * copies + b"".join(recs[:rest]))
    # patch queueOffset (+20) and physicalOffset (+28), big-endian int64 at every record start
    q = np.ndarray((len(ba) - 35,), ">i8", ba, 0, (1,))
    q[starts[:-1] + 20] = np.arange(n)
    q[starts[:-1] + 28] = starts[:-1]
    return bytes(ba), starts


def split_chunks(buf: bytes, starts: np.ndarray, per_chunk: int) -> list[bytes]:
    mv = memoryview(buf)
    bounds = starts[::per_chunk].tolist()
    if bounds[-1] != len(buf):
        bounds.append(len(buf))
    return [bytes(mv[a:b]) for a, b in itertools.pairwise(bounds)]


@dataclass
class Row:
    scenario: str  # fast | reference | read | socket | pull+decode
    chunk: int  # records per pull body
    per_call: int  # records per decode call
    messages: int
    record_bytes: int
    elapsed_s: float  # best of the runs
    median_s: float
    cpu_s: float  # process CPU time of the best run
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return _report.per_s(self.messages, self.elapsed_s)

    @property
    def mb_s(self) -> float:
        return _report.per_s(self.record_bytes / _report.MB, self.elapsed_s)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for k in ("elapsed_s", "median_s", "cpu_s"):
            out[k] = round(out[k], 4)
        out["msgs_per_s"] = round(self.msgs_per_s, 1)
        out["record_mb_s"] = round(self.mb_s, 2)
        out["ns_per_msg"] = round(self.elapsed_s / self.messages * 1e9, 1)
        return out


def _groups(chunks: list[bytes], per_call_chunks: int) -> list[list[bytes]]:
    return [chunks[i : i + per_call_chunks] for i in range(0, len(chunks), per_call_chunks)]


def _time(fn: Callable[[], Any], repeat: int) -> tuple[float, float, float]:
    """-> (best wall, median wall, CPU time of the best run)."""
    runs: list[tuple[float, float]] = []
    for _ in range(repeat):
        gc.collect()
        with Clock() as t:
            fn()
        runs.append((t.wall, t.cpu))
    best = min(runs)
    return best[0], statistics.median(r[0] for r in runs), best[1]


def copy_bytes(group: Sequence[bytes], _broker: str) -> Any:
    """The bytes copied once: what any decoder that materialises the records must at least do."""
    return bytearray(group[0]) if len(group) == 1 else b"".join(group)


#: the in-memory scenarios: name -> decode(pull bodies of one call, broker name)
DECODERS: dict[str, Callable[[Sequence[bytes], str], Any]] = {
    "read": copy_bytes,
    "fast": decode_to_batch,
    "reference": decode_to_batch_reference,
}
#: (chunk, per_call) pairs that read and the fast decoder run; the reference runs one chunk per call
PLAN = [(1024, 1024), (1024, 4096), (1024, 16384), (32, 32), (32, 1024), (32, 4096), (32, 16384)]
QUICK_PLAN = [(1024, 1024), (1024, 16384), (32, 32)]


def run_scenario(name: str, chunks: list[bytes], messages: int, chunk: int, per_call: int, repeat: int) -> Row:
    groups = _groups(chunks, max(1, per_call // chunk))
    decode = DECODERS[name]

    def loop() -> None:
        for g in groups:
            decode(g, BROKER)

    if name != "reference":  # the reference is slow and steady: no warm-up run
        loop()
    best, median, cpu = _time(loop, repeat)
    return Row(name, chunk, per_call, messages, sum(len(c) for c in chunks), best, median, cpu,
               {"calls": len(groups)})


def check_equal(chunks: list[bytes], per_call: int, chunk: int) -> None:
    """The fast decoder must give the reference's batch (on the first few calls)."""
    for g in _groups(chunks, max(1, per_call // chunk))[:3]:
        fast, ref = decode_to_batch(g, BROKER), decode_to_batch_reference(g, BROKER)
        if fast.schema != ARROW_SCHEMA or not fast.equals(ref):
            raise AssertionError(f"fast decoder differs from the reference (chunk {chunk}, per call {per_call})")


def in_memory(buf: bytes, starts: np.ndarray, plan: list[tuple[int, int]], n_ref: int, repeat: int) -> list[Row]:
    """Every decoder of :data:`DECODERS` on the records of ``buf``: read and fast for each
    (chunk, per call) pair of ``plan``, then the reference once per chunk size, on the first
    ``n_ref`` records and one run fewer (it is slow and steady)."""
    n = len(starts) - 1
    chunks = {c: split_chunks(buf, starts, c) for c in sorted({c for c, _ in plan})}
    ref_chunks = chunks if n_ref == n else {
        c: split_chunks(buf[: starts[n_ref]], starts[: n_ref + 1], c) for c in chunks}
    for c, pc in plan:
        check_equal(chunks[c], pc, c)
    rows: list[Row] = []
    for c, pc in plan:
        rows.append(run_scenario("read", chunks[c], n, c, pc, repeat))
        rows.append(run_scenario("fast", chunks[c], n, c, pc, repeat))
    for c in chunks:
        rows.append(run_scenario("reference", ref_chunks[c], n_ref, c, c, max(1, repeat - 1)))
    return rows


# -- end to end: pulls from a broker, and the socket they could at most fill ---------------------


def _serve_bytes(port: int, data: bytes, times: int) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(times):
            s.sendall(data)


def socket_floor(data: bytes, messages: int, repeat: int) -> Row:
    """The same bytes over loopback TCP from a forked child: what any client could at most read."""
    import multiprocessing
    import socket

    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    child = multiprocessing.get_context("fork").Process(target=_serve_bytes, args=(port, data, repeat + 1),
                                                        daemon=True)
    child.start()
    conn, _ = srv.accept()
    srv.close()
    buf = bytearray(len(data))
    view = memoryview(buf)

    def once() -> None:
        got = 0
        while got < len(buf):
            k = conn.recv_into(view[got:], len(buf) - got)
            if not k:
                raise AssertionError("the sending child closed early")
            got += k

    try:
        once()  # warm-up
        best, median, cpu = _time(once, repeat)
    finally:
        conn.close()
        child.join(10)
    return Row("socket", MAX_PULL, MAX_PULL, messages, len(data), best, median, cpu, {"transport": "loopback TCP"})


def _fill_queue(c: Any, mq: Any, n: int) -> None:
    """``n`` messages into ``mq``, 512 a send, with the properties and bodies of :func:`build_records`."""
    rnd = random.Random(11)
    for first in range(0, n, 512):
        entries = []
        for i in range(first, min(n, first + 512)):
            props = {"TAGS": ("TagA", "TagB", "TagC")[i % 3], "KEYS": f"order-{rnd.randrange(10**9)}",
                     "UNIQ_KEY": f"0A000001{rnd.randrange(16**24):024X}", "region": "eu-west-1"}
            if i % 2:
                props["traceId"] = f"{rnd.randrange(16**16):016x}"
            entries.append(BatchEntry(rnd.randbytes(BODY_SIZE), encode_properties(props)))
        c.send_batch(mq, entries)


def pull_decode_end_to_end(n: int, repeat: int, workdir: str) -> tuple[Row, Row]:
    """Preload ``n`` messages into one queue of a broker in a child process, then time the
    reader's partition path (``read_range``) over them and the socket floor for the bytes its
    pulls carried."""
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.source import QueueRange, read_range

    topic = "BenchDecode"
    with start_broker("cli", os.path.join(workdir, "e2e")) as h:
        c = RemotingClient(h.namesrv_addr)
        try:
            c.create_topic(topic, 1)
            mq = c.message_queues(topic, refresh=True)[0]
            _fill_queue(c, mq, n)
            part = QueueRange(mq, 0, n, (h.namesrv_addr,), None, "", "*", MAX_PULL, True)
            # the bytes the pulls carry, for the socket floor
            wire = b"".join(c.pull(mq, off, MAX_PULL).body or b"" for off in range(0, n, MAX_PULL))
            got = 0

            def once() -> None:
                nonlocal got
                got = sum(b.num_rows for b in read_range(part, c))

            once()
            if got != n:
                raise AssertionError(f"pull + decode read {got} rows, expected {n}")
            best, median, cpu = _time(once, repeat)
            pulled = Row("pull+decode", MAX_PULL, MAX_PULL, n, len(wire), best, median, cpu,
                         {"broker": f"{h.launcher} child process", "path": "source.read_range"})
        finally:
            c.close()
    return pulled, socket_floor(wire, n, repeat)


# -- output ---------------------------------------------------------------------------------------


def format_table(rows: list[Row], ref_rate: dict[int, float], read_rate: dict[tuple[int, int], float]) -> str:
    head = (f"{'scenario':11} {'chunk':>6} {'per call':>9} {'messages':>10} {'msgs/s':>12} {'ns/msg':>8} "
            f"{'MB/s':>8} {'x ref':>7} {'% read':>7} {'cpu/wall':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ref = ref_rate.get(r.chunk)
        rd = read_rate.get((r.chunk, r.per_call))
        lines.append(
            f"{r.scenario:11} {r.chunk:>6} {r.per_call:>9} {r.messages:>10,} {r.msgs_per_s:>12,.0f} "
            f"{r.elapsed_s / r.messages * 1e9:>8.0f} {r.mb_s:>8.1f} "
            f"{(r.msgs_per_s / ref if ref and r.scenario in ('fast', 'reference') else float('nan')):>7.1f} "
            f"{(100 * r.msgs_per_s / rd if rd and r.scenario in ('fast', 'reference') else float('nan')):>7.1f} "
            f"{r.cpu_s / r.elapsed_s:>8.2f}"
        )
    return "\n".join(lines)


def calibration_us() -> float:
    """Best time of a fixed pure-Python loop (1000 additions), in microseconds: how fast this core
    runs the interpreter right now (shared or throttled cores vary a lot between runs)."""
    import timeit

    return min(timeit.repeat("for i in range(1000): x += i", "x = 0", number=200, repeat=5)) / 200 * 1e6


@dataclass(frozen=True)
class Settings:
    """What a run measures (from the command line, with the defaults of its mode)."""

    quick: bool
    repeat: int
    plan: list[tuple[int, int]]
    messages: int
    e2e_messages: int
    reference_messages: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Settings:
        """``run`` also accepts the namespace of ``python -m benchmarks`` (which has --quick and
        --repeat), using the defaults for what it lacks."""
        quick = bool(getattr(args, "quick", False))
        n = getattr(args, "messages", None) or (50_000 if quick else 1_000_000)
        return cls(quick, int(getattr(args, "repeat", None) or (1 if quick else 3)), QUICK_PLAN if quick else PLAN, n,
                   getattr(args, "e2e_messages", None) or (10_000 if quick else 200_000),
                   min(getattr(args, "reference_messages", None) or n, n))


def print_report(rows: list[Row], mi: dict[str, Any], record_bytes: float, total: float) -> None:
    """The table and the headline figures (``mi``: the machine facts with the core-speed
    calibration before and after)."""
    ref_rate = {r.chunk: r.msgs_per_s for r in rows if r.scenario == "reference"}
    read_rate = {(r.chunk, r.per_call): r.msgs_per_s for r in rows if r.scenario == "read"}
    sock = next(r for r in rows if r.scenario == "socket")
    e2e = next(r for r in rows if r.scenario == "pull+decode")
    calib0, calib1 = mi["python_loop_us"]
    print()
    print(f"client decode benchmark: {BODY_SIZE}-byte bodies, {record_bytes:.0f} bytes per record, one core, "
          f"Python {mi['python_version']}, numpy {mi['numpy']}, pyarrow {mi['pyarrow']}; MB = 1e6 bytes")
    print(f"core speed: a 1000-addition Python loop took {calib0:.1f} us before, {calib1:.1f} us after"
          + (f"; hypervisor steal {mi['steal_pct']}% of the machine's CPU time" if "steal_pct" in mi else ""))
    print(format_table(rows, ref_rate, read_rate))
    print("x ref: speed-up over the reference decoder with the same chunks; % read: share of the rate of "
          "just copying the same bytes; cpu/wall < 1: the core was shared")
    print(f"calls of fewer than {SMALL_INPUT_BYTES:,} bytes (the 32-record pull bodies one by one) go to the "
          "reference decoder inside decode_to_batch: it is faster on so few records")
    print(f"end to end: pull + decode {e2e.msgs_per_s:,.0f} msgs/s ({e2e.mb_s:.1f} MB/s) vs the same bytes from a "
          f"socket {sock.msgs_per_s:,.0f} msgs/s ({sock.mb_s:.1f} MB/s): "
          f"{100 * e2e.mb_s / sock.mb_s:.1f}% of the limit")
    print(f"target {TARGET:,} msgs/s: best fast scenario {_best_fast(rows):,.0f} msgs/s; total {total:.1f}s")


def _best_fast(rows: list[Row]) -> float:
    return max((r.msgs_per_s for r in rows if r.scenario == "fast"), default=0.0)


def results_doc(rows: list[Row], s: Settings, mi: dict[str, Any], record_bytes: float, total: float) -> dict[str, Any]:
    sock = next(r for r in rows if r.scenario == "socket")
    e2e = next(r for r in rows if r.scenario == "pull+decode")
    return {
        "benchmark": "client_decode",
        "quick": s.quick,
        "created": _provenance.created(),
        "git_commit": _provenance.git_commit(),
        "machine": mi,
        "setup": {
            "messages": s.messages,
            "reference_messages": s.reference_messages,
            "small_input_bytes": SMALL_INPUT_BYTES,
            "body_size": BODY_SIZE,
            "record_bytes_avg": round(record_bytes, 1),
            "properties": "TAGS, KEYS (one key), UNIQ_KEY, region, traceId on every other message",
            "repeats": s.repeat,
            "target_msgs_per_s": TARGET,
            "end_to_end_messages": s.e2e_messages,
            "units": "MB = 1e6 bytes of stored records; elapsed is the best wall time of the runs",
        },
        "total_elapsed_s": round(total, 2),
        "target_met": _best_fast(rows) >= TARGET,
        "end_to_end": {"pull_decode_msgs_per_s": round(e2e.msgs_per_s), "pull_decode_mb_s": round(e2e.mb_s, 1),
                       "socket_msgs_per_s": round(sock.msgs_per_s), "socket_mb_s": round(sock.mb_s, 1),
                       "share_of_socket": round(e2e.mb_s / sock.mb_s, 3) if sock.mb_s else None},
        "results": [r.to_json() for r in rows],
    }


def plot_panels(rows: list[Row]) -> list[_plot.Panel]:
    sock = next(r for r in rows if r.scenario == "socket")
    e2e = next(r for r in rows if r.scenario == "pull+decode")
    fast = [r for r in rows if r.scenario == "fast"]
    return [
        _plot.Panel("decode from memory: fast decoder (chunk / records per call) vs copying the bytes", "msgs/s",
                    [_plot.Bar(f"{r.scenario} {r.chunk}/{r.per_call}", r.msgs_per_s, r.scenario == "read")
                     for r in rows if r.scenario in ("fast", "read") and r.chunk == 1024]
                    + [_plot.Bar(f"reference {r.chunk}", r.msgs_per_s, True) for r in rows
                       if r.scenario == "reference"], target=TARGET, log=True),
        _plot.Panel("end to end: pull + decode from a broker vs the same bytes from a socket", "MB/s of records",
                    [_plot.Bar("socket (limit)", sock.mb_s, True), _plot.Bar("pull + decode", e2e.mb_s),
                     _plot.Bar(f"fast decode, best ({max(fast, key=lambda r: r.msgs_per_s).per_call}/call)",
                               max(r.mb_s for r in fast))]),
    ]


# -- entry point ----------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """This benchmark's options. ``run`` also accepts the namespace of ``python -m benchmarks``
    (which has --quick and --repeat), using the defaults below for what it lacks."""
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 50,000 messages, three decode plans, one run each, 10,000 end to end")
    p.add_argument("--messages", type=int, default=None, help="messages per scenario (default 1,000,000)")
    p.add_argument("--reference-messages", type=int, default=None,
                   help="messages the reference decoder runs on (default: all; a prefix when smaller)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs per scenario; the best is reported (default 3; 1 with --quick)")
    p.add_argument("--e2e-messages", type=int, default=None,
                   help="messages of the end-to-end pull + decode and socket scenarios (default 200,000; "
                        "20,000 with --quick)")
    _report.add_results_dir(p)


#: the order of a chunk/per-call group's rows in the table and the JSON
ORDER = {"read": 0, "fast": 1, "reference": 2, "socket": 3, "pull+decode": 4}


def run(args: argparse.Namespace) -> int:
    s = Settings.of(args)
    t0 = time.perf_counter()
    steal0, calib0 = steal_ticks(), calibration_us()
    print(f"building {s.messages:,} records ...", flush=True)
    buf, starts = build_records(s.messages)
    rows = in_memory(buf, starts, s.plan, s.reference_messages, s.repeat)
    print(f"end to end: {s.e2e_messages:,} messages in a broker child process ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as workdir:
        rows.extend(pull_decode_end_to_end(s.e2e_messages, s.repeat, workdir))
    rows.sort(key=lambda r: (r.chunk, r.per_call, ORDER[r.scenario]))
    total = time.perf_counter() - t0
    mi = _provenance.machine_info()
    mi.update(_provenance.library_versions("numpy", "pyarrow"))
    calib1, steal1 = calibration_us(), steal_ticks()
    mi["python_loop_us"] = [round(calib0, 1), round(calib1, 1)]  # before, after
    if steal0 and steal1 and steal1[1] > steal0[1]:
        mi["steal_pct"] = round(100 * (steal1[0] - steal0[0]) / (steal1[1] - steal0[1]), 1)
    record_bytes = len(buf) / s.messages
    print_report(rows, mi, record_bytes, total)
    _report.write_results(_report.results_path(args, "client_decode"),
                          results_doc(rows, s, mi, record_bytes, total), plot_panels(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.client_decode", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
