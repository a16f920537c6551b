"""Small batches in few tasks: the queue ranges of a batch packed into fewer partitions.

Spark runs a task per partition, and a Python task costs tens of milliseconds before it reads
a message (the hand-off to a Python worker and back). A batch of a few hundred messages spread
over many queues spends most of its time there, a task per queue, so queue ranges are packed
together until a partition holds about ``minMessagesPerPartition`` messages; a batch large
enough keeps one partition per queue (and minPartitions may split them further, which packing
then leaves alone). A packed partition is read range by range in one task, over one client:
each range is read exactly as it would be alone (:func:`.pull_loop.read_range`: its checks,
errors and rows are the same).

A partition never packs ranges of two brokers. A broker that loses its store changes what a
replay of the batch reads from it; rows read from another broker must come out of the replay in
the same partitions at the same row numbers, or an exactly-once writer cannot tell them for the
rows it wrote the first time (its message ids are partition and row number), and a store lost on
one broker would cost rows of the others.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from .queue_range import QueueRange

__all__ = ["PackedRanges", "pack", "ranges_of"]


@dataclass(frozen=True)
class PackedRanges(InputPartition):
    """One Spark partition reading several queue ranges, in this order, in one task (they come
    from one planner: the same connection settings)."""

    ranges: tuple[QueueRange, ...]


def pack(ranges: list[QueueRange], per_partition: int, at_least: int = 1, most: int | None = None
         ) -> list[QueueRange | PackedRanges]:
    """``ranges`` in about ``ceil(messages / per_partition)`` partitions (``at_least`` at least,
    one per range at most), each range whole and each partition of one broker's ranges: per
    broker, the largest ranges first, each to the partition holding the fewest messages so far,
    so a broker's partitions come out about equal; more partitions when one would hold more than
    ``most`` messages (maxRecordsPerPartition). ``per_partition`` 0, or ranges that already ask
    for a partition each, leave ``ranges`` as they are. A partition of one range is that range;
    partitions are in the order of their first range."""
    if per_partition <= 0:
        return list(ranges)
    by_broker: dict[str, list[QueueRange]] = {}
    for r in ranges:
        by_broker.setdefault(r.mq.broker, []).append(r)
    total = sum(r.end - r.start for r in ranges) or 1
    # minPartitions shared in proportion to the brokers' messages, rounded up, a broker's share
    # no more than its ranges; what that cap leaves over goes to the brokers with ranges to
    # spare, most messages first (all from the batch's offsets: a replay packs the same)
    brokers = sorted(by_broker, key=lambda b: (-sum(r.end - r.start for r in by_broker[b]), b))
    share = {b: min(len(by_broker[b]), max(1, -(-at_least * sum(r.end - r.start for r in by_broker[b]) // total)))
             for b in brokers}
    short = at_least - sum(share.values())
    for b in brokers:
        more = min(max(0, short), len(by_broker[b]) - share[b])
        share[b] += more
        short -= more
    out: list[QueueRange | PackedRanges] = []
    for b in brokers:
        out.extend(_pack_one(by_broker[b], per_partition, share[b], most))
    return sorted(out, key=lambda p: _first(p))


def _pack_one(ranges: list[QueueRange], per_partition: int, at_least: int, most: int | None
              ) -> list[QueueRange | PackedRanges]:
    """:func:`pack` of one broker's ranges."""
    total = sum(r.end - r.start for r in ranges)
    want = max(at_least, -(-total // per_partition))
    if most is not None:
        want = max(want, -(-total // most))
    while want < len(ranges):
        bins = _bins(ranges, want)
        if most is None or all(sum(r.end - r.start for r in b) <= most for b in bins):
            break
        want += 1
    if want >= len(ranges):
        return list(ranges)
    out: list[QueueRange | PackedRanges] = []
    for b in bins:
        b.sort(key=lambda r: (r.mq, r.start))
        out.append(b[0] if len(b) == 1 else PackedRanges(tuple(b)))
    return out


def _bins(ranges: list[QueueRange], want: int) -> list[list[QueueRange]]:
    """``ranges`` dealt into ``want`` bins, the largest first, each to the emptiest bin."""
    heap: list[tuple[int, int]] = [(0, i) for i in range(max(1, want))]
    bins: list[list[QueueRange]] = [[] for _ in heap]
    for r in sorted(ranges, key=lambda r: (r.start - r.end, r.mq, r.start)):
        size, i = heapq.heappop(heap)
        bins[i].append(r)
        heapq.heappush(heap, (size + r.end - r.start, i))
    return bins


def _first(p: QueueRange | PackedRanges) -> tuple:
    r = p.ranges[0] if isinstance(p, PackedRanges) else p
    return (r.mq, r.start)


def ranges_of(partitions: list[QueueRange | PackedRanges]) -> list[QueueRange]:
    """The queue ranges of ``partitions``, packed or not, in partition order."""
    return [r for p in partitions for r in (p.ranges if isinstance(p, PackedRanges) else (p,))]
