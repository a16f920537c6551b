"""Delayed delivery: messages with a DELAY level or a 5.x timer property wait in the schedule
topic and are re-put into their destination queue when due."""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..codec import PropertyKey, decode_record, encode_properties
from .state import SCHEDULE_TOPIC, ConsumerOffsets
from .store import MessageStore, NewMessage

log = logging.getLogger(__name__)

__all__ = ["SCHEDULE_QUEUE", "SCHEDULE_TOPIC", "TIMER_OUT_MS", "Delayed", "DelayedDelivery", "delivery_due_ms"]

# Queue 0 of the schedule topic holds
# the waiting messages; queue 1 holds one "done" marker per delivered entry (body = the
# entry's offset in queue 0). Both live in the commit log, so restarts recover them.
SCHEDULE_QUEUE = 0
SCHEDULE_DONE_QUEUE = 1
SCHEDULE_GROUP = "CID_RMQ_SYS_SCHEDULE"
#: Internal property: the absolute due time (epoch ms) of a waiting message.
TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
#: 4.x delay levels 1..18 (the ``messageDelayLevel`` default), in milliseconds.
DELAY_LEVELS_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)
#: The scheduler looks at the heap at least this often (and sooner when a due time is near).
_SCHEDULE_TICK_S = 0.1
#: At most this many delayed messages are re-put by one store write.
_SCHEDULE_BATCH = 512


def delivery_due_ms(props: dict[str, str], now_ms: int, max_delay_ms: int) -> tuple[int | None, bool]:
    """When a message with these properties may be delivered, and whether a DELAY level set it.

    The time is epoch ms, or None for "at once".

    Follows Java brokers: a DELAY level above 0 wins (levels above 18 count as 18) and the
    5.x timer properties are then ignored; otherwise TIMER_DELAY_MS, then TIMER_DELAY_SEC
    (both relative to ``now_ms``), then TIMER_DELIVER_MS (absolute). A due time not in the
    future means "at once". Raises ValueError for a malformed value or a timer delay
    beyond ``max_delay_ms``.
    """
    level_s = props.get(PropertyKey.DELAY)
    if level_s is not None and level_s.strip():
        try:
            level = int(level_s)
        except ValueError:
            raise ValueError(f"property DELAY={level_s!r} is not an integer delay level") from None
        if level > 0:
            return now_ms + DELAY_LEVELS_MS[min(level, len(DELAY_LEVELS_MS)) - 1], True
    for key, base, scale in ((PropertyKey.TIMER_DELAY_MS, now_ms, 1),
                             (PropertyKey.TIMER_DELAY_SEC, now_ms, 1000),
                             (PropertyKey.TIMER_DELIVER_MS, 0, 1)):
        raw = props.get(key)
        if raw is None:
            continue
        try:
            due = base + int(raw) * scale
        except ValueError:
            raise ValueError(f"property {key}={raw!r} is not an integer") from None
        if due <= now_ms:
            return None, False
        if due - now_ms > max_delay_ms:
            raise ValueError(f"timer message illegal: property {key}={raw} asks for a delay of "
                             f"{due - now_ms} ms; at most {max_delay_ms} ms are accepted")
        return due, False
    return None, False



@dataclass(slots=True)
class Delayed:
    """A delayed message waiting in the schedule queue."""

    schedule_offset: int
    due_ms: int
    commit_log_offset: int
    size: int



