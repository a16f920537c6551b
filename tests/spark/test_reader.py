"""spark.readStream/read.format("rocketmq") against the embedded broker and the real Apache RocketMQ."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import time
import zlib

import pytest
from pyspark.sql import functions as F

from brokers import queued, settles_at
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _produce(client: RemotingClient, topic: str, n: int, start: int = 0) -> None:
    """Sends msg-<start>..msg-<start+n-1> and returns once the topic's consume queues hold them."""
    qs = client.message_queues(topic)
    before = queued(client, topic)
    for i in range(start, start + n):
        props = encode_properties({"TAGS": "even" if i % 2 == 0 else "odd", "KEYS": f"k{i} x{i}", "u": str(i)})
        client.send_batch(qs[i % len(qs)], [BatchEntry(b"msg-%d" % i, props)])
    assert settles_at(client, topic, before + n) == before + n


def _stream(spark, mq: EmbeddedBroker, topic: str, group: str, ckpt: str, transport=None, **opts: str):
    where = transport.options if transport is not None else {"namesrvAddr": mq.namesrv_addr}
    reader = (spark.readStream.format("rocketmq").options(**where)
              .option("topic", topic).option("consumerGroup", group))
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (reader.load().writeStream.format("memory").queryName(f"q_{group}").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    return q


def test_available_now_reads_everything_with_every_field(spark, broker, client, tmp_path, transport) -> None:
    topic, group = broker.create_topic(transport("SPARK_READ_ALL")), transport("g_all")
    _produce(client, topic, 40)
    q = _stream(spark, broker, topic, group, str(tmp_path / "ck"), transport, startingOffsets="earliest")
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


def test_restart_on_same_checkpoint_continues_without_loss_or_duplicates(spark, broker, client, tmp_path,
                                                                         transport) -> None:
    topic, group = broker.create_topic(transport("SPARK_RESTART")), transport("g_restart")
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run() -> None:
        q = (spark.readStream.format("rocketmq").options(**transport.options)
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
    topic, group = broker.create_topic("SPARK_LIMIT"), "g_limit"
    _produce(client, topic, 30)
    q = _stream(spark, broker, topic, group, str(tmp_path / "ck"), startingOffsets="earliest",
                maxMessagesPerTrigger="8")
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [8, 8, 8, 6]
    assert spark.sql(f"select count(*) c from q_{group}").collect()[0].c == 30
    # commits of the batches before the last reached the broker
    committed = sum(client.query_consumer_offset(group, m) or 0 for m in client.message_queues(topic))
    assert committed >= 24


def test_group_offsets_start_and_tag_filter(spark, broker, client, tmp_path, transport) -> None:
    topic, group = broker.create_topic(transport("SPARK_GROUP")), transport("g_grp")
    _produce(client, topic, 16)
    client.create_group(group)  # brokers take no offsets for a group they do not know
    for m in client.message_queues(topic):
        client.update_consumer_offset(group, m, 2)  # each queue has 4 messages; skip the first 2
    _stream(spark, broker, topic, group, str(tmp_path / "ck"), transport, subExpression="even").stop()
    rows = spark.sql(f"select body, tag, queueOffset from q_{group}").collect()
    assert all(r.tag == "even" and r.queueOffset >= 2 for r in rows)
    assert sorted(r.body for r in rows) == sorted(bytearray(b"msg-%d" % i) for i in range(8, 16) if i % 2 == 0)


def test_batch_read_with_ending_offsets(spark, broker, client, transport) -> None:
    topic = broker.create_topic(transport("SPARK_BATCH"))
    _produce(client, topic, 12)
    df = (spark.read.format("rocketmq").options(**transport.options).option("topic", topic)
          .option("startingOffsets", "earliest")
          .option("endingOffsets", f'{{"{topic}":{{"broker-a:0":2,"broker-a:1":-1}}}}').load())
    rows = df.collect()
    by_q: dict[int, int] = {}
    for r in rows:
        by_q[r.queueId] = by_q.get(r.queueId, 0) + 1
    assert by_q == {0: 2, 1: 3, 2: 3, 3: 3}
    # startingOffsets as JSON: a given offset, -2 (earliest), -1 (latest), and queues not named start
    # at their earliest
    df = (spark.read.format("rocketmq").options(**transport.options).option("topic", topic)
          .option("startingOffsets", f'{{"{topic}":{{"broker-a:0":1,"broker-a:1":-2,"broker-a:2":-1}}}}').load())
    offsets = sorted((r.queueId, r.queueOffset) for r in df.collect())
    assert offsets == [(0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (3, 0), (3, 1), (3, 2)]


def test_a_schema_of_some_fields_reads_just_those_batch_and_stream(spark, broker, client, tmp_path,
                                                                   transport) -> None:
    topic = broker.create_topic(transport("SPARK_PROJECT"))
    _produce(client, topic, 40)
    full = (spark.read.format("rocketmq").options(**transport.options).option("topic", topic)
            .option("startingOffsets", "earliest").load())
    for ddl in ("body BINARY, queueOffset BIGINT", "storeHost STRING, tag STRING, queueId INT",
                "properties MAP<STRING,STRING>, messageId STRING, keys ARRAY<STRING>, bornTimestamp TIMESTAMP"):
        names = [f.strip().split(" ")[0] for f in re.split(r",(?![^<]*>)", ddl)]
        got = (spark.read.format("rocketmq").schema(ddl).options(**transport.options).option("topic", topic)
               .option("startingOffsets", "earliest").load())
        assert got.columns == names
        assert sorted(map(repr, got.collect())) == sorted(map(repr, full.select(*names).collect())), ddl
    # a tag filter still applies when no tag column is asked for
    odd = (spark.read.format("rocketmq").schema("body BINARY").options(**transport.options).option("topic", topic)
           .option("startingOffsets", "earliest").option("subExpression", "odd").load())
    assert sorted(bytes(r.body) for r in odd.collect()) == sorted(b"msg-%d" % i for i in range(1, 40, 2))
    # a stream with a schema of two fields
    group = transport("g_project")
    q = (spark.readStream.format("rocketmq").schema("queueOffset BIGINT, body BINARY").options(**transport.options)
         .option("topic", topic).option("consumerGroup", group).option("startingOffsets", "earliest").load()
         .writeStream.format("memory").queryName(f"q_{group}").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    rows = spark.sql(f"select * from q_{group}").collect()
    assert [f.name for f in spark.sql(f"select * from q_{group}").schema.fields] == ["queueOffset", "body"]
    assert sorted(bytes(r.body) for r in rows) == sorted(b"msg-%d" % i for i in range(40))


@pytest.mark.parametrize("ddl, named", [("body BINARY, nope STRING", "nope"), ("body STRING", "body string"),
                                        ("queueOffset INT", "queueOffset int")])
def test_a_schema_with_an_unknown_or_mistyped_field_names_it(spark, broker, ddl, named) -> None:
    with pytest.raises(Exception, match=re.escape(named)) as info:
        (spark.read.format("rocketmq").schema(ddl).option("namesrvAddr", broker.namesrv_addr).option("topic", "x")
         .load().collect())
    assert "accepted" in str(info.value) or "has type" in str(info.value)


def test_unknown_option_names_option_value_and_accepted(spark, broker) -> None:
    with pytest.raises(Exception, match="startingOffset"):
        (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", "x")
         .option("startingOffset", "earliest").load().collect())


def test_committed_broker_offsets_equal_processed_batch_ends(spark, broker, client, tmp_path, transport) -> None:
    topic, group = broker.create_topic(transport("SPARK_COMMITS")), transport("g_commits")
    _produce(client, topic, 40)
    q = _stream(spark, broker, topic, group, str(tmp_path / "ck"), transport, startingOffsets="earliest",
                maxMessagesPerTrigger="10")
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert len(batches) == 4
    # Spark commits batch N-1 only when batch N starts; the reader writes each finished batch's
    # end at the next trigger, so when the run ends the broker holds the end of the last one
    last_end = json.loads(batches[3]["sources"][0]["endOffset"])[topic]
    committed = {m.key: client.query_consumer_offset(group, m) for m in client.message_queues(topic)}
    assert committed == last_end


def test_starting_timestamp_and_consume_from_where(spark, broker, client, tmp_path, transport) -> None:
    topic, t = broker.create_topic(transport("SPARK_TS")), transport
    _produce(client, topic, 8)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    _produce(client, topic, 8, start=8)
    _stream(spark, broker, topic, t("g_ts"), str(tmp_path / "ck1"), t, startingTimestamp=str(cut)).stop()
    got = sorted(bytes(r.body) for r in spark.sql(f"select body from q_{t('g_ts')}").collect())
    assert got == sorted(b"msg-%d" % i for i in range(8, 16))
    iso = dt.datetime.fromtimestamp(cut / 1000, dt.UTC).isoformat()
    _stream(spark, broker, topic, t("g_iso"), str(tmp_path / "ck2"), t, startingTimestamp=iso).stop()
    assert spark.sql(f"select count(*) c from q_{t('g_iso')}").collect()[0].c == 8
    # a group with no committed offsets: latest (stream default) reads nothing already there
    _stream(spark, broker, topic, t("g_new_latest"), str(tmp_path / "ck3"), t).stop()
    assert spark.sql(f"select count(*) c from q_{t('g_new_latest')}").collect()[0].c == 0
    _stream(spark, broker, topic, t("g_new_earliest"), str(tmp_path / "ck4"), t, consumeFromWhere="earliest").stop()
    assert spark.sql(f"select count(*) c from q_{t('g_new_earliest')}").collect()[0].c == 16


def test_new_queues_are_picked_up_from_their_earliest_offset(spark, broker, client, tmp_path) -> None:
    topic, group = broker.create_topic("SPARK_GROW", queues=2), "g_grow"
    _produce(client, topic, 4)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run() -> None:
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
             .option("topic", topic).option("consumerGroup", group).option("startingOffsets", "earliest").load()
             .select("body", "queueId").writeStream.format("parquet")
             .option("checkpointLocation", ck).option("path", out).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()

    run()
    client.create_topic(topic, queues=4)
    _produce(client, topic, 8, start=4)  # client.message_queues now sees 4 queues
    run()
    rows = spark.read.parquet(out).collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"msg-%d" % i for i in range(12))
    assert {r.queueId for r in rows} == {0, 1, 2, 3}


def test_fail_on_data_loss(spark, tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path / "mq"), segment_size=4096) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            topic = "SPARK_LOSS"
            c.create_topic(topic, queues=1)
            _produce(c, topic, 100)
            mq.call(lambda: mq.broker.store.delete_before(3 * 4096))
            low = c.min_offset(c.message_queues(topic)[0])
            assert low > 0
            reader = (spark.read.format("rocketmq").option("namesrvAddr", mq.namesrv_addr).option("topic", topic)
                      .option("startingOffsets", f'{{"{topic}":{{"broker-a:0":0}}}}'))
            with pytest.raises(Exception, match=rf"SPARK_LOSS/broker-a:0: offsets \[0, {low}\) were deleted"):
                reader.load().collect()
            rows = reader.option("failOnDataLoss", "false").load().collect()
            assert sorted(r.queueOffset for r in rows) == list(range(low, 100))
        finally:
            c.close()


def test_min_partitions_splits_a_single_queue_exactly(spark, broker, client) -> None:
    topic = broker.create_topic("SPARK_SPLIT", queues=1)
    _produce(client, topic, 50)
    df = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
          .option("minPartitions", "4").load())
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.queueOffset for r in df.collect()) == list(range(50))


