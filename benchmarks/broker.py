"""Broker benchmark: append and pull throughput of the embedded broker over remoting.

Scenarios (100-byte bodies, properties ``TAGS=bench``, a topic of 4 queues)::

    append single          one message per SEND_MESSAGE_V2, one request at a time
    append batch           256 messages per SEND_BATCH_MESSAGE, one request at a time
    append single x8       8 threads sending single messages at once (group commit)
    ... each with flush=async and flush=sync
    pull seq               every queue read back in turn, max 1024 per pull, one pull at a time
    pull seq + decode      the same, records decoded client-side (decode_records)
    pull pipelined         pulls at computed offsets, DEPTH in flight per queue, all queues at once
    pull seq / pipelined   at a real broker's cap of 32 messages per pull

The suite is a table of broker stages per placement (``STAGES``, ``REAL_STAGES``: how each
broker is started, then its append scenarios, ``APPENDS``, and pull scenarios, ``Pull``).
Only the public client API is used. The pull scenarios read back what "append batch"
(flush=async) wrote; the cap-32 broker reopens that store. Pulls are idempotent, so each
runs ``--repeat`` times and the median is reported; appends run once.

The broker runs in a child process (``python -m rocketmq_spark.cli broker``, or
EmbeddedBroker in a multiprocessing child when the CLI is missing), as users run it, and
in a thread of this process (client and broker share one GIL); and, where java and mvn are
there, Apache RocketMQ's own broker (tests/real_rocketmq.py: its VERSION, 5.5.0) gets the same appends
(async flush) and pulls, which it caps at 32 messages each: the embedded broker's cost is
then a printed ratio per scenario (real / process). A full run measures all three.

``python -m benchmarks.broker [--quick] [--broker process|thread|real|both|all] [--profile]``
(``python -m benchmarks`` runs it with the other benchmarks); results go to
``benchmarks/results/broker.json`` and ``broker.png`` (``broker-quick.*`` with ``--quick``).
``--quick`` (a smoke run) sends 200 single and 10,000 batched messages per scenario, against
the process broker only (add ``--broker both`` for the thread placement too).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties
from rocketmq_spark.model import MessageQueue

from . import _plot, _provenance, _report
from ._brokers import BrokerHandle, chosen_launcher, java_missing, start_broker
from ._cpu import OtherProcesses
from ._profiling import summarize_cprofile
from ._runs import check, median_of
from ._synthetic import body_of

BODY_SIZE = 100
BODY = body_of(BODY_SIZE)
PROPS = encode_properties({"TAGS": "bench"})
BATCH = 256
MAX_PULL = 1024
REAL_BROKER_CAP = 32
SENDER_THREADS = 8
PIPELINE_DEPTH = 4  # pulls in flight per queue (x4 queues)
PIPELINE_DEPTH_CAPPED = 16  # at 32 messages per pull more are needed to hide the round trip
RESULTS_DIR = _report.RESULTS_DIR
MB = _report.MB


@dataclass(frozen=True)
class Sizes:
    single: int  # messages of each single-send scenario
    batch: int  # messages of each batched scenario (and of the pull scenarios)


FULL = Sizes(single=20_000, batch=200_000)
QUICK = Sizes(single=200, batch=10_000)


@dataclass
class Row:
    scenario: str
    broker: str  # process | thread | real
    launcher: str  # cli | mp | thread
    flush: str
    messages: int
    elapsed_s: float
    requests: int
    body_bytes: int
    record_bytes: int
    params: dict[str, Any] = field(default_factory=dict)
    #: share of the machine's CPUs other processes used meanwhile (None: unknown)
    other_cpu_share: float | None = None

    @property
    def msgs_per_s(self) -> float:
        return _report.per_s(self.messages, self.elapsed_s)

    @property
    def body_mb_s(self) -> float:
        return _report.per_s(self.body_bytes / MB, self.elapsed_s)

    @property
    def record_mb_s(self) -> float:
        return _report.per_s(self.record_bytes / MB, self.elapsed_s)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["elapsed_s"] = round(self.elapsed_s, 4)
        out["msgs_per_s"] = round(self.msgs_per_s, 1)
        out["body_mb_s"] = round(self.body_mb_s, 3)
        out["record_mb_s"] = round(self.record_mb_s, 3)
        out["us_per_request"] = round(self.elapsed_s / self.requests * 1e6, 1) if self.requests else None
        return out


# -- the client side of each scenario ---------------------------------------------------


def append_single(c: RemotingClient, qs: list[MessageQueue], n: int) -> tuple[float, int]:
    """n single sends round-robin over the queues, one at a time. -> (elapsed, requests)."""
    nq = len(qs)
    t0 = time.perf_counter()
    for i in range(n):
        c.send(qs[i % nq], BODY, PROPS)
    return time.perf_counter() - t0, n


def append_batch(c: RemotingClient, qs: list[MessageQueue], n: int, batch: int = BATCH) -> tuple[float, int]:
    """n messages in batches of ``batch`` round-robin over the queues, one request at a time."""
    entries = [BatchEntry(BODY, PROPS) for _ in range(batch)]
    nq = len(qs)
    sent = requests = 0
    t0 = time.perf_counter()
    while sent < n:
        k = min(batch, n - sent)
        res = c.send_batch(qs[requests % nq], entries if k == batch else entries[:k])
        check(len(res) == k, "one send result per batch entry")
        sent += k
        requests += 1
    return time.perf_counter() - t0, requests


def append_single_threads(c: RemotingClient, qs: list[MessageQueue], n: int,
                          threads: int = SENDER_THREADS) -> tuple[float, int]:
    """n single sends from ``threads`` threads at once (one shared client and connection)."""
    per = [n // threads + (1 if t < n % threads else 0) for t in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def worker(t: int) -> None:
        mq = qs[t % len(qs)]
        start.wait()
        try:
            for _ in range(per[t]):
                c.send(mq, BODY, PROPS)
        except BaseException as exc:  # noqa: BLE001 (re-raised after the join)
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed, n


@dataclass
class PullTotals:
    messages: int = 0
    record_bytes: int = 0
    body_bytes: int = 0
    requests: int = 0
    short_pulls: int = 0


def pull_sequential(c: RemotingClient, qs: list[MessageQueue], max_nums: int, *,
                    decode: bool = False) -> tuple[float, PullTotals]:
    """Read every queue from offset 0 to its end, one pull at a time."""
    tot = PullTotals()
    t0 = time.perf_counter()
    for mq in qs:
        off = 0
        while True:
            res = c.pull(mq, off, max_nums)
            tot.requests += 1
            if res.status == "NO_NEW_MSG":
                break
            check(res.status == "FOUND", f"pull of {mq} at {off}: {res.status}")
            got = res.next_offset - off
            tot.messages += got
            tot.record_bytes += len(res.body)
            if decode:
                recs = decode_records(res.body)
                check(len(recs) == got, "records in a pull body match its offset range")
                for r in recs:
                    tot.body_bytes += len(r.body)
            off = res.next_offset
            if off >= res.max_offset:
                break
    elapsed = time.perf_counter() - t0
    if not decode:
        tot.body_bytes = tot.messages * BODY_SIZE
    return elapsed, tot


def pull_pipelined(c: RemotingClient, qs: list[MessageQueue], ends: dict[MessageQueue, int],
                   step: int, depth: int) -> tuple[float, PullTotals]:
    """Keep ``depth`` pulls of ``step`` messages in flight per queue, at computed offsets.

    A pull that comes back short (byte cap, a lower broker cap) gets a follow-up pull
    for its gap, so every message is read exactly once whatever the broker serves.
    """
    tot = PullTotals()
    issue_at = {mq: 0 for mq in qs}
    inflight: deque[tuple[MessageQueue, int, int, Any]] = deque()

    def issue(mq: MessageQueue, off: int, n: int) -> None:
        inflight.append((mq, off, n, c.pull_async(mq, off, n)))
        tot.requests += 1

    def issue_next(mq: MessageQueue) -> None:
        off = issue_at[mq]
        if off < ends[mq]:
            n = min(step, ends[mq] - off)
            issue_at[mq] = off + n
            issue(mq, off, n)

    t0 = time.perf_counter()
    for _ in range(depth):
        for mq in qs:
            issue_next(mq)
    while inflight:
        mq, off, n, fut = inflight.popleft()
        res = c.pull_result(mq, fut)
        check(res.status == "FOUND", f"pipelined pull of {mq} at {off}: {res.status}")
        got = res.next_offset - off
        check(0 < got <= n, f"pull of {mq} at {off} returned {got} of {n}")
        tot.messages += got
        tot.record_bytes += len(res.body)
        if got < n:
            tot.short_pulls += 1
            issue(mq, off + got, n - got)
        else:
            issue_next(mq)
    elapsed = time.perf_counter() - t0
    tot.body_bytes = tot.messages * BODY_SIZE
    return elapsed, tot


def record_size(c: RemotingClient, mq: MessageQueue) -> int:
    """Size of one stored record of ``mq`` (all records of a scenario have the same size)."""
    res = c.pull(mq, 0, 1)
    check(res.status == "FOUND", f"first record of {mq}")
    recs = decode_records(res.body)
    check(len(recs) == 1 and recs[0].body == BODY and recs[0].tags == "bench", "stored record round-trips")
    return len(res.body)


def _wait_indexed(c: RemotingClient, ends: dict[MessageQueue, int], timeout_s: float = 60.0) -> None:
    """Until every queue's max offset reaches what was sent to it (Apache RocketMQ answers a send
    before its consume queue is written; a pull before that sees a shorter queue)."""
    deadline = time.monotonic() + timeout_s
    while any(c.max_offset(mq) < n for mq, n in ends.items()):
        check(time.monotonic() < deadline, f"the broker indexed every message within {timeout_s:.0f}s")
        time.sleep(0.1)


def _warm_up(c: RemotingClient) -> None:
    """Routes, connections, topic creation and first-call costs, outside any timing."""
    qs = c.message_queues("bench-warmup")
    for mq in qs:
        c.send(mq, BODY, PROPS)
        c.send_batch(mq, [BatchEntry(BODY, PROPS)] * 16)
        c.pull(mq, 0, 32)


# -- the floor: a raw TCP round trip on this machine ----------------------------------------


def _echo(sock: Any) -> None:
    import socket

    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with sock:
        while True:
            data = sock.recv(65536)
            if not data:
                return
            sock.sendall(data)


def _echo_child(port: int) -> None:
    import socket

    _echo(socket.create_connection(("127.0.0.1", port)))


def loopback_rtt_us(placement: str, n: int = 2000, size: int = 64) -> float:
    """Median-of-3 mean round trip (us) of a ``size``-byte ping-pong over loopback TCP, with
    the echo side in a child process or in a thread: no broker, the latency floor of one
    request on this machine."""
    import multiprocessing
    import socket

    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        if placement == "process":
            peer: Any = multiprocessing.get_context("spawn").Process(target=_echo_child, args=(port,), daemon=True)
        else:
            peer = threading.Thread(target=_echo_child, args=(port,), daemon=True)
        peer.start()
        srv.settimeout(60)
        conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * size
    runs = []
    with conn:
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                conn.sendall(msg)
                got = 0
                while got < size:
                    got += len(conn.recv(size - got))
            runs.append((time.perf_counter() - t0) / n * 1e6)
    peer.join(10)
    return sorted(runs)[1]


# -- the scenarios, as tables -------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """An append scenario: ``send(client, queues, n)`` -> (elapsed, requests) of ``n`` messages
    (Sizes.single or Sizes.batch) to ``topic`` (suffixed ``-sync`` under sync flush)."""

    name: str
    send: Callable[[RemotingClient, list[MessageQueue], int], tuple[float, int]]
    topic: str
    size: str  # the Sizes field: single | batch
    params: dict[str, Any] = field(default_factory=dict)


#: the append scenarios, in the order they run under each flush mode; the pulls read back what
#: the batched one wrote
APPENDS = (
    Append("append single", append_single, "bench-single", "single"),
    Append(f"append batch {BATCH}", append_batch, "bench-batch", "batch", {"batch": BATCH}),
    Append(f"append single x{SENDER_THREADS} threads", append_single_threads, "bench-thread", "single",
           {"threads": SENDER_THREADS}),
)


@dataclass(frozen=True)
class Pull:
    """A pull scenario over every queue of the batched topic: ``max_nums`` asked per pull, one
    pull at a time queue after queue (``depth`` 0, records decoded with ``decode``) or ``depth``
    pulls in flight per queue at computed offsets."""

    name: str
    max_nums: int
    depth: int = 0
    decode: bool = False
    params: dict[str, Any] = field(default_factory=dict)

    def run(self, c: RemotingClient, qs: list[MessageQueue], ends: dict[MessageQueue, int]) -> tuple[float, PullTotals]:
        if self.depth:
            return pull_pipelined(c, qs, ends, self.max_nums, self.depth)
        return pull_sequential(c, qs, self.max_nums, decode=self.decode)


def _sequential(**params: Any) -> tuple[Pull, Pull]:
    """Every queue read in turn, asking 1024 a pull, with and without decoding."""
    return (Pull(f"pull seq {MAX_PULL}", MAX_PULL, params={"max_nums": MAX_PULL, **params}),
            Pull(f"pull seq {MAX_PULL} + decode", MAX_PULL, decode=True,
                 params={"max_nums": MAX_PULL, **params, "decode": True}))


#: pulls of 32 (a real broker's cap), PIPELINE_DEPTH_CAPPED in flight per queue
PIPELINED_CAPPED = Pull(f"pull pipelined cap {REAL_BROKER_CAP} d{PIPELINE_DEPTH_CAPPED}", REAL_BROKER_CAP,
                        PIPELINE_DEPTH_CAPPED, params={"max_nums": REAL_BROKER_CAP, "broker_cap": REAL_BROKER_CAP,
                                                       "depth_per_queue": PIPELINE_DEPTH_CAPPED})


@dataclass(frozen=True)
class Stage:
    """One broker of a placement's run: how it starts, then its appends (under ``flush``; None:
    none, the store is read as an earlier stage left it) and its pulls (each ``--repeat``
    times, the median kept)."""

    label: str  # the end of its log line
    store: str  # its data directory in the run's work directory ({broker}: the placement)
    flush: str | None
    pulls: tuple[Pull, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)  # EmbeddedBroker options
    capped: bool = False  # it serves at most REAL_BROKER_CAP messages a pull (checked)
    topics: tuple[str, ...] = ()  # created with 4 queues first (Apache RocketMQ would make 8)
    wait_indexed: bool = False  # the pulls wait until every message sent is in its consume queue


#: the embedded broker's stages (in a child process or in a thread): async flush with every pull
#: scenario, the same store reopened by a broker capped at 32 messages per pull, then sync flush
#: (fsync before each send is answered; concurrent sends share an fsync)
STAGES = (
    Stage(f"flush=async, max {MAX_PULL}/pull", "{broker}-async", "async", (
        *_sequential(),
        Pull(f"pull pipelined {MAX_PULL} d{PIPELINE_DEPTH}", MAX_PULL, PIPELINE_DEPTH,
             params={"max_nums": MAX_PULL, "depth_per_queue": PIPELINE_DEPTH}))),
    Stage(f"same store, max {REAL_BROKER_CAP}/pull", "{broker}-async", None, (
        Pull(f"pull seq cap {REAL_BROKER_CAP}", MAX_PULL, params={"max_nums": MAX_PULL, "broker_cap": REAL_BROKER_CAP}),
        PIPELINED_CAPPED), config={"max_pull_messages": REAL_BROKER_CAP}, capped=True),
    Stage("flush=sync", "{broker}-sync", "sync", config={"flush": "sync"}),
)

#: Apache RocketMQ's broker: the same appends (async flush, its default; sync flush would need
#: another broker config), then the pulls, which it caps at 32 messages whatever is asked
REAL_STAGES = (
    Stage(f"flush=async, max {REAL_BROKER_CAP}/pull (its own cap)", "real", "async",
          (*_sequential(broker_cap=REAL_BROKER_CAP), PIPELINED_CAPPED), capped=True,
          topics=("bench-warmup", "bench-single", "bench-batch", "bench-thread"), wait_indexed=True),
)


# -- running a suite against one broker placement ---------------------------------------


def _start(broker: str, launcher: str, data_dir: str, log: Callable[[str], None], **config: Any) -> BrokerHandle:
    """A broker placed as ``broker`` (process | thread | real); ``auto`` falls back to a
    multiprocessing child when the CLI fails to start."""
    if broker in ("thread", "real"):
        return start_broker(broker, data_dir, **config)
    chosen = chosen_launcher(launcher)
    try:
        return start_broker(chosen, data_dir, **config)
    except Exception as exc:
        if chosen != "cli" or launcher != "auto":
            raise
        log(f"  broker CLI failed ({exc}); falling back to a multiprocessing child")
        return start_broker("mp", data_dir, **config)


@dataclass
class _Placement:
    """The scenarios' side of one placement's run: its sizes and repeats, and the rows so far."""

    broker: str
    sizes: Sizes
    repeats: int
    log: Callable[[str], None]
    rows: list[Row] = field(default_factory=list)

    def add(self, scenario: str, h: BrokerHandle, flush: str, elapsed: float, requests: int, messages: int,
            body_bytes: int, record_bytes: int, meter: OtherProcesses, **params: Any) -> None:
        row = Row(scenario, self.broker, h.launcher, flush, messages, elapsed, requests, body_bytes, record_bytes,
                  params, meter.share())
        self.rows.append(row)
        self.log(f"  {scenario:<28} {row.msgs_per_s:>11,.0f} msgs/s  {row.elapsed_s:7.2f} s")

    def appends(self, h: BrokerHandle, c: RemotingClient, flush: str) -> dict[str, list[MessageQueue]]:
        """:data:`APPENDS` under ``flush``. -> the queues of each topic."""
        suffix = "" if flush == "async" else "-sync"
        queues = {a.topic: c.message_queues(f"{a.topic}{suffix}") for a in APPENDS}
        for a in APPENDS:
            n = getattr(self.sizes, a.size)
            meter = OtherProcesses(h.pid).start()
            el, req = a.send(c, queues[a.topic], n)
            rs = record_size(c, queues[a.topic][0])
            self.add(a.name, h, flush, el, req, n, n * BODY_SIZE, n * rs, meter, **a.params)
        return queues

    def pulls(self, h: BrokerHandle, c: RemotingClient, qs: list[MessageQueue], ends: dict[MessageQueue, int],
              stage: Stage) -> None:
        """The stage's pulls, each ``repeats`` times (reads are idempotent); the median run is kept."""
        rec_size = record_size(c, qs[0])
        min_requests = self.sizes.batch // REAL_BROKER_CAP if stage.capped else 0
        for p in stage.pulls:
            meter = OtherProcesses(h.pid).start()
            runs = []
            for _ in range(self.repeats):
                el, tot = p.run(c, qs, ends)
                check(tot.messages == self.sizes.batch, f"{p.name} read {tot.messages} of {self.sizes.batch}")
                check(tot.requests >= min_requests, f"{p.name}: the broker capped each pull")
                check(tot.record_bytes == tot.messages * rec_size, f"{p.name}: every record read whole, once")
                runs.append((el, tot))
            el, tot = median_of(runs, key=lambda r: r[0])
            self.add(p.name, h, "async", el, tot.requests, tot.messages, tot.body_bytes, tot.record_bytes, meter,
                     **p.params, short_pulls=tot.short_pulls, runs_s=[round(r[0], 4) for r in runs])


