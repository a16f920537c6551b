"""Reader and writer on a real cluster shape: one name server, two brokers (queue ids repeat
per broker), failover, name server lists and consumer-group hygiene. Every test runs on the
embedded cluster and on Apache RocketMQ (the session's ``real_cluster``: broker-a a master with
a slave, broker-b a master), through :class:`_Shape`, the few things the tests do to a cluster."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.sql import functions as F

from brokers import queued, settles_at, wait_until
from rocketmq_spark import EmbeddedCluster, RocketMQOffsetCommitter
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import RemotingCommand

pytestmark = [pytest.mark.spark, pytest.mark.integration]


class _Shape:
    """A cluster of two broker groups, ``broker-a`` and ``broker-b``, embedded or real.
    ``crash(name)``: the broker is gone without a word (embedded: its route stays until the
    name server notices; real: a SIGKILL, the name server drops it when its connection closes);
    ``restart(name)``: back on its ports with its store, registered when this returns."""

    def __init__(self, kind: str, cluster: Any) -> None:
        self.kind, self.cluster = kind, cluster
        self.namesrv_addr: str = cluster.namesrv_addr

    def addr(self, name: str) -> str:
        return self.cluster.broker_addrs[name] if self.kind == "embedded" else self.cluster.addr(name)

    def crash(self, name: str) -> None:
        if self.kind == "embedded":
            self.cluster.stop_broker(name, unregister=False)
        else:
            self.cluster.kill(name)

    def restart(self, name: str) -> None:
        if self.kind == "embedded":
            self.cluster.start_broker(name)
        else:
            self.cluster.start_member(name)

    def create_topic(self, client: RemotingClient, topic: str, queues: int = 4) -> None:
        """``topic`` with ``queues`` queues on both groups (and broker-a's slave), routed on both
        when this returns."""
        if self.kind == "real":
            self.cluster.create_topic(topic, queues)
        else:
            client.create_topic(topic, queues=queues)
        assert wait_until(lambda: {q.broker for q in client.message_queues(topic, refresh=True)}
                          == {"broker-a", "broker-b"}, 30), f"{topic} is not routed on both groups"


@pytest.fixture(scope="module", params=["embedded", "real"])
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Shape]:
    if request.param == "real":
        yield _Shape("real", request.getfixturevalue("real_cluster"))
        return
    with EmbeddedCluster(str(tmp_path_factory.mktemp("cluster")), brokers=2) as c:  # a store: crashes keep it
        yield _Shape("embedded", c)


@pytest.fixture()
def cclient(cluster: _Shape) -> Iterator[RemotingClient]:
    c = RemotingClient(cluster.namesrv_addr)
    try:
        yield c
    finally:
        c.close()


def _offset_at(client: RemotingClient, addr: str, group: str, mq: MessageQueue) -> int:
    """The group's offset of ``mq`` as the broker at ``addr`` holds it (asked by address, not route)."""
    ext = {"topic": mq.topic, "consumerGroup": group, "queueId": str(mq.queue_id), "setZeroIfNotFound": "false"}
    r = client.invoke(addr, RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=ext), f"offset at {addr}")
    return int(r.ext_fields["offset"])


def _stored(client: RemotingClient, topic: str) -> list[bytes]:
    """Every body stored in ``topic``, pulled queue by queue (a real broker answers 32 per pull)."""
    bodies: list[bytes] = []
    for q in client.message_queues(topic, refresh=True):
        offset, end = 0, client.max_offset(q)
        while offset < end:
            records = decode_records(client.pull(q, offset, 32).body or b"")
            assert records, f"nothing pulled from {q} at {offset} of {end}"
            bodies += [r.body for r in records]
            offset = records[-1].queue_offset + 1
    return bodies


def _produce(client: RemotingClient, topic: str, n: int, start: int = 0) -> None:
    """Sends c-<start>..c-<start+n-1>; returns once the topic's consume queues hold them."""
    qs = client.message_queues(topic)
    before = queued(client, topic)
    for i in range(start, start + n):
        client.send_batch(qs[i % len(qs)], [BatchEntry(b"c-%d" % i, encode_properties({"TAGS": "t", "i": str(i)}))])
    assert settles_at(client, topic, before + n) == before + n


def _bodies(df) -> list[bytes]:
    return sorted(bytes(r.body) for r in df.select("body").collect())


