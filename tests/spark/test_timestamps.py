"""Per-queue start and end times (Spark's Kafka source's startingOffsetsByTimestamp,
startingOffsetsByTimestampStrategy and endingOffsetsByTimestamp) on the embedded broker and
Apache RocketMQ."""

from __future__ import annotations

import json
import time

import pytest

from brokers import settles_at

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _read(spark, broker, topic: str, **opts: str) -> list[tuple[int, int]]:
    df = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
          .options(**opts).load())
    return sorted((r.queueId, r.queueOffset) for r in df.select("queueId", "queueOffset").collect())


def test_each_queue_starts_and_ends_at_its_own_time(spark, broker, client, tmp_path) -> None:
    topic = broker.create_topic("BY_TIME", queues=2)
    q0, q1 = client.message_queues(topic)
    for i in range(4):
        client.send(q0, b"early-%d" % i)
        client.send(q1, b"early-%d" % i)
    assert settles_at(client, topic, 8) == 8
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(4):
        client.send(q0, b"late-%d" % i)
        client.send(q1, b"late-%d" % i)
    assert settles_at(client, topic, 16) == 16
    future = cut + 3_600_000

    def times(t0: int, t1: int) -> str:
        return json.dumps({topic: {q0.key: t0, q1.key: t1}})

    # queue 0 from the cut, queue 1 from its first message
    assert _read(spark, broker, topic, startingOffsetsByTimestamp=times(cut, 0)) == \
        [(0, o) for o in range(4, 8)] + [(1, o) for o in range(8)]
    # a time past a queue's last message: the query fails naming it (strategy error, the default) ...
    with pytest.raises(Exception, match=r"(?s)startingOffsetsByTimestamp.*no message stored at or after.*"
                                        r"startingOffsetsByTimestampStrategy=latest"):
        _read(spark, broker, topic, startingOffsetsByTimestamp=times(cut, future))
    # ... or starts the queue at its latest offset (strategy latest)
    assert _read(spark, broker, topic, startingOffsetsByTimestamp=times(cut, future),
                 startingOffsetsByTimestampStrategy="latest") == [(0, o) for o in range(4, 8)]
    # a stream: the same starts; the group's offsets follow
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", "g_by_time").option("startingOffsetsByTimestamp", times(0, cut)).load()
         .select("queueId", "queueOffset").writeStream.format("memory").queryName("q_by_time")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    got = sorted((r.queueId, r.queueOffset) for r in spark.sql("select * from q_by_time").collect())
    assert got == [(0, o) for o in range(8)] + [(1, o) for o in range(4, 8)]
    # endingOffsetsByTimestamp: each queue up to its first message at or after its time
    assert _read(spark, broker, topic, endingOffsetsByTimestamp=times(cut, future)) == \
        [(0, o) for o in range(4)] + [(1, o) for o in range(8)]
