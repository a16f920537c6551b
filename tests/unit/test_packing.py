"""Small batches in few tasks (rocketmq_spark.source.packing): how a batch's queue ranges are
packed into partitions, and that a packed partition reads each range as it would alone."""

from __future__ import annotations

import pickle
import random

import pytest

from rocketmq_spark.model import MessageQueue
from rocketmq_spark.source.packing import PackedRanges, pack, ranges_of
from rocketmq_spark.source.queue_range import QueueRange


def _range(qid: int, start: int, end: int, broker: str = "broker-a") -> QueueRange:
    return QueueRange(MessageQueue("T", broker, qid), start, end, ("127.0.0.1:9876",), None, "g", "*", 32, True)


def _sizes(parts: list) -> list[int]:
    return [sum(r.end - r.start for r in ranges_of([p])) for p in parts]


def test_a_small_batch_over_four_queues_is_one_partition_reading_them_in_queue_order() -> None:
    ranges = [_range(q, 10, 10 + 40) for q in (2, 0, 3, 1)]
    (part,) = pack(ranges, 10_000)
    assert isinstance(part, PackedRanges)
    assert [(r.mq.queue_id, r.start, r.end) for r in part.ranges] == [(0, 10, 50), (1, 10, 50), (2, 10, 50),
                                                                       (3, 10, 50)]
    assert pickle.loads(pickle.dumps(part)) == part  # it travels to an executor as it is


def test_large_ranges_keep_a_partition_each() -> None:
    ranges = [_range(q, 0, 20_000) for q in range(4)]
    assert pack(ranges, 10_000) == ranges
    assert pack(ranges[:1], 10_000) == ranges[:1]


@pytest.mark.parametrize(("per_partition", "at_least", "expected"), [
    (0, 1, 8),         # 0: one partition per queue, as before packing
    (10_000, 1, 1),    # 800 messages
    (300, 1, 3),       # ceil(800 / 300)
    (10_000, 3, 3),    # minPartitions asks for three
    (10_000, 20, 8),   # never more partitions than ranges (minPartitions splits before packing)
])
def test_partition_count(per_partition: int, at_least: int, expected: int) -> None:
    ranges = [_range(q, 0, 100) for q in range(8)]
    assert len(pack(ranges, per_partition, at_least)) == expected


def test_every_range_is_in_exactly_one_partition_and_partitions_are_about_equal() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        n = rnd.randint(1, 40)
        ranges = [_range(q, s, s + rnd.randint(1, 5_000), rnd.choice(("broker-a", "broker-b")))
                  for q, s in enumerate(rnd.randint(0, 10**6) for _ in range(n))]
        per = rnd.choice((100, 1_000, 10_000, 50_000))
        at_least = rnd.randint(1, 4)
        parts = pack(ranges, per, at_least)
        got = ranges_of(parts)
        assert sorted(got, key=lambda r: r.mq) == sorted(ranges, key=lambda r: r.mq)  # none lost, none twice
        assert all(not isinstance(p, PackedRanges) or len(p.ranges) > 1 for p in parts)
        assert all(len({r.mq.broker for r in ranges_of([p])}) == 1 for p in parts)  # one broker each
        assert len(parts) >= min(len(ranges), at_least)  # minPartitions met wherever ranges allow
        for broker in ("broker-a", "broker-b"):
            mine = [p for p in parts if ranges_of([p])[0].mq.broker == broker]
            if not mine:
                continue
            sizes = _sizes(mine)
            # the largest first, each to the emptiest: no partition of a broker exceeds another
            # of it by more than a range
            assert max(sizes) - min(sizes) <= max(r.end - r.start for r in ranges if r.mq.broker == broker)


def test_a_small_batch_over_two_brokers_is_a_partition_per_broker() -> None:
    """A replay of a batch after broker-a lost its store reads other rows from broker-a's
    ranges: broker-b's rows must keep their partition and row numbers, or an exactly-once
    writer cannot match them with the rows it wrote the first time (the fault suite's
    wipe-broker-now lost 100 rows of broker-b so, in a partition packed with broker-a's)."""
    ranges = [_range(q, 0, 40, b) for b in ("broker-b", "broker-a") for q in (1, 0)]
    parts = pack(ranges, 10_000)
    assert [[(r.mq.broker, r.mq.queue_id) for r in ranges_of([p])] for p in parts] == [
        [("broker-a", 0), ("broker-a", 1)], [("broker-b", 0), ("broker-b", 1)]]
    # minPartitions is shared by the brokers in proportion to their messages, rounded up
    ranges = [_range(q, 0, 300 if b == "broker-a" else 100, b) for b in ("broker-a", "broker-b") for q in range(4)]
    assert [len(ranges_of([p])) for p in pack(ranges, 10_000, 2)] == [2, 2, 4]
    # a broker's share is no more than its ranges; the rest goes to a broker with ranges to spare
    ranges = [_range(0, 0, 300, "broker-a")] + [_range(q, 0, 25, "broker-b") for q in range(4)]
    parts = pack(ranges, 10_000, 4)
    assert len(parts) == 4 and [len(ranges_of([p])) for p in parts] == [1, 2, 1, 1]
