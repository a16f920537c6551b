"""Pacing and splitting, as users of Spark's Kafka source know them: minMessagesPerTrigger with
maxTriggerDelay (Kafka's minOffsetsPerTrigger, maxTriggerDelay) and maxRecordsPerPartition (the
same name in Kafka's source), on the embedded broker and Apache RocketMQ."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from brokers import queued, settles_at, wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")

#: the delay the burst waits for (seconds): long against a trigger (tens of ms) on a quiet machine
DELAY_S = 4


def _produce(client: RemotingClient, topic: str, first: int, n: int, per_send: int = 250) -> None:
    qs = client.message_queues(topic)
    before = queued(client, topic)
    props = encode_properties({"TAGS": "p"})
    for i in range(first, first + n, per_send):
        client.send_batch(qs[(i // per_send) % len(qs)],
                          [BatchEntry(b"m-%07d" % j, props) for j in range(i, min(first + n, i + per_send))])
    assert settles_at(client, topic, before + n, timeout_s=30) == before + n


def _at(progress: dict) -> dt.datetime:
    return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))


def test_a_burst_below_min_messages_waits_for_max_trigger_delay(spark, broker, client, tmp_path) -> None:
    topic, group = broker.create_topic("PACE_BURST", queues=2), "g_pace"
    _produce(client, topic, 0, 10, per_send=10)  # there before the query starts: its first trigger reads them
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", group).option("startingOffsets", "earliest")
         .option("minMessagesPerTrigger", "100").option("maxTriggerDelay", f"{DELAY_S}s").load()
         .writeStream.format("memory").queryName("q_pace").option("checkpointLocation", str(tmp_path / "ck"))
         .start())
    try:
        def batches() -> list[dict]:
            return [p for p in q.recentProgress if p["numInputRows"]]

        assert wait_until(lambda: len(batches()) >= 1, 90), q.recentProgress
        first = batches()[0]
        assert first["numInputRows"] == 10  # a run's first trigger does not wait
        # a burst of 10 < 100 (one send: a trigger never sees half of it): it waits for the delay
        _produce(client, topic, 10, 10, per_send=10)
        assert wait_until(lambda: len(batches()) >= 2, 90), q.recentProgress
        second = batches()[1]
        assert second["numInputRows"] == 10
        waited = (_at(second) - _at(first)).total_seconds()
        # the clock started when the first batch was planned (a moment after its trigger began);
        # without pacing the burst would go at the next trigger, tens of milliseconds after it came
        assert waited >= DELAY_S - 0.5, f"the burst went {waited:.2f}s after the batch before it"
        _produce(client, topic, 20, 150, per_send=50)  # past the minimum: a batch of its own
        assert wait_until(lambda: sum(p["numInputRows"] for p in batches()) >= 170, 90), q.recentProgress
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    bodies = sorted(bytes(r.body) for r in spark.sql("select body from q_pace").collect())
    assert bodies == [b"m-%07d" % i for i in range(170)]


def test_max_records_per_partition_splits_one_backlogged_queue(spark, broker, client, tmp_path) -> None:
    topic, group, n = broker.create_topic("SPLIT_ONE", queues=1), "g_split", 100_000
    _produce(client, topic, 0, n, per_send=500)
    df = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
          .option("maxRecordsPerPartition", "25000").load())
    assert df.rdd.getNumPartitions() == 4  # one queue, four tasks
    offsets = sorted(r.queueOffset for r in df.select("queueOffset").collect())
    assert offsets == list(range(n))
    # a stream: the pieces of one queue in one batch; the group's offset goes to the queue's end
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", group).option("startingOffsets", "earliest")
         .option("maxRecordsPerPartition", "30000").load().select("queueOffset")
         .writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    got = sorted(r.queueOffset for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert got == list(range(n))
    (mq,) = client.message_queues(topic)
    assert wait_until(lambda: client.query_consumer_offset(group, mq) == n, 30), \
        client.query_consumer_offset(group, mq)


def test_stored_sizes_are_each_records_size_as_a_pull_returns_it(broker, client) -> None:
    # maxBytesPerTrigger counts what the consume queue says each message takes (QUERY_CONSUME_QUEUE,
    # mqadmin queryCq): the size that heads each stored record a pull returns
    topic = broker.create_topic("PACE_SIZES", queues=1)
    (mq,) = client.message_queues(topic)
    bodies = [b"x" * n for n in (1, 10, 100, 1000, 10_000)] * 20
    props = encode_properties({"TAGS": "s"})
    client.send_batch(mq, [BatchEntry(b, props) for b in bodies[:50]])
    client.send_batch(mq, [BatchEntry(b, props) for b in bodies[50:]])
    assert settles_at(client, topic, 100) == 100
    pulled: list[int] = []
    while len(pulled) < 100:
        body = client.pull(mq, len(pulled), 32).body
        at = 0
        while at < len(body):
            size = int.from_bytes(body[at:at + 4], "big")
            pulled.append(size)
            at += size
    assert client.stored_sizes(mq, 0, 100) == pulled
    assert client.stored_sizes(mq, 95, 100) == pulled[95:]  # the queue ends first
    assert client.stored_sizes(mq, 100, 10) == []
    assert pulled[3] - pulled[2] == 900  # the body's length, and nothing else, differs


def test_max_bytes_per_trigger_splits_a_backlog_by_stored_size(spark, broker, client, tmp_path) -> None:
    topic, group, n = broker.create_topic("PACE_BYTES", queues=2), "g_bytes", 10_000
    qs = client.message_queues(topic)
    props = encode_properties({"TAGS": "b"})
    for i in range(0, n, 500):
        client.send_batch(qs[(i // 500) % 2], [BatchEntry(b"%06d" % j + b"." * (j % 200), props)
                                               for j in range(i, i + 500)])
    assert settles_at(client, topic, n, timeout_s=30) == n
    sizes = {mq.queue_id: client.stored_sizes(mq, 0, n) for mq in qs}
    total = sum(map(sum, sizes.values()))
    cap = total // 5 + 1
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", group).option("startingOffsets", "earliest")
         .option("maxBytesPerTrigger", str(cap)).load().selectExpr("CAST(body AS STRING) AS body")
         .writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    used = []
    for i, p in enumerate(batches):
        (src,) = p["sources"]
        start = (json.loads(src["startOffset"] or "null") or {topic: {}})[topic]  # the first batch's: none
        end = json.loads(src["endOffset"])[topic]
        used.append(sum(sum(sizes[int(k.split(":")[1])][start.get(k, 0):end[k]]) for k in end))
        # the budget is shared by backlog: the first batch (both queues full) reads both
        assert i > 0 or all(end[k] > start.get(k, 0) for k in end), (start, end)
    assert all(u <= cap for u in used), (cap, used)
    assert len(batches) >= 5 and sum(used) == total  # split by size, nothing left out
    bodies = sorted(r.body for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert len(bodies) == n and [b[:6] for b in bodies] == [f"{i:06d}" for i in range(n)]
