"""A broker that loses its store under a query (issue 29): a replaced disk, a re-provisioned
broker, a topic deleted and re-created. It comes back with the query's topics starting at offset
0 again, and new messages take the offsets the query had read or planned past. The query must
not wait at its old offsets in silence (nor skip the new messages below them): with
failOnDataLoss=true it fails naming the queue and both offsets, with failOnDataLoss=false it
reads each queue again from its new earliest offset, every new message exactly once; batch
reads alike; and also when the queue has grown past the query's offset by the time the query
looks (a mark of a message it planned past no longer matches).

The exactly-once sink alike: a destination broker that loses the half messages a batch's tasks
prepared before the driver commits them fails the batch, and the query's restart writes those
rows again, each once.

Each broker here is the module's own (its store is deleted): an EmbeddedCluster, whose name
server stays up while its broker is away, and an Apache RocketMQ name server and broker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from brokers import queued, settles_at, skip_or_fail, wait_until
from real_rocketmq import RealRocketMQ, java_available, provision
from rocketmq_spark.broker import EmbeddedBroker, EmbeddedCluster
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import DataLossError, RocketMQSparkError
from rocketmq_spark.model import Txn
from rocketmq_spark.sink import TxLog, WriterOptions
from rocketmq_spark.sink.transactional import _rows, _txns, commit_batch, destination_marks, store_prints
from rocketmq_spark.sink.writer import write_rows
from rocketmq_spark.source import Planner, ReaderOptions
from rocketmq_spark.source.pull_loop import read_range

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability]

BROKERS = ("embedded", "real")

#: messages per queue read before the store is lost
OLD = 20


@dataclass
class LossyBroker:
    """A name server and one broker (``broker-a``) whose store a test takes away."""

    kind: str
    namesrv_addr: str
    cluster: EmbeddedCluster | None = None
    real: RealRocketMQ | None = None

    def create_topic(self, topic: str, queues: int) -> str:
        c = RemotingClient(self.namesrv_addr)
        try:
            c.create_topic(topic, queues)
        finally:
            c.close()
        if self.real is not None:
            self.real.topic_route_ready(topic)
        return topic

    def lose_store(self, fills: dict[str, list[int]], scratch: Path) -> None:
        """Stops the broker (a crash), deletes its store (messages, topics, groups and their
        offsets) and starts it again on the same ports; it comes back with each topic of
        ``fills`` holding new messages, ``fills[topic][i]`` in queue i (bodies ``new-i-j``).
        A query does not see such a topic before it holds all of them: the embedded broker's
        store is filled by a broker of its own before it starts; the real one's topic is
        created by one batch send into queue 0 (only one queue may be filled then)."""
        if self.cluster is not None:
            filler = EmbeddedBroker(str(scratch), broker_name="broker-a", grpc_port=None).start()
            try:
                for topic, counts in fills.items():
                    c = RemotingClient(filler.namesrv_addr)
                    try:
                        c.create_topic(topic, len(counts))
                        _send(c, topic, "new", counts)
                    finally:
                        c.close()
                filler.flush()
            finally:
                filler.stop()
            self.cluster.stop_broker("broker-a")
            shutil.rmtree(Path(self.cluster.data_dir or "") / "broker-a")
            shutil.move(str(scratch), str(Path(self.cluster.data_dir or "") / "broker-a"))
            self.cluster.start_broker("broker-a")
            return
        assert self.real is not None
        self.real.stop_broker(kill=True)
        shutil.rmtree(self.real.workdir / "store")
        self.real.start_broker()
        c = RemotingClient(self.namesrv_addr)
        try:
            for topic, counts in fills.items():
                assert len(counts) == 1, "the real broker's topics come back with queue 0 filled only"
                # a topic the name server does not route is sent with the route of TBW102: the
                # broker creates it on this send, with its messages
                q0 = c.message_queues(topic, writable=True)[0]
                c.send_batch(q0, [BatchEntry(f"new-0-{j}".encode()) for j in range(counts[0])])
                # in the consume queue (not routed yet: asked of the queue itself)
                wait_until(lambda q0=q0, n=counts[0]: c.max_offset(q0) >= n, 10, 0.05)
                assert c.max_offset(q0) == counts[0]
        finally:
            c.close()


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LossyBroker]:
    if request.param == "embedded":
        with EmbeddedCluster(str(tmp_path_factory.mktemp("lossy-embedded")), brokers=1, grpc=False) as cluster:
            yield LossyBroker("embedded", cluster.namesrv_addr, cluster=cluster)
        return
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(), tmp_path_factory.mktemp("lossy-real"), proxy=False)
    rmq.start()
    try:
        yield LossyBroker("real", rmq.namesrv_addr, real=rmq)
    finally:
        rmq.stop(grace_s=2)


def _send(c: RemotingClient, topic: str, prefix: str, counts: list[int]) -> None:
    """Sends ``counts[i]`` messages to queue i; returns once the consume queues hold them."""
    qs = c.message_queues(topic, refresh=True, writable=True)
    before = queued(c, topic)
    for qid, n in enumerate(counts):
        if n:
            c.send_batch(qs[qid], [BatchEntry(f"{prefix}-{qid}-{j}".encode()) for j in range(n)])
    assert settles_at(c, topic, before + sum(counts)) == before + sum(counts)


def _produce(broker: LossyBroker, topic: str, prefix: str, counts: list[int]) -> None:
    c = RemotingClient(broker.namesrv_addr)
    try:
        _send(c, topic, prefix, counts)
    finally:
        c.close()


def _bodies(prefix: str, counts: list[int]) -> Counter[str]:
    return Counter(f"{prefix}-{q}-{j}" for q, n in enumerate(counts) for j in range(n))


def _reader(spark: Any, broker: LossyBroker, topic: str, group: str, fail: bool, stream: bool = True) -> Any:
    r = spark.readStream if stream else spark.read
    r = (r.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("failOnDataLoss", str(fail).lower()))
    if stream:
        r = (r.option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("brokerDownTimeoutMs", "240000"))
    return r


def _stream(spark: Any, broker: LossyBroker, topic: str, name: str, fail: bool, ck: Path) -> Any:
    return (_reader(spark, broker, topic, name, fail).load().selectExpr("CAST(body AS STRING) AS body")
            .writeStream.format("memory").queryName(name).option("checkpointLocation", str(ck))
            .trigger(processingTime="300 milliseconds").start())


def _read_now(spark: Any, broker: LossyBroker, topic: str, name: str, fail: bool, ck: Path) -> Counter[str]:
    """One Trigger.AvailableNow run of a stream on checkpoint ``ck``: what it read."""
    out = ck.parent / f"{ck.name}-out"
    q = (_reader(spark, broker, topic, name, fail).load().selectExpr("CAST(body AS STRING) AS body")
         .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination(240)
    assert not q.isActive, "the AvailableNow run did not end"
    return Counter(r.body for r in spark.read.parquet(str(out)).collect())


def _table(spark: Any, name: str) -> Counter[str]:
    return Counter(r.body for r in spark.sql(f"select body from {name}").collect())


def _wait_rows(spark: Any, q: Any, name: str, want: Counter[str], what: str, timeout_s: float = 180) -> None:
    def done() -> bool:
        assert q.isActive, f"{name} stopped: {q.exception()}"
        return _table(spark, name) == want

    assert wait_until(done, timeout_s, 0.3), \
        f"{what}: {name} read {_table(spark, name) - want} more, {want - _table(spark, name)} not"


def _failure(q: Any, timeout_s: float = 180) -> str:
    """The error the query stopped with (it must stop within ``timeout_s``)."""
    assert wait_until(lambda: not q.isActive, timeout_s, 0.3), \
        f"the query still runs, silent, {timeout_s:.0f}s after its broker lost its store; last progress " \
        f"{q.lastProgress}"
    return str(q.exception())


def test_a_store_lost_under_running_streams_and_batch_reads(spark, broker: LossyBroker, tmp_path) -> None:
    kind = broker.kind.upper()
    topic = broker.create_topic(f"LOST_{kind}", 2)
    batch_topic = broker.create_topic(f"LOST_BATCH_{kind}", 2)
    _produce(broker, topic, "old", [OLD, OLD])
    _produce(broker, batch_topic, "old", [OLD, OLD])
    fails, skips = _stream(spark, broker, topic, f"lost_fail_{kind}", True, tmp_path / "ck-fail"), \
        _stream(spark, broker, topic, f"lost_skip_{kind}", False, tmp_path / "ck-skip")
    try:
        old = _bodies("old", [OLD, OLD])
        _wait_rows(spark, fails, f"lost_fail_{kind}", old, "the messages before the loss")
        _wait_rows(spark, skips, f"lost_skip_{kind}", old, "the messages before the loss")
        broker.lose_store({topic: [5, 5], batch_topic: [5, 5]} if broker.real is None else {},
                          tmp_path / "scratch")
        if broker.real is not None:  # several queues: created, then filled (fewer than the query read)
            for t in (topic, batch_topic):
                broker.create_topic(t, 2)
                _produce(broker, t, "new", [5, 5])
        err = _failure(fails)
        assert "DataLossError" in err and f"{topic}/broker-a:" in err, err
        assert "the query's next offset is 20, the queue's max offset" in err, err
        assert "failOnDataLoss=false" in err and "startingOffsets=earliest" in err, err
        # failOnDataLoss=false: each queue is read again from its earliest offset, nothing twice
        _wait_rows(spark, skips, f"lost_skip_{kind}", old + _bodies("new", [5, 5]), "the new messages")
        _produce(broker, topic, "newer", [30, 30])  # past the offsets the query stood at
        _wait_rows(spark, skips, f"lost_skip_{kind}", old + _bodies("new", [5, 5]) + _bodies("newer", [30, 30]),
                   "the messages after them")
    finally:
        fails.stop()
        skips.stop()

    # batch reads from where a query stood before the loss: its offsets JSON, or the group's
    # offsets when the broker kept them (a topic re-created on a broker that kept its offsets)
    stood = f'{{"{batch_topic}":{{"broker-a:0":{OLD},"broker-a:1":{OLD}}}}}'
    c = RemotingClient(broker.namesrv_addr)
    try:
        group = f"lost_batch_{kind}"
        c.create_group(group)
        for mq in c.message_queues(batch_topic, refresh=True):
            c.update_consumer_offset(group, mq, OLD)
    finally:
        c.close()
    for how in (("startingOffsets", stood), ("consumerGroup", group)):
        df = _reader(spark, broker, batch_topic, group, True, stream=False).option(*how).load()
        with pytest.raises(Exception) as info:
            df.collect()
        assert f"{batch_topic}/broker-a:0: the query's next offset is 20, the queue's max offset 5" \
               in str(info.value), (how, str(info.value))
        got = _reader(spark, broker, batch_topic, group, False, stream=False).option(*how).load() \
            .selectExpr("CAST(body AS STRING) AS body").collect()
        assert Counter(r.body for r in got) == _bodies("new", [5, 5]), how


def test_a_store_refilled_past_the_querys_offset_is_noticed_running_and_restarted(spark, broker: LossyBroker,
                                                                                 tmp_path) -> None:
    kind = broker.kind.upper()
    topic, stopped = broker.create_topic(f"REFILLED_{kind}", 1), broker.create_topic(f"REFILLED_STOPPED_{kind}", 1)
    _produce(broker, topic, "old", [OLD])
    _produce(broker, stopped, "old", [OLD])
    old = _bodies("old", [OLD])
    # queries that read the topic, then stopped before the loss (their checkpoints carry the marks)
    assert _read_now(spark, broker, stopped, f"refill_stopped_fail_{kind}", True, tmp_path / "ck-sf") == old
    assert _read_now(spark, broker, stopped, f"refill_stopped_skip_{kind}", False, tmp_path / "ck-ss") == old
    fails, skips = _stream(spark, broker, topic, f"refill_fail_{kind}", True, tmp_path / "ck-fail"), \
        _stream(spark, broker, topic, f"refill_skip_{kind}", False, tmp_path / "ck-skip")
    try:
        _wait_rows(spark, fails, f"refill_fail_{kind}", old, "the messages before the loss")
        _wait_rows(spark, skips, f"refill_skip_{kind}", old, "the messages before the loss")
        # back with three times as many new messages as the queries read: past their offsets
        broker.lose_store({topic: [3 * OLD], stopped: [3 * OLD]}, tmp_path / "scratch")
        err = _failure(fails)
        assert "DataLossError" in err and f"{topic}/broker-a:0: the query's next offset is 20" in err, err
        mark = f"and offset {OLD - 1}, stored at "
        if broker.real is None:
            assert mark in err and "holds a message stored at" in err, err
        else:  # the query may look in the millisecond between the topic's creation and its messages
            assert mark in err or "the queue's max offset 0" in err, err
        new = _bodies("new", [3 * OLD])
        _wait_rows(spark, skips, f"refill_skip_{kind}", old + new, "every new message, once")
    finally:
        fails.stop()
        skips.stop()
    # restarted on their checkpoints: the marks they kept are compared once, before reading on
    with pytest.raises(Exception) as info:
        _read_now(spark, broker, stopped, f"refill_stopped_fail_{kind}", True, tmp_path / "ck-sf")
    assert f"{stopped}/broker-a:0: the query's next offset is 20, and offset {OLD - 1}, stored at " \
           in str(info.value), str(info.value)
    assert _read_now(spark, broker, stopped, f"refill_stopped_skip_{kind}", False, tmp_path / "ck-ss") == old + new


def test_a_range_planned_before_the_store_was_lost_reads_nothing_of_the_new_store(broker: LossyBroker,
                                                                                 tmp_path) -> None:
    """A batch planned on the old store whose task reads after the broker came back without it
    (the fault suite's wipe-broker-now: parquet rows read twice). Before: the task read the new
    store's messages at the planned offsets as the planned ones, and the next batch, which
    restarts the queue at its new earliest offset, read them again."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    kind = broker.kind.upper()
    topic = broker.create_topic(f"LOST_TASK_{kind}", 1)
    _produce(broker, topic, "old", [OLD])
    planner = Planner(ReaderOptions.parse({"namesrvAddr": broker.namesrv_addr, "topic": topic,
                                           "consumerGroup": f"lost_task_{kind}", "startingOffsets": "earliest",
                                           "failOnDataLoss": "false"}, stream=True))
    try:
        start = planner.initial()
        end = planner.next_end(start, ReadAllAvailable())
        (part,) = planner.partitions(start, end, planner.marks_of(end))
    finally:
        planner.client.close()
    assert (part.start, part.end) == (0, OLD) and part.mark is not None and part.mark[0] == OLD - 1
    # back with three times as many new messages: the planned offsets all hold new ones
    broker.lose_store({topic: [3 * OLD]}, tmp_path / "scratch")
    read = [bytes(b).decode() for batch in read_range(part) for b in batch.column("body").to_pylist()]
    assert read == [], f"the task read {len(read)} messages of the new store as the planned ones: {read[:3]}"
    strict = replace(part, fail_on_data_loss=True)
    with pytest.raises(DataLossError) as err:
        list(read_range(strict))
    assert f"{topic}/broker-a:0: planned offsets [0, {OLD}) are not on the broker: offset {OLD - 1}, stored at " \
        in str(err.value), str(err.value)


EOS_DRIVER = os.path.join(os.path.dirname(__file__), "eos_lost_driver.py")


def _routed(broker: LossyBroker, topic: str, queues: int) -> bool:
    c = RemotingClient(broker.namesrv_addr)
    try:
        return len(c.message_queues(topic, refresh=True)) == queues
    except RocketMQSparkError:
        return False
    finally:
        c.close()


def _topic_bodies(broker: LossyBroker, topic: str, at_least: int) -> Counter[str]:
    """Every message body of ``topic``, read once it holds ``at_least`` (Apache RocketMQ's broker
    indexes a committed message a moment after answering its END)."""
    c = RemotingClient(broker.namesrv_addr)
    try:
        qs = c.message_queues(topic, refresh=True)
        assert wait_until(lambda: sum(c.max_offset(q) for q in qs) >= at_least, 30), \
            f"{topic} holds {sum(c.max_offset(q) for q in qs)} messages, fewer than {at_least}"
        out: Counter[str] = Counter()
        for q in qs:
            at, end = 0, c.max_offset(q)
            while at < end:
                res = c.pull(q, at, 32)
                out.update(bytes(r.payload()).decode() for r in decode_records(res.body))
                at = res.next_offset
        return out
    finally:
        c.close()


def test_an_exactly_once_batch_whose_destination_lost_its_halves_is_written_again_each_row_once(
        spark, broker: LossyBroker, tmp_path) -> None:
    """The fault suite's wipe-broker-now, on the sink: a batch's tasks prepared its rows as half
    messages on the destination broker, which lost its store and came back empty before the
    driver committed them. Its "no half message" answers used to be taken as "ended before": the
    batch was marked committed and its rows lost. Now the commit fails naming them, the batch
    stays uncommitted, and the query's restart writes them again: every row exactly once."""
    kind = broker.kind.upper()
    dst = broker.create_topic(f"EOS_LOST_{kind}", 2)
    src, ck, handshake = tmp_path / "src", tmp_path / "ck", tmp_path / "handshake"
    src.mkdir()
    handshake.mkdir()
    rows = Counter(f"row-{f}-{i}" for f in range(2) for i in range(40))
    for f in range(2):
        (src / f"part-{f}.txt").write_text("".join(f"row-{f}-{i}\n" for i in range(40)))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def driver(mode: str) -> list[str]:
        return [sys.executable, EOS_DRIVER, broker.namesrv_addr, str(src), dst, str(ck), str(handshake), mode]

    err_path = tmp_path / "first.stderr"  # a file: Spark's logs would fill a pipe nobody reads while waiting
    with open(err_path, "w") as err_file:
        first = subprocess.Popen(driver("pause"), stdout=subprocess.DEVNULL, stderr=err_file, text=True, env=env)
        try:
            assert wait_until(lambda: (handshake / "prepared").exists() or first.poll() is not None, 240, 0.2), \
                "the first run's commit did not start within 240 s"
            assert (handshake / "prepared").exists(), \
                f"the first run ended before its commit: {err_path.read_text()[-3000:]}"
            broker.lose_store({}, tmp_path / "scratch")
            # back empty, with the topic created again (as the fault suite's cluster does)
            broker.create_topic(dst, 2)
            assert wait_until(lambda: _routed(broker, dst, 2), 60), f"{dst} is not routed after the store was lost"
            (handshake / "lost").touch()
            first.wait(300)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
    err = err_path.read_text()
    assert first.returncode != 0, "the commit of halves the broker lost succeeded: " + err[-3000:]
    assert "DataLossError" in err and "exactly-once batch 0" in err, err[-3000:]
    assert "80 of the batch's 80 rows" in err and f"broker broker-a topic {dst}" in err, err[-3000:]
    assert "restart the query" in err, err[-3000:]
    commits = ck / "rocketmq-sink" / "commits"
    assert len(json.loads((commits / "0.json").read_text())["lost"]) == 80
    assert not (commits / "0.ended").exists()
    assert _topic_bodies(broker, dst, 0) == Counter()  # nothing committed into the new store

    # the restart (what eos_lost_driver.py's normal mode runs), in this session's SparkSession: a
    # driver of its own, started after the failed one
    q = (spark.readStream.format("text").load(str(src)).selectExpr("value AS body")
         .writeStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", dst)
         .option("delivery", "exactly-once").option("checkpointLocation", str(ck))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    got = _topic_bodies(broker, dst, 80)
    assert got == rows, f"lost {rows - got}, doubled {got - rows}"  # every row exactly once
    assert (commits / "0.ended").exists() and json.loads((commits / "0.json").read_text())["lost"] == []


def test_an_exactly_once_replay_sends_no_end_into_a_new_store_grown_past_its_marks(broker: LossyBroker,
                                                                                  tmp_path) -> None:
    """A batch is recorded (its marks and store print taken) and its driver dies before any END;
    the destination broker loses its store and comes back holding as many messages as before,
    and the next batch's tasks prepare their halves there, at the very commit-log positions of
    the first batch's. The replay of the first batch must not end them by position: the broker's
    checks (producer group, half-queue offset, commit-log offset) all pass for them, so it would
    commit the second batch's rows in the first's place and the first's rows would be lost. Its
    store print (the message just below the mark, stored at another time in the new store)
    tells the replay that the store is another: the recorded halves count as lost, the replay's
    own (its tasks ran again) stand in for them, and every row is stored once."""
    kind = broker.kind.upper()
    # a store of this test's own from its first byte (the module's other tests wrote to the
    # broker's): the new store below is filled from its first byte too, so their positions match
    broker.lose_store({}, tmp_path / "scratch-0")
    dst = broker.create_topic(f"EOS_PRINT_{kind}", 1)
    assert wait_until(lambda: _routed(broker, dst, 1), 60), f"{dst} is not routed"
    ck = tmp_path / "ck"
    opts = WriterOptions.parse({"namesrvAddr": broker.namesrv_addr, "topic": dst, "delivery": "exactly-once",
                                "checkpointLocation": str(ck)})
    before = 12
    first = [f"a-{i:02d}" for i in range(20)]
    second = [f"b-{i:02d}" for i in range(20)]  # the same sizes: the same positions

    def prepared(rows: list[str], batch_id: int) -> tuple[list[Txn], Any]:
        """One task's halves of ``rows`` (by position), and what the driver records of its rows."""
        report = write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [r.encode() for r in rows]})]), batch_id)
        return sorted(_txns([report]), key=lambda t: t.commit_log_offset), _rows([report])

    c = RemotingClient(broker.namesrv_addr)
    try:
        _send(c, dst, "old", [before])
        txns0, rows0 = prepared(first, 0)
        marks = destination_marks(c, txns0)
        prints = store_prints(c, marks or {})
        assert marks and prints, f"marks {marks}, prints {prints}"
        # what the first commit records before its first END
        TxLog(str(ck)).record(0, txns0, marks, sums=rows0.sums, nonces=rows0.nonces, prints=prints)
    finally:
        c.close()

    broker.lose_store({dst: [before]}, tmp_path / "scratch")  # back as full as it was ("new-0-j")
    broker.create_topic(dst, 1)
    assert wait_until(lambda: _routed(broker, dst, 1), 60), f"{dst} is not routed after the store was lost"
    txns1, rows1 = prepared(second, 1)
    at = [(t.queue_offset, t.commit_log_offset) for t in txns0]
    assert [(t.queue_offset, t.commit_log_offset) for t in txns1] == at, \
        "the second batch's halves are not where the first's were: the case is not made"

    # the restarted driver replays the recorded batch: Spark runs its tasks again (new halves,
    # the same message ids and rows), then commits
    txns, rows = prepared(first, 0)
    commit_batch(opts, txns, 0, rows)
    new = Counter(f"new-0-{j}" for j in range(before))
    got = _topic_bodies(broker, dst, before + 20)
    assert got == new + Counter(first), f"after the replay: lost {new + Counter(first) - got}, " \
                                        f"more {got - new - Counter(first)} (the second batch is not committed yet)"
    commit_batch(opts, txns1, 1, rows1)
    got = _topic_bodies(broker, dst, before + 40)
    want = new + Counter(first) + Counter(second)
    assert got == want, f"lost {want - got}, doubled {got - want}"
