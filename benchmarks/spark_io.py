"""Spark I/O benchmark: RocketMQ -> Spark (the reader) and Spark -> RocketMQ (the writer).

The scenarios use the public API only (``rocketmq_spark.register(spark)`` and
``format("rocketmq")``; :class:`~rocketmq_spark.client.RemotingClient` to preload and check)
against the embedded broker in a child process (``python -m rocketmq_spark.cli broker``), with
a local[2] SparkSession (UI off, 2 shuffle partitions)::

  source: messages preloaded over 8 queues (TAGS, KEYS, UNIQ_KEY and one user property)
    rocketmq -> noop        readStream.format("rocketmq"), startingOffsets=earliest, to the noop
                            sink with trigger(availableNow=True); start() to termination
    synthetic -> noop       the floor: a Python streaming data source (benchmarks/_synthetic.py),
                            same schema, 8 partitions per batch, yielding prebuilt Arrow
                            RecordBatches of the reader's batch size (1024 rows), same trigger
                            and sink
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

  exactly-once (issue 33; on Apache RocketMQ in a full run with the default launcher when java
  and mvn are there, ``--java-eos``; skipped with --quick, which the JSON says):
    the embedded figure     the sink's write exactly-once against 20,000 msgs/s (EOS_TARGET)
    on Apache RocketMQ      a broker of tests/real_rocketmq.py VERSION; one after the other: the
                            Spark writer with delivery=exactly-once, our client's half sends +
                            END_TRANSACTION, and the Java client's TransactionMQProducer (JavaPeer
                            tx-bench: 32 threads share it, sendMessageInTransaction, the listener
                            answers COMMIT_MESSAGE, so each half is ended by the client's oneway
                            END_TRANSACTION), same rows; ratios ours / Java (target >= 0.9) under
                            "exactly_once" in the JSON, also against the Java client's time until
                            its messages were all in the queues

  the real peers (full run, default launcher, when java and mvn are there; ``--peers``):
    rocketmq -> noop on     the same full-schema reads (2M x 100 B, 200k x 4 KiB, 8 queues) from
      Apache RocketMQ       Apache RocketMQ's broker (tests/real_rocketmq.py VERSION, 5.5.0; the JSON
                            records the release measured, "versions"."rocketmq"), in the same
                            Spark session, next to the embedded broker's figures above
    Java client vs ours     rocketmq-client's lite pull and our reader's partition path
                            (read_range: pulls in flight, decoded to Arrow) over the 100-byte
                            topic on that broker, one core each
    Kafka -> noop           Spark's own Kafka source (headers included) reading the same messages
                            (key, body, one header) from Kafka 4.1.1 (KRaft, one node, 8
                            partitions), loaded by Spark's Kafka sink (benchmarks/_kafka.py)

The run is a list of sections (``SECTIONS``: source, gRPC vs remoting, the Java client, the
pushed read, sink, exactly-once, the real peers; ``--sections`` picks some); the source, gRPC
and sink sections loop over tables of named scenarios (``SOURCE``, ``GRPC``, ``SINK``).

Warm-ups (one small query of each source, one small write of each mode) run before anything is
timed, while the preload goes on. ``--repeat`` runs each source scenario R times and keeps the
median. Counts are checked: a source run must report exactly N input rows, a sink run must leave
N messages in its topic. Besides wall time every row has the CPU seconds of our own process tree
(driver, JVM, Python workers and planners, broker; also per process kind) and the share of the
machine other processes took meanwhile ("noise"): on a shared 2-core box wall figures move with
it, CPU per message much less.

``python -m benchmarks.spark_io [--quick] [--repeat R] [--messages N] [--eos-messages N] [--peers auto|on|off]
[--java-eos auto|on|off] [--sections a,b] [--profile]``
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
import functools
import gzip
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties
from rocketmq_spark.model import MessageQueue

from . import _plot, _provenance, _report
from ._brokers import BrokerHandle, chosen_launcher, java_missing, start_broker, tests_on_path
from ._cpu import TreeMeter, broker_process
from ._profiling import py_spy, py_spy_record, summarize_collapsed
from ._runs import check, key_value, median_of
from ._synthetic import SyntheticDataSource, body_of

QUEUES = 8
PULL = 1024  # messages per pull (the reader's default pullBatchSize; the broker's cap)
PRELOAD_BATCH = 512
SEND_BATCH = 512  # the writer's default maxBatchMessages
SEND_WINDOW = 8  # batch sends in flight, as the writer keeps per task
WARMUP_ROWS = 4 * 1024
SOURCE_TARGET_RATIO = 0.5
SINK_TARGET = 200_000
#: issue 33: the Spark writer's exactly-once rows/s on the embedded broker, every full run
EOS_TARGET = 20_000
#: issue 33: on Apache RocketMQ, the Spark writer's exactly-once rows/s over the Java client's
#: transactional producer's messages/s, same broker, same run
EOS_JAVA_TARGET_RATIO = 0.9
#: threads sharing the Java TransactionMQProducer (sendMessageInTransaction is synchronous:
#: one half message in flight per thread; our writer keeps 64 per task, 2 tasks)
JAVA_TX_THREADS = 32
#: the projected read: a schema of two fields (only those are decoded)
PROJECTED = "body BINARY, queueOffset BIGINT"
#: issue 22: the projected read at >= 1.5x the full-schema read's rows/s
PROJECTED_TARGET_RATIO = 1.5
#: where the traced read sends its trace records (created with the source topics)
TRACE_TOPIC = "bench-trace"


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
        return _report.per_s(self.messages, self.elapsed_s)

    @property
    def body_mb_s(self) -> float:
        return _report.per_s(self.messages * self.body_size / _report.MB, self.elapsed_s)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["elapsed_s"] = round(self.elapsed_s, 4)
        out["cpu_s"] = round(self.cpu_s, 2)
        out["msgs_per_s"] = round(self.msgs_per_s, 1)
        out["body_mb_s"] = round(self.body_mb_s, 2)
        out["cpu_us_per_msg"] = round(self.cpu_s / self.messages * 1e6, 2) if self.messages else None
        return out

    def line(self) -> str:
        """The run log's line for this row."""
        runs = f"  runs {self.runs_s}" if self.runs_s else ""
        return f"{self.scenario:<34} {self.body_size:>5} B {self.msgs_per_s:>11,.0f} msgs/s{runs}"


def _measured(scenario: str, group: str, n: int, body_size: int, m: TreeMeter, params: dict[str, Any]) -> Row:
    return Row(scenario, group, n, body_size, m.elapsed, m.cpu_s, m.noise, m.broker_cpu_s, m.cpu_by_process,
               params=params)


def _median_run(fn: Callable[[], Row], repeat: int) -> Row:
    runs = [fn() for _ in range(max(1, repeat))]
    best = median_of(runs, key=lambda r: r.elapsed_s)
    best.runs_s = [round(r.elapsed_s, 3) for r in runs]
    return best


# -- the client-side scenarios (no Spark) -------------------------------------------------------