def _stream(spark, ns: str, topic: str, group: str, ckpt: str, **opts: str):
    reader = (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
              .option("consumerGroup", group))
    for k, v in opts.items():
        reader = reader.option(k, v)
    return (reader.load().writeStream.format("memory").queryName(f"q_{group.replace('-', '_')}")
            .option("checkpointLocation", ckpt).trigger(availableNow=True).start())


def test_topics_span_both_brokers_and_spark_reads_and_writes_all(spark, cluster, cclient) -> None:
    topic = "CL_RW"
    cluster.create_topic(cclient, topic)
    rows = [(f"w{i}", f"k{i}") for i in range(64)]
    (spark.createDataFrame(rows, "body STRING, tag STRING").write.mode("append").format("rocketmq")
     .option("namesrvAddr", cluster.namesrv_addr).option("topic", topic).option("maxBatchMessages", "4").save())
    assert settles_at(cclient, topic, 64) == 64
    qs = cclient.message_queues(topic)
    assert {q.broker for q in qs} == {"broker-a", "broker-b"} and len(qs) == 8  # queue ids 0..3 on each
    per_broker = {b: sum(cclient.max_offset(q) for q in qs if q.broker == b) for b in ("broker-a", "broker-b")}
    assert sum(per_broker.values()) == 64 and min(per_broker.values()) > 0  # the writer used both
    df = spark.read.format("rocketmq").option("namesrvAddr", cluster.namesrv_addr).option("topic", topic).load()
    got = df.select(F.col("body").cast("string").alias("b"), "tag", "broker", "queueId", "queueOffset").collect()
    assert sorted(r.b for r in got) == sorted(b for b, _ in rows)
    assert {r.broker for r in got} == {"broker-a", "broker-b"}
    # (broker, queueId, queueOffset) names each message once: queue ids repeat per broker
    assert len({(r.broker, r.queueId, r.queueOffset) for r in got}) == 64


def test_offsets_commit_to_the_owning_broker_and_a_group_resumes(spark, cluster, cclient, tmp_path) -> None:
    topic, group = "CL_GROUP", "cl-group"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 40)  # 5 per queue on both brokers
    for i, q in enumerate(m for m in cclient.message_queues(topic) if m.broker == "broker-a"):
        cclient.send_batch(q, [BatchEntry(b"a-%d" % i), BatchEntry(b"a2-%d" % i)])  # broker-a: 7 per queue
    assert settles_at(cclient, topic, 48) == 48
    committer = RocketMQOffsetCommitter(cluster.namesrv_addr, group, topics=[topic], measure_lag=False)
    spark.streams.addListener(committer)
    try:
        q = _stream(spark, cluster.namesrv_addr, topic, group, str(tmp_path / "ck1"), startingOffsets="earliest",
                    maxMessagesPerTrigger="15")
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
        ends = [json.loads(p["sources"][0]["endOffset"])[topic] for p in q.recentProgress if p["numInputRows"]]
        assert set(ends[-1]) == {f"broker-{b}:{i}" for b in "ab" for i in range(4)}  # offsets keep brokers apart
        qs = cclient.message_queues(topic)
        deadline = time.monotonic() + 30
        while (any(cclient.query_consumer_offset(group, m) != cclient.max_offset(m) for m in qs)
               and time.monotonic() < deadline):
            time.sleep(0.1)
        # each broker holds the group's offsets of its own queues (queue ids repeat per broker)
        for m in qs:
            assert cclient.query_consumer_offset(group, m) == cclient.max_offset(m)
        for qid in range(4):  # asked of each broker by address (queue ids repeat per broker)
            for name, n in (("broker-a", 7), ("broker-b", 5)):
                m = next(m for m in qs if m.broker == name and m.queue_id == qid)
                assert _offset_at(cclient, cluster.addr(name), group, m) == n
    finally:
        spark.streams.removeListener(committer)
    # a new query (new checkpoint) of the same group starts where the group is: only new messages
    _produce(cclient, topic, 8, start=40)
    q = _stream(spark, cluster.namesrv_addr, topic, group, str(tmp_path / "ck2"))
    q.awaitTermination(120)
    assert q.exception() is None
    assert _bodies(spark.sql("select body from q_cl_group")) == sorted(b"c-%d" % i for i in range(40, 48))