def test_a_small_batch_is_read_by_one_task_and_each_queue_exactly(spark, broker, client) -> None:
    topic = broker.create_topic("SPARK_PACKED", queues=4)
    _produce(client, topic, 60)  # 15 a queue
    read = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
            .option("startingOffsets", f'{{"{topic}":{{"broker-a:1":5}}}}'))  # the others from their earliest
    df = read.load()
    assert df.rdd.getNumPartitions() == 1
    got = sorted((r.queueId, r.queueOffset) for r in df.collect())
    assert got == sorted((q, o) for q in range(4) for o in range(5 if q == 1 else 0, 15))
    per_queue = read.option("minMessagesPerPartition", "0").load()
    assert per_queue.rdd.getNumPartitions() == 4
    assert sorted((r.queueId, r.queueOffset) for r in per_queue.collect()) == got
    assert read.option("minMessagesPerPartition", "20").load().rdd.getNumPartitions() == 3  # ceil(55 / 20)


def test_messages_sent_by_ali_ons_read_by_spark(spark, broker, client) -> None:
    from alions_support import alions_produce, ensure_alions

    ensure_alions()
    topic = broker.create_topic("SPARK_ALIONS")
    big = bytes(range(256)) * 40  # > 4 KiB: ali-ons deflates it
    sent = [{"body": "hello", "tags": "TagA", "keys": ["k1", "k2"], "props": {"color": "red"}},
            {"bodyB64": base64.b64encode(big).decode(), "tags": "Big", "keys": ["big"]}]
    results = alions_produce(broker.namesrv_addr, topic, sent)
    assert settles_at(client, topic, 2) == 2
    df = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic).load())
    rows = {bytes(r.body): r for r in df.collect()}
    assert set(rows) == {b"hello", big}
    hello = rows[b"hello"]
    assert (hello.tag, hello.keys, hello.properties) == ("TagA", ["k1", "k2"], {"color": "red"})
    # ali-ons sets no UNIQ_KEY: a 5.x broker gives a single send one of its own (Java's id layout,
    # 16 or 28 bytes in hex by the broker's IP version), which is the messageId, not the offset id
    assert re.fullmatch(r"[0-9A-F]{32}|[0-9A-F]{56}", hello.messageId) and hello.messageId != results[0]["msgId"]
    assert rows[big].tag == "Big" and rows[big].keys == ["big"]