def preload(c: RemotingClient, topic: str, n: int, body_size: int) -> tuple[list[MessageQueue], float]:
    """``n`` messages round-robin over the topic's queues, ``PRELOAD_BATCH`` per send_batch,
    one request at a time. -> (queues, elapsed)."""
    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    check(len(qs) == QUEUES, f"{topic} has {QUEUES} queues (got {len(qs)})")
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
        check(len(res) == k, "one send result per entry")
        sent += k
        i += 1
    elapsed = time.perf_counter() - t0
    check(topic_count(c, topic, n) == n, f"{topic} holds the {n} preloaded messages")
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
    """The Apache RocketMQ Java client (rocketmq-client of real_rocketmq.VERSION, DefaultLitePullConsumer
    in assign mode, 32 per pull, messages decoded to MessageExt and counted) reading the whole topic,
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
    with TreeMeter() as m:
        (line,) = java_peer.run(lib, classes, "pull", {
            "namesrv": ns, "topic": topic, "group": f"bench-java-{uuid.uuid4().hex[:6]}", "fromOffsets": "earliest",
            "count": n, "countOnly": True, "pullBatchSize": 32, "timeoutMs": 600_000}, timeout=900,
            prefix=("taskset", "-c", "0"))
    check(line["count"] == n, f"the Java client read {line['count']} of {n}")
    row = _measured("Java client lite pull, one core", "source", n, body_size, m,
                    params={"client_seconds": line["seconds"], "jvm_start_included_s": round(m.elapsed, 2)})
    row.elapsed_s = float(line["seconds"])  # the client's own loop, JVM start-up excluded
    return row


def java_transactions(c: RemotingClient, ns: str, topic: str, n: int, body_size: int,
                      threads: int = JAVA_TX_THREADS) -> Row | None:
    """The Apache RocketMQ Java client's transactional producer (rocketmq-client of
    real_rocketmq.VERSION: TransactionMQProducer.sendMessageInTransaction from ``threads``
    threads, the local-transaction listener answering COMMIT_MESSAGE, so the client ends each
    half message with END_TRANSACTION, sent oneway) writing ``n`` messages to ``topic``; timed by
    the client from its first send to its last (JVM start-up and a warm-up of 2,000 excluded;
    params: visible_seconds, until the topic's queues held them all). Checked: the topic then
    holds at least warm-up + ``n`` committed messages (params: duplicates, those past it: the
    client sends a half again after a timeout and commits both). None when java or mvn is missing."""
    tests_on_path()
    import java_peer
    from real_rocketmq import cache_root, java_available, provision

    if java_available():
        return None
    lib = provision()
    classes = java_peer.build(lib, cache_root())
    c.create_topic(topic, QUEUES)
    warm = 2_000
    with TreeMeter() as m:
        (line,) = java_peer.run(lib, classes, "tx-bench", {
            "namesrv": ns, "topic": topic, "group": f"bench-java-tx-{uuid.uuid4().hex[:6]}", "count": n,
            "threads": threads, "bodySize": body_size, "warmup": warm}, timeout=900)
    check(line["failed"] == 0 and line["notCommitted"] == 0, f"the Java transactional producer: {line}")
    got = topic_count(c, topic, warm + n)
    # more is possible: the client sends a half again when its answer timed out (retries 2), and
    # commits both (seen on a loaded box: 42,236 of 42,000)
    check(got >= warm + n, f"the Java transactional producer's topic holds {got} of {warm + n}")
    row = _measured(f"Java TransactionMQProducer, {threads} threads", "sink", n, body_size, m,
                    params={"client_seconds": line["seconds"], "visible_seconds": line["visibleSeconds"],
                            "msgs_per_s_until_visible": round(n / line["visibleSeconds"], 1)
                            if line["visibleSeconds"] else None,
                            "threads": threads, "warm_up_messages": warm,
                            "jvm_start_included_s": round(m.elapsed, 2), "verified_count": got - warm,
                            "duplicates": got - warm - n})
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


def client_pull_decode(c: RemotingClient, qs: list[MessageQueue], n: int, body_size: int,
                       name: str = "client pull + decode (no Spark)") -> Row:
    """Every queue pulled in turn, 1024 per pull, each pull body decoded to a RecordBatch."""
    from rocketmq_spark.codec.arrow import decode_to_batch

    rows = pulls = 0
    decode_s = 0.0
    with TreeMeter() as m:
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
    check(rows == n, f"client loop read {rows} of {n}")
    return _measured(name, "source", n, body_size, m, params={
        "pulls": pulls, "decode_s": round(decode_s, 3),
        "decode_share": round(decode_s / m.elapsed, 3) if m.elapsed else None})


def reader_pull_decode(c: RemotingClient, ns: str, qs: list[MessageQueue], n: int, body_size: int,
                       name: str = "our reader's read_range (no Spark)") -> Row:
    """What one Spark read task does, without Spark: ``source.reader.read_range`` (pulls in
    flight, decoded to Arrow) over every queue in turn, on one connection."""
    from rocketmq_spark.source import QueueRange, read_range

    ends = {mq: c.max_offset(mq) for mq in qs}
    parts = [QueueRange(mq, 0, end, (ns,), None, f"bench-{uuid.uuid4().hex[:6]}", "*", PULL, True)
             for mq, end in ends.items() if end > 0]
    with TreeMeter() as m:
        rows = sum(b.num_rows for p in parts for b in read_range(p, c))
    check(rows == n, f"read_range read {rows} of {n}")
    return _measured(name, "source", n, body_size, m, params={})


def client_pull_decode_grpc(endpoint: str, qs: list[MessageQueue], n: int, body_size: int) -> Row:
    """As :func:`client_pull_decode`, over the gRPC endpoint (PullMessage streams)."""
    from rocketmq_spark.client.grpc_client import GrpcClient, message_columns
    from rocketmq_spark.codec.arrow import columns_to_batch

    g = GrpcClient(endpoint)
    rows = pulls = 0
    try:
        with TreeMeter() as m:
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
    check(rows == n, f"gRPC client loop read {rows} of {n}")
    return _measured("client gRPC pull + decode (no Spark)", "source", n, body_size, m, params={"pulls": pulls})


def client_send(c: RemotingClient, topic: str, n: int, body_size: int) -> Row:
    """The writer's send pattern without Spark: batches of 512 with 8 in flight, one thread."""
    c.create_topic(topic, QUEUES)
    qs = c.message_queues(topic, refresh=True)
    body = body_of(body_size)
    prefix = uuid.uuid4().hex[:22].upper()
    inflight: deque[tuple[MessageQueue, int, Any]] = deque()
    sent = i = 0
    with TreeMeter() as m:
        while sent < n:
            k = min(SEND_BATCH, n - sent)
            entries = [BatchEntry(body, f"UNIQ_KEY\x01{prefix}{j:010X}\x02") for j in range(sent, sent + k)]
            mq = qs[i % len(qs)]
            inflight.append((mq, k, c.send_async(mq, c.send_request(mq, entries))))
            sent += k
            i += 1
            while len(inflight) > SEND_WINDOW or (sent >= n and inflight):
                q, cnt, fut = inflight.popleft()
                check(len(c.send_results(q, cnt, fut.result(60))) == cnt, "one result per entry")
    check(topic_count(c, topic, n) == n, f"{topic} holds {n} messages")
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
    with TreeMeter() as m:
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
    check(topic_count(c, topic, n) == n, f"{topic} holds {n} committed messages")
    return _measured("client half sends + END_TRANSACTION (no Spark)", "sink", n, body_size, m, params={
        "half_send_s": round(t_half, 3), "half_msgs_per_s": round(n / t_half, 1), "end_transaction_s": round(t_end, 3),
        "end_transactions_per_s": round(n / t_end, 1), "in_flight": window, "burst": burst,
        "end_in_flight": end_window})


# -- the Spark scenarios -------------------------------------------------------------------------


def make_spark(jars: list[str] | None = None) -> Any:
    """A local[2] session with both sources registered; ``jars``: extra jars on its class path
    (Spark's Kafka source for the peers section)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # The Python workers import the synthetic source (benchmarks._synthetic) by name.
    pp = os.environ.get("PYTHONPATH", "")
    if _provenance.REPO not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = _provenance.REPO + (os.pathsep + pp if pp else "")
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


def run_stream(spark: Any, reader: Any, workdir: str, label: str) -> tuple[TreeMeter, int, list[dict[str, Any]]]:
    """reader -> noop with trigger(availableNow=True); timed from start() to termination."""
    ck = os.path.join(workdir, "ck", f"{label}-{uuid.uuid4().hex[:8]}")
    writer = reader.load().writeStream.format("noop").trigger(availableNow=True).option("checkpointLocation", ck)
    with TreeMeter() as m:
        q = writer.start()
        q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{label}: {q.exception()}")
    rows, batches = _progress(q)
    return m, rows, batches


def _stream_row(spark: Any, reader: Any, workdir: str, label: str, name: str, n: int, body_size: int) -> Row:
    """:func:`run_stream` of ``reader``, checked to read ``n`` rows, as a source row."""
    m, rows, batches = run_stream(spark, reader, workdir, label)
    check(rows == n, f"{name} read {rows} of {n} rows")
    return _measured(name, "source", n, body_size, m, params=_batch_params(m, batches))


def spark_rocketmq_source(spark: Any, ns: str, topic: str, n: int, body_size: int, workdir: str,
                          name: str = "rocketmq -> noop (Spark)", endpoints: str | None = None,
                          schema: str | None = None, options: dict[str, str] | None = None) -> Row:
    """The reader over remoting (name server ``ns``), or over gRPC when ``endpoints`` is given;
    ``schema``: a user-given schema (a projection of the row schema); ``options``: more reader
    options."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    where = {"endpoints": endpoints} if endpoints else {"namesrvAddr": ns}
    reader = spark.readStream.format("rocketmq")
    if schema:
        reader = reader.schema(schema)
    reader = (reader.options(**where).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", "earliest").options(**(options or {})))
    return _stream_row(spark, reader, workdir, "rmq", name, n, body_size)


def spark_synthetic_source(spark: Any, n: int, body_size: int, workdir: str,
                           name: str = "synthetic -> noop (Spark floor)") -> Row:
    reader = (spark.readStream.format("rmqbench_synthetic").option("rows", str(n)).option("bodySize", str(body_size))
              .option("partitions", str(QUEUES)).option("batchRows", str(PULL)))
    return _stream_row(spark, reader, workdir, "syn", name, n, body_size)


def spark_kafka_source(spark: Any, bootstrap: str, topic: str, n: int, body_size: int, workdir: str) -> Row:
    """Spark's Kafka source (headers included) -> noop, trigger(availableNow); checks that every
    record of the 8 partitions was read."""
    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("includeHeaders", "true"))
    return _stream_row(spark, reader, workdir, "kafka", "Kafka -> noop (Spark's Kafka source)", n, body_size)


def _batch_params(m: TreeMeter, batches: list[dict[str, Any]]) -> dict[str, Any]:
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
        check(rows == WARMUP_ROWS, f"warm-up query read {rows} of {WARMUP_ROWS}")


def warm_up_writer(spark: Any, c: RemotingClient, ns: str, eos: bool) -> None:
    spark_write(spark, c, ns, WARMUP_ROWS, "at-least-once")
    if eos:
        spark_write(spark, c, ns, 256, "exactly-once")


def sink_frame(spark: Any, n: int, body_size: int) -> Any:
    """n rows, a ``body_size``-byte BINARY body each, cached and materialised."""
    df = spark.range(n).selectExpr(
        f"CAST(lpad(CAST(id AS STRING), {body_size}, 'abcdefghij') AS BINARY) AS body").cache()
    check(df.count() == n, "sink frame rows")
    return df


def spark_sink(spark: Any, c: RemotingClient, ns: str, df: Any, n: int, body_size: int, delivery: str,
               options: dict[str, str] | None = None, label: str = "") -> Row:
    topic = f"bench-sink-{delivery.split('-')[0]}-{uuid.uuid4().hex[:6]}"
    c.create_topic(topic, QUEUES)
    w = (df.write.mode("append").format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
         .option("delivery", delivery).options(**(options or {})))
    with TreeMeter() as m:
        w.save()
    got = topic_count(c, topic, n)
    check(got == n, f"write {delivery}: the topic holds {got} of {n} messages")
    return _measured(f"write {delivery}{label} (Spark)", "sink", n, body_size, m,
                     params={"topic": topic, "partitions": df.rdd.getNumPartitions(), "verified_count": got})


def spark_write(spark: Any, c: RemotingClient, ns: str, n: int, delivery: str,
                options: dict[str, str] | None = None, label: str = "") -> Row:
    """:func:`spark_sink` of a fresh cached frame of ``n`` 100-byte rows (dropped after)."""
    df = sink_frame(spark, n, 100)
    try:
        return spark_sink(spark, c, ns, df, n, 100, delivery, options, label)
    finally:
        df.unpersist()


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
        with TreeMeter() as m:
            got = df.count()
        check(got == want, f"the pushed-read window holds {want} messages (read {got})")
        name = f"1/{slices} by storeTimestamp, {'pushed' if pushdown else 'not pushed'}"
        rows[pushdown] = _measured(name, "source", want, 100, m, params={"topic_messages": want * slices})
    return rows[True], rows[False]


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


# -- the run: a broker, its topics preloaded, one Spark session, then the sections in order ------


class Topic(NamedTuple):
    """A preloaded topic: ``n`` messages of ``size``-byte bodies over the queues ``qs``."""

    name: str
    n: int
    size: int
    qs: list[MessageQueue]


@dataclass
class Run:
    """What every section of a run works with, and ``out``, the results they add to (see
    :func:`run_suite` for its keys)."""

    sizes: Sizes
    repeat: int
    workdir: str
    broker: BrokerHandle
    c: RemotingClient  # a client of the broker, for the scenarios without Spark and the checks
    spark: Any
    say: Callable[[str], None]  # a line in the run log and the result's timeline
    out: dict[str, Any]
    peers: bool  # the real peers run after the sink (the Java client is compared there)
    kafka_version: str | None = None  # Spark's Kafka source, when it could be fetched
    real_eos: str | None = None  # why the exactly-once writes on Apache RocketMQ are skipped (None: they run)
    #: broker.conf keys over the harness's for the peers' Apache RocketMQ (--real-broker-config)
    real_config: dict[str, str] = field(default_factory=dict)
    topics: list[Topic] = field(default_factory=list)  # the source topics, 100 B then 4 KiB
    grpc_topics: list[Topic] = field(default_factory=list)  # the topic read over gRPC and remoting

    @property
    def ns(self) -> str:
        return self.broker.namesrv_addr


#: the source scenarios, run in this order on every preloaded topic, each the median of --repeat
#: runs; the synthetic source is the floor the others are compared with
SOURCE: dict[str, Callable[[Run, Topic], Row]] = {
    "rocketmq": lambda r, t: spark_rocketmq_source(r.spark, r.ns, t.name, t.n, t.size, r.workdir),
    "synthetic": lambda r, t: spark_synthetic_source(r.spark, t.n, t.size, r.workdir),
    "client": lambda r, t: client_pull_decode(r.c, t.qs, t.n, t.size),
    # the same read with a schema of two fields (body, queueOffset): only those decoded
    "projected": lambda r, t: spark_rocketmq_source(r.spark, r.ns, t.name, t.n, t.size, r.workdir,
                                                    name="rocketmq (body, queueOffset) -> noop", schema=PROJECTED),
    # the full read with message trace on (SubBefore and SubAfter records of every message)
    "traced": lambda r, t: spark_rocketmq_source(r.spark, r.ns, t.name, t.n, t.size, r.workdir,
                                                 name="rocketmq traceEnabled -> noop",
                                                 options={"traceEnabled": "true", "traceTopic": TRACE_TOPIC}),
}


def source_section(run: Run) -> None:
    """:data:`SOURCE` on every preloaded topic; the ratios to the synthetic floor (by wall time
    and by CPU time per message) and of the projected read to the full-schema one."""
    for t in run.topics:
        rows: dict[str, Row] = {}
        for key, scenario in SOURCE.items():
            rows[key] = row = _median_run(functools.partial(scenario, run, t), run.repeat)
            run.say(row.line())
        rs, ss, rp = rows["rocketmq"], rows["synthetic"], rows["projected"]
        run.out["ratios"][f"{t.size}B"] = round(rs.msgs_per_s / ss.msgs_per_s if ss.msgs_per_s else 0.0, 3)
        cpu_ratio = (ss.cpu_s / ss.messages) / (rs.cpu_s / rs.messages) if rs.cpu_s and ss.cpu_s else 0.0
        run.out["ratios_cpu"][f"{t.size}B"] = round(cpu_ratio, 3)
        run.out["ratios"][f"projected_{t.size}B"] = round(rp.msgs_per_s / rs.msgs_per_s, 3)
        for r in rows.values():
            r.params["ratio_to_synthetic"] = round(r.msgs_per_s / ss.msgs_per_s, 3)
        rp.params["ratio_to_full_schema"] = round(rp.msgs_per_s / rs.msgs_per_s, 3)
        rt = rows["traced"]
        run.out["ratios"][f"traced_{t.size}B"] = rt.params["ratio_to_untraced"] = round(
            rt.msgs_per_s / rs.msgs_per_s, 3)
        run.out["source"] += rows.values()


#: the reader over remoting and over gRPC on the same data, once each in this order: through
#: Spark (only with Sizes.grpc_spark) and with the client alone; a ratio gRPC / remoting per pair
GRPC: dict[str, Callable[[Run, Topic], Row]] = {
    "spark remoting": lambda r, t: spark_rocketmq_source(r.spark, r.ns, t.name, t.n, t.size, r.workdir,
                                                         name="rocketmq -> noop (Spark), gRPC set"),
    "spark gRPC": lambda r, t: spark_rocketmq_source(r.spark, r.ns, t.name, t.n, t.size, r.workdir,
                                                     name="rocketmq gRPC -> noop (Spark)",
                                                     endpoints=r.broker.grpc_endpoint),
    "client remoting": lambda r, t: client_pull_decode(r.c, t.qs, t.n, t.size, name="client pull + decode, gRPC set"),
    "client gRPC": lambda r, t: client_pull_decode_grpc(r.broker.grpc_endpoint, t.qs, t.n, t.size),
}


def grpc_section(run: Run) -> None:
    """:data:`GRPC` on the gRPC topic (preloaded when the broker has a gRPC endpoint)."""
    for t in run.grpc_topics:
        rows: dict[str, Row] = {}
        for key, scenario in GRPC.items():
            if key.startswith("spark") and not run.sizes.grpc_spark:
                continue
            rows[key] = row = scenario(run, t)
            run.say(row.line())
        for pair in ("spark", "client"):
            if f"{pair} gRPC" in rows:
                run.out["grpc_to_remoting"][f"{pair}_{t.size}B"] = round(
                    rows[f"{pair} gRPC"].msgs_per_s / rows[f"{pair} remoting"].msgs_per_s, 3)
        run.out["grpc"] = list(rows.values())


def java_section(run: Run) -> None:
    """The Java client and our client on the 100-byte topic, one core each (when java, mvn and
    taskset are there); with the real peers this is done on Apache RocketMQ's broker instead."""
    t = next((t for t in run.topics if t.size == 100), None)
    if t is None or run.peers:
        return
    jr = java_pull(run.ns, t.name, t.n, 100)
    if jr is None:
        return
    ours = one_core(lambda: client_pull_decode(run.c, t.qs, t.n, 100, name="our client pull + decode, one core"))
    run.out["java_client"] = [ours, jr]
    run.out["ratios"]["client_to_java"] = round(ours.msgs_per_s / jr.msgs_per_s, 3)
    run.say(f"{ours.scenario:<34} {ours.msgs_per_s:>11,.0f} msgs/s; {jr.scenario} {jr.msgs_per_s:,.0f} msgs/s")


def pushdown_section(run: Run) -> None:
    """A 1/24 storeTimestamp window read with and without filterPushdown (:func:`pushed_read`)."""
    pushed, full = pushed_read(run.spark, run.c, run.ns, run.sizes.slice_rows)
    run.out["pushdown"] = [pushed, full]
    run.out["ratios"]["pushed_read"] = round(full.elapsed_s / pushed.elapsed_s, 3)
    run.say(f"{pushed.scenario:<34} {pushed.elapsed_s:.2f}s; {full.scenario} {full.elapsed_s:.2f}s")


#: the sink scenarios, in the order they run (the client-only ceiling first, then the Spark writer
#: in both modes, then the exactly-once pattern without Spark), all of 100-byte bodies
SINK: dict[str, Callable[[Run], Row]] = {
    "client send": lambda r: client_send(r.c, f"bench-send-{uuid.uuid4().hex[:6]}", r.sizes.sink, 100),
    "at-least-once": lambda r: spark_write(r.spark, r.c, r.ns, r.sizes.sink, "at-least-once"),
    "exactly-once": lambda r: spark_write(r.spark, r.c, r.ns, r.sizes.sink_eos, "exactly-once"),
    "client transactions": lambda r: client_transactions(r.c, f"bench-tx-{uuid.uuid4().hex[:6]}", r.sizes.sink_eos,
                                                         100),
    # with message trace on: a Pub record per message (and the per-row encoder: see docs/options.md)
    "at-least-once traced": lambda r: spark_write(r.spark, r.c, r.ns, r.sizes.sink, "at-least-once",
                                                  {"traceEnabled": "true", "traceTopic": TRACE_TOPIC}, " traceEnabled"),
}
#: the order of the sink rows in the table and the JSON
SINK_LISTED = ("at-least-once", "exactly-once", "client send", "client transactions", "at-least-once traced")


def sink_section(run: Run) -> None:
    """:data:`SINK`, after warming the writer up again (its warm-up was minutes ago and Spark
    stops Python processes idle for a minute: a cold start costs ~1-2 s per write job)."""
    if run.sizes.warm_up:
        warm_up_writer(run.spark, run.c, run.ns, run.sizes.sink_eos >= 10_000)
    run.c.create_topic(TRACE_TOPIC, QUEUES)  # where the traced write's Pub records go
    rows: dict[str, Row] = {}
    for key, scenario in SINK.items():
        rows[key] = row = scenario(run)
        p = row.params
        run.say(row.line() + (f"  (half sends {p['half_msgs_per_s']:,.0f}/s, END_TRANSACTION "
                              f"{p['end_transactions_per_s']:,.0f}/s)" if "half_msgs_per_s" in p else ""))
    run.out["sink"] += [rows[k] for k in SINK_LISTED]


def exactly_once_section(run: Run) -> None:
    """Issue 33's exactly-once targets: the Spark writer's exactly-once figure of the sink
    section against :data:`EOS_TARGET`; then on Apache RocketMQ's broker (tests/real_rocketmq.py
    VERSION), one after the other in this run, the Spark writer (delivery=exactly-once), our
    client's transactional pattern (:func:`client_transactions`) and the Java client's
    transactional producer (:func:`java_transactions`), each the median of --repeat runs, and
    the ratios ours / Java. Skipped (and said so in the JSON) with --quick, without java and mvn,
    or with --java-eos off."""
    emb = next((r for r in run.out["sink"] if r.scenario == "write exactly-once (Spark)"), None)
    doc: dict[str, Any] = {"target_embedded_msgs_s": EOS_TARGET, "target_ratio_to_java": EOS_JAVA_TARGET_RATIO,
                           "embedded_msgs_s": round(emb.msgs_per_s, 1) if emb else None,
                           "embedded_met": bool(emb and emb.msgs_per_s >= EOS_TARGET), "real": [], "ratios": {}}
    if run.sizes.sink_eos < 10_000:  # the smoke run's few rows: start-up dominates, the target is for full runs
        doc["embedded_met"] = None
    run.out["exactly_once"] = doc
    if run.real_eos is not None:
        doc["real_skipped"] = run.real_eos
        return
    from ._brokers import RealBroker

    n = run.sizes.sink_eos
    # Apache's own check-back timings (5.x: a half is asked about once 6 s old, every 30 s), not the
    # test harness's 3 s / 2 s: the writer's tasks leave a batch write's check-backs unanswered, so
    # each check-back round asked about every half of the write (the Java client's are ended at once)
    # and Apache's own op-message batching (4096 B, every 3 s), not the test harness's for 5.4+
    # (one op a write, an hour's wait): there a lost wakeup of the broker's op batch service
    # leaves its queue of 20,000 ops full for the hour, then every END waits 100 ms (seen here:
    # ENDs at ~100/s after a burst of 20,000, the Spark writer's commit refused as busy). With
    # Apache's, that service spins a core whenever no op was written for 3 s (apache/rocketmq#10966),
    # as for any user of 5.4+: here while the Spark writer's tasks send halves, before its commit
    apache = {"transactionTimeOut": 6000, "transactionCheckInterval": 30_000, "transactionOpMsgMaxSize": 4096,
              "transactionOpBatchInterval": 3000}
    h = RealBroker(os.path.join(run.workdir, "real-eos"), apache)
    with h, broker_process(h.pid):
        doc["rocketmq"] = h.version
        doc["rocketmq_check_backs"] = ", ".join(f"{k} {v}" for k, v in apache.items()) + " (Apache 5.x defaults)"
        run.say(f"Apache RocketMQ {h.version} for the exactly-once writes: broker pid {h.pid}")
        c = RemotingClient(h.namesrv_addr)
        try:
            spark_write(run.spark, c, h.namesrv_addr, 1024, "exactly-once")  # warm-up (the writer's path on it)
            # and the broker's transaction path: a fresh broker JIT-compiles it during whichever
            # scenario runs first (7.6 s of C2 CPU, measured, in a 21 s exactly-once write), and the
            # Java producer runs last
            client_transactions(c, f"bench-tx-warm-{uuid.uuid4().hex[:6]}", min(n, 50_000), 100)
            rows: dict[str, Row] = {}
            for key, fn in (("spark", lambda: spark_write(run.spark, c, h.namesrv_addr, n, "exactly-once")),
                            ("client", lambda: client_transactions(c, f"bench-tx-{uuid.uuid4().hex[:6]}", n, 100))):
                rows[key] = r = _median_run(fn, run.repeat)
                r.scenario += ", Apache RocketMQ"
                r.params["broker"] = f"Apache RocketMQ {h.version}"
                run.say(r.line())
            jr = java_transactions(c, h.namesrv_addr, f"bench-java-tx-{uuid.uuid4().hex[:6]}", n, 100)
        finally:
            c.close()
    doc["real"] = [rows["spark"], rows["client"]]
    if jr is None:
        doc["real_skipped"] = "the Java client could not run (java or mvn missing)"
        return
    jr.params["broker"] = f"Apache RocketMQ {h.version}"
    run.say(jr.line())
    doc["real"].append(jr)
    doc["ratios"] = {"spark_writer_to_java": round(rows["spark"].msgs_per_s / jr.msgs_per_s, 3),
                     "client_to_java": round(rows["client"].msgs_per_s / jr.msgs_per_s, 3)}
    if jr.params["msgs_per_s_until_visible"]:
        # the Java client's ENDs are oneway: its clock stops before the broker applied them
        doc["ratios"]["spark_writer_to_java_until_visible"] = round(
            rows["spark"].msgs_per_s / jr.params["msgs_per_s_until_visible"], 3)
    doc["java_met"] = doc["ratios"]["spark_writer_to_java"] >= EOS_JAVA_TARGET_RATIO


def peers_section(run: Run) -> None:
    """The real peers (:func:`run_peers`), when asked for."""
    if run.peers:
        run.out["peers"] = run_peers(run)


#: the sections of a run, in order; each adds its rows and ratios to ``Run.out``
SECTIONS: list[tuple[str, Callable[[Run], None]]] = [
    ("source", source_section),
    ("grpc", grpc_section),  # gRPC vs remoting
    ("java", java_section),  # the Java client's pull
    ("pushdown", pushdown_section),
    ("sink", sink_section),
    ("exactly-once", exactly_once_section),  # issue 33's targets; on Apache RocketMQ beside the Java client
    ("peers", peers_section),  # the real peers
]
#: the sections whose scenarios read the preloaded source topics (the others need only bench-warmup)
READS = ("source", "grpc", "java", "peers")


class Preload(threading.Thread):
    """The run's topics preloaded in a thread (not part of any figure) while the SparkSession
    starts: bench-warmup first (``warm_ready`` is set then, or on failure), the source topics,
    then the gRPC topic; :meth:`result` joins and re-raises what failed."""

    def __init__(self, h: BrokerHandle, sizes: Sizes, out: dict[str, Any], say: Callable[[str], None],
                 sources: bool = True) -> None:
        super().__init__(name="preload", daemon=True)
        self.h, self.sizes, self.out, self.say, self.sources = h, sizes, out, say, sources
        self.topics: list[Topic] = []
        self.grpc_topics: list[Topic] = []
        self.failed: list[BaseException] = []
        self.warm_ready = threading.Event()

    def run(self) -> None:
        pc = RemotingClient(self.h.namesrv_addr)
        try:
            preload(pc, "bench-warmup", WARMUP_ROWS, 100)
            self.warm_ready.set()
            if not self.sources:
                return
            pc.create_topic(TRACE_TOPIC, QUEUES)  # the traced read's trace records go there
            for size, n in ((100, self.sizes.small), (4096, self.sizes.large)):
                if n > 0:
                    self.topics.append(self._source_topic(pc, size, n))
            if self.sizes.grpc and self.h.grpc_endpoint:
                qs, el = preload(pc, "bench-src-grpc", self.sizes.grpc, 100)
                self.grpc_topics.append(Topic("bench-src-grpc", self.sizes.grpc, 100, qs))
                self.say(f"preloaded {self.sizes.grpc:,} x 100 B into bench-src-grpc in {el:.1f}s")
        except BaseException as exc:  # noqa: BLE001 (re-raised in the main thread)
            self.failed.append(exc)
        finally:
            self.warm_ready.set()
            pc.close()

    def _source_topic(self, pc: RemotingClient, size: int, n: int) -> Topic:
        topic = f"bench-src-{size}"
        qs, el = preload(pc, topic, n, size)
        self.out["preload"].append({"topic": topic, "messages": n, "body_size": size, "elapsed_s": round(el, 2),
                                    "msgs_per_s": round(n / el, 1),
                                    "note": "send_batch, one request at a time, while Spark started"})
        self.say(f"preloaded {n:,} x {size} B into {topic} in {el:.1f}s ({n / el:,.0f} msgs/s, "
                 "send_batch one at a time)")
        return Topic(topic, n, size, qs)

    def result(self) -> tuple[list[Topic], list[Topic]]:
        """-> (source topics, gRPC topics), once the preload is done."""
        self.join()
        if self.failed:
            raise self.failed[0]
        return self.topics, self.grpc_topics


def _warm_up(run: Run, loader: Preload) -> None:
    """JVM code paths and the Python workers of both sources and of the writer warmed up, all at
    once and while the preload goes on (none of it is timed); then the preload's topics."""
    loader.warm_ready.wait()
    warm = run.sizes.warm_up
    if not loader.failed and warm and not loader.sources:  # only the writer is timed
        warm_up_writer(run.spark, run.c, run.ns, run.sizes.sink_eos >= 10_000)
        run.say("warm-up writes done")
    elif not loader.failed and warm:
        warm_up_sources(run.spark, run.ns, run.workdir,
                        lambda: warm_up_writer(run.spark, run.c, run.ns, run.sizes.sink_eos >= 10_000),
                        synthetic=run.sizes.warm_synthetic)
        run.say("warm-up queries and writes done")
    t_wait = time.perf_counter()
    run.topics, run.grpc_topics = loader.result()
    if warm and loader.sources and time.perf_counter() - t_wait > 20:
        # Spark stops Python workers idle for a minute: warm the read path up again
        warm_up_sources(run.spark, run.ns, run.workdir, synthetic=run.sizes.warm_synthetic)
        run.say("preload done; sources warmed up again")


def _kafka_connector(peers: bool, say: Callable[[str], None]) -> tuple[list[str], str | None]:
    """Spark's Kafka source jars and version for the real peers (none without them, or when
    they cannot be fetched: Kafka is then left out)."""
    if not peers:
        return [], None
    from ._kafka import connector_jars

    try:
        return connector_jars()
    except RuntimeError as exc:
        say(f"Spark's Kafka source unavailable, Kafka left out: {exc}")
        return [], None


def run_suite(sizes: Sizes, workdir: str, *, launcher: str = "auto", repeat: int | None = None,
              log: Callable[[str], None] = print, peers: bool = False, real_eos: str | None = "not asked for",
              sections: tuple[str, ...] | None = None, real_config: dict[str, str] | None = None) -> dict[str, Any]:
    """Every section of :data:`SECTIONS` against the broker ``launcher`` starts; with ``peers``
    the reads again from Apache RocketMQ's broker and from Kafka (see :func:`run_peers`) in the
    same Spark session. -> rows (``source``, ``sink``, ``grpc``, ``pushdown``, ``java_client``,
    ``peers``), ratios (``ratios``, ``ratios_cpu``, ``grpc_to_remoting``), ``preload`` and the
    ``timeline`` of the run log. ``real_eos``: why the exactly-once writes on Apache RocketMQ
    are skipped (None: they run); ``sections``: the keys of :data:`SECTIONS` to run (all: None;
    the source topics are preloaded only for those of :data:`READS`); ``real_config``: broker.conf
    keys for the peers' Apache RocketMQ (default: the harness's, Apache's defaults for reads)."""
    chosen = [(k, fn) for k, fn in SECTIONS if sections is None or k in sections]
    t_start = time.perf_counter()
    out: dict[str, Any] = {"source": [], "sink": [], "preload": [], "ratios": {}, "ratios_cpu": {},
                           "grpc_to_remoting": {}, "timeline": []}

    def say(msg: str) -> None:
        t = time.perf_counter() - t_start
        out["timeline"].append([round(t, 1), " ".join(msg.split())])
        log(f"[{t:6.1f}s] {msg}")

    with start_broker(chosen_launcher(launcher), os.path.join(workdir, "broker")) as h, broker_process(h.pid):
        say(f"broker: launcher {h.launcher}, pid {h.pid}, name server {h.namesrv_addr}")
        c = RemotingClient(h.namesrv_addr)
        spark = None
        try:
            loader = Preload(h, sizes, out, say, sources=any(k in READS for k, _ in chosen))
            loader.start()
            kafka_jars, kafka_version = _kafka_connector(peers, say)
            spark = make_spark(kafka_jars)
            say("SparkSession up")
            run = Run(sizes, repeat or sizes.repeat, workdir, h, c, spark, say, out, peers, kafka_version, real_eos,
                      real_config=dict(real_config or {}))
            _warm_up(run, loader)
            for _, section in chosen:
                section(run)
        finally:
            if spark is not None:
                spark.stop()
            c.close()
    return out


# -- the real peers: Apache RocketMQ's broker and Spark's own Kafka source ------------------------


def run_peers(run: Run) -> dict[str, Any]:
    """The full-schema reads of 2M x 100 B and 200k x 4 KiB from Apache RocketMQ's broker (next
    to the embedded broker's figures in ``run.out["source"]``), our reader's pull + decode
    against the Java client's on that broker (one core each), then the same data in Kafka read
    by Spark's Kafka source. -> rows and ratios (embedded/real/Kafka per size, ours/Java)."""
    out: dict[str, Any] = {"rows": [], "ratios": {}, "versions": {}}
    base = {r.body_size: r for r in run.out["source"] if r.scenario == "rocketmq -> noop (Spark)"}
    plan = [(size, n) for size, n in ((100, run.sizes.small), (4096, run.sizes.large)) if n > 0]
    real_rows = _real_rocketmq_reads(run, out, plan, base)
    if run.kafka_version is None:
        run.say("Kafka skipped: Spark's Kafka source could not be fetched")
        return out
    _kafka_reads(run, out, plan, base, real_rows)
    return out


def _real_rocketmq_reads(run: Run, out: dict[str, Any], plan: list[tuple[int, int]],
                         base: dict[int, Row]) -> dict[int, Row]:
    """The reads of ``plan`` ((body size, messages)) from Apache RocketMQ's broker, then the
    Java client beside our reader on its 100-byte topic. -> the Spark rows by body size."""
    from ._brokers import RealBroker

    real_rows: dict[int, Row] = {}
    h = RealBroker(os.path.join(run.workdir, "real"), run.real_config)
    with h, broker_process(h.pid):
        out["versions"]["rocketmq"] = h.version
        out["real_broker_config"] = dict(run.real_config)
        conf = ", ".join(f"{k}={v}" for k, v in run.real_config.items())
        tuned = f" (broker.conf: {conf})" if conf else ""
        run.say(f"Apache RocketMQ {h.version}: broker pid {h.pid}, name server {h.namesrv_addr}{tuned}")
        c = RemotingClient(h.namesrv_addr)
        try:
            preload(c, "bench-warmup", WARMUP_ROWS, 100)  # what warm_up_sources reads
            loaded = []
            for size, n in plan:
                topic = f"bench-real-{size}"
                qs, el = preload(c, topic, n, size)
                check(topic_count(c, topic, n) == n, f"Apache RocketMQ indexed {n} messages of {topic}")
                run.say(f"preloaded {n:,} x {size} B into Apache RocketMQ in {el:.1f}s")
                loaded.append(Topic(topic, n, size, qs))
            warm_up_sources(run.spark, h.namesrv_addr, run.workdir, synthetic=False)
            for t in loaded:
                read = functools.partial(spark_rocketmq_source, run.spark, h.namesrv_addr, t.name, t.n, t.size,
                                         run.workdir, name="rocketmq -> noop (Spark), Apache RocketMQ")
                r = _median_run(read, run.repeat)
                real_rows[t.size] = r
                out["rows"].append(r)
                run.say(r.line())
                if t.size in base:
                    out["ratios"][f"real_to_embedded_{t.size}B"] = round(r.msgs_per_s / base[t.size].msgs_per_s, 3)
            t100 = next((t for t in loaded if t.size == 100), None)
            if t100 is not None:
                _java_beside_ours(run, out, c, h.namesrv_addr, h.version, t100)
        finally:
            c.close()
    return real_rows


def _java_beside_ours(run: Run, out: dict[str, Any], c: RemotingClient, ns: str, version: str, t: Topic) -> None:
    """The Java client's lite pull and our reader's read_range over ``t`` on Apache RocketMQ
    ``version`` (name server ``ns``), one core each."""
    jr = java_pull(ns, t.name, t.n, 100)
    if jr is None:
        return
    ours = one_core(lambda: reader_pull_decode(c, ns, t.qs, t.n, 100, name="our reader's pull + decode, one core"))
    jr.params["broker"] = ours.params["broker"] = f"Apache RocketMQ {version}"
    out["java_client"] = [ours, jr]
    out["ratios"]["client_to_java"] = round(ours.msgs_per_s / jr.msgs_per_s, 3)
    run.say(f"{ours.scenario:<34} {ours.msgs_per_s:>11,.0f} msgs/s; {jr.scenario} "
            f"{jr.msgs_per_s:,.0f} msgs/s (Apache RocketMQ)")


def _kafka_reads(run: Run, out: dict[str, Any], plan: list[tuple[int, int]], base: dict[int, Row],
                 real_rows: dict[int, Row]) -> None:
    """The data of ``plan`` loaded into Kafka by Spark's Kafka sink and read by its source."""
    from ._kafka import KAFKA_VERSION, Kafka

    out["versions"].update(kafka=KAFKA_VERSION, spark_sql_kafka=run.kafka_version)
    with Kafka(os.path.join(run.workdir, "kafka"), partitions=QUEUES) as k, broker_process(k.pid):
        run.say(f"Kafka {KAFKA_VERSION} (KRaft, one node) at {k.bootstrap}; Spark's Kafka source {run.kafka_version}")
        warm = "bench-kafka-warmup"
        kafka_load(run.spark, k.bootstrap, warm, WARMUP_ROWS, 100)
        spark_kafka_source(run.spark, k.bootstrap, warm, WARMUP_ROWS, 100, run.workdir)
        for size, n in plan:
            topic = f"bench-kafka-{size}"
            el = kafka_load(run.spark, k.bootstrap, topic, n, size)
            run.say(f"loaded {n:,} x {size} B into Kafka in {el:.1f}s (Spark's Kafka sink)")
            kr = _median_run(functools.partial(spark_kafka_source, run.spark, k.bootstrap, topic, n, size,
                                               run.workdir), run.repeat)
            out["rows"].append(kr)
            run.say(kr.line())
            if size in base:
                out["ratios"][f"embedded_to_kafka_{size}B"] = round(base[size].msgs_per_s / kr.msgs_per_s, 3)
            if size in real_rows:
                out["ratios"][f"real_to_kafka_{size}B"] = round(real_rows[size].msgs_per_s / kr.msgs_per_s, 3)


# -- output --------------------------------------------------------------------------------------


def format_table(rows: list[Row], extra: list[tuple[str, Callable[[Row], str]]] | None = None) -> str:
    head = ["scenario", "msgs", "body", "elapsed s", "msgs/s", "body MB/s", "CPU s", "broker", "CPU us/msg", "noise"]
    head += [h for h, _ in extra or ()]
    body = [[r.scenario, f"{r.messages:,}", f"{r.body_size} B", f"{r.elapsed_s:.2f}", f"{r.msgs_per_s:,.0f}",
             f"{r.body_mb_s:.1f}", f"{r.cpu_s:.1f}", "?" if r.broker_cpu_s is None else f"{r.broker_cpu_s:.1f}",
             f"{r.cpu_s / r.messages * 1e6:.1f}" if r.messages else "-",
             "?" if r.noise is None else f"{100 * r.noise:.0f}%"] + [fn(r) for _, fn in extra or ()]
            for r in rows]
    return "\n".join(_report.table(head, body))


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


def _print_source(res: dict[str, Any], repeat: int) -> None:
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
        elif k == "pushed_read":
            print(f"a 1/24 storeTimestamp window, read with filterPushdown: {v:.2f}x faster than without "
                  "(the same count)")
        elif k.startswith("traced_"):
            print(f"read with traceEnabled / without at {k[7:]}: {v:.2f} (the trace records of every message "
                  "sent by each worker's background thread)")
        elif k.startswith("projected_"):
            print(f"projected read (schema {PROJECTED}) / full-schema read at {k[10:]}: {v:.2f} "
                  f"(target >= {PROJECTED_TARGET_RATIO})")
        else:
            print(f"ratio rocketmq/synthetic at {k}: {v:.2f} by wall time (target >= {SOURCE_TARGET_RATIO}); "
                  f"{res['ratios_cpu'][k]:.2f} by CPU time per message (less sensitive to neighbours)")


def _print_sink(res: dict[str, Any]) -> None:
    print("sink: Spark DataFrame -> RocketMQ (df.write, cached input; counts verified on the broker)")
    print(format_table(res["sink"]))
    if len(res["sink"]) != len(SINK_LISTED):
        return
    alo, _, cs, ct, traced = res["sink"]
    print(f"at-least-once: {alo.msgs_per_s:,.0f} msgs/s (target >= {SINK_TARGET:,}); the same send pattern "
          f"without Spark: {cs.msgs_per_s:,.0f} msgs/s; with traceEnabled: {traced.msgs_per_s:,.0f} msgs/s "
          f"({traced.msgs_per_s / alo.msgs_per_s:.2f}x)")
    print(f"exactly-once pattern without Spark: half sends {ct.params['half_msgs_per_s']:,.0f} msgs/s "
          f"({ct.params['half_send_s']:.2f}s), then END_TRANSACTION ({ct.params['end_in_flight']} in flight) "
          f"{ct.params['end_transactions_per_s']:,.0f}/s ({ct.params['end_transaction_s']:.2f}s)")


def _print_exactly_once(eos: dict[str, Any]) -> None:
    emb = eos.get("embedded_msgs_s")
    if emb is not None:
        met = {True: "met", False: "NOT met", None: "a full run's target"}[eos["embedded_met"]]
        print(f"exactly-once (Spark) on the embedded broker: {emb:,.0f} msgs/s (target >= {EOS_TARGET:,}: {met})")
    if eos.get("real"):
        print(f"exactly-once on Apache RocketMQ {eos.get('rocketmq', '?')}, same broker, one after the other:")
        print(format_table(eos["real"]))
    for k, v in eos.get("ratios", {}).items():
        who = ("the Spark writer (exactly-once)" if k.startswith("spark")
               else "our client's half sends + END_TRANSACTION")
        until = " until its messages were all in the queues (its ENDs are oneway)" if k.endswith("visible") else ""
        print(f"{who} / the Java client's TransactionMQProducer{until} on Apache RocketMQ: {v:.2f}"
              + (f" (target >= {EOS_JAVA_TARGET_RATIO})" if k == "spark_writer_to_java" else ""))
    if eos.get("real_skipped"):
        print(f"exactly-once on Apache RocketMQ beside the Java client: skipped ({eos['real_skipped']})")


def print_report(res: dict[str, Any], mi: dict[str, Any], total: TreeMeter, *, mode: str, where: str,
                 repeat: int) -> None:
    """The suite's tables and ratios, after the run log."""
    print()
    print(f"spark_io benchmark ({mode}): local[2], {QUEUES} queues, {where}; "
          f"{mi['cpu_count']} CPUs, load average {mi['loadavg_at_start'][0]:.2f} at start / "
          f"{mi.get('loadavg', [0])[0]:.2f} at end; MB = 1e6 bytes")
    _print_source(res, repeat)
    if res.get("peers"):
        print_peers(res["peers"])
    print()
    _print_sink(res)
    if res.get("exactly_once"):
        _print_exactly_once(res["exactly_once"])
    print("CPU s: our process tree (driver, JVM, Python workers, broker), broker: the broker process's part; "
          "noise: share of the CPUs other processes used meanwhile")
    print("CPU seconds by process (python workers: the tasks; python planners: Spark's planning and commit "
          "processes):")
    for r in res["source"] + res["sink"] + res.get("exactly_once", {}).get("real", []):
        print(f"  {r.scenario:<46} {r.body_size:>5} B  " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                                  r.cpu_by_process.items()))
    print(f"total {total.elapsed:.1f}s; other processes used {100 * (total.noise or 0):.0f}% of the machine")