def test_starting_timestamp_on_two_brokers(spark, cluster, cclient, tmp_path) -> None:
    topic = "CL_TS"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 16)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(cclient, topic, 16, start=16)
    q = _stream(spark, cluster.namesrv_addr, topic, "cl-ts", str(tmp_path / "ck"), startingTimestamp=str(cut))
    q.awaitTermination(120)
    assert q.exception() is None
    rows = spark.sql("select body, broker from q_cl_ts").collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"c-%d" % i for i in range(16, 32))
    assert {r.broker for r in rows} == {"broker-a", "broker-b"}


def test_name_server_list_with_one_down(spark, cluster, cclient) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    topic = "CL_NS_LIST"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 12)
    for order in (f"{dead};{cluster.namesrv_addr}", f"{cluster.namesrv_addr};{dead}"):
        df = spark.read.format("rocketmq").option("namesrvAddr", order).option("topic", topic).load()
        assert df.count() == 12


def test_a_group_with_other_online_consumers_is_refused_unless_shared(spark, cluster, cclient, tmp_path) -> None:
    topic, group = "CL_SHARED", "cl-shared"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 4)
    other = RemotingClient(cluster.namesrv_addr)
    try:  # another client joins the group on broker-b (as a push consumer's heartbeat does)
        other.invoke(cluster.addr("broker-b"), __import__("rocketmq_spark.remoting.frame", fromlist=["x"])
                     .RemotingCommand(34, body=json.dumps({"clientID": "10.0.0.9@other", "producerDataSet": [],
                                                           "consumerDataSet": [{"groupName": group}]}).encode()),
                     "heartbeat")
        q = _stream(spark, cluster.namesrv_addr, topic, group, str(tmp_path / "ck1"), startingOffsets="earliest")
        with pytest.raises(Exception, match=r"consumer group 'cl-shared' has online consumers \(broker-b: "
                                            r"10\.0\.0\.9@other\).*allowSharedGroup=true"):
            q.awaitTermination(120)
        q = _stream(spark, cluster.namesrv_addr, topic, group, str(tmp_path / "ck2"), startingOffsets="earliest",
                    allowSharedGroup="true")
        q.awaitTermination(120)
        assert q.exception() is None
        assert spark.sql("select count(*) c from q_cl_shared").collect()[0].c == 4
    finally:
        other.close()


def test_a_query_restarted_after_a_crash_a_broker_did_not_see_is_not_refused(spark, cluster, cclient, tmp_path) -> None:
    # a driver SIGKILLed while broker-b was partitioned stays listed there as an online consumer
    # (Apache RocketMQ drops it after 120 s without heartbeats): its restart must not be refused
    import subprocess
    import sys

    from rocketmq_spark.remoting.frame import RemotingCommand

    topic, group = "CL_CRASHED", "cl-crashed"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 6)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    crashed = RemotingClient(cluster.namesrv_addr)
    try:  # its heartbeat's connection stays open: the broker never saw the crash
        crashed.invoke(cluster.addr("broker-b"), RemotingCommand(34, body=json.dumps({
            "clientID": f"rocketmq-spark@{socket.gethostname()}@{gone.pid}@7f00", "producerDataSet": [],
            "consumerDataSet": [{"groupName": group}]}).encode()), "heartbeat")
        assert cclient.group_consumers(group, [topic]) == {
            "broker-b": [f"rocketmq-spark@{socket.gethostname()}@{gone.pid}@7f00"]}
        q = _stream(spark, cluster.namesrv_addr, topic, group, str(tmp_path / "ck"), startingOffsets="earliest")
        q.awaitTermination(120)
        assert q.exception() is None
        assert spark.sql("select count(*) c from q_cl_crashed").collect()[0].c == 6
    finally:
        crashed.close()


