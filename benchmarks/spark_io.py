"""Spark I/O benchmark: RocketMQ -> Spark (the reader) and Spark -> RocketMQ (the writer).

The scenarios use the public API only (``rocketmq_spark.register(spark)`` and
``format("rocketmq")``; :class:`~rocketmq_spark.client.RemotingClient` to preload and check)
against the embedded broker in a child process (``python -m rocketmq_spark.cli broker``), with
a local[2] SparkSession (UI off, 2 shuffle partitions)::

  source: messages preloaded over 8 queues (TAGS, KEYS, UNIQ_KEY and one user property)
    rocketmq -> noop        readStream.format("rocketmq"), startingOffsets=earliest, to the noop
                            sink with trigger(availableNow=True); start() to termination
    synthetic -> noop       the floor: a Python streaming data source defined here, same schema,
                            8 partitions per batch, yielding prebuilt Arrow RecordBatches of the
                            reader's batch size (1024 rows), same trigger and sink
    client pull + decode    no Spark: RemotingClient.pull(mq, offset, 1024) over every queue in
                            turn + codec.arrow.decode_to_batch([body], broker)
  sink: 100-byte BINARY bodies from spark.range, cached and counted before timing
    write at-least-once     df.write.format("rocketmq").save() (batched sends, 8 in flight/task)
    write exactly-once      the same with delivery=exactly-once (one transactional half message
                            per row; the driver ends them in DataSourceWriter.commit)
    client send             the at-least-once send pattern without Spark (batches of 512, 8 in
                            flight, one thread): what the broker allows
    client half sends +     the exactly-once pattern without Spark, its two phases timed apart
      END_TRANSACTION       (builds the protocol's requests itself, as the writer does: a
                            diagnostic, not a user-level scenario)

  the real peers (full run, default launcher, when java and mvn are there; ``--peers``):
    rocketmq -> noop on     the same full-schema reads (2M x 100 B, 200k x 4 KiB, 8 queues) from
      Apache RocketMQ       Apache RocketMQ 5.3.3's broker (tests/real_rocketmq.py), in the same
                            Spark session, next to the embedded broker's figures above
    Java client vs ours     rocketmq-client's lite pull and our reader's partition path
                            (read_range: pulls in flight, decoded to Arrow) over the 100-byte
                            topic on that broker, one core each
    Kafka -> noop           Spark's own Kafka source (headers included) reading the same messages
                            (key, body, one header) from Kafka 4.1.1 (KRaft, one node, 8
                            partitions), loaded by Spark's Kafka sink (benchmarks/_kafka.py)

Warm-ups (one small query of each source, one small write of each mode) run before anything is
timed, while the preload goes on. ``--repeat`` runs each source scenario R times and keeps the
median. Counts are checked: a source run must report exactly N input rows, a sink run must leave
N messages in its topic. Besides wall time every row has the CPU seconds of our own process tree
(driver, JVM, Python workers and planners, broker; also per process kind) and the share of the
machine other processes took meanwhile ("noise"): on a shared 2-core box wall figures move with
it, CPU per message much less.

``python -m benchmarks.spark_io [--quick] [--repeat R] [--messages N] [--peers auto|on|off] [--profile]``
(``python -m benchmarks`` runs it with the other suites); results go to
``benchmarks/results/spark_io.json`` and ``spark_io.png`` (``spark_io-quick.*`` with ``--quick``:
20,000 messages, one run each, no warm-ups, no 4 KiB scenario, 300 exactly-once rows, 2,000
over gRPC by the clients only: a smoke run, its figures say little). ``--profile`` samples
the rocketmq reads and both writes with py-spy (``pip install py-spy``) instead of the figures
and writes ``results/spark_io-profile.txt``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.source import ARROW_SCHEMA, SCHEMA_DDL

from . import _report
from ._brokers import BrokerHandle, cli_available, java_missing, start_broker, tests_on_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO, "benchmarks", "results")
QUEUES = 8
PULL = 1024  # messages per pull (the reader's default pullBatchSize; the broker's cap)
PRELOAD_BATCH = 512
SEND_BATCH = 512  # the writer's default maxBatchMessages
SEND_WINDOW = 8  # batch sends in flight, as the writer keeps per task
WARMUP_ROWS = 4 * 1024
SOURCE_TARGET_RATIO = 0.5
SINK_TARGET = 200_000
MB = 1_000_000


@dataclass(frozen=True)
class Sizes:
    small: int  # 100-byte messages read by the source scenarios
    large: int  # 4 KiB messages read by the source scenarios (0: skipped)
    sink: int  # rows written at-least-once
    sink_eos: int  # rows written exactly-once (one transaction each: far slower)
    repeat: int  # runs of each source scenario (median kept)
    grpc: int = 0  # 100-byte messages read over gRPC and over remoting, side by side (once each)
    warm_synthetic: bool = True  # a warm-up query of the synthetic source too (the rocketmq one warms up
    # what both share: the JVM paths and the pyspark.worker daemon)
    warm_up: bool = True  # warm-up queries and writes before anything is timed (off in the smoke run)
    grpc_spark: bool = True  # the gRPC comparison through Spark too, not only the clients
    slice_rows: int = 20_000  # the pushed read: 24 store-time slices of this many messages


#: exactly-once writes 200,000 rows (20,000 until now: at ~12k msgs/s that is under 2 s, of which
#: the job's and the commit process's start are a fixed quarter; issue 21 speaks of a million)
FULL = Sizes(small=2_000_000, large=200_000, sink=2_000_000, sink_eos=200_000, repeat=3, grpc=200_000)
QUICK = Sizes(small=20_000, large=0, sink=20_000, sink_eos=300, repeat=1, grpc=2_000, warm_synthetic=False,
              warm_up=False, grpc_spark=False, slice_rows=500)


# -- the synthetic baseline: a Python streaming source that costs ~nothing --------------------


@dataclass(frozen=True)
class SyntheticPartition(InputPartition):
    index: int
    rows: int
    body_size: int
    batch_rows: int


def template_batch(n: int, body_size: int, index: int) -> Any:
    """``n`` rows in ARROW_SCHEMA that look like the reader's (built once per partition)."""
    import pyarrow as pa

    now_us = int(time.time() * 1e6)
    body = bytes((i * 37 + 11) % 256 for i in range(body_size))
    return pa.RecordBatch.from_pydict({
        "topic": ["bench-synthetic"] * n,
        "broker": ["broker-a"] * n,
        "queueId": [index] * n,
        "queueOffset": list(range(n)),
        "messageId": [f"0A000001{index:08X}{i:016X}" for i in range(n)],
        "tag": ["TagA"] * n,
        "keys": [[f"order-{i}"] for i in range(n)],
        "body": [body] * n,
        "properties": [[("region", "eu-west-1")]] * n,
        "bornTimestamp": [now_us] * n,
        "storeTimestamp": [now_us] * n,
        "bornHost": ["127.0.0.1:40000"] * n,
        "storeHost": ["127.0.0.1:10911"] * n,
    }, schema=ARROW_SCHEMA)


class SyntheticStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"offset": rows}``; each batch split into ``partitions`` ranges."""

    def __init__(self, rows: int, body_size: int, partitions: int, batch_rows: int) -> None:
        self.rows, self.body_size, self.parts, self.batch_rows = rows, body_size, partitions, batch_rows

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"offset": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[SyntheticPartition]:
        total = int(end["offset"]) - int(start["offset"])
        per = [total // self.parts + (1 if i < total % self.parts else 0) for i in range(self.parts)]
        return [SyntheticPartition(i, n, self.body_size, self.batch_rows) for i, n in enumerate(per) if n]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, SyntheticPartition)
        full = template_batch(partition.batch_rows, partition.body_size, partition.index)
        left = partition.rows
        while left > 0:
            k = min(left, partition.batch_rows)
            yield full if k == partition.batch_rows else full.slice(0, k)
            left -= k

    def commit(self, end: dict) -> None:
        pass


class SyntheticDataSource(DataSource):
    """``format("rmqbench_synthetic")``: options rows, bodySize, partitions, batchRows."""

    @classmethod
    def name(cls) -> str:
        return "rmqbench_synthetic"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        o = self.options
        return SyntheticStreamReader(int(o["rows"]), int(o.get("bodySize", 100)), int(o.get("partitions", QUEUES)),
                                     int(o.get("batchRows", PULL)))


# -- CPU accounting: our process tree vs the rest of the machine -------------------------------


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, own CPU seconds: utime + stime) of every process we can read."""
    hz = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            out[int(name)] = (int(st[1]), (int(st[11]) + int(st[12])) / hz)
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree_cpu_by_pid(root: int | None = None) -> dict[int, float]:
    """Own CPU seconds of ``root`` (this process) and of each of its live descendants."""
    root = root or os.getpid()
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out[pid] = table[pid][1]
        todo.extend(kids.get(pid, ()))
    return out