def test_every_field_round_trips_with_chispa(spark, broker, client, transport) -> None:
    from chispa import assert_df_equality

    topic = broker.create_topic(transport("SPARK_CHISPA"))
    q = client.message_queues(topic)[1]
    big = b"z" * 6000
    client.send(q, zlib.compress(big), encode_properties({"TAGS": "t", "KEYS": "a b", "p": "1"}), sys_flag=1)
    client.send(q, b"plain", encode_properties({"UNIQ_KEY": "ABC123"}))
    assert settles_at(client, topic, 2) == 2
    df = (spark.read.format("rocketmq").options(**transport.options).option("topic", topic).load()
          .select("queueId", "queueOffset", "messageId", "tag", "keys", "body", "properties", "storeHost"))
    expected = spark.createDataFrame(
        [(1, 0, None, "t", ["a", "b"], bytearray(big), {"p": "1"}, broker.broker_addr),
         (1, 1, "ABC123", None, [], bytearray(b"plain"), {}, broker.broker_addr)],
        df.schema)
    actual = df.withColumn("messageId", F.when(F.col("queueOffset") == 0, F.lit(None)).otherwise(F.col("messageId")))
    assert_df_equality(actual.orderBy("queueOffset"), expected.orderBy("queueOffset"), ignore_nullable=True)
