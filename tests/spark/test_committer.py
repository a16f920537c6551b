"""The listener-based committer: broker offsets reach the end, last batch included."""

from __future__ import annotations

import time

import pytest

from brokers import settles_at
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.codec import BatchEntry

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def test_available_now_with_listener_leaves_broker_offsets_at_the_max(spark, broker, client, tmp_path,
                                                                      transport) -> None:
    topic, group = broker.create_topic(transport("LISTEN_END")), transport("g_listen")
    qs = client.message_queues(topic)
    for i in range(40):
        client.send_batch(qs[i % 4], [BatchEntry(b"m%d" % i)])
    assert settles_at(client, topic, 40) == 40
    committer = RocketMQOffsetCommitter(transport.options.get("namesrvAddr"), group,
                                        endpoints=transport.options.get("endpoints"), topics=[topic])
    spark.streams.addListener(committer)
    try:
        q = (spark.readStream.format("rocketmq").options(**transport.options).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "15").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        maxes = [client.max_offset(m) for m in qs]
        deadline = time.monotonic() + 30  # listener events are delivered asynchronously
        def settled() -> bool:  # offsets written, then the lag of that same event measured
            lag = committer.lag
            return ([client.query_consumer_offset(group, m) for m in qs] == maxes
                    and all(m in lag and lag[m].messages_behind == 0 for m in qs))

        while not settled() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [client.query_consumer_offset(group, m) for m in qs] == maxes == [10, 10, 10, 10]
        lag = committer.lag
        assert {m: lag[m].messages_behind for m in qs} == {m: 0 for m in qs}
        # more data arrives: the lag is measured in messages and in store time
        client.send_batch(qs[0], [BatchEntry(b"late")])
        assert settles_at(client, topic, 41) == 41
        time.sleep(0.05)  # the message is at least 50 ms old at the commit below
        committer.commit({qs[0]: 10})
        assert committer.lag[qs[0]].messages_behind == 1 and committer.lag[qs[0]].ms_behind >= 40
    finally:
        spark.streams.removeListener(committer)
