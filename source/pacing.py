"""Pacing a bursty topic: a micro-batch waits for ``minMessagesPerTrigger`` new messages, but
never longer than ``maxTriggerDelay`` (Spark's Kafka source's minOffsetsPerTrigger and
maxTriggerDelay, with its rules); and ``maxBytesPerTrigger`` caps a batch by the messages'
stored size (:func:`admit_bytes`).

At each trigger the messages available past the batch's start are counted over every queue
(before maxMessagesPerTrigger caps the batch). Fewer than the minimum, and less than the delay
since the clock last started: the trigger plans no batch, and the messages wait. The clock
starts when a batch is planned, and when a trigger finds the delay run out (with or without
messages: then a batch takes what there is); before the first trigger of a run it has run
out, so a restarted query reads what waited at once. Under Trigger.AvailableNow nothing
waits: everything the run reads is there already, and the run must end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..model import MessageQueue

__all__ = ["Pacing", "admit_bytes"]

#: the fewest consume-queue entries asked at once for their sizes (doubling from there)
_FIRST_SIZES = 64


class Pacing:
    """The wait of one query's batches for enough messages (see the module)."""

    def __init__(self, min_messages: int | None, max_delay_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_messages = min_messages
        self.max_delay_s = max_delay_ms / 1000
        self._clock = clock
        #: when the clock last started (None: not yet in this run, so the delay has run out)
        self.started: float | None = None

    def holds(self, available: int, *, available_now: bool = False) -> bool:
        """Whether the trigger waits, with ``available`` messages past the batch's start;
        False restarts the clock (the trigger plans a batch, or finds nothing to plan)."""
        if not self.min_messages or available_now:
            return False
        now = self._clock()
        if self.started is not None and now - self.started < self.max_delay_s and available < self.min_messages:
            return True
        self.started = now
        return False


def admit_bytes(begin: dict[MessageQueue, int], end: dict[MessageQueue, int], budget: int,
                sizes: Callable[[MessageQueue, int, int], list[int]]) -> dict[MessageQueue, int]:
    """``end`` cut so that the messages of ``[begin, end)`` take at most ``budget`` bytes as
    stored (``sizes(mq, start, count)``: the stored sizes from ``start``, fewer where they end).
    Each queue first gets a share of the budget in proportion to its backlog (as
    maxMessagesPerTrigger shares messages), then what the shares left goes to the queues with
    the most left to read. A batch where no message fits takes one message (of the queue with
    the largest backlog), so a message larger than the budget never stops a query. Sizes are
    asked lazily, from a few entries per queue, doubling."""
    backlog = {mq: end[mq] - begin[mq] for mq in end if end[mq] > begin[mq]}
    if not backlog:
        return dict(end)
    total = sum(backlog.values())
    known: dict[MessageQueue, list[int]] = {mq: [] for mq in backlog}
    took = dict.fromkeys(backlog, 0)

    def size_at(mq: MessageQueue, i: int) -> int | None:
        have = known[mq]
        while i >= len(have):
            want = min(backlog[mq] - len(have), max(_FIRST_SIZES, len(have)))
            got = sizes(mq, begin[mq] + len(have), want) if want > 0 else []
            if not got:
                return None  # not there now (retention, a lost store): the pull finds out
            have.extend(got[:want])
        return have[i]

    def take(mq: MessageQueue, allowance: int) -> int:
        spent = 0
        while took[mq] < backlog[mq]:
            size = size_at(mq, took[mq])
            if size is None or spent + size > allowance:
                break
            spent += size
            took[mq] += 1
        return spent

    used = sum(take(mq, budget * backlog[mq] // total) for mq in sorted(backlog))
    for mq in sorted(backlog, key=lambda m: (took[m] - backlog[m], m)):
        if used >= budget:
            break
        used += take(mq, budget - used)
    if not any(took.values()):
        took[min(backlog, key=lambda m: (-backlog[m], m))] = 1
    return {mq: begin[mq] + took.get(mq, 0) if mq in backlog else end[mq] for mq in end}
