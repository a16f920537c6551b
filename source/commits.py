"""The group's offsets as one query writes them: what it planned, processed and committed per
queue (:class:`QueueStatus`, which ``mqadmin consumerStatus`` and ``rocketmq-spark progress``
show), the committable offset by the min-unconsumed rule (:class:`InFlightTracker`), and the
writes to the brokers, whose faults are logged and retried at the next write, never raised."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from ..checkpoints import InFlightTracker
from ..client.membership import QueueStatus
from ..client.retry import bounded
from ..errors import ConnectionFailedError, OffsetResetPendingError
from ..model import MessageQueue
from .availability import REPROBE_BUDGET_S, Availability
from .context import QueryContext

log = logging.getLogger(__name__)

__all__ = ["Commits", "QueueOffsets"]

QueueOffsets = dict[MessageQueue, int]


class Commits:
    """One query's commits of its group's offsets."""

    def __init__(self, ctx: QueryContext, availability: Availability) -> None:
        self.ctx = ctx
        self.availability = availability
        self.tracker = InFlightTracker()
        self._status: dict[MessageQueue, QueueStatus] = {}
        #: per queue, the offsets whose commit failed since the last one that went through (the
        #: broker may have applied one all the same, its answer lost): the broker holding one of
        #: them is not a reset
        self.unsure: dict[MessageQueue, set[int]] = {}
        #: queues whose reset the next batch follows: Spark's commit of the batch before it
        #: (it comes after the next batch is planned) no longer counts for them
        self.stale: set[MessageQueue] = set()

    def status_of(self, mq: MessageQueue) -> QueueStatus:
        st = self._status.get(mq)
        if st is None:
            st = self._status[mq] = QueueStatus()
        return st

    def running_info(self) -> dict[MessageQueue, QueueStatus]:
        """What the query has planned, processed and committed per queue (for the brokers'
        GET_CONSUMER_RUNNING_INFO: mqadmin consumerStatus, rocketmq-spark progress)."""
        return {mq: replace(st) for mq, st in list(self._status.items())}

    def planned(self, begin: QueueOffsets, end: QueueOffsets) -> None:
        """A batch ``[begin, end)`` was planned: its ranges are in flight."""
        now = int(time.time() * 1000)
        for mq in end:
            self.tracker.register(mq, begin[mq], end[mq])
            st = self.status_of(mq)
            st.planned, st.last_planned_ms = end[mq], now

    def completed(self, end: QueueOffsets) -> QueueOffsets:
        """Spark processed everything below ``end`` -> each queue's committable offset
        (min-unconsumed rule: never past a range still in flight)."""
        committable: QueueOffsets = {}
        for mq, off in end.items():
            self.tracker.complete_through(mq, off)
            self.status_of(mq).processed = off
            c = self.tracker.committable(mq)
            if c is not None:
                committable[mq] = c
        return committable

    def fresh(self, end: QueueOffsets) -> QueueOffsets:
        """``end`` without the queues where it is the end of a batch planned before the queue's
        reset (see :meth:`restart`): Spark's commit of it no longer counts there."""
        out: QueueOffsets = {}
        for mq, off in end.items():
            if mq in self.stale:
                self.stale.discard(mq)
                continue
            out[mq] = off
        return out

    def restart(self, mq: MessageQueue, offset: int) -> None:
        """The queue is read again from ``offset`` (a reset followed, a lost store): what was
        planned or done before no longer counts for its commits."""
        self.tracker.reset(mq, offset)
        self.stale.add(mq)
        store = self.ctx.opened_store
        if store is not None:
            store.forget(mq)

    def write(self, offsets: QueueOffsets) -> list[MessageQueue]:
        """Write ``offsets`` as the group's (:meth:`BrokerOffsetStore.commit`: failures logged and
        retried at the next write); a broker found unreachable is noted down, and what each broker
        took is what the query expects it to hold (see :mod:`.resets`). -> the queues whose write
        a broker ignored because a server-side reset of the queue waits for the group's next pull
        (:class:`OffsetResetPendingError`)."""
        asked = time.monotonic()
        with bounded(REPROBE_BUDGET_S):  # a failed commit waits for the next commit, not a chain of timeouts
            failed = self.ctx.store.commit(offsets)
        waiting = sorted(mq for mq, exc in failed.items() if isinstance(exc, OffsetResetPendingError))
        for mq, exc in failed.items():
            if isinstance(exc, OffsetResetPendingError):
                continue
            if isinstance(exc, ConnectionFailedError):  # the next batch's tasks count from here
                self.availability.note_down(mq.broker, asked, str(exc))
            if mq in offsets:
                self.unsure.setdefault(mq, set()).add(offsets[mq])
        now = int(time.time() * 1000)
        for mq, off in offsets.items():
            if mq not in failed:
                st = self.status_of(mq)
                st.committed, st.last_committed_ms = off, now
                self.unsure.pop(mq, None)
        return waiting