class DelayedDelivery:
    """The delayed messages waiting for delivery (by schedule-queue offset) and their scheduler.

    A delayed message is stored in SCHEDULE_TOPIC queue 0 with REAL_TOPIC / REAL_QID (its
    destination) and TIMER_OUT_MS (its due time); only the schedule queue sees it, so the
    destination queue's pulls, min and max offsets do not. The scheduler keeps the waiting ones
    in a heap by (due time, schedule offset) and, once due, re-puts each into its destination
    queue together with a done marker in SCHEDULE_TOPIC queue 1 (body = the schedule offset) in
    the same store write, delivery first: a crash between the two can only deliver again, never
    lose. The progress (lowest schedule offset still waiting) is kept as the consumer offset of
    SCHEDULE_GROUP, so a restart rescans only the schedule queue beyond it, minus the done markers.
    """

    def __init__(self, store: MessageStore, offsets: ConsumerOffsets, *, pack_peer: Callable[[str], bytes]) -> None:
        self.store = store
        self.offsets = offsets
        self.pack_peer = pack_peer
        self.pending: dict[int, Delayed] = {}
        self._heap: list[tuple[int, int]] = []  # (due ms, schedule offset)
        self._low: list[int] = []  # schedule offsets; lazily pruned, for the progress
        self._wake = asyncio.Event()

    def add(self, d: Delayed) -> None:
        """A message stored in the schedule queue: it waits until ``d.due_ms``."""
        self.pending[d.schedule_offset] = d
        heapq.heappush(self._heap, (d.due_ms, d.schedule_offset))
        heapq.heappush(self._low, d.schedule_offset)
        if self._heap[0][1] == d.schedule_offset:
            self._wake.set()  # a new earliest due time: let the scheduler re-arm

    def load(self) -> None:
        """Rebuild the waiting delayed messages: schedule entries since the saved progress
        minus those with a done marker."""
        start = self.offsets.query(SCHEDULE_TOPIC, SCHEDULE_GROUP, SCHEDULE_QUEUE)
        waiting, done = (SCHEDULE_TOPIC, SCHEDULE_QUEUE), (SCHEDULE_TOPIC, SCHEDULE_DONE_QUEUE)
        for rec in self.store.unfinished(waiting, done, start):
            if PropertyKey.REAL_TOPIC not in rec.properties:
                log.warning("schedule queue entry %d has no REAL_TOPIC; ignoring it", rec.queue_offset)
                continue
            try:
                due = int(rec.properties.get(TIMER_OUT_MS, "0"))
            except ValueError:
                due = 0  # unreadable due time: deliver it now rather than never
            self.add(Delayed(rec.queue_offset, due, rec.physical_offset, rec.total_size))
        if self.pending:
            log.info("recovered %d delayed messages waiting for delivery", len(self.pending))

    def save_progress(self) -> None:
        sched = self.store.find_queue(SCHEDULE_TOPIC, SCHEDULE_QUEUE)
        if sched is None:
            return
        low = self._low
        while low and low[0] not in self.pending:
            heapq.heappop(low)
        progress = low[0] if low else sched.max_offset
        if self.offsets.query(SCHEDULE_TOPIC, SCHEDULE_GROUP, SCHEDULE_QUEUE) != progress:
            self.offsets.commit(SCHEDULE_TOPIC, SCHEDULE_GROUP, SCHEDULE_QUEUE, progress)

    async def run(self) -> None:
        """Deliver delayed messages when due; wakes at the earliest due time (at least every
        ``_SCHEDULE_TICK_S``) and at once when a send brings an earlier one."""
        while True:
            timeout = _SCHEDULE_TICK_S
            try:
                self.deliver_due()
            except Exception:
                log.exception("delivering delayed messages failed")
            else:
                if self._heap:
                    wait = self._heap[0][0] / 1000.0 - time.time()
                    timeout = min(timeout, max(wait, 0.001))
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def deliver_due(self, now_ms: int | None = None) -> int:
        """Re-put every delayed message due by ``now_ms`` into its destination queue, in
        due-time order, with its done markers. Returns how many were delivered."""
        heap = self._heap
        delivered = 0
        while True:
            now = int(time.time() * 1000) if now_ms is None else now_ms
            taken: list[tuple[int, int]] = []
            batch: list[NewMessage] = []
            while heap and heap[0][0] <= now and len(taken) < _SCHEDULE_BATCH:
                item = heapq.heappop(heap)
                d = self.pending.get(item[1])
                if d is None or d.due_ms != item[0]:
                    continue
                taken.append(item)
                copy = self._delivered_copy(d)
                if copy is not None:
                    batch.append(copy)
                batch.append(NewMessage(SCHEDULE_TOPIC, SCHEDULE_DONE_QUEUE, str(d.schedule_offset).encode(),
                                        "", born_timestamp=now, born_host=self.store.store_host))
            if not taken:
                break
            try:
                self.store.put(batch)
            except Exception:
                for item in taken:  # still waiting: try again on the next round
                    heapq.heappush(heap, item)
                raise
            for _, off in taken:
                del self.pending[off]
            delivered += len(batch) - len(taken)
            self.save_progress()
        return delivered

    def _delivered_copy(self, d: Delayed) -> NewMessage | None:
        """The message as its destination queue gets it, or None when the entry is lost."""
        raw = self.store.record_at(d.commit_log_offset)
        rec = decode_record(raw) if raw is not None else None
        if rec is None or rec.topic != SCHEDULE_TOPIC or rec.queue_offset != d.schedule_offset:
            log.error("delayed message at schedule offset %d (commit log %d) is unreadable; "
                      "dropping it", d.schedule_offset, d.commit_log_offset)
            return None
        props = dict(rec.properties)
        topic = props.get(PropertyKey.REAL_TOPIC, "")
        try:
            queue_id = int(props.get(PropertyKey.REAL_QID, "0"))
        except ValueError:
            queue_id = 0
        # What a 5.x broker's delivered copy keeps (its timer wheel serves both kinds): a
        # delay-level message its DELAY, REAL_TOPIC and REAL_QID; a timer message also
        # TIMER_OUT_MS and when it entered and left the timer (TIMER_ENQUEUE_MS/DEQUEUE_MS).
        if PropertyKey.DELAY in props:
            props.pop(TIMER_OUT_MS, None)
        else:
            props[TIMER_ENQUEUE_MS] = str(rec.store_timestamp)
            props[TIMER_DEQUEUE_MS] = str(int(time.time() * 1000))
        if not topic:
            log.error("delayed message at schedule offset %d has no REAL_TOPIC; dropping it",
                      d.schedule_offset)
            return None
        return NewMessage(topic, queue_id, rec.body, encode_properties(props), rec.flag, rec.sys_flag,
                          rec.born_timestamp, self.pack_peer(rec.born_host), rec.reconsume_times)