def machine_busy() -> float | None:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall time, our process tree's CPU time and the other processes' share of the machine.

    Our tree is sampled every ``interval`` s per process: Spark's Python workers die when idle
    and the pyspark daemon ignores SIGCHLD, so a reaped worker's CPU time is credited to no
    parent (cutime) and only per-process samples keep it. Each process's CPU is its last
    sample minus its first (0 for a process born during the run); what a short-lived process
    burns after the last sample is missed.
    """

    #: the broker's pid, when known: its share of our CPU time is reported apart (broker_cpu_s)
    broker_pid: int | None = None

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.cpu_s = 0.0
        self.broker_cpu_s: float | None = None
        self.cpu_by_process: dict[str, float] = {}
        self.noise: float | None = None
        self.elapsed = 0.0

    def _sample(self) -> None:
        for pid, cpu in tree_cpu_by_pid().items():
            if pid not in self._first:
                self._first[pid] = 0.0  # born during the run
            if pid not in self._kinds:
                self._kinds[pid] = self._kind(pid)  # while it lives: its command line says what it is
            self._last[pid] = cpu

    def _kind(self, pid: int) -> str:
        if pid == Meter.broker_pid:
            return "broker"
        if pid == os.getpid():
            return "driver"
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return "gone"
        if "pyspark.daemon pyspark.worker" in cmd:
            return "python workers"
        if "pyspark" in cmd and "java" not in cmd.split(" ", 1)[0]:
            return "python planners"  # planning, commit and streaming source runner processes
        return "jvm" if "java" in cmd.split(" ", 1)[0] else "other"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Meter:
        self._first = tree_cpu_by_pid()
        self._last = dict(self._first)
        self._kinds: dict[int, str] = {p: self._kind(p) for p in self._first}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)
        self.busy0 = machine_busy()
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.t0
        self._stop.set()
        self._thread.join()
        self._sample()
        busy1 = machine_busy()
        self.cpu_s = sum(max(0.0, self._last[p] - self._first[p]) for p in self._last)
        by: dict[str, float] = {}
        for p in self._last:
            k = self._kinds.get(p) or self._kind(p)
            by[k] = by.get(k, 0.0) + max(0.0, self._last[p] - self._first[p])
        self.cpu_by_process = {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.01}
        bp = Meter.broker_pid
        if bp is not None and bp in self._last:
            self.broker_cpu_s = round(self._last[bp] - self._first[bp], 2)
        if self.busy0 is not None and busy1 is not None and self.elapsed > 0:
            other = max(0.0, (busy1 - self.busy0) - self.cpu_s)
            self.noise = round(other / (self.elapsed * (os.cpu_count() or 1)), 3)


# -- results -----------------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    group: str  # source | sink
    messages: int
    body_size: int
    elapsed_s: float
    cpu_s: float
    noise: float | None
    broker_cpu_s: float | None = None
    cpu_by_process: dict[str, float] = field(default_factory=dict)
    runs_s: list[float] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def body_mb_s(self) -> float:
        return self.messages * self.body_size / MB / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["elapsed_s"] = round(self.elapsed_s, 4)
        out["cpu_s"] = round(self.cpu_s, 2)
        out["msgs_per_s"] = round(self.msgs_per_s, 1)
        out["body_mb_s"] = round(self.body_mb_s, 2)
        out["cpu_us_per_msg"] = round(self.cpu_s / self.messages * 1e6, 2) if self.messages else None
        return out


def _measured(scenario: str, group: str, n: int, body_size: int, m: Meter, params: dict[str, Any]) -> Row:
    return Row(scenario, group, n, body_size, m.elapsed, m.cpu_s, m.noise, m.broker_cpu_s, m.cpu_by_process,
               params=params)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(f"benchmark check failed: {what}")


def _median_run(fn: Callable[[], Row], repeat: int) -> Row:
    runs = [fn() for _ in range(max(1, repeat))]
    best = sorted(runs, key=lambda r: r.elapsed_s)[len(runs) // 2]
    best.runs_s = [round(r.elapsed_s, 3) for r in runs]
    return best


# -- preloading and checking through the client -------------------------------------------------


def body_of(size: int) -> bytes:
    return bytes((i * 37 + 11) % 256 for i in range(size))


def preload(c: RemotingClient, topic: str, n: int, body_size: int) -> tuple[list[MessageQueue], float]:
    """``n`` messages round-robin over the topic's queues, ``PRELOAD_BATCH`` per send_batch,
    one request at a time. -> (queues, elapsed)."""
    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    _check(len(qs) == QUEUES, f"{topic} has {QUEUES} queues (got {len(qs)})")
    body = body_of(body_size)
    batch = max(1, min(PRELOAD_BATCH, (2 * 1024 * 1024) // (body_size + 200)))
    prefix = uuid.uuid4().hex[:16].upper()
    sent = i = 0
    t0 = time.perf_counter()
    while sent < n:
        k = min(batch, n - sent)
        entries = [BatchEntry(body, encode_properties({
            "TAGS": ("TagA", "TagB", "TagC")[j % 3], "KEYS": f"order-{j}", "UNIQ_KEY": f"{prefix}{j:016X}",
            "region": "eu-west-1"})) for j in range(sent, sent + k)]
        res = c.send_batch(qs[i % len(qs)], entries)
        _check(len(res) == k, "one send result per entry")
        sent += k
        i += 1
    elapsed = time.perf_counter() - t0
    _check(topic_count(c, topic, n) == n, f"{topic} holds the {n} preloaded messages")
    return qs, elapsed


def topic_count(c: RemotingClient, topic: str, expect: int | None = None, wait_s: float = 30.0) -> int:
    """Messages in ``topic``; with ``expect``, asked again for up to ``wait_s`` until it holds
    that many (Apache RocketMQ's broker indexes a message a moment after answering its send)."""
    deadline = time.monotonic() + wait_s
    while True:
        got = sum(c.max_offset(mq) - c.min_offset(mq) for mq in c.message_queues(topic, refresh=True))
        if expect is None or got == expect or time.monotonic() >= deadline:
            return got
        time.sleep(0.1)


def java_pull(ns: str, topic: str, n: int, body_size: int) -> Row | None:
    """The Apache RocketMQ Java client (rocketmq-client 5.3.3, DefaultLitePullConsumer in assign
    mode, 32 per pull, messages decoded to MessageExt and counted) reading the whole topic,
    pinned to one core with taskset; timed by the client from assign to the last message.
    None when java, mvn or taskset is missing (the peer is built from the Maven Central jars
    the test suite provisions)."""
    tests_on_path()
    import java_peer
    from real_rocketmq import cache_root, java_available, provision

    if java_available() or not shutil.which("taskset"):
        return None
    lib = provision()
    classes = java_peer.build(lib, cache_root())
    with Meter() as m:
        (line,) = java_peer.run(lib, classes, "pull", {
            "namesrv": ns, "topic": topic, "group": f"bench-java-{uuid.uuid4().hex[:6]}", "fromOffsets": "earliest",
            "count": n, "countOnly": True, "pullBatchSize": 32, "timeoutMs": 600_000}, timeout=900,
            prefix=("taskset", "-c", "0"))
    _check(line["count"] == n, f"the Java client read {line['count']} of {n}")
    row = _measured("Java client lite pull, one core", "source", n, body_size, m,
                    params={"client_seconds": line["seconds"], "jvm_start_included_s": round(m.elapsed, 2)})
    row.elapsed_s = float(line["seconds"])  # the client's own loop, JVM start-up excluded
    return row


def one_core(fn: Callable[[], Row]) -> Row:
    """``fn`` with this process pinned to one core (our client and its reader thread share it)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        return fn()
    finally:
        os.sched_setaffinity(0, before)


def client_pull_decode(c: RemotingClient, qs: list[MessageQueue], n: int, body_size: int) -> Row:
    """Every queue pulled in turn, 1024 per pull, each pull body decoded to a RecordBatch."""
    from rocketmq_spark.codec.arrow import decode_to_batch

    rows = pulls = 0
    decode_s = 0.0
    with Meter() as m:
        for mq in qs:
            off = 0
            while True:
                res = c.pull(mq, off, PULL)
                pulls += 1
                if res.status != "FOUND":
                    break
                t = time.perf_counter()
                batch = decode_to_batch([res.body], mq.broker)
                decode_s += time.perf_counter() - t
                rows += batch.num_rows
                off = res.next_offset
                if off >= res.max_offset:
                    break
    _check(rows == n, f"client loop read {rows} of {n}")
    return _measured("client pull + decode (no Spark)", "source", n, body_size, m, params={
        "pulls": pulls, "decode_s": round(decode_s, 3),
        "decode_share": round(decode_s / m.elapsed, 3) if m.elapsed else None})


def reader_pull_decode(c: RemotingClient, ns: str, qs: list[MessageQueue], n: int, body_size: int) -> Row:
    """What one Spark read task does, without Spark: ``source.reader.read_range`` (pulls in
    flight, decoded to Arrow) over every queue in turn, on one connection."""
    from rocketmq_spark.source.reader import QueueRange, read_range

    ends = {mq: c.max_offset(mq) for mq in qs}
    parts = [QueueRange(mq, 0, end, (ns,), None, f"bench-{uuid.uuid4().hex[:6]}", "*", PULL, True)
             for mq, end in ends.items() if end > 0]
    with Meter() as m:
        rows = sum(b.num_rows for p in parts for b in read_range(p, c))
    _check(rows == n, f"read_range read {rows} of {n}")
    return _measured("our reader's read_range (no Spark)", "source", n, body_size, m, params={})


def client_pull_decode_grpc(endpoint: str, qs: list[MessageQueue], n: int, body_size: int) -> Row:
    """As :func:`client_pull_decode`, over the gRPC endpoint (PullMessage streams)."""
    from rocketmq_spark.client.grpc_client import GrpcClient, message_columns
    from rocketmq_spark.codec.arrow import columns_to_batch

    g = GrpcClient(endpoint)
    rows = pulls = 0
    try:
        with Meter() as m:
            for mq in qs:
                off, hi = 0, g.max_offset(mq)
                while off < hi:
                    res = g.pull(mq, off, PULL)
                    pulls += 1
                    if res.status != "FOUND":
                        break
                    rows += columns_to_batch(message_columns(res.messages), mq.broker).num_rows
                    off = res.next_offset
    finally:
        g.close()
    _check(rows == n, f"gRPC client loop read {rows} of {n}")
    return _measured("client gRPC pull + decode (no Spark)", "source", n, body_size, m, params={"pulls": pulls})


def client_send(c: RemotingClient, topic: str, n: int, body_size: int) -> Row:
    """The writer's send pattern without Spark: batches of 512 with 8 in flight, one thread."""
    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    body = body_of(body_size)
    prefix = uuid.uuid4().hex[:22].upper()
    inflight: deque[tuple[MessageQueue, int, Any]] = deque()
    sent = i = 0
    with Meter() as m:
        while sent < n:
            k = min(SEND_BATCH, n - sent)
            entries = [BatchEntry(body, f"UNIQ_KEY\x01{prefix}{j:010X}\x02") for j in range(sent, sent + k)]
            mq = qs[i % len(qs)]
            inflight.append((mq, k, c.send_async(mq, c.send_request(mq, entries))))
            sent += k
            i += 1
            while len(inflight) > SEND_WINDOW or (sent >= n and inflight):
                q, cnt, fut = inflight.popleft()
                _check(len(c.send_results(q, cnt, fut.result(60))) == cnt, "one result per entry")
    _check(topic_count(c, topic, n) == n, f"{topic} holds {n} messages")
    return _measured("client send 512 x8 in flight (no Spark)", "sink", n, body_size, m,
                     params={"batch": SEND_BATCH, "in_flight": SEND_WINDOW})


def client_transactions(c: RemotingClient, topic: str, n: int, body_size: int, window: int = 64,
                        burst: int = 32, end_window: int = 256) -> Row:
    """The exactly-once writer's pattern without Spark, its two phases timed apart: one half
    message per request, written ``burst`` at a time with ``window`` in flight (as a writer
    task does), then END_TRANSACTION for each through the client's end_transactions (as the
    driver's commit does)."""
    from rocketmq_spark.codec import TransactionType

    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    body = body_of(body_size)
    group = "bench-tx"
    prefix = uuid.uuid4().hex[:22].upper()
    inflight: deque[tuple[MessageQueue, str, Any]] = deque()
    queued: list[tuple[MessageQueue, str, Any]] = []
    txns: list[Any] = []
    with Meter() as m:
        t0 = time.perf_counter()
        for j in range(n):
            uniq = f"{prefix}{j:010X}"
            mq = qs[j % len(qs)]
            props = f"UNIQ_KEY\x01{uniq}\x02TRAN_MSG\x01true\x02PGROUP\x01{group}\x02"
            queued.append((mq, uniq, c.send_request(mq, [BatchEntry(body, props)], producer_group=group,
                                                    sys_flag=TransactionType.PREPARED)))
            if len(queued) >= burst or j == n - 1:
                futs = c.send_async_many([(q, req) for q, _, req in queued])
                inflight.extend((q, u, f) for (q, u, _), f in zip(queued, futs))
                queued = []
            while len(inflight) > window or (j == n - 1 and inflight):
                q, u, fut = inflight.popleft()
                txns.append(c.transaction(c.send_results(q, 1, fut.result(60))[0], u))
        t_half = time.perf_counter() - t0
        c.end_transactions(txns, commit=True, producer_group=group, window=end_window)
        t_end = time.perf_counter() - t0 - t_half
    _check(topic_count(c, topic, n) == n, f"{topic} holds {n} committed messages")
    return _measured("client half sends + END_TRANSACTION (no Spark)", "sink", n, body_size, m, params={
        "half_send_s": round(t_half, 3), "half_msgs_per_s": round(n / t_half, 1), "end_transaction_s": round(t_end, 3),
        "end_transactions_per_s": round(n / t_end, 1), "in_flight": window, "burst": burst,
        "end_in_flight": end_window})


def pushed_read(spark: Any, c: RemotingClient, ns: str, slice_rows: int, slices: int = 24) -> tuple[Row, Row]:
    """One slice of a topic stored in ``slices`` store-time slices (a day's hours), read with a
    storeTimestamp window: a batch count with filterPushdown (offset bounds from the brokers'
    search by time) and without (every message read, Spark filters). -> (pushed, full)."""
    topic = f"bench-slices-{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    body = body_of(100)
    cuts = []
    for _ in range(slices):
        time.sleep(0.02)
        cuts.append(int(time.time() * 1000))
        time.sleep(0.02)
        per_queue = slice_rows // len(qs)
        for q in qs:
            for start in range(0, per_queue, PRELOAD_BATCH):
                c.send_batch(q, [BatchEntry(body)] * min(PRELOAD_BATCH, per_queue - start))
    time.sleep(0.02)
    cuts.append(int(time.time() * 1000))
    lo, hi = cuts[slices // 2], cuts[slices // 2 + 1]
    want = (slice_rows // len(qs)) * len(qs)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    rows: dict[bool, Row] = {}
    for pushdown in (False, True, False, True):  # each twice, the second kept (the first warms its path up)
        df = (spark.read.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
              .option("startingOffsets", "earliest").option("filterPushdown", str(pushdown).lower()).load()
              .where(f"storeTimestamp >= timestamp_millis({lo}) AND storeTimestamp < timestamp_millis({hi})"))
        with Meter() as m:
            got = df.count()
        _check(got == want, f"the pushed-read window holds {want} messages (read {got})")
        name = f"1/{slices} by storeTimestamp, {'pushed' if pushdown else 'not pushed'}"
        rows[pushdown] = _measured(name, "source", want, 100, m, params={"topic_messages": want * slices})
    return rows[True], rows[False]


# -- Spark ---------------------------------------------------------------------------------------


def make_spark(jars: list[str] | None = None) -> Any:
    """A local[2] session with both sources registered; ``jars``: extra jars on its class path
    (Spark's Kafka source for the peers section)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The Python workers import this module (the synthetic source) by name.
    pp = os.environ.get("PYTHONPATH", "")
    if REPO not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = REPO + (os.pathsep + pp if pp else "")
    from pyspark.sql import SparkSession

    import rocketmq_spark

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.jars", ",".join(jars or []))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rocketmq_spark.register(spark)
    spark.dataSource.register(SyntheticDataSource)
    return spark


def _progress(q: Any) -> tuple[int, list[dict[str, Any]]]:
    rows, batches = 0, []
    for p in q.recentProgress:
        d = json.loads(p.json) if hasattr(p, "json") else dict(p)
        rows += int(d.get("numInputRows", 0))
        if int(d.get("numInputRows", 0)):
            batches.append({"batchId": d.get("batchId"), "rows": int(d.get("numInputRows", 0)),
                            "durationMs": d.get("durationMs", {})})
    return rows, batches


def run_stream(spark: Any, reader: Any, workdir: str, label: str) -> tuple[Meter, int, list[dict[str, Any]]]:
    """reader -> noop with trigger(availableNow=True); timed from start() to termination."""
    ck = os.path.join(workdir, "ck", f"{label}-{uuid.uuid4().hex[:8]}")
    writer = reader.load().writeStream.format("noop").trigger(availableNow=True).option("checkpointLocation", ck)
    with Meter() as m:
        q = writer.start()
        q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{label}: {q.exception()}")
    rows, batches = _progress(q)
    return m, rows, batches


#: the projected read: a schema of two fields (only those are decoded)
PROJECTED = "body BINARY, queueOffset BIGINT"
#: issue 22: the projected read at >= 1.5x the full-schema read's rows/s
PROJECTED_TARGET_RATIO = 1.5


def spark_rocketmq_source(spark: Any, ns: str, topic: str, n: int, body_size: int, workdir: str,
                          name: str = "rocketmq -> noop (Spark)", endpoints: str | None = None,
                          schema: str | None = None) -> Row:
    """The reader over remoting (name server ``ns``), or over gRPC when ``endpoints`` is given;
    ``schema``: a user-given schema (a projection of the row schema)."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    where = {"endpoints": endpoints} if endpoints else {"namesrvAddr": ns}
    reader = spark.readStream.format("rocketmq")
    if schema:
        reader = reader.schema(schema)
    reader = (reader.options(**where).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", "earliest"))
    m, rows, batches = run_stream(spark, reader, workdir, "rmq")
    _check(rows == n, f"{name} read {rows} of {n} rows")
    return _measured(name, "source", n, body_size, m, params=_batch_params(m, batches))


def spark_synthetic_source(spark: Any, n: int, body_size: int, workdir: str,
                           name: str = "synthetic -> noop (Spark floor)") -> Row:
    reader = (spark.readStream.format("rmqbench_synthetic").option("rows", str(n)).option("bodySize", str(body_size))
              .option("partitions", str(QUEUES)).option("batchRows", str(PULL)))
    m, rows, batches = run_stream(spark, reader, workdir, "syn")
    _check(rows == n, f"{name} read {rows} of {n} rows")
    return _measured(name, "source", n, body_size, m, params=_batch_params(m, batches))


def _batch_params(m: Meter, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the wall time went: inside micro-batches (addBatch = the read itself) or around them
    (query start, the planning process, the final empty check, stop)."""
    trig = sum(int(b["durationMs"].get("triggerExecution", 0)) for b in batches) / 1000
    add = sum(int(b["durationMs"].get("addBatch", 0)) for b in batches) / 1000
    return {"micro_batches": batches, "add_batch_s": round(add, 3), "in_batches_s": round(trig, 3),
            "outside_batches_s": round(m.elapsed - trig, 3)}


def warm_up_sources(spark: Any, ns: str, workdir: str, meanwhile: Callable[[], None] | None = None, *,
                    synthetic: bool = True) -> None:
    """One small query of each source, both at once (first-query costs kept out of the figures),
    running ``meanwhile()`` in this thread while they run.

    (DataFrame writes to a Python data source must come from the main thread: from another
    Python thread Spark 4.3 fails them with DATA_SOURCE_NOT_FOUND; streaming queries run on
    their own, so they overlap the writer's warm-up here.)"""
    rmq = (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", "bench-warmup")
           .option("consumerGroup", f"bench-warm-{uuid.uuid4().hex[:8]}").option("startingOffsets", "earliest"))
    syn = spark.readStream.format("rmqbench_synthetic").option("rows", str(WARMUP_ROWS))
    queries = [r.load().writeStream.format("noop").trigger(availableNow=True)
               .option("checkpointLocation", os.path.join(workdir, "ck", f"warm-{i}-{uuid.uuid4().hex[:8]}")).start()
               for i, r in enumerate((rmq, syn) if synthetic else (rmq,))]
    if meanwhile is not None:
        meanwhile()
    for q in queries:
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"warm-up query: {q.exception()}")
        rows, _ = _progress(q)
        _check(rows == WARMUP_ROWS, f"warm-up query read {rows} of {WARMUP_ROWS}")


def warm_up_writer(spark: Any, c: RemotingClient, ns: str, eos: bool) -> None:
    warm = sink_frame(spark, WARMUP_ROWS, 100)
    spark_sink(spark, c, ns, warm, WARMUP_ROWS, 100, "at-least-once")
    warm.unpersist()
    if eos:
        warm = sink_frame(spark, 256, 100)
        spark_sink(spark, c, ns, warm, 256, 100, "exactly-once")
        warm.unpersist()


def sink_frame(spark: Any, n: int, body_size: int) -> Any:
    """n rows, a ``body_size``-byte BINARY body each, cached and materialised."""
    df = spark.range(n).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {body_size}, 'abcdefghij') AS BINARY) AS body").cache()
    _check(df.count() == n, "sink frame rows")
    return df


def spark_sink(spark: Any, c: RemotingClient, ns: str, df: Any, n: int, body_size: int, delivery: str) -> Row:
    topic = f"bench-sink-{delivery.split('-')[0]}-{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, QUEUES)
    w = (df.write.mode("append").format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
         .option("delivery", delivery))
    with Meter() as m:
        w.save()
    got = topic_count(c, topic, n)
    _check(got == n, f"write {delivery}: the topic holds {got} of {n} messages")
    return _measured(f"write {delivery} (Spark)", "sink", n, body_size, m,
                     params={"topic": topic, "partitions": df.rdd.getNumPartitions(), "verified_count": got})


# -- output --------------------------------------------------------------------------------------


# -- the real peers: Apache RocketMQ's broker and Spark's own Kafka source ------------------------


def kafka_load(spark: Any, bootstrap: str, topic: str, n: int, body_size: int) -> float:
    """``n`` records (key ``order-<i>``, the same body the RocketMQ preload sends, one header
    ``region``) written by Spark's Kafka sink into ``topic`` (created with 8 partitions on first
    write). -> elapsed seconds."""
    from pyspark.sql import functions as F

    body = body_of(body_size)
    df = (spark.range(n, numPartitions=QUEUES)
          .select(F.concat(F.lit("order-"), F.col("id").cast("string")).alias("key"),
                  F.lit(body).alias("value"),
                  F.array(F.struct(F.lit("region").alias("key"), F.lit(b"eu-west-1").alias("value"))).alias("headers")))
    t0 = time.perf_counter()
    df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save()
    return time.perf_counter() - t0


def spark_kafka_source(spark: Any, bootstrap: str, topic: str, n: int, body_size: int, workdir: str) -> Row:
    """Spark's Kafka source (headers included) -> noop, trigger(availableNow); checks that every
    record of the 8 partitions was read."""
    name = "Kafka -> noop (Spark's Kafka source)"
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("includeHeaders", "true"))
    m, rows, batches = run_stream(spark, reader, workdir, "kafka")
    _check(rows == n, f"{name} read {rows} of {n} rows")
    return _measured(name, "source", n, body_size, m, params=_batch_params(m, batches))


def run_peers(spark: Any, sizes: Sizes, workdir: str, repeat: int, embedded: list[Row], kafka_version: str | None,
              say: Callable[[str], None]) -> dict[str, Any]:
    """The full-schema reads of 2M x 100 B and 200k x 4 KiB from Apache RocketMQ's broker (next
    to the embedded broker's figures in ``embedded``), our client's pull + decode against the Java
    client's on that broker (one core each), then the same data in Kafka read by Spark's Kafka
    source. -> rows and ratios (embedded/real/Kafka per size, ours/Java)."""
    from ._brokers import RealBroker
    from ._kafka import KAFKA_VERSION, Kafka

    out: dict[str, Any] = {"rows": [], "ratios": {}, "versions": {}}
    base = {r.body_size: r for r in embedded if r.scenario == "rocketmq -> noop (Spark)"}
    plan = [(size, n) for size, n in ((100, sizes.small), (4096, sizes.large)) if n > 0]
    real_rows: dict[int, Row] = {}
    with RealBroker(os.path.join(workdir, "real")) as h:
        out["versions"]["rocketmq"] = h.version
        Meter.broker_pid = h.pid
        say(f"Apache RocketMQ {h.version}: broker pid {h.pid}, name server {h.namesrv_addr}")
        c = RemotingClient(h.namesrv_addr)
        try:
            preload(c, "bench-warmup", WARMUP_ROWS, 100)  # what warm_up_sources reads
            loaded = []
            for size, n in plan:
                topic = f"bench-real-{size}"
                qs, el = preload(c, topic, n, size)
                _check(topic_count(c, topic, n) == n, f"Apache RocketMQ indexed {n} messages of {topic}")
                say(f"preloaded {n:,} x {size} B into Apache RocketMQ in {el:.1f}s")
                loaded.append((topic, n, size, qs))
            warm_up_sources(spark, h.namesrv_addr, workdir, synthetic=False)
            for topic, n, size, _ in loaded:
                r = _median_run(lambda t=topic, n=n, size=size: spark_rocketmq_source(
                    spark, h.namesrv_addr, t, n, size, workdir, name="rocketmq -> noop (Spark), Apache RocketMQ"),
                    repeat)
                real_rows[size] = r
                out["rows"].append(r)
                say(f"{r.scenario:<34} {size:>5} B {r.msgs_per_s:>11,.0f} msgs/s  runs {r.runs_s}")
                if size in base:
                    out["ratios"][f"real_to_embedded_{size}B"] = round(r.msgs_per_s / base[size].msgs_per_s, 3)
            t100 = next(((t, n, qs) for t, n, size, qs in loaded if size == 100), None)
            if t100 is not None:
                jr = java_pull(h.namesrv_addr, t100[0], t100[1], 100)
                if jr is not None:
                    ours = one_core(lambda: reader_pull_decode(c, h.namesrv_addr, t100[2], t100[1], 100))
                    ours.scenario = "our reader's pull + decode, one core"
                    jr.params["broker"] = ours.params["broker"] = f"Apache RocketMQ {h.version}"
                    out["java_client"] = [ours, jr]
                    out["ratios"]["client_to_java"] = round(ours.msgs_per_s / jr.msgs_per_s, 3)
                    say(f"{ours.scenario:<34} {ours.msgs_per_s:>11,.0f} msgs/s; {jr.scenario} "
                        f"{jr.msgs_per_s:,.0f} msgs/s (Apache RocketMQ)")
        finally:
            c.close()
            Meter.broker_pid = None
    if kafka_version is None:
        say("Kafka skipped: Spark's Kafka source could not be fetched")
        return out
    out["versions"].update(kafka=KAFKA_VERSION, spark_sql_kafka=kafka_version)
    with Kafka(os.path.join(workdir, "kafka"), partitions=QUEUES) as k:
        Meter.broker_pid = k.pid
        say(f"Kafka {KAFKA_VERSION} (KRaft, one node) at {k.bootstrap}; Spark's Kafka source {kafka_version}")
        try:
            warm = "bench-kafka-warmup"
            kafka_load(spark, k.bootstrap, warm, WARMUP_ROWS, 100)
            spark_kafka_source(spark, k.bootstrap, warm, WARMUP_ROWS, 100, workdir)
            for size, n in plan:
                topic = f"bench-kafka-{size}"
                el = kafka_load(spark, k.bootstrap, topic, n, size)
                say(f"loaded {n:,} x {size} B into Kafka in {el:.1f}s (Spark's Kafka sink)")
                kr = _median_run(lambda t=topic, n=n, size=size: spark_kafka_source(spark, k.bootstrap, t, n, size,
                                                                                    workdir), repeat)
                out["rows"].append(kr)
                say(f"{kr.scenario:<34} {size:>5} B {kr.msgs_per_s:>11,.0f} msgs/s  runs {kr.runs_s}")
                if size in base:
                    out["ratios"][f"embedded_to_kafka_{size}B"] = round(base[size].msgs_per_s / kr.msgs_per_s, 3)
                if size in real_rows:
                    out["ratios"][f"real_to_kafka_{size}B"] = round(real_rows[size].msgs_per_s / kr.msgs_per_s, 3)
        finally:
            Meter.broker_pid = None
    return out


def format_table(rows: list[Row], extra: list[tuple[str, Callable[[Row], str]]] | None = None) -> str:
    head = ["scenario", "msgs", "body", "elapsed s", "msgs/s", "body MB/s", "CPU s", "broker", "CPU us/msg", "noise"]
    for h, _ in extra or ():
        head.append(h)
    body = []
    for r in rows:
        cells = [r.scenario, f"{r.messages:,}", f"{r.body_size} B", f"{r.elapsed_s:.2f}", f"{r.msgs_per_s:,.0f}",
                 f"{r.body_mb_s:.1f}", f"{r.cpu_s:.1f}", "?" if r.broker_cpu_s is None else f"{r.broker_cpu_s:.1f}",
                 f"{r.cpu_s / r.messages * 1e6:.1f}" if r.messages else "-",
                 "?" if r.noise is None else f"{100 * r.noise:.0f}%"]
        for _, fn in extra or ():
            cells.append(fn(r))
        body.append(cells)
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) for i in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


# -- the suite -----------------------------------------------------------------------------------


def _start(workdir: str, launcher: str) -> BrokerHandle:
    chosen = launcher if launcher != "auto" else ("cli" if cli_available() else "mp")
    return start_broker(chosen, os.path.join(workdir, "broker"))


def run_suite(sizes: Sizes, workdir: str, *, launcher: str = "auto", repeat: int | None = None,
              log: Callable[[str], None] = print, peers: bool = False) -> dict[str, Any]:
    """Every scenario against the broker ``launcher`` starts; with ``peers`` the reads again from
    Apache RocketMQ's broker and from Kafka (see :func:`run_peers`) in the same Spark session."""
    repeat = repeat or sizes.repeat
    t_start = time.perf_counter()

    out: dict[str, Any] = {"source": [], "sink": [], "preload": [], "ratios": {}, "ratios_cpu": {},
                           "grpc_to_remoting": {}, "timeline": []}

    def say(msg: str) -> None:
        t = time.perf_counter() - t_start
        out["timeline"].append([round(t, 1), " ".join(msg.split())])
        log(f"[{t:6.1f}s] {msg}")

    with _start(workdir, launcher) as h:
        say(f"broker: launcher {h.launcher}, pid {h.pid}, name server {h.namesrv_addr}")
        Meter.broker_pid = h.pid
        c = RemotingClient(h.namesrv_addr)
        spark = None
        try:
            # Preloads (not part of any figure) run in a thread while the SparkSession starts.
            topics: list[tuple[str, int, int, list[MessageQueue]]] = []
            grpc_topic: list[tuple[str, int, int, list[MessageQueue]]] = []
            failed: list[BaseException] = []
            warm_ready = threading.Event()

            def load_all() -> None:
                pc = RemotingClient(h.namesrv_addr)
                try:
                    preload(pc, "bench-warmup", WARMUP_ROWS, 100)
                    warm_ready.set()
                    for size, n in ((100, sizes.small), (4096, sizes.large)):
                        if n <= 0:
                            continue
                        topic = f"bench-src-{size}"
                        qs, el = preload(pc, topic, n, size)
                        out["preload"].append({"topic": topic, "messages": n, "body_size": size,
                                               "elapsed_s": round(el, 2), "msgs_per_s": round(n / el, 1),
                                               "note": "send_batch, one request at a time, while Spark started"})
                        say(f"preloaded {n:,} x {size} B into {topic} in {el:.1f}s ({n / el:,.0f} msgs/s, "
                            "send_batch one at a time)")
                        topics.append((topic, n, size, qs))
                    if sizes.grpc and h.grpc_endpoint:
                        qs, el = preload(pc, "bench-src-grpc", sizes.grpc, 100)
                        grpc_topic.append(("bench-src-grpc", sizes.grpc, 100, qs))
                        say(f"preloaded {sizes.grpc:,} x 100 B into bench-src-grpc in {el:.1f}s")
                except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
                    failed.append(exc)
                finally:
                    warm_ready.set()
                    pc.close()

            loader = threading.Thread(target=load_all, name="preload", daemon=True)
            loader.start()
            kafka_jars: list[str] = []
            kafka_version = None
            if peers:
                from ._kafka import connector_jars

                try:
                    kafka_jars, kafka_version = connector_jars()
                except RuntimeError as exc:
                    say(f"Spark's Kafka source unavailable, Kafka left out: {exc}")
            spark = make_spark(kafka_jars)
            say("SparkSession up")
            warm_ready.wait()
            if not failed and sizes.warm_up:
                # JVM code paths, Python workers of both sources and of the writer warmed up, all at
                # once and while the preload goes on (none of it is timed)
                warm_up_sources(spark, h.namesrv_addr, workdir,
                                lambda: warm_up_writer(spark, c, h.namesrv_addr, sizes.sink_eos >= 10_000),
                                synthetic=sizes.warm_synthetic)
                say("warm-up queries and writes done")
            t_wait = time.perf_counter()
            loader.join()
            if failed:
                raise failed[0]
            if sizes.warm_up and time.perf_counter() - t_wait > 20:
                # Spark stops Python workers idle for a minute: warm the read path up again
                warm_up_sources(spark, h.namesrv_addr, workdir, synthetic=sizes.warm_synthetic)
                say("preload done; sources warmed up again")

            for topic, n, size, qs in topics:
                rs = _median_run(lambda t=topic, n=n, size=size: spark_rocketmq_source(
                    spark, h.namesrv_addr, t, n, size, workdir), repeat)
                say(f"{rs.scenario:<34} {size:>5} B {rs.msgs_per_s:>11,.0f} msgs/s  runs {rs.runs_s}")
                ss = _median_run(lambda n=n, size=size: spark_synthetic_source(spark, n, size, workdir), repeat)
                say(f"{ss.scenario:<34} {size:>5} B {ss.msgs_per_s:>11,.0f} msgs/s  runs {ss.runs_s}")
                cl = _median_run(lambda qs=qs, n=n, size=size: client_pull_decode(c, qs, n, size), repeat)
                say(f"{cl.scenario:<34} {size:>5} B {cl.msgs_per_s:>11,.0f} msgs/s  runs {cl.runs_s}")
                ratio = rs.msgs_per_s / ss.msgs_per_s if ss.msgs_per_s else 0.0
                out["ratios"][f"{size}B"] = round(ratio, 3)
                cpu_ratio = (ss.cpu_s / ss.messages) / (rs.cpu_s / rs.messages) if rs.cpu_s and ss.cpu_s else 0.0
                out["ratios_cpu"][f"{size}B"] = round(cpu_ratio, 3)
                # the same read with a schema of two fields (body, queueOffset): only those decoded
                rp = _median_run(lambda t=topic, n=n, size=size: spark_rocketmq_source(
                    spark, h.namesrv_addr, t, n, size, workdir, name="rocketmq (body, queueOffset) -> noop",
                    schema=PROJECTED), repeat)
                say(f"{rp.scenario:<34} {size:>5} B {rp.msgs_per_s:>11,.0f} msgs/s  runs {rp.runs_s}")
                out["ratios"][f"projected_{size}B"] = round(rp.msgs_per_s / rs.msgs_per_s, 3)
                for r in (rs, ss, cl, rp):
                    r.params["ratio_to_synthetic"] = round(r.msgs_per_s / ss.msgs_per_s, 3)
                rp.params["ratio_to_full_schema"] = round(rp.msgs_per_s / rs.msgs_per_s, 3)
                out["source"] += [rs, ss, cl, rp]

            for topic, n, size, qs in grpc_topic:
                # the same data over gRPC (PullMessage streams) and over remoting, once each
                spark_rows = []
                if sizes.grpc_spark:
                    rr = spark_rocketmq_source(spark, h.namesrv_addr, topic, n, size, workdir,
                                               name="rocketmq -> noop (Spark), gRPC set")
                    rg = spark_rocketmq_source(spark, h.namesrv_addr, topic, n, size, workdir,
                                               name="rocketmq gRPC -> noop (Spark)", endpoints=h.grpc_endpoint)
                    out["grpc_to_remoting"][f"spark_{size}B"] = round(rg.msgs_per_s / rr.msgs_per_s, 3)
                    spark_rows = [rr, rg]
                cl = client_pull_decode(c, qs, n, size)
                cl.scenario = "client pull + decode, gRPC set"
                cg = client_pull_decode_grpc(h.grpc_endpoint, qs, n, size)
                for r in (*spark_rows, cl, cg):
                    say(f"{r.scenario:<34} {size:>5} B {r.msgs_per_s:>11,.0f} msgs/s")
                out["grpc_to_remoting"][f"client_{size}B"] = round(cg.msgs_per_s / cl.msgs_per_s, 3)
                out["grpc"] = [*spark_rows, cl, cg]

            # the Java client and ours on the same data, one core each (100-byte messages)
            t100 = next(((t, n, qs) for t, n, size, qs in topics if size == 100), None)
            if t100 is not None and not peers:  # with peers: on Apache RocketMQ's broker, below
                jr = java_pull(h.namesrv_addr, t100[0], t100[1], 100)
                if jr is not None:
                    ours = one_core(lambda: client_pull_decode(c, t100[2], t100[1], 100))
                    ours.scenario = "our client pull + decode, one core"
                    out["java_client"] = [ours, jr]
                    out["ratios"]["client_to_java"] = round(ours.msgs_per_s / jr.msgs_per_s, 3)
                    say(f"{ours.scenario:<34} {ours.msgs_per_s:>11,.0f} msgs/s; {jr.scenario} "
                        f"{jr.msgs_per_s:,.0f} msgs/s")

            pushed, full = pushed_read(spark, c, h.namesrv_addr, sizes.slice_rows)
            out["pushdown"] = [pushed, full]
            out["ratios"]["pushed_read"] = round(full.elapsed_s / pushed.elapsed_s, 3)
            say(f"{pushed.scenario:<34} {pushed.elapsed_s:.2f}s; {full.scenario} {full.elapsed_s:.2f}s")

            # sink: the client-only ceiling, then the Spark writer in both modes. The writer was
            # warmed up minutes ago and Spark stops Python processes idle for a minute: warm its
            # planning and commit processes up again (a cold start costs ~1-2 s per write job)
            if sizes.warm_up:
                warm_up_writer(spark, c, h.namesrv_addr, sizes.sink_eos >= 10_000)
            cs = client_send(c, f"bench-send-{uuid.uuid4().hex[:6]}", sizes.sink, 100)
            say(f"{cs.scenario:<34} {'100':>5} B {cs.msgs_per_s:>11,.0f} msgs/s")
            df = sink_frame(spark, sizes.sink, 100)
            ra = spark_sink(spark, c, h.namesrv_addr, df, sizes.sink, 100, "at-least-once")
            say(f"{ra.scenario:<34} {'100':>5} B {ra.msgs_per_s:>11,.0f} msgs/s")
            df.unpersist()
            df = sink_frame(spark, sizes.sink_eos, 100)
            re_ = spark_sink(spark, c, h.namesrv_addr, df, sizes.sink_eos, 100, "exactly-once")
            say(f"{re_.scenario:<34} {'100':>5} B {re_.msgs_per_s:>11,.0f} msgs/s")
            df.unpersist()
            ct = client_transactions(c, f"bench-tx-{uuid.uuid4().hex[:6]}", sizes.sink_eos, 100)
            say(f"{ct.scenario:<34} {'100':>5} B {ct.msgs_per_s:>11,.0f} msgs/s  (half sends "
                f"{ct.params['half_msgs_per_s']:,.0f}/s, END_TRANSACTION {ct.params['end_transactions_per_s']:,.0f}/s)")
            out["sink"] += [ra, re_, cs, ct]
            if peers:
                out["peers"] = run_peers(spark, sizes, workdir, repeat, out["source"], kafka_version, say)
        finally:
            if spark is not None:
                spark.stop()
            c.close()
    return out


# -- profiling -----------------------------------------------------------------------------------


def _py_spy() -> str | None:
    exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return exe if os.path.exists(exe) else shutil.which("py-spy")


def _proc_kind(frame: str) -> str:
    """py-spy's ``process PID:"cmdline"`` frame -> a short name (broker, worker kind, driver)."""
    if "rocketmq_spark.cli" in frame:
        return "broker"
    if "benchmarks" in frame:
        return "driver"
    cmd = frame.split(":", 1)[-1].strip('"')
    if "jspawnhelper" in cmd:
        return "python worker (starting)"  # the JVM forks through jspawnhelper, then execs python
    if "pyspark" in cmd:
        return "python worker " + cmd.rsplit(" ", 1)[-1].split(".")[-1]  # daemon, worker, <runner name>
    return cmd.split(" ", 1)[0].rsplit("/", 1)[-1]


def _ours(frame: str) -> bool:
    """A frame of rocketmq_spark code (py-spy prints paths relative to sys.path entries)."""
    return any(s in frame for s in ("(source/", "(sink/", "(checkpoints/", "rocketmq_spark/", "/source/", "/sink/"))


def summarize_collapsed(path: str, top: int = 12) -> str:
    """py-spy's raw (collapsed) output -> samples per process, the top functions by self samples
    in each busy process, and rocketmq_spark's functions by self and inclusive samples.

    Samples are of running Python threads (py-spy's idle detection drops most waits; what is
    left of waits shows as Condition.wait, select or the pyspark daemon's ``manager``)."""
    self_counts: dict[tuple[str, str], int] = {}
    incl_counts: dict[str, int] = {}
    by_proc: dict[str, int] = {}
    total = 0
    with open(path) as f:
        for ln in f:
            stack, _, cnt = ln.rstrip("\n").rpartition(" ")
            try:
                k = int(cnt)
            except ValueError:
                continue
            frames = stack.split(";")
            procs = 0
            while procs < len(frames) and frames[procs].startswith("process "):
                procs += 1  # --subprocesses: the process chain (driver;java;daemon;worker) comes first
            proc = _proc_kind(frames[procs - 1]) if procs else "driver"
            frames = frames[procs:] or ["(no Python frame)"]
            total += k
            by_proc[proc] = by_proc.get(proc, 0) + k
            key = (proc, frames[-1])
            self_counts[key] = self_counts.get(key, 0) + k
            for fr in set(frames):
                incl_counts[fr] = incl_counts.get(fr, 0) + k
    if not total:
        return "(no samples)"
    lines = [f"{total:,} samples at 100/s per running Python thread; % of all samples"]
    lines.append("by process: " + ", ".join(f"{p} {100 * k / total:.0f}%"
                                            for p, k in sorted(by_proc.items(), key=lambda kv: -kv[1])))
    for proc, pk in sorted(by_proc.items(), key=lambda kv: -kv[1]):
        if pk < 0.05 * total:
            continue
        lines.append(f"-- {proc} ({100 * pk / total:.0f}%): top functions by self samples --")
        mine = sorted(((fr, k) for (p, fr), k in self_counts.items() if p == proc), key=lambda kv: -kv[1])
        for fr, k in mine[:top]:
            lines.append(f"{100 * k / total:6.1f}%  {fr}")
    lines.append("-- rocketmq_spark functions: self% / inclusive% --")
    own: dict[str, int] = {}
    for (_, fr), k in self_counts.items():
        if _ours(fr):
            own[fr] = own.get(fr, 0) + k
    ranked = sorted((fr for fr in incl_counts if _ours(fr)), key=lambda fr: (-own.get(fr, 0), -incl_counts[fr]))
    for fr in ranked[: 2 * top]:
        lines.append(f"{100 * own.get(fr, 0) / total:6.1f}% {100 * incl_counts[fr] / total:6.1f}%  {fr}")
    return "\n".join(lines)


def profile(sizes: Sizes, workdir: str, out_dir: str, launcher: str = "auto") -> str:
    """py-spy (sampling, subprocesses included) over the rocketmq source query and both writes."""
    exe = _py_spy()
    if exe is None:
        return "py-spy is not installed: .venv/bin/pip install py-spy"
    os.makedirs(out_dir, exist_ok=True)
    report: list[str] = []
    with _start(workdir, launcher) as h:
        c = RemotingClient(h.namesrv_addr)
        try:
            large = sizes.large or 50_000
            preload(c, "bench-prof", sizes.small, 100)
            preload(c, "bench-prof-4k", large, 4096)
            preload(c, "bench-warmup", WARMUP_ROWS, 100)
            spark = make_spark()
            try:
                warm_up_sources(spark, h.namesrv_addr, workdir,
                                lambda: warm_up_writer(spark, c, h.namesrv_addr, True))
                df = sink_frame(spark, sizes.sink, 100)
                df_eos = sink_frame(spark, sizes.sink_eos, 100)
                phases: list[tuple[str, Callable[[], Row]]] = [
                    ("source", lambda: spark_rocketmq_source(spark, h.namesrv_addr, "bench-prof", sizes.small, 100,
                                                             workdir)),
                    ("synthetic", lambda: spark_synthetic_source(spark, sizes.small, 100, workdir)),
                    ("source-4k", lambda: spark_rocketmq_source(spark, h.namesrv_addr, "bench-prof-4k", large, 4096,
                                                                workdir)),
                    ("sink-alo", lambda: spark_sink(spark, c, h.namesrv_addr, df, sizes.sink, 100, "at-least-once")),
                    ("sink-eos", lambda: spark_sink(spark, c, h.namesrv_addr, df_eos, sizes.sink_eos, 100,
                                                    "exactly-once")),
                ]
                for name, fn in phases:
                    raw = os.path.join(workdir, f"spark_io-profile-{name}.collapsed")
                    spy = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--function",
                                            "--nonblocking", "--rate", "100", "--format", "raw", "-o", raw],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    time.sleep(1.5)  # py-spy attaches
                    row = fn()
                    spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
                    try:
                        _, err = spy.communicate(timeout=60)
                    except subprocess.TimeoutExpired:
                        spy.kill()
                        _, err = spy.communicate()
                    head = f"== {name}: {row.scenario}, {row.messages:,} msgs, {row.elapsed_s:.2f}s " \
                           f"({row.msgs_per_s:,.0f} msgs/s) =="
                    if os.path.exists(raw):
                        report.append(head + "\n" + summarize_collapsed(raw))
                        with open(raw, "rb") as src, gzip.open(os.path.join(out_dir, os.path.basename(raw) + ".gz"),
                                                                "wb") as dst:
                            shutil.copyfileobj(src, dst)  # for flame graphs (e.g. inferno, speedscope)
                    else:
                        report.append(head + "\n(py-spy wrote nothing) " + err.decode(errors="replace")[-500:])
            finally:
                spark.stop()
        finally:
            c.close()
    return "\n\n".join(report)