def plot_panels(res: dict[str, Any]) -> list[_plot.Panel]:
    def baseline(r: Row) -> bool:
        return r.scenario.startswith(("synthetic", "client"))

    panels = []
    for size in sorted({r.body_size for r in res["source"]}):
        panels.append(_plot.Panel(
            f"source, {size}-byte bodies: RocketMQ -> Spark vs the synthetic Arrow source and a plain client loop "
            f"(ratio {res['ratios'].get(f'{size}B', float('nan')):.2f}, target {SOURCE_TARGET_RATIO})", "msgs/s",
            [_plot.Bar(r.scenario, r.msgs_per_s, baseline(r)) for r in res["source"] if r.body_size == size]))
    panels.append(_plot.Panel("sink: Spark -> RocketMQ, 100-byte bodies (grey: without Spark)", "msgs/s",
                              [_plot.Bar(r.scenario, r.msgs_per_s, baseline(r)) for r in res["sink"]],
                              target=SINK_TARGET, log=True))
    if res.get("peers", {}).get("rows"):
        for size in sorted({r.body_size for r in res["peers"]["rows"]}):
            bars = [_plot.Bar(r.scenario.replace(" (Spark)", ", embedded broker"), r.msgs_per_s)
                    for r in res["source"] if r.body_size == size and r.scenario == "rocketmq -> noop (Spark)"]
            bars += [_plot.Bar(r.scenario, r.msgs_per_s, r.scenario.startswith("Kafka"))
                     for r in res["peers"]["rows"] if r.body_size == size]
            panels.append(_plot.Panel(f"the real peers, {size}-byte bodies: our reader on both brokers vs Spark's "
                                      "Kafka source (grey)", "msgs/s", bars))
    if res.get("exactly_once", {}).get("real"):
        panels.append(_plot.Panel("exactly-once on Apache RocketMQ: ours vs the Java client's transactional producer "
                                  "(grey: without Spark)", "msgs/s",
                                  [_plot.Bar(r.scenario, r.msgs_per_s, not r.scenario.startswith("write"))
                                   for r in res["exactly_once"]["real"]]))
    if res.get("grpc"):
        panels.append(_plot.Panel("the reader over gRPC and over remoting, same data", "msgs/s",
                                  [_plot.Bar(r.scenario, r.msgs_per_s) for r in res["grpc"]], log=True))
    return panels


