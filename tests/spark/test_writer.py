"""df.write / writeStream .format("rocketmq") against the embedded broker and the real Apache RocketMQ."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from brokers import WRITE_TRANSPORTS, wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import decode_records
from rocketmq_spark.sink import WriterOptions
from rocketmq_spark.sink.writer import abort_batch, commit_batch, write_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")
TRANSPORTS = WRITE_TRANSPORTS


def _read(spark, broker, topic, transport=None):
    where = transport.read_options if transport is not None else {"namesrvAddr": broker.namesrv_addr}
    return spark.read.format("rocketmq").options(**where).option("topic", topic).load()


def test_batch_write_round_trips_every_column(spark, broker, client, transport) -> None:
    topic = broker.create_topic(transport("W_ROUND"))
    big = "x" * 9000  # compressed on the way, inflated by the reader
    rows = [(f"body-{i}", f"tag{i % 2}", [f"k{i}", "shared"], {"n": str(i)}) for i in range(20)] + [
        (big, "big", ["big"], {})]
    df = spark.createDataFrame(rows, "body STRING, tag STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>")
    df.write.mode("append").format("rocketmq").options(**transport.options).option("topic", topic).save()
    back = _read(spark, broker, topic, transport).select(
        F.col("body").cast("string").alias("body"), "tag", "keys", "properties")
    assert_df_equality(back.orderBy("body"), df.orderBy("body"), ignore_nullable=True)
    ids = [r.messageId for r in _read(spark, broker, topic, transport).collect()]
    assert len(set(ids)) == 21  # every message got its own UNIQ_KEY


def test_missing_or_mistyped_columns_fail_before_sending(spark, broker, client) -> None:
    topic = "W_BAD"
    with pytest.raises(Exception, match="column body"):
        spark.createDataFrame([("x",)], "payload STRING").write.mode("append").format("rocketmq") \
            .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).save()
    with pytest.raises(Exception, match=r"column keys.*ARRAY<STRING> or STRING"):
        spark.createDataFrame([("x", 1)], "body STRING, keys INT").write.mode("append").format("rocketmq") \
            .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).save()
    with pytest.raises(Exception, match="delivery"):
        spark.createDataFrame([("x",)], "body STRING").write.mode("append").format("rocketmq") \
            .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).option("delivery", "twice").save()
    assert topic not in client.topic_list()


def test_topic_column_and_fifo_message_groups(spark, broker, client, transport) -> None:
    ta = broker.create_topic(transport("W_FIFO_A"), message_type="FIFO")
    tb = broker.create_topic(transport("W_FIFO_B"), message_type="FIFO")
    rows = [(f"m{i}", ta if i % 3 else tb, f"g{i % 2}") for i in range(60)]
    df = spark.createDataFrame(rows, "body STRING, topic STRING, messageGroup STRING").coalesce(1)
    df.write.mode("append").format("rocketmq").options(**transport.options).save()
    for topic in (ta, tb):
        got = _read(spark, broker, topic, transport).select(F.col("body").cast("string").alias("b"), "queueId",
                                                  "queueOffset").collect()
        expected = [b for b, t, _ in rows if t == topic]
        assert sorted(r.b for r in got) == sorted(expected)
        for g in ("g0", "g1"):
            mine = [r for r in got if int(r.b[1:]) % 2 == int(g[1])]
            assert len({r.queueId for r in mine}) == 1  # one group, one queue
            in_order = [r.b for r in sorted(mine, key=lambda r: r.queueOffset)]
            assert in_order == [b for b in expected if int(b[1:]) % 2 == int(g[1])]


def test_delivery_timestamp_sets_the_timer_property(spark, broker, client) -> None:
    topic = broker.create_topic("W_DELAY", queues=1, message_type="DELAY")
    due = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)  # already due: readable at once
    (spark.createDataFrame([("late", due)], "body STRING, deliveryTimestamp TIMESTAMP")
     .write.mode("append").format("rocketmq")
     .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).save())
    q = client.message_queues(topic)[0]
    deadline = time.monotonic() + 10
    while client.max_offset(q) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    rec = decode_records(client.pull(q, 0, 10).body)[0]
    assert int(rec.properties["TIMER_DELIVER_MS"]) == int(due.timestamp() * 1000)


#: a 5.x proxy's remoting port (5.3.3, 5.5.0) completes END_TRANSACTION only for transactions it relayed a check-back
#: for (it drops the others, answering SUCCESS): exactly-once there waits for check-backs (docs/production.md)
EOS_TRANSPORTS = pytest.mark.transports(real=("remoting", "grpc"))


def _bodies(client: RemotingClient, qs) -> list[bytes]:  # type: ignore[no-untyped-def]
    return sorted(rec.payload() for q in qs for rec in decode_records(client.pull(q, 0, 100).body))


@EOS_TRANSPORTS
def test_exactly_once_failed_task_shows_nothing_then_retry_once(broker, client, tmp_path, transport) -> None:
    import pyarrow as pa

    topic = broker.create_topic(transport("W_EOS_TASKS"), queues=2, message_type="TRANSACTION")
    opts = WriterOptions.parse({**transport.options, "topic": topic, "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    part0 = pa.RecordBatch.from_pydict({"body": [b"a0", b"a1", b"a2"]})
    part1 = pa.RecordBatch.from_pydict({"body": [b"b0", b"b1"]})

    def failing() -> object:
        yield part1
        raise RuntimeError("task 1 dies after sending")

    report0 = write_rows(opts, iter([part0]), 7)  # task 0 succeeded
    with pytest.raises(RuntimeError):
        write_rows(opts, failing(), 7)  # task 1 failed (its own half messages rolled back)
    abort_batch(opts, [__import__("rocketmq_spark.sink.txlog", fromlist=["Txn"]).Txn.from_list(t)
                       for t in report0.txns], 7)
    qs = client.message_queues(topic)
    assert sum(client.max_offset(q) for q in qs) == 0  # consumers see nothing of batch 7
    # the retry of batch 7: both tasks succeed, the driver commits
    r0 = write_rows(opts, iter([part0]), 7)
    r1 = write_rows(opts, iter([part1]), 7)
    from rocketmq_spark.sink.writer import _txns

    commit_batch(opts, _txns([r0, r1]), 7)
    want = [b"a0", b"a1", b"a2", b"b0", b"b1"]
    # a proxy passes END_TRANSACTION on to the broker oneway: visible a moment after commit() returns
    wait_until(lambda: _bodies(client, qs) == want, 15)
    assert _bodies(client, qs) == want
    # a replay of batch 7 (driver restarted before Spark logged the commit) commits nothing twice
    r2 = write_rows(opts, iter([part0, part1]), 7)
    commit_batch(opts, _txns([r2]), 7)
    # a later batch over the same path: once it shows, the replay's ENDs were applied before it
    r3 = write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [b"c0"]})]), 8)
    commit_batch(opts, _txns([r3]), 8)
    wait_until(lambda: b"c0" in _bodies(client, qs), 15)
    assert _bodies(client, qs) == want + [b"c0"]


@pytest.mark.brokers("real")
def test_exactly_once_through_a_proxys_remoting_port_is_refused_before_sending(broker, client, tmp_path) -> None:
    import pyarrow as pa

    from rocketmq_spark.errors import OptionError

    topic = broker.create_topic("W_EOS_PROXY_PORT", queues=2, message_type="TRANSACTION")
    port = broker.real.proxy_remoting_addr
    opts = WriterOptions.parse({"namesrvAddr": port, "topic": topic, "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    with pytest.raises(OptionError, match=r"namesrvAddr.*proxy's remoting port.*endpoints") as err:
        write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [b"x"]})]), 0)
    assert port in str(err.value)
    assert sum(client.max_offset(q) for q in client.message_queues(topic)) == 0


@EOS_TRANSPORTS
def test_streaming_exactly_once_round_trip(spark, broker, client, tmp_path, transport) -> None:
    src = broker.create_topic(transport("W_EOS_SRC"), queues=2)
    dst = broker.create_topic(transport("W_EOS_DST"), queues=2, message_type="TRANSACTION")
    qs = client.message_queues(src)
    for i in range(30):
        client.send(qs[i % 2], b"e%d" % i)
    q = (spark.readStream.format("rocketmq").options(**transport.read_options).option("topic", src)
         .option("consumerGroup", transport("g_eos")).option("startingOffsets", "earliest")
         .option("maxMessagesPerTrigger", "10").load().select("body")
         .writeStream.format("rocketmq").options(**transport.options).option("topic", dst)
         .option("delivery", "exactly-once").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    want = sorted(b"e%d" % i for i in range(30))
    wait_until(lambda: _bodies(client, client.message_queues(dst)) == want, 15)  # ENDs via a proxy: oneway
    got = sorted(bytes(r.body) for r in _read(spark, broker, dst, transport).collect())
    assert got == want
    if not broker.is_real:
        assert not broker.broker.pending_tx  # every half message was ended


def test_delayed_rows_are_not_readable_before_their_time(spark, broker, client, transport) -> None:
    # a 5.x proxy takes delayed messages only on a DELAY topic, and refuses to create MIXED ones: every
    # row here has a delivery time ("now" is due at once)
    topic = broker.create_topic(transport("W_DELAY_FUTURE"), queues=1, message_type="DELAY")
    now = dt.datetime.now(dt.UTC)
    due = now + dt.timedelta(seconds=3)
    spark.createDataFrame([("soon", due), ("now", now)], "body STRING, deliveryTimestamp TIMESTAMP") \
        .write.mode("append").format("rocketmq").options(**transport.options) \
        .option("topic", topic).save()
    q = client.message_queues(topic)[0]
    due_ms = int(due.timestamp() * 1000)
    assert wait_until(lambda: client.max_offset(q) >= 1, 10)  # "now" (a timer rounds to its tick)
    if time.time() * 1000 < due_ms - 1000:  # still well before the due time
        assert [r.payload() for r in decode_records(client.pull(q, 0, 10).body)] == [b"now"]
    assert wait_until(lambda: client.max_offset(q) >= 2, 15)
    recs = decode_records(client.pull(q, 0, 10).body)
    assert [r.payload() for r in recs] == [b"now", b"soon"]
    # the real broker's timer wheel ticks once a second (timerPrecisionMs): due within that tick
    assert recs[1].store_timestamp >= due_ms - (1000 if broker.is_real else 5)