# -- entry point ---------------------------------------------------------------------------------


def _git_modified() -> list[str] | None:
    """Files of the working tree that differ from the commit (the figures are of those)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain"], check=False, capture_output=True, text=True,
                             timeout=5, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return [ln[3:] for ln in out.stdout.splitlines() if ln[:2].strip()] if out.returncode == 0 else None


def print_peers(peers: dict[str, Any]) -> None:
    v = peers["versions"]
    print()
    print(f"the real peers: Apache RocketMQ {v.get('rocketmq', '?')} (name server + broker, no proxy), Kafka "
          f"{v.get('kafka', '-')} (KRaft, one node, 8 partitions) read by Spark's Kafka source "
          f"{v.get('spark_sql_kafka', '-')}; same data, same Spark session, same noop sink and trigger")
    print(format_table(peers["rows"] + peers.get("java_client", [])))
    names = {"real_to_embedded": "Spark reader on Apache RocketMQ / on the embedded broker",
             "embedded_to_kafka": "Spark reader on the embedded broker / Spark's Kafka source",
             "real_to_kafka": "Spark reader on Apache RocketMQ / Spark's Kafka source"}
    for k, val in peers["ratios"].items():
        if k == "client_to_java":
            print(f"our reader's pull + decode (read_range) / the Java client's (lite pull), one core each, on "
                  f"Apache RocketMQ: {val:.2f}")
            continue
        stem, size = k.rsplit("_", 1)
        print(f"{names.get(stem, stem)} at {size}: {val:.2f}")


def plot_panels(res: dict[str, Any]) -> list[_report.Panel]:
    def baseline(r: Row) -> bool:
        return r.scenario.startswith(("synthetic", "client"))

    panels = []
    for size in sorted({r.body_size for r in res["source"]}):
        panels.append(_report.Panel(
            f"source, {size}-byte bodies: RocketMQ -> Spark vs the synthetic Arrow source and a plain client loop "
            f"(ratio {res['ratios'].get(f'{size}B', float('nan')):.2f}, target {SOURCE_TARGET_RATIO})", "msgs/s",
            [_report.Bar(r.scenario, r.msgs_per_s, baseline(r)) for r in res["source"] if r.body_size == size]))
    panels.append(_report.Panel("sink: Spark -> RocketMQ, 100-byte bodies (grey: without Spark)", "msgs/s",
                                [_report.Bar(r.scenario, r.msgs_per_s, baseline(r)) for r in res["sink"]],
                                target=SINK_TARGET, log=True))
    if res.get("peers", {}).get("rows"):
        for size in sorted({r.body_size for r in res["peers"]["rows"]}):
            bars = [_report.Bar(r.scenario.replace(" (Spark)", ", embedded broker"), r.msgs_per_s)
                    for r in res["source"] if r.body_size == size and r.scenario == "rocketmq -> noop (Spark)"]
            bars += [_report.Bar(r.scenario, r.msgs_per_s, r.scenario.startswith("Kafka"))
                     for r in res["peers"]["rows"] if r.body_size == size]
            panels.append(_report.Panel(f"the real peers, {size}-byte bodies: our reader on both brokers vs Spark's "
                                        "Kafka source (grey)", "msgs/s", bars))
    if res.get("grpc"):
        panels.append(_report.Panel("the reader over gRPC and over remoting, same data", "msgs/s",
                                    [_report.Bar(r.scenario, r.msgs_per_s) for r in res["grpc"]], log=True))
    return panels


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK.small:,} messages per source scenario, {QUICK.sink:,} written (a smoke run)")
    p.add_argument("--repeat", type=int, default=None,
                   help=f"runs of each source scenario, median kept (default {FULL.repeat}; {QUICK.repeat} "
                        "with --quick)")
    p.add_argument("--messages", type=int, default=None, help="override the 100-byte message count (source and "
                   "at-least-once sink)")
    p.add_argument("--launcher", choices=("auto", "cli", "mp", "real"), default="auto",
                   help="how the broker process starts (auto: the rocketmq_spark.cli broker command; real: Apache "
                        "RocketMQ from Maven Central, results in spark_io-real.*)")
    p.add_argument("--peers", choices=("auto", "on", "off"), default="auto",
                   help="after the suite, the reads again from Apache RocketMQ's broker and from Kafka (Spark's "
                        "Kafka source) with the Java client beside ours (auto: on in a full run with the default "
                        "launcher when java and mvn are there)")
    p.add_argument("--profile", action="store_true",
                   help="instead of the figures: py-spy the reads (rocketmq 100 B and 4 KiB, synthetic) and both "
                        "writes (writes results/spark_io-profile.txt and the raw samples as "
                        "results/spark_io-profile-*.collapsed.gz); --messages sets the size")
    _report.add_results_dir(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_io", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from .broker import _git_commit, machine_info

    sizes = QUICK if args.quick else FULL
    if args.messages:
        sizes = dataclasses.replace(sizes, small=args.messages, sink=args.messages)
    out_path = _report.results_path(args, "spark_io-real" if args.launcher == "real" else "spark_io")
    workdir = tempfile.mkdtemp(prefix="rocketmq-spark-bench-")
    try:
        if args.profile:
            text = profile(sizes, workdir, RESULTS_DIR, args.launcher)
            print(text)
            with open(os.path.join(RESULTS_DIR, "spark_io-profile.txt"), "w") as f:
                f.write(text + "\n")
            return 0
        peers = args.peers == "on" or (args.peers == "auto" and not args.quick and args.launcher != "real"
                                       and java_missing() is None)
        load_start = os.getloadavg()
        with Meter() as total:
            res = run_suite(sizes, workdir, launcher=args.launcher, repeat=args.repeat, peers=peers)
        mi = machine_info()
        mi["loadavg_at_start"] = [round(x, 2) for x in load_start]
        mi["own_tree_cpu_s"] = round(total.cpu_s, 1)
        mi["other_processes_cpu_share"] = total.noise
        import pyarrow
        import pyspark

        mi["pyspark"], mi["pyarrow"] = pyspark.__version__, pyarrow.__version__
        repeat = args.repeat or sizes.repeat
        mode = "quick" if args.quick else "full"
        print()
        where = "Apache RocketMQ's broker" if args.launcher == "real" else "the broker in a child process"
        print(f"spark_io benchmark ({mode}): local[2], {QUEUES} queues, {where}; "
              f"{mi['cpu_count']} CPUs, load average {load_start[0]:.2f} at start / {mi.get('loadavg', [0])[0]:.2f} "
              "at end; MB = 1e6 bytes")
        print(f"source: RocketMQ -> Spark noop sink, trigger(availableNow), start() to termination "
              f"(median of {repeat})")
        print(format_table(res["source"], [
            ("vs synthetic", lambda r: f"{r.params['ratio_to_synthetic']:.2f}"),
            ("outside batches s", lambda r: f"{r.params['outside_batches_s']:.2f}" if "outside_batches_s" in r.params
             else "-")]))
        print("outside batches: query start, planning process, final empty check and stop (fixed per query)")
        if res.get("grpc"):
            print()
            print("the reader over gRPC (PullMessage: one stream item per message) and over remoting, same data:")
            print(format_table(res["grpc"]))
        for k, v in res["grpc_to_remoting"].items():
            print(f"reader over gRPC / over remoting, {k.replace('_', ' at ')}: {v:.2f} (same data, same run)")
        for k, v in res["ratios"].items():
            if k == "client_to_java":
                print(f"our client's pull + decode / the Java client's (lite pull), one core each: {v:.2f}")
                continue
            if k == "pushed_read":
                print(f"a 1/24 storeTimestamp window, read with filterPushdown: {v:.2f}x faster than without "
                      "(the same count)")
                continue
            if k.startswith("projected_"):
                print(f"projected read (schema {PROJECTED}) / full-schema read at {k[10:]}: {v:.2f} "
                      f"(target >= {PROJECTED_TARGET_RATIO})")
                continue
            by_cpu = res["ratios_cpu"][k]
            print(f"ratio rocketmq/synthetic at {k}: {v:.2f} by wall time (target >= {SOURCE_TARGET_RATIO}); "
                  f"{by_cpu:.2f} by CPU time per message (less sensitive to neighbours)")

        if res.get("peers"):
            print_peers(res["peers"])
        print()
        print("sink: Spark DataFrame -> RocketMQ (df.write, cached input; counts verified on the broker)")
        print(format_table(res["sink"]))
        alo, _, cs, ct = res["sink"]
        print(f"at-least-once: {alo.msgs_per_s:,.0f} msgs/s (target >= {SINK_TARGET:,}); the same send pattern "
              f"without Spark: {cs.msgs_per_s:,.0f} msgs/s")
        print(f"exactly-once pattern without Spark: half sends {ct.params['half_msgs_per_s']:,.0f} msgs/s "
              f"({ct.params['half_send_s']:.2f}s), then END_TRANSACTION ({ct.params['end_in_flight']} in flight) "
              f"{ct.params['end_transactions_per_s']:,.0f}/s ({ct.params['end_transaction_s']:.2f}s)")
        print("CPU s: our process tree (driver, JVM, Python workers, broker), broker: the broker process's part; "
              "noise: share of the CPUs other processes used meanwhile")
        print("CPU seconds by process (python workers: the tasks; python planners: Spark's planning and commit "
              "processes):")
        for r in res["source"] + res["sink"]:
            print(f"  {r.scenario:<46} {r.body_size:>5} B  " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                                      r.cpu_by_process.items()))
        print(f"total {total.elapsed:.1f}s; other processes used {100 * (total.noise or 0):.0f}% of the machine")
        doc = {
            "benchmark": "spark_io",
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "quick": args.quick,
            "git_commit": _git_commit(),
            "git_modified": _git_modified(),
            "machine": mi,
            "setup": {
                "spark": "local[2], spark.ui.enabled=false, spark.sql.shuffle.partitions=2",
                "queues": QUEUES, "pull_batch": PULL, "sizes": asdict(sizes), "repeat": repeat,
                "source_properties": "TAGS, KEYS, UNIQ_KEY, region (one user property)",
                "sink_body": "100-byte BINARY from spark.range (cached, counted before timing)",
                "units": "MB = 1e6 bytes; elapsed = wall time (source: start() to termination; sink: save()); "
                         "cpu_s = CPU of our process tree incl. the broker; noise = other processes' CPU share",
                "targets": {"source_ratio_to_synthetic": SOURCE_TARGET_RATIO, "sink_at_least_once_msgs_s": SINK_TARGET},
            },
            "preload": res["preload"],
            "ratios_rocketmq_to_synthetic": res["ratios"],
            "ratios_rocketmq_to_synthetic_by_cpu_per_msg": res["ratios_cpu"],
            "total_elapsed_s": round(total.elapsed, 1),
            "timeline": res["timeline"],
            "source": [r.to_json() for r in res["source"]],
            "sink": [r.to_json() for r in res["sink"]],
            "grpc_vs_remoting": [r.to_json() for r in res.get("grpc", [])],
            "pushed_read": [r.to_json() for r in res.get("pushdown", [])],
            "java_client": [r.to_json() for r in res.get("java_client", [])
                            or res.get("peers", {}).get("java_client", [])],
            "peers": {"versions": res.get("peers", {}).get("versions", {}),
                      "ratios": res.get("peers", {}).get("ratios", {}),
                      "rows": [r.to_json() for r in res.get("peers", {}).get("rows", [])]},
            "ratios_grpc_to_remoting": res["grpc_to_remoting"],
        }
        _report.write_results(out_path, doc, plot_panels(res))
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