def test_failover_writer_moves_on_reader_waits_then_fails_naming_the_broker(spark, cluster, cclient,
                                                                           tmp_path) -> None:
    ns, topic = cluster.namesrv_addr, "CL_FAIL"
    cluster.create_topic(cclient, topic)
    _produce(cclient, topic, 40)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run(timeout_ms: str):
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
             .option("consumerGroup", "cl-fail").option("startingOffsets", "earliest")
             .option("brokerDownTimeoutMs", timeout_ms).load().select("body").writeStream.format("parquet")
             .option("checkpointLocation", ck).option("path", out).trigger(availableNow=True).start())
        try:
            q.awaitTermination(180)
        except Exception:  # noqa: BLE001 (the failure is read from q.exception())
            pass
        return q

    assert run("30000").exception() is None  # everything so far: 40 rows
    cluster.crash("broker-b")
    timer = threading.Timer(2.0, cluster.restart, args=("broker-b",))
    try:
        # the writer keeps sending: every row lands on the surviving broker
        (spark.createDataFrame([(f"after-{i}",) for i in range(30)], "body STRING").write.mode("append")
         .format("rocketmq").option("namesrvAddr", ns).option("topic", topic).save())
        alive = [q for q in cclient.message_queues(topic) if q.broker == "broker-a"]
        assert settles_at(cclient, topic, 20 + 30, queues=alive) == 20 + 30
        # the reader reads broker-a on, waits for broker-b, then fails naming it: with its address
        # while the name server still routes it; a real name server drops a broker whose
        # connection closed at once, so this run (a new driver) never learnt the address
        q = run("3000")
        err = str(q.exception())
        assert "broker-b" in err and "unavailable" in err, err
        assert cluster.addr("broker-b") in err or (cluster.kind == "real" and "in no route" in err), err
        # broker-b comes back while a query waits for it: that query completes
        timer.start()
        assert run("60000").exception() is None
    finally:
        if timer.ident is not None:  # started: broker-b is back when it ends
            timer.join()
        else:
            cluster.restart("broker-b")
    rows = spark.read.parquet(out).collect()
    # across the three runs (one checkpoint): every message exactly once
    c2 = RemotingClient(ns)
    try:
        total = sum(c2.max_offset(q) for q in c2.message_queues(topic, refresh=True))
    finally:
        c2.close()
    assert total == 70
    bodies = sorted(bytes(r.body) for r in rows)
    assert len(bodies) == len(set(bodies)) == 70


def test_ali_ons_produces_and_consumes_across_both_brokers(cluster, cclient) -> None:
    from alions_support import alions_consume, alions_produce, ensure_alions

    ensure_alions()
    topic, group = "CL_ALIONS", "cl-alions"
    cluster.create_topic(cclient, topic, queues=2)
    sent = [{"body": f"ons-{i}", "tags": "T", "keys": [f"k{i}"]} for i in range(12)]
    alions_produce(cluster.namesrv_addr, topic, sent)
    assert settles_at(cclient, topic, 12) == 12
    qs = cclient.message_queues(topic)
    per_broker = {b: sum(cclient.max_offset(q) for q in qs if q.broker == b) for b in ("broker-a", "broker-b")}
    assert sum(per_broker.values()) == 12 and min(per_broker.values()) > 0
    got = alions_consume(cluster.namesrv_addr, topic, group, 12)
    assert sorted(base64.b64decode(m["bodyB64"]).decode() for m in got) == sorted(m["body"] for m in sent)
    for q in qs:  # ali-ons committed the group's offsets on both brokers
        assert cclient.query_consumer_offset(group, q) == cclient.max_offset(q)


def test_a_broker_killed_in_the_middle_of_a_task_loses_no_row(cluster, cclient) -> None:
    import pyarrow as pa

    from rocketmq_spark.sink import WriterOptions
    from rocketmq_spark.sink.writer import write_rows

    topic = "CL_MID_TASK"
    cluster.create_topic(cclient, topic, queues=2)
    opts = WriterOptions.parse({"namesrvAddr": cluster.namesrv_addr, "topic": topic, "maxBatchMessages": "16"})

    def rows():
        for i in range(20):
            if i == 10:  # half the task's rows are sent: broker-b dies
                cluster.crash("broker-b")
            yield pa.RecordBatch.from_pydict({"body": [b"r%d-%d" % (i, j) for j in range(32)]})

    try:
        report = write_rows(opts, rows(), None)
    finally:
        cluster.restart("broker-b")
    assert report.rows == 640
    c2 = RemotingClient(cluster.namesrv_addr)
    try:
        stored = _stored(c2, topic)
        on_a = sum(c2.max_offset(q) for q in c2.message_queues(topic) if q.broker == "broker-a")
    finally:
        c2.close()
    # every row is stored (at-least-once: a batch in flight at the kill may be there twice)
    assert set(stored) == {b"r%d-%d" % (i, j) for i in range(20) for j in range(32)}
    assert len(stored) >= 640 and on_a > 320  # after the kill, everything went to broker-a