def _batched_ends(qs: list[MessageQueue], n: int) -> dict[MessageQueue, int]:
    """Messages per queue after :func:`append_batch` sent ``n`` round-robin over ``qs``."""
    ends = {mq: 0 for mq in qs}
    for i in range(-(-n // BATCH)):
        ends[qs[i % len(qs)]] += min(BATCH, n - i * BATCH)
    return ends


def run_suite(broker: str, sizes: Sizes, workdir: str, *, launcher: str = "auto", repeats: int = 3,
              log: Callable[[str], None] = print) -> list[Row]:
    """Every stage of :data:`STAGES` (:data:`REAL_STAGES` for ``real``) against brokers placed as
    ``broker`` (process | thread | real)."""
    run = _Placement(broker, sizes, repeats, log)
    ends: dict[MessageQueue, int] = {}  # of the batched topic, as the last appends left it
    for stage in REAL_STAGES if broker == "real" else STAGES:
        with _start(broker, launcher, os.path.join(workdir, stage.store.format(broker=broker)), log,
                    **stage.config) as h:
            who = "Apache RocketMQ" if broker == "real" else f"{broker}, launcher {h.launcher}"
            log(f"broker ({who}, pid {h.pid}), {stage.label}")
            c = RemotingClient(h.namesrv_addr)
            try:
                for topic in stage.topics:
                    c.create_topic(topic, 4)
                _warm_up(c)
                if stage.flush is not None:
                    qs = run.appends(h, c, stage.flush)["bench-batch"]
                    ends = _batched_ends(qs, sizes.batch)
                else:
                    qs = c.message_queues("bench-batch")
                if stage.wait_indexed:
                    _wait_indexed(c, ends)
                if stage.pulls:
                    run.pulls(h, c, qs, ends, stage)
            finally:
                c.close()
    return run.rows


# -- output ---------------------------------------------------------------------------------


def format_table(rows: list[Row]) -> str:
    head = ["scenario", "broker", "flush", "msgs", "requests", "elapsed s", "msgs/s", "body MB/s", "wire MB/s",
            "noise"]
    body = [[r.scenario, f"{r.broker}/{r.launcher}" if r.broker != r.launcher else r.broker, r.flush,
             f"{r.messages:,}", f"{r.requests:,}", f"{r.elapsed_s:.3f}", f"{r.msgs_per_s:,.0f}",
             f"{r.body_mb_s:.2f}", f"{r.record_mb_s:.2f}",
             "?" if r.other_cpu_share is None else f"{100 * r.other_cpu_share:.0f}%"] for r in rows]
    head_line, rule, *lines = _report.table(head, body, left=3)
    out = [head_line, rule]
    prev = None
    for r, line in zip(rows, lines):
        if prev is not None and prev != r.broker:
            out.append("")  # a blank line between placements
        prev = r.broker
        out.append(line)
    return "\n".join(out)


def _sort_key(r: Row) -> tuple[int, int, int]:
    order = {"process": 0, "thread": 1}
    kind = 0 if r.scenario.startswith("append") else 1
    flush = 0 if r.flush == "async" else 1
    return order.get(r.broker, 2), kind, flush if kind == 0 else 0


def write_json(rows: list[Row], *, quick: bool, sizes: Sizes, repeats: int, elapsed_s: float, path: str,
               baseline: dict[str, Any] | None = None, machine: dict[str, Any] | None = None) -> None:
    doc = {
        "benchmark": "broker",
        "created": _provenance.created(),
        "quick": quick,
        "git_commit": _provenance.git_commit(),
        "machine": machine or _provenance.machine_info(),
        "setup": {
            "body_size": BODY_SIZE,
            "properties": PROPS.replace("\x01", "=").replace("\x02", ";"),
            "queues": 4,
            "batch": BATCH,
            "sender_threads": SENDER_THREADS,
            "max_pull": MAX_PULL,
            "real_broker_cap": REAL_BROKER_CAP,
            "pipeline_depth_per_queue": PIPELINE_DEPTH,
            "pipeline_depth_per_queue_capped": PIPELINE_DEPTH_CAPPED,
            "messages": asdict(sizes),
            "pull_repeats": repeats,
            "units": "MB = 1e6 bytes; body MB/s counts message bodies, wire MB/s whole stored records "
                     "(the bytes a pull carries); elapsed is wall time of the client loop",
        },
        "baseline": baseline or {},
        "total_elapsed_s": round(elapsed_s, 2),
        "results": [r.to_json() for r in rows],
    }

    def label(r: Row) -> str:
        return f"{r.scenario} ({r.flush}, {r.broker})" if r.flush not in ("", "-") else f"{r.scenario} ({r.broker})"

    appends = [r for r in rows if r.scenario.startswith("append")]
    pulls = [r for r in rows if r.scenario.startswith("pull")]
    _report.write_results(path, doc, [
        _plot.Panel("append: single vs batched sends, async vs sync flush", "msgs/s",
                    [_plot.Bar(label(r), r.msgs_per_s, r.scenario == "append single") for r in appends], log=True),
        _plot.Panel("pull: max 1024 vs a real broker's 32 per pull, sequential vs pipelined", "msgs/s",
                    [_plot.Bar(label(r), r.msgs_per_s) for r in pulls]),
    ])


def real_ratios(rows: list[Row]) -> dict[str, float]:
    """Apache RocketMQ's msgs/s over the process broker's for each scenario both ran, by name
    (async flush; a real "pull seq 1024" gets 32 per pull, the embedded one up to 1024)."""
    embedded = {r.scenario: r for r in rows if r.broker == "process" and r.flush == "async"}
    out = {}
    for r in rows:
        if r.broker != "real":
            continue
        e = embedded.get(r.scenario)
        if e is not None and e.msgs_per_s:
            out[r.scenario] = round(r.msgs_per_s / e.msgs_per_s, 3)
    return out


def print_report(rows: list[Row], mi: dict[str, Any], *, quick: bool, repeats: int, rtt: dict[str, float],
                 noise: dict[str, float], ratios: dict[str, float], total: float) -> None:
    print()
    print(f"broker benchmark ({'quick' if quick else 'full'}): {BODY_SIZE}-byte bodies, 4 queues, "
          f"{mi['cpu_count']} CPUs, Python {mi['python_version']}, load average "
          f"{mi['loadavg_at_start'][0]:.2f} at start / {mi.get('loadavg', [0])[0]:.2f} at end; MB = 1e6 bytes")
    print(format_table(rows))
    print("wire MB/s counts whole stored records (what a pull carries); pulls: median of "
          f"{repeats} runs; noise: share of the CPUs other processes used meanwhile")
    if rtt:
        print("floor, a raw 64-byte TCP ping-pong over loopback: "
              + ", ".join(f"{p} peer {v:.0f} us/round trip" for p, v in rtt.items()))
    if noise:
        print(f"other processes on this machine used {noise['other_processes_cpu_s']:.1f} CPU-s during the run "
              f"({100 * noise['other_processes_cpu_share']:.0f}% of its CPUs): "
              "figures are skewed when that is high")
    for scenario, v in ratios.items():
        print(f"Apache RocketMQ / the embedded broker (process), {scenario}: {v:.2f}")
    print(f"total {total:.1f}s")


# -- profiling ------------------------------------------------------------------------------


def profile(sizes: Sizes, workdir: str, out_dir: str, top: int = 20) -> str:
    """cProfile of the broker's event-loop thread during a batched append and the pulls."""
    import pstats

    os.makedirs(out_dir, exist_ok=True)
    report: list[str] = []
    with start_broker("mp", os.path.join(workdir, "profile")) as h:
        c = RemotingClient(h.namesrv_addr)
        try:
            _warm_up(c)
            qs = c.message_queues("bench-batch")
            phases: list[tuple[str, Callable[[], Any]]] = [
                ("append-batch", lambda: append_batch(c, qs, sizes.batch)),
                ("pull-seq-1024", lambda: pull_sequential(c, qs, MAX_PULL)),
                ("pull-seq-32", lambda: pull_sequential(c, qs, REAL_BROKER_CAP)),
                ("append-single", lambda: append_single(c, c.message_queues("bench-single"), sizes.single)),
            ]
            for name, fn in phases:
                path = os.path.join(out_dir, f"broker-profile-{name}.prof")
                h.profile_start()
                el, _ = fn()
                h.profile_stop(path)
                report.append(summarize_cprofile(pstats.Stats(path), name, el, top))
        finally:
            c.close()
    return "\n\n".join(report)


# -- entry point ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.broker", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: 200 single sends and 10,000 batched per scenario, one pull run")
    p.add_argument("--broker", choices=("process", "thread", "real", "both", "all"), default=None,
                   help="where the broker runs: a child process (as users run it), a thread of the "
                        "benchmark process (shared GIL), both, Apache RocketMQ's own broker (real, from Maven "
                        "Central: needs java and mvn), or all three (default: all, or both without java; "
                        "process with --quick)")
    p.add_argument("--launcher", choices=("auto", "cli", "mp"), default="auto",
                   help="how the process broker starts: the rocketmq_spark.cli broker command, or "
                        "EmbeddedBroker in a multiprocessing child (auto: cli when present)")
    p.add_argument("--profile", action="store_true",
                   help="instead of the figures: cProfile the broker loop thread during batched append, "
                        "sequential pull and single sends (writes results/broker-profile-*.prof)")
    p.add_argument("--repeat", type=int, default=None,
                   help="runs of each pull scenario; the median is reported (default 3; 1 with --quick)")
    _report.add_results_dir(p)


def run(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    args.repeat = args.repeat or (1 if args.quick else 3)
    workdir = tempfile.mkdtemp(prefix="rocketmq-bench-")
    try:
        if args.profile:
            text = profile(sizes, workdir, RESULTS_DIR)
            print(text)
            with open(os.path.join(RESULTS_DIR, "broker-profile.txt"), "w") as f:
                f.write(text + "\n")
            return 0
        placement = args.broker or ("process" if args.quick else "all" if java_missing() is None else "both")
        placements = {"both": ["process", "thread"], "all": ["process", "thread", "real"]}.get(placement, [placement])
        load_start = os.getloadavg()
        others = OtherProcesses(children=True).start()
        t0 = time.perf_counter()
        rows: list[Row] = []
        for placement in placements:
            rows += run_suite(placement, sizes, workdir, launcher=args.launcher, repeats=args.repeat)
        rtt = {placement: round(loopback_rtt_us(placement), 1) for placement in placements if placement != "real"}
        total = time.perf_counter() - t0
        noise = others.summary(total)
        rows.sort(key=_sort_key)
        mi = _provenance.machine_info()
        mi["loadavg_at_start"] = [round(x, 2) for x in load_start]
        mi.update(noise)
        ratios = real_ratios(rows)
        print_report(rows, mi, quick=args.quick, repeats=args.repeat, rtt=rtt, noise=noise, ratios=ratios, total=total)
        write_json(rows, quick=args.quick, sizes=sizes, repeats=args.repeat, elapsed_s=total,
                   path=_report.results_path(args, "broker"),
                   baseline={"loopback_tcp_rtt_us": rtt, "real_to_embedded_process": ratios}, machine=mi)
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
