"""What a real Apache RocketMQ showed about RocketMQ, checked on both brokers, and the parity
subset that runs on the older releases of the matrix.

Each test here is a behaviour where the embedded broker once differed from the real one, or
where RocketMQ's own tools are the judge of what the Spark source did. The whole real-broker
suite runs on one release (real_rocketmq.VERSION, 5.5.0); the tests marked ``parity`` run on
5.3.3 and 4.9.7 too (PARITY_RELEASES; each started once for this module, a name server and a
broker, over remoting): a batch and a streaming read, a tag filter, a write at-least-once and
exactly-once, timestamps and the lookup of offsets by time, group offsets committed and resumed
from, and a reset by time judged by mqadmin.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from brokers import PARITY_KINDS, Target, queued, settles_at, wait_until
from real_rocketmq import VERSION_4, RealRocketMQ
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.client import RemotingClient, connect
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties, java_string_hash
from rocketmq_spark.errors import BrokerError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting import RemotingCommand, RequestCode, ResponseCode
from rocketmq_spark.sink import WriterOptions
from rocketmq_spark.sink.encode import TX_TAG
from rocketmq_spark.sink.txlog import TxLog
from rocketmq_spark.sink.writer import _txns, check_decision, commit_batch, write_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real", *PARITY_KINDS)
CLI = [sys.executable, "-m", "rocketmq_spark.cli"]


def _send(client: RemotingClient, topic: str, items: list[tuple[int, bytes, str]]) -> None:
    """(queue index, body, tag) each, one message per send, in order."""
    qs = client.message_queues(topic)
    before = queued(client, topic)
    for qi, body, tag in items:
        client.send_batch(qs[qi], [BatchEntry(body, encode_properties({"TAGS": tag}) if tag else "")])
    assert settles_at(client, topic, before + len(items)) == before + len(items)  # readable


def _available_now(spark, where: dict[str, str], topic: str, name: str, ckpt: str, **opts: str):  # type: ignore[no-untyped-def]
    reader = spark.readStream.format("rocketmq").options(**where).option("topic", topic)
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.format("memory").queryName(name).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    return spark.sql(f"select * from {name}").collect()


def _committed_through_listener(spark, where: dict[str, str], topic: str, group: str, ckpt: str,
                                client: RemotingClient, **opts: str):  # type: ignore[no-untyped-def]
    """An AvailableNow run with the offset committer listener; returns the rows once the
    broker holds the group's offsets at every queue's max offset (the last batch included)."""
    committer = RocketMQOffsetCommitter(where.get("namesrvAddr"), group, topics=[topic])
    spark.streams.addListener(committer)
    try:
        rows = _available_now(spark, where, topic, f"q_{group}", ckpt, consumerGroup=group, **opts)
        qs = client.message_queues(topic)
        maxes = [client.max_offset(q) for q in qs]
        assert wait_until(lambda: [client.query_consumer_offset(group, q) for q in qs] == maxes, 60), (
            f"group {group} holds {[client.query_consumer_offset(group, q) for q in qs]}, the queues end at {maxes}")
        return rows
    finally:
        spark.streams.removeListener(committer)


# -- tag filtering: brokers compare hash codes, the reader compares strings -------------


@pytest.mark.parity
def test_a_tag_whose_hash_collides_is_delivered_by_the_broker_and_dropped_by_the_reader(
        spark, broker, client, tmp_path) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    topic = broker.create_topic("PAR_TAGS", queues=2)
    # each queue: Aa, BB, Aa, BB, ... ending with BB (so committed offsets must pass BB messages)
    items = [((i // 2) % 2, b"m%d-%s" % (i, b"Aa" if i % 2 == 0 else b"BB"), "Aa" if i % 2 == 0 else "BB")
             for i in range(16)]
    _send(client, topic, items + [(0, b"other", "x")] + [(0, b"m-last-BB", "BB")])
    # the broker filters by hash: "BB" comes with an "Aa" subscription (on both brokers)
    q0 = client.message_queues(topic)[0]
    pulled = decode_records(client.pull(q0, 0, 32, subscription="Aa").body)
    assert {r.tags for r in pulled} == {"Aa", "BB"}
    want = sorted(body for _, body, tag in items if tag == "Aa")
    batch = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
             .option("subExpression", "Aa").load().collect())
    assert sorted(bytes(r.body) for r in batch) == want and {r.tag for r in batch} == {"Aa"}
    stream = _committed_through_listener(spark, {"namesrvAddr": broker.namesrv_addr}, topic, "g_par_tags",
                                         str(tmp_path / "ck"), client, subExpression="Aa",
                                         startingOffsets="earliest")
    assert sorted(bytes(r.body) for r in stream) == want  # and the group's offsets passed every BB


# -- writing, timestamps and offsets by time, a group's offsets resumed from -------------


def _read_rows(spark, broker: Target, topic: str, **opts: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
    for k, v in opts.items():
        reader = reader.option(k, v)
    return reader.load()


def _millis(ts: dt.datetime) -> int:
    return round(ts.timestamp() * 1000)


@pytest.mark.parity
def test_batch_writes_at_least_once_and_exactly_once_read_back_with_their_columns_and_times(
        spark, broker, client) -> None:
    plain = broker.create_topic("PAR_WRITE", queues=2)
    txn = broker.create_topic("PAR_WRITE_TX", queues=2, message_type="TRANSACTION")
    schema = "body STRING, tag STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>"
    for topic, delivery in ((plain, "at-least-once"), (txn, "exactly-once")):
        rows = [(f"{delivery}-{i}", f"t{i % 2}", [f"k{i}", "shared"], {"n": str(i)}) for i in range(10)]
        before = int(time.time() * 1000)
        (spark.createDataFrame(rows, schema).write.mode("append").format("rocketmq")
         .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).option("delivery", delivery).save())
        qs = client.message_queues(topic)
        # the driver ends the transactions with one-way END_TRANSACTION requests: committed soon after
        assert wait_until(lambda qs=qs: sum(client.max_offset(q) for q in qs) == 10, 15), delivery
        after = int(time.time() * 1000)
        back = _read_rows(spark, broker, topic).collect()
        # exactly-once rows keep the writer's transaction tag (check-backs are answered by it)
        assert all((TX_TAG in r.properties) == (delivery == "exactly-once") for r in back)
        got = [(bytes(r.body).decode(), r.tag, r.keys, {k: v for k, v in r.properties.items() if k != TX_TAG})
               for r in back]
        assert sorted(got) == sorted(rows)
        assert len({r.messageId for r in back}) == 10
        # born by the writer, stored by the broker, on this machine's clock
        for r in back:
            assert before <= _millis(r.bornTimestamp) <= _millis(r.storeTimestamp) <= after, (delivery, r)


@pytest.mark.parity
def test_starting_timestamp_and_a_store_timestamp_filter_find_the_offsets_by_time(spark, broker, client) -> None:
    topic = broker.create_topic("PAR_TIMES", queues=2)
    _send(client, topic, [(i % 2, b"early-%d" % i, "") for i in range(6)])
    qs = client.message_queues(topic)
    last_early = max(client.store_time_at(q, client.max_offset(q) - 1) or 0 for q in qs)
    while int(time.time() * 1000) <= last_early:  # the later ones in a millisecond of their own
        time.sleep(0.001)
    _send(client, topic, [(i % 2, b"late-%d" % i, "") for i in range(4)])
    cut = last_early + 1
    late = sorted(b"late-%d" % i for i in range(4))
    # startingTimestamp: each queue's first offset stored at or after it (SEARCH_OFFSET_BY_TIMESTAMP)
    rows = _read_rows(spark, broker, topic, startingTimestamp=str(cut)).collect()
    assert sorted(bytes(r.body) for r in rows) == late
    assert sorted((r.queueId, r.queueOffset) for r in rows) == [(0, 3), (0, 4), (1, 3), (1, 4)]
    # a storeTimestamp filter becomes the same lookup per queue (and Spark keeps the filter)
    cut_ts = dt.datetime.fromtimestamp(cut / 1000, dt.UTC)
    filtered = _read_rows(spark, broker, topic).where(F.col("storeTimestamp") >= F.lit(cut_ts)).collect()
    assert sorted(bytes(r.body) for r in filtered) == late


@pytest.mark.parity
def test_a_new_query_of_a_group_resumes_where_the_groups_committed_offsets_are(spark, broker, client,
                                                                              tmp_path) -> None:
    topic, group = broker.create_topic("PAR_RESUME", queues=2), "g_par_resume"
    where = {"namesrvAddr": broker.namesrv_addr}
    _send(client, topic, [(i % 2, b"a%d" % i, "") for i in range(10)])
    first = _committed_through_listener(spark, where, topic, group, str(tmp_path / "ck1"), client,
                                        startingOffsets="earliest")
    assert sorted(bytes(r.body) for r in first) == sorted(b"a%d" % i for i in range(10))
    _send(client, topic, [(i % 2, b"b%d" % i, "") for i in range(6)])
    # another checkpoint, the same group: startingOffsets=group (the default with a consumerGroup)
    second = _available_now(spark, where, topic, "q_par_resume_2", str(tmp_path / "ck2"), consumerGroup=group)
    assert sorted(bytes(r.body) for r in second) == sorted(b"b%d" % i for i in range(6))


# -- a new consumer group on a young topic ----------------------------------------------


@pytest.mark.parity
def test_a_send_to_a_queue_id_past_the_topics_queues_is_refused(broker, client) -> None:
    """Brokers keep a send's queue id below the topic's queue count and refuse a larger one
    (INVALID_PARAMETER, "request queueId[N] is illegal"; 4.9 answers SYSTEM_ERROR), a single send
    and a batch alike; nothing is stored."""
    topic = broker.create_topic("PARITY_QID_" + broker.kind.upper(), 4)
    (mq, *_) = client.message_queues(topic)
    past = MessageQueue(topic, mq.broker, 9)
    code = ResponseCode.SYSTEM_ERROR if (broker.release or "").startswith("4.") else ResponseCode.INVALID_PARAMETER
    for entries in ([BatchEntry(b"one", "")], [BatchEntry(b"a", ""), BatchEntry(b"b", "")]):
        with pytest.raises(BrokerError) as err:
            client.send_batch(past, entries)
        assert err.value.code == code and "queueId[9] is illegal" in str(err.value), err.value
    assert sum(client.max_offset(q) for q in client.message_queues(topic)) == 0


def test_a_new_group_with_consume_from_latest_starts_at_the_latest_offsets(spark, broker, client, tmp_path) -> None:
    topic, group = broker.create_topic("PAR_NEWGROUP", queues=2), "g_par_new"
    _send(client, topic, [(i % 2, b"old-%d" % i, "") for i in range(8)])
    q = client.message_queues(topic)[0]
    # what the broker itself answers a new group on a young queue: offset 0 (a push consumer with
    # CONSUME_FROM_LAST_OFFSET would read everything)
    raw = client.invoke(broker.broker_addr, RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields={
        "topic": topic, "consumerGroup": group, "queueId": "0"}), "query offset")
    assert (raw.code, raw.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0")
    assert client.query_consumer_offset(group, q) is None  # the client tells it apart: never committed
    out = str(tmp_path / "out")

    def run() -> None:  # consumeFromWhere=latest is the stream default
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
             .option("consumerGroup", group).load().select("body").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None, q.exception()

    run()
    _send(client, topic, [(i % 2, b"new-%d" % i, "") for i in range(4)])
    run()
    rows = spark.read.parquet(out).collect()
    assert sorted(bytes(r.body) for r in rows) == [b"new-0", b"new-1", b"new-2", b"new-3"]


# -- RocketMQ's own tools as the judge ----------------------------------------------------


def _mqadmin_progress(rmq: RealRocketMQ, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """queueId -> (broker offset, consumer offset) from ``mqadmin consumerProgress``."""
    out: dict[int, tuple[int, int]] = {}
    for line in rmq.mqadmin("consumerProgress", "-g", group).splitlines():
        cols = line.split()
        if cols and cols[0] == topic:
            out[int(cols[2])] = (int(cols[3]), int(cols[4]))
    return out


@pytest.mark.brokers("real")
def test_mqadmin_and_our_progress_show_the_offsets_the_query_committed(spark, broker, client, tmp_path) -> None:
    topic, group = broker.create_topic("PAR_PROGRESS", queues=2), "g_par_progress"
    _send(client, topic, [(i % 2, b"p%d" % i, "") for i in range(30)])
    _committed_through_listener(spark, {"namesrvAddr": broker.namesrv_addr}, topic, group, str(tmp_path / "ck"),
                                client, startingOffsets="earliest", maxMessagesPerTrigger="10")
    _send(client, topic, [(0, b"late", "")])  # one message behind
    ends = {q.queue_id: client.query_consumer_offset(group, q) for q in client.message_queues(topic)}
    assert ends == {0: 15, 1: 15}
    assert _mqadmin_progress(broker.real, group, topic) == {0: (16, 15), 1: (15, 15)}
    ours = json.loads(subprocess.run([*CLI, "progress", "-g", group, "-t", topic, "--json", "-n",
                                      broker.namesrv_addr], capture_output=True, text=True, check=True).stdout)
    assert {r["queueId"]: (r["brokerOffset"], r["consumerOffset"]) for r in ours["queues"]} == {
        0: (16, 15), 1: (15, 15)}


# not on 4.9: its brokers reset a group to the message stored nearest to the time (not the first
# at or after it), and only through a consumer online in the group; mqadmin then commits the
# offsets itself (resetOffsetByTimeOld) and prints another table
@pytest.mark.brokers("real", "real-5.3.3")
def test_our_reset_offset_plan_and_mqadmin_reset_offset_by_time_agree(broker, client) -> None:
    topic, group = broker.create_topic("PAR_RESET", queues=2), "g_par_reset"
    for i in range(10):  # each in a millisecond of its own: a search by time finds the first of a millisecond
        _send(client, topic, [(i % 2, b"a%d" % i, "")])
        time.sleep(0.003)
    qs = client.message_queues(topic)
    middle = client.store_time_at(qs[0], 3)  # the 4th message of queue 0: offsets 3 (q0) and 3 or 4 (q1)
    assert middle is not None
    _send(client, topic, [(i % 2, b"b%d" % i, "") for i in range(10)])
    client.create_group(group)
    for q in qs:
        client.update_consumer_offset(group, q, 9)
    plan = json.loads(subprocess.run(
        [*CLI, "reset-offset", "-g", group, "-t", topic, "--timestamp", str(middle), "--dry-run", "--json", "-n",
         broker.namesrv_addr], capture_output=True, text=True, check=True).stdout)
    ours = {r["queueId"]: r["new"] for r in plan["queues"]}
    out = broker.real.mqadmin("resetOffsetByTime", "-g", group, "-t", topic, "-s", str(middle))
    theirs = {int(m[1]): int(m[2]) for m in re.finditer(r"^broker-a\s+(\d+)\s+(\d+)\s*$", out, re.M)}
    assert ours == theirs == {q.queue_id: client.query_consumer_offset(group, q) for q in qs}
    assert ours[0] == 3


# -- exactly-once: check-backs roll back strays; the replay commits the record ----------------


def test_check_backs_roll_back_what_the_record_leaves_out_and_the_replay_commits_the_rest(broker, client,
                                                                                          tmp_path) -> None:
    topic = broker.create_topic("PAR_CHECKBACK", queues=2, message_type="TRANSACTION")
    opts = WriterOptions.parse({"namesrvAddr": broker.namesrv_addr, "topic": topic, "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    kept = write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [b"a0", b"a1", b"a2"]})]), 5)
    write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [b"b0", b"b1"]})]), 6)  # half messages too
    txlog = TxLog(str(tmp_path))
    # the driver recorded batch 5 and died before ending it; batch 6 was replayed without these rows
    txlog.record(5, _txns([kept]), {})
    txlog.record(6, [])
    asked: dict[str, bool | None] = {}

    def decide(properties: dict[str, str], msg_id: str) -> bool | None:  # the writer's rule, recorded
        asked[msg_id] = check_decision(txlog, properties, msg_id)
        return asked[msg_id]

    checker = connect(broker.namesrv_addr)
    try:
        checker.start_producer(opts.producer_group, [topic], decide)
        # a real broker first checks after transactionTimeOut (3 s here), the embedded one after 6 s
        assert wait_until(lambda: len(asked) == 5, 60), asked
    finally:
        checker.close()
    # the strays are rolled back at once; the recorded ones are left to the driver (never answered)
    assert sorted(asked.values(), key=str) == [False, False, None, None, None]
    qs = client.message_queues(topic)

    def bodies() -> list[bytes]:
        return sorted(r.payload() for q in qs for r in decode_records(client.pull(q, 0, 100).body))

    assert bodies() == []
    commit_batch(opts, _txns([kept]), 5)  # the replay of batch 5
    want = [b"a0", b"a1", b"a2"]
    assert wait_until(lambda: bodies() == want, 15)
    assert bodies() == want


# -- gRPC against a released proxy ------------------------------------------------------


@pytest.mark.brokers("real")
def test_reading_over_grpc_from_a_released_proxy_fails_naming_namesrvaddr(spark, broker) -> None:
    topic = broker.create_topic("PAR_GRPC_READ")
    with pytest.raises(Exception, match=r"does not implement .*namesrvAddr"):
        (spark.read.format("rocketmq").option("endpoints", broker.grpc_endpoint).option("topic", topic)
         .load().collect())


# -- a broker restart mid-stream (last: it restarts the session's broker) -------------------


@pytest.mark.brokers("real")
def test_a_broker_killed_and_restarted_mid_stream_loses_and_repeats_nothing(spark, broker, client, tmp_path) -> None:
    topic = broker.create_topic("PAR_RESTART", queues=2)
    sent = [b"r%03d" % i for i in range(300)]
    qs = client.message_queues(topic)
    for i in range(0, 300, 50):
        client.send_batch(qs[(i // 50) % 2], [BatchEntry(b) for b in sent[i:i + 50]])
    assert settles_at(client, topic, 300) == 300
    got: list[bytes] = []
    restarted = threading.Event()

    def sink(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        got.extend(bytes(r.body) for r in df.select("body").collect())
        if batch_id == 1 and not restarted.is_set():
            broker.real.stop_broker(kill=True)  # a crash between batches; back a few seconds later
            threading.Thread(target=lambda: (broker.real.start_broker(), restarted.set()), daemon=True).start()

    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", "g_par_restart").option("startingOffsets", "earliest")
         .option("maxMessagesPerTrigger", "50").option("brokerDownTimeoutMs", "120000").load()
         .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    # the query may end before start_broker() returns: the restarted broker answers before it
    # has registered (the reader keeps the known route while the name server lists no broker)
    assert restarted.wait(120)
    assert sorted(got) == sent  # nothing lost, nothing twice


# -- Apache RocketMQ 4.9 --------------------------------------------------------------------


@pytest.mark.brokers(f"real-{VERSION_4}")
def test_on_4_9_a_new_group_starts_where_consume_from_where_says(spark, broker, client, tmp_path) -> None:
    client.create_topic("PAR_49", queues=2)
    (q0, q1) = client.message_queues("PAR_49", refresh=True)
    for i in range(4):
        client.send_batch(q0, [BatchEntry(b"m%d" % i)])
    assert settles_at(client, "PAR_49", 4) == 4
    # 4.9 answers 0 to a new group on a young queue AND on an empty one, and ignores setZeroIfNotFound
    for qid in (0, 1):
        raw = client.invoke(broker.broker_addr, RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields={
            "topic": "PAR_49", "consumerGroup": "g49", "queueId": str(qid), "setZeroIfNotFound": "false"}), "q")
        assert (raw.code, raw.ext_fields.get("offset")) == (ResponseCode.SUCCESS, "0")
    assert client.query_consumer_offsets("g49", [q0, q1]) == {q0: None, q1: None}  # the offset table tells
    where = {"namesrvAddr": broker.namesrv_addr}
    assert _available_now(spark, where, "PAR_49", "q_par49_latest", str(tmp_path / "a"),
                          consumerGroup="g49") == []
    # the run's position is on the broker when it ends, read nothing as it did
    assert client.query_consumer_offsets("g49", [q0, q1]) == {q0: 4, q1: 0}
    rows = _available_now(spark, where, "PAR_49", "q_par49_earliest", str(tmp_path / "b"),
                          consumerGroup="g49_e", consumeFromWhere="earliest")
    assert sorted(bytes(r.body) for r in rows) == [b"m0", b"m1", b"m2", b"m3"]
    client.update_consumer_offset("g49_z", q1, 0)  # a committed 0 stays a committed 0
    assert client.query_consumer_offsets("g49_z", [q0, q1]) == {q0: None, q1: 0}
