"""Batch reads read less (issue 22): filters on storeTimestamp become per-queue offset bounds
(the broker's search by store time), filters on tag the subscription (the broker filters by
tag hash), filters on topic, broker and queueId prune queues. Correctness never depends on it:
every query returns what the same query returns with filterPushdown=false, on the embedded
broker and on Apache RocketMQ."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest
from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, LessThan

from brokers import Target, queued, settles_at
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.source import ReaderOptions, RocketMQBatchReader, RocketMQPushdownBatchReader
from rocketmq_spark.source.packing import ranges_of

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _slices(client: RemotingClient, topic: str, slices: int, per_queue: int) -> list[int]:
    """``slices`` runs of messages (tags A, B, C in turn) with a gap between them; returns the
    store-time cut before each run (epoch ms) and one after the last."""
    qs = client.message_queues(topic)
    before = queued(client, topic)
    cuts = []
    for s in range(slices):
        time.sleep(0.03)
        cuts.append(int(time.time() * 1000))
        time.sleep(0.03)
        for q in qs:
            client.send_batch(q, [BatchEntry(f"s{s}-q{q.queue_id}-{i}".encode(), f"TAGS\x01{'ABC'[i % 3]}\x02")
                                  for i in range(per_queue)])
    time.sleep(0.03)
    cuts.append(int(time.time() * 1000))
    sent = slices * len(qs) * per_queue
    assert settles_at(client, topic, before + sent) == before + sent  # in the consume queues: readable
    return cuts


def _ts(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_pushed_queries_return_what_unpushed_ones_do(spark: Any, broker: Target, client: RemotingClient,
                                                     transport: Any) -> None:
    topic, other = broker.create_topic(transport("PUSH_A")), broker.create_topic(transport("PUSH_B"), 2)
    cuts = _slices(client, topic, 4, 6)
    _slices(client, other, 1, 3)
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")  # Spark's own switch for pushFilters

    def read(pushdown: bool) -> Any:
        return (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
                .option("topic", f"{topic},{other}").option("startingOffsets", "earliest")
                .option("filterPushdown", str(pushdown).lower()).load())

    queries = [
        f"storeTimestamp >= '{_ts(cuts[1])}' AND storeTimestamp < '{_ts(cuts[2])}'",
        f"storeTimestamp BETWEEN '{_ts(cuts[1])}' AND '{_ts(cuts[3])}'",
        f"storeTimestamp > '{_ts(cuts[3])}'",
        f"storeTimestamp <= '{_ts(cuts[1])}'",
        "tag = 'A'",
        "tag IN ('B', 'C') AND queueId IN (0, 2)",
        f"topic = '{other}' AND tag = 'B'",
        "broker = 'no-such-broker'",
        f"tag = 'A' AND storeTimestamp >= '{_ts(cuts[2])}'",
        "tag = 'A' AND tag = 'B'",
    ]
    for where in queries:
        pushed = sorted(bytes(r.body) for r in read(True).where(where).select("body").collect())
        plain = sorted(bytes(r.body) for r in read(False).where(where).select("body").collect())
        assert pushed == plain, where
    one_slice = sorted(bytes(r.body) for r in read(True).where(queries[0]).select("body").collect())
    assert one_slice and all(b.startswith(b"s1-") for b in one_slice) and len(one_slice) == 6 * 4


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_pushed_filters_plan_only_the_queues_and_offsets_that_can_match(broker: Target, client: RemotingClient,
                                                                       transport: Any) -> None:
    topic = broker.create_topic(transport("PUSH_PLAN"))
    cuts = _slices(client, topic, 4, 5)
    opts = ReaderOptions.parse({"namesrvAddr": broker.namesrv_addr, "topic": topic, "startingOffsets": "earliest"},
                               stream=False)

    def planned(filters: list[Any]) -> dict[int, tuple[int, int]]:
        reader = RocketMQPushdownBatchReader(opts)
        left = list(reader.pushFilters(filters))
        assert left == filters  # Spark evaluates every filter again on what is read
        return {p.mq.queue_id: (p.start, p.end) for p in ranges_of(reader.partitions())}

    every = planned([])
    assert every == {q: (0, 20) for q in range(4)}
    window = [GreaterThanOrEqual(("storeTimestamp",), dt.datetime.fromtimestamp(cuts[1] / 1000)),
              LessThan(("storeTimestamp",), dt.datetime.fromtimestamp(cuts[2] / 1000))]
    got = planned(window)
    assert all(5 <= s and e <= 11 for s, e in got.values()) and len(got) == 4, got  # one slice (+1 at most)
    assert set(planned([In(("queueId",), (1, 3))])) == {1, 3}
    assert planned([EqualTo(("topic",), "elsewhere")]) == {}
    reader = RocketMQPushdownBatchReader(opts)
    list(reader.pushFilters([In(("tag",), ("A", "B"))]))
    assert {p.sub_expression for p in ranges_of(reader.partitions())} == {"A || B"}
    # endingTimestamp (Kafka's option): each queue up to its first message stored at or after it
    upto = ReaderOptions.parse({"namesrvAddr": broker.namesrv_addr, "topic": topic, "startingOffsets": "earliest",
                                "endingTimestamp": str(cuts[2])}, stream=False)
    ends = [p.end for p in ranges_of(RocketMQBatchReader(upto).partitions())]  # no pushdown needed for it
    assert len(ends) == 4 and all(10 <= e <= 11 for e in ends), ends  # two slices (+1 at most)
