"""spark.readStream/read.format("rocketmq") against the embedded broker."""

from __future__ import annotations

import datetime as dt

import pytest

from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.remoting import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _produce(client: RemotingClient, topic: str, n: int, start: int = 0) -> None:
    qs = client.message_queues(topic)
    for i in range(start, start + n):
        props = encode_properties({"TAGS": "even" if i % 2 == 0 else "odd", "KEYS": f"k{i} x{i}", "u": str(i)})
        client.send_batch(qs[i % len(qs)], [BatchEntry(b"msg-%d" % i, props)])


def _stream(spark, mq: EmbeddedBroker, topic: str, group: str, ckpt: str, **opts: str):
    reader = (spark.readStream.format("rocketmq").option("namesrvAddr", mq.namesrv_addr)
              .option("topic", topic).option("consumerGroup", group))
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.format("memory").queryName(f"q_{group}").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q


def test_available_now_reads_everything_with_every_field(spark, broker, client, tmp_path) -> None:
    topic, group = "SPARK_READ_ALL", "g_all"
    _produce(client, topic, 40)
    q = _stream(spark, broker, topic, group, str(tmp_path / "ck"), startingOffsets="earliest")
    rows = spark.sql(f"select * from q_{group}").collect()
    assert len(rows) == 40
    by_body = {bytes(r.body): r for r in rows}
    r7 = by_body[b"msg-7"]
    assert r7.topic == topic and r7.broker == "broker-a" and r7.queueId == 7 % 4
    assert r7.tag == "odd" and r7.keys == ["k7", "x7"] and r7.properties == {"u": "7"}
    assert r7.storeHost == broker.broker_addr and r7.bornHost.startswith("127.0.0.1:")
    assert isinstance(r7.storeTimestamp, dt.datetime) and len(r7.messageId) == 32
    assert sorted(r.queueOffset for r in rows if r.queueId == 0) == list(range(10))
    # the last batch of an AvailableNow run is committed by the listener (later issue); the
    # commits Spark did make are at most the max
    for mqueue in client.message_queues(topic):
        committed = client.query_consumer_offset(group, mqueue)
        assert committed is None or committed <= client.max_offset(mqueue)
    q.stop()


def test_restart_on_same_checkpoint_continues_without_loss_or_duplicates(spark, broker, client, tmp_path) -> None:
    topic, group = "SPARK_RESTART", "g_restart"
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run() -> None:
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
             .option("topic", topic).option("consumerGroup", group).option("startingOffsets", "earliest").load()
             .select("body", "queueId", "queueOffset").writeStream.format("parquet")
             .option("checkpointLocation", ck).option("path", out).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()

    _produce(client, topic, 20)
    run()
    _produce(client, topic, 12, start=20)
    run()
    bodies = [bytes(r.body) for r in spark.read.parquet(out).collect()]
    assert sorted(bodies) == sorted(b"msg-%d" % i for i in range(32))  # no loss, no duplicate


def test_max_messages_per_trigger_bounds_each_batch(spark, broker, client, tmp_path) -> None:
    topic, group = "SPARK_LIMIT", "g_limit"
    _produce(client, topic, 30)
    q = _stream(spark, broker, topic, group, str(tmp_path / "ck"), startingOffsets="earliest",
                maxMessagesPerTrigger="8")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [8, 8, 8, 6]
    assert spark.sql(f"select count(*) c from q_{group}").collect()[0].c == 30
    # commits of the batches before the last reached the broker
    committed = sum(client.query_consumer_offset(group, m) or 0 for m in client.message_queues(topic))
    assert committed >= 24


def test_group_offsets_start_and_tag_filter(spark, broker, client, tmp_path) -> None:
    topic, group = "SPARK_GROUP", "g_grp"
    _produce(client, topic, 16)
    for m in client.message_queues(topic):
        client.update_consumer_offset(group, m, 2)  # each queue has 4 messages; skip the first 2
    _stream(spark, broker, topic, group, str(tmp_path / "ck"), subExpression="even").stop()
    rows = spark.sql(f"select body, tag, queueOffset from q_{group}").collect()
    assert all(r.tag == "even" and r.queueOffset >= 2 for r in rows)
    assert sorted(r.body for r in rows) == sorted(bytearray(b"msg-%d" % i) for i in range(8, 16) if i % 2 == 0)


def test_batch_read_with_ending_offsets(spark, broker, client) -> None:
    topic = "SPARK_BATCH"
    _produce(client, topic, 12)
    df = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
          .option("startingOffsets", "earliest")
          .option("endingOffsets", '{"%s":{"broker-a:0":2,"broker-a:1":-1}}' % topic).load())
    rows = df.collect()
    by_q: dict[int, int] = {}
    for r in rows:
        by_q[r.queueId] = by_q.get(r.queueId, 0) + 1
    assert by_q == {0: 2, 1: 3, 2: 3, 3: 3}


def test_unknown_option_names_option_value_and_accepted(spark, broker) -> None:
    with pytest.raises(Exception, match="startingOffset"):
        (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", "x")
         .option("startingOffset", "earliest").load().collect())
