"""subscribePattern (Spark's Kafka source's option of the same name) on the embedded broker and
Apache RocketMQ: the topics of the name servers' list a regular expression matches, a topic
created while the query runs read from its first message, system topics never."""

from __future__ import annotations

import pytest

from brokers import settles_at, wait_until
from rocketmq_spark.client import RemotingClient

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _send(client: RemotingClient, topic: str, n: int) -> None:
    qs = client.message_queues(topic, refresh=True)
    for i in range(n):
        client.send(qs[i % len(qs)], b"%s-%d" % (topic.encode(), i))
    assert settles_at(client, topic, n) == n


def test_a_pattern_reads_matching_topics_and_one_created_while_it_runs(spark, broker, client, tmp_path) -> None:
    first = broker.create_topic("PATTERN_T_1", queues=2)
    _send(client, first, 5)
    broker.create_topic("PATTERNX_T_1", queues=1)  # does not match
    _send(client, "PATTERNX_T_1", 2)
    # a retry topic with messages and the auto-create topic: the pattern names them, and still
    # never reads them
    retry = broker.create_topic("%RETRY%g_pattern_sys", queues=1)
    _send(client, retry, 3)
    pattern = "PATTERN_T_.*|%RETRY%.*|TBW102|RMQ_SYS_.*"
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
         .option("subscribePattern", pattern).option("consumerGroup", "g_pattern")
         .option("startingOffsets", "earliest").load()
         .selectExpr("topic", "queueOffset", "CAST(body AS STRING) AS body")
         .writeStream.format("memory").queryName("q_pattern").option("checkpointLocation", str(tmp_path / "ck"))
         .start())
    try:
        def count() -> int:
            return spark.sql("select count(*) c from q_pattern").collect()[0].c

        assert wait_until(lambda: count() >= 5, 90), q.recentProgress
        second = broker.create_topic("PATTERN_T_2", queues=2)  # while the query runs
        _send(client, second, 7)
        assert wait_until(lambda: count() >= 12, 90), (count(), q.recentProgress)
        assert q.exception() is None, q.exception()
        # the group's offsets are committed for both topics, at the trigger after the batch that
        # read them (Spark never commits a query's last batch before it stops: waited for here,
        # while the query runs; CI once stopped it first and waited in vain)
        for topic, n in ((first, 5), (second, 7)):
            qs = client.message_queues(topic)
            assert wait_until(lambda qs=qs, n=n: sum(client.query_consumer_offset("g_pattern", m) or 0
                                                     for m in qs) >= n, 30), topic
    finally:
        q.stop()
    rows = spark.sql("select topic, queueOffset, body from q_pattern").collect()
    assert sorted(r.body for r in rows) == sorted([f"{first}-{i}" for i in range(5)] +
                                                  [f"{second}-{i}" for i in range(7)])
    # the new topic is read from its first message
    assert sorted(r.queueOffset for r in rows if r.topic == second) == [0, 0, 1, 1, 2, 2, 3]