def results_doc(res: dict[str, Any], mi: dict[str, Any], total: TreeMeter, *, quick: bool, sizes: Sizes,
                repeat: int) -> dict[str, Any]:
    """The JSON document of a run (its keys are what past results are compared by)."""
    peers = res.get("peers", {})
    return {
        "benchmark": "spark_io",
        "created": _provenance.created(),
        "quick": quick,
        "git_commit": _provenance.git_commit(),
        "git_modified": _provenance.git_modified(),
        "machine": mi,
        "setup": {
            "spark": "local[2], spark.ui.enabled=false, spark.sql.shuffle.partitions=2",
            "queues": QUEUES, "pull_batch": PULL, "sizes": asdict(sizes), "repeat": repeat,
            "source_properties": "TAGS, KEYS, UNIQ_KEY, region (one user property)",
            "sink_body": "100-byte BINARY from spark.range (cached, counted before timing)",
            "units": "MB = 1e6 bytes; elapsed = wall time (source: start() to termination; sink: save()); "
                     "cpu_s = CPU of our process tree incl. the broker; noise = other processes' CPU share",
            "targets": {"source_ratio_to_synthetic": SOURCE_TARGET_RATIO, "sink_at_least_once_msgs_s": SINK_TARGET,
                        "sink_exactly_once_msgs_s": EOS_TARGET,
                        "exactly_once_to_java_on_rocketmq": EOS_JAVA_TARGET_RATIO},
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
        "java_client": [r.to_json() for r in res.get("java_client", []) or peers.get("java_client", [])],
        "peers": {"versions": peers.get("versions", {}), "ratios": peers.get("ratios", {}),
                  "rows": [r.to_json() for r in peers.get("rows", [])]},
        "ratios_grpc_to_remoting": res["grpc_to_remoting"],
        "exactly_once": _eos_json(res.get("exactly_once")),
    }


def _eos_json(eos: dict[str, Any] | None) -> dict[str, Any]:
    """The exactly-once section of the JSON (issue 33's targets; rows as JSON)."""
    if eos is None:
        return {"skipped": "the exactly-once section did not run"}
    return {**eos, "real": [r.to_json() for r in eos.get("real", [])]}


# -- profiling -----------------------------------------------------------------------------------


def profile(sizes: Sizes, workdir: str, out_dir: str, launcher: str = "auto") -> str:
    """py-spy (sampling, subprocesses included) over the rocketmq source queries, the synthetic
    one and both writes, one scenario after the other."""
    exe = py_spy()
    if exe is None:
        return "py-spy is not installed: .venv/bin/pip install py-spy"
    os.makedirs(out_dir, exist_ok=True)
    report: list[str] = []
    with start_broker(chosen_launcher(launcher), os.path.join(workdir, "broker")) as h:
        ns = h.namesrv_addr
        c = RemotingClient(ns)
        try:
            large = sizes.large or 50_000
            preload(c, "bench-prof", sizes.small, 100)
            preload(c, "bench-prof-4k", large, 4096)
            preload(c, "bench-warmup", WARMUP_ROWS, 100)
            spark = make_spark()
            try:
                warm_up_sources(spark, ns, workdir, lambda: warm_up_writer(spark, c, ns, True))
                df = sink_frame(spark, sizes.sink, 100)
                df_eos = sink_frame(spark, sizes.sink_eos, 100)
                phases: list[tuple[str, Callable[[], Row]]] = [
                    ("source", lambda: spark_rocketmq_source(spark, ns, "bench-prof", sizes.small, 100, workdir)),
                    ("synthetic", lambda: spark_synthetic_source(spark, sizes.small, 100, workdir)),
                    ("source-4k", lambda: spark_rocketmq_source(spark, ns, "bench-prof-4k", large, 4096, workdir)),
                    ("sink-alo", lambda: spark_sink(spark, c, ns, df, sizes.sink, 100, "at-least-once")),
                    ("sink-eos", lambda: spark_sink(spark, c, ns, df_eos, sizes.sink_eos, 100, "exactly-once")),
                ]
                for name, fn in phases:
                    report.append(_profiled(exe, os.path.join(workdir, f"spark_io-profile-{name}.collapsed"), name,
                                            fn, out_dir))
            finally:
                spark.stop()
        finally:
            c.close()
    return "\n\n".join(report)


def _profiled(exe: str, raw: str, name: str, fn: Callable[[], Row], out_dir: str) -> str:
    """One scenario under py-spy -> its summary; the raw samples kept gzipped in ``out_dir``
    for flame graphs (e.g. inferno, speedscope)."""
    row, err = py_spy_record(exe, raw, fn)
    head = f"== {name}: {row.scenario}, {row.messages:,} msgs, {row.elapsed_s:.2f}s ({row.msgs_per_s:,.0f} msgs/s) =="
    if not os.path.exists(raw):
        return head + "\n(py-spy wrote nothing) " + err[-500:]
    with open(raw, "rb") as src, gzip.open(os.path.join(out_dir, os.path.basename(raw) + ".gz"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    return head + "\n" + summarize_collapsed(raw)


# -- entry point ---------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK.small:,} messages per source scenario, {QUICK.sink:,} written (a smoke run)")
    p.add_argument("--repeat", type=int, default=None,
                   help=f"runs of each source scenario, median kept (default {FULL.repeat}; {QUICK.repeat} "
                        "with --quick)")
    p.add_argument("--messages", type=int, default=None, help="override the 100-byte message count (source and "
                   "at-least-once sink)")
    p.add_argument("--eos-messages", type=int, default=None,
                   help=f"override the exactly-once row count (default {FULL.sink_eos:,}; {QUICK.sink_eos:,} with "
                        "--quick)")
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
    p.add_argument("--real-broker-config", type=key_value, action="append", metavar="KEY=VALUE",
                   help="a broker.conf key for the peers' Apache RocketMQ (repeatable; default: Apache's defaults "
                        "but what the harness sets), e.g. maxTransferCountOnMessageInMemory=1024")
    p.add_argument("--java-eos", choices=("auto", "on", "off"), default="auto",
                   help="after the sink, the exactly-once writes again on Apache RocketMQ beside the Java client's "
                        "transactional producer (auto: on in a full run with the default launcher when java and mvn "
                        "are there)")
    p.add_argument("--sections", default=None,
                   help="comma-separated sections to run (default all): " + ", ".join(k for k, _ in SECTIONS))
    _report.add_results_dir(p)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_io", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


def _real_eos_skipped(args: argparse.Namespace) -> str | None:
    """Why the exactly-once writes on Apache RocketMQ are left out of this run (None: they run)."""
    if args.java_eos == "off":
        return "--java-eos off"
    if args.launcher == "real":
        return "--launcher real: the whole run is on Apache RocketMQ already"
    missing = java_missing()
    if missing is not None:
        return f"the Java side cannot run: {missing}"
    if args.java_eos == "auto" and args.quick:
        return "--quick: the smoke run skips Apache RocketMQ and the Java client (start-up alone takes ~20 s)"
    return None


def run(args: argparse.Namespace) -> int:
    sizes = QUICK if args.quick else FULL
    if args.messages:
        sizes = dataclasses.replace(sizes, small=args.messages, sink=args.messages)
    if args.eos_messages:
        sizes = dataclasses.replace(sizes, sink_eos=args.eos_messages)
    workdir = tempfile.mkdtemp(prefix="rocketmq-spark-bench-")
    try:
        if args.profile:
            text = profile(sizes, workdir, _report.RESULTS_DIR, args.launcher)
            print(text)
            with open(os.path.join(_report.RESULTS_DIR, "spark_io-profile.txt"), "w") as f:
                f.write(text + "\n")
            return 0
        peers = args.peers == "on" or (args.peers == "auto" and not args.quick and args.launcher != "real"
                                       and java_missing() is None)
        real_eos = _real_eos_skipped(args)
        sections = tuple(x.strip() for x in args.sections.split(",")) if args.sections else None
        unknown = set(sections or ()) - {k for k, _ in SECTIONS}
        if unknown:
            p_err = f"unknown sections {sorted(unknown)}; one of {[k for k, _ in SECTIONS]}"
            raise SystemExit(p_err)
        load_start = os.getloadavg()
        with TreeMeter() as total:
            res = run_suite(sizes, workdir, launcher=args.launcher, repeat=args.repeat, peers=peers,
                            real_eos=real_eos, sections=sections, real_config=dict(args.real_broker_config or ()))
        mi = _provenance.machine_info()
        mi["loadavg_at_start"] = [round(x, 2) for x in load_start]
        mi["own_tree_cpu_s"] = round(total.cpu_s, 1)
        mi["other_processes_cpu_share"] = total.noise
        mi.update(_provenance.library_versions("pyspark", "pyarrow"))
        repeat = args.repeat or sizes.repeat
        where = "Apache RocketMQ's broker" if args.launcher == "real" else "the broker in a child process"
        print_report(res, mi, total, mode="quick" if args.quick else "full", where=where, repeat=repeat)
        doc = results_doc(res, mi, total, quick=args.quick, sizes=sizes, repeat=repeat)
        _report.write_results(_report.results_path(args, "spark_io-real" if args.launcher == "real" else "spark_io"),
                              doc, plot_panels(res))
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
