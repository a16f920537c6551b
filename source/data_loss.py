"""Data loss: a query's planned offsets the broker no longer has. Deleted by retention (a
start below the queue's min offset), or lost with the broker's store (a start above its max
offset, or a message at the queue's mark that is not the one the query planned past, see
:mod:`.marks`). failOnDataLoss=true fails the query naming each queue; false skips the
retention gap, or reads a lost queue again from its first offset.

Marks are taken as the query plans past messages (a few pulls, rarely) and compared only when
there is a reason to doubt a broker: it did not answer, or the client had to connect to it
anew. A restarted query compares the marks its checkpoint kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from ..errors import ConnectionFailedError, DataLossError, RocketMQSparkError, TopicNotFoundError
from ..model import MessageQueue
from ..offsets import Mark
from .availability import Availability
from .commits import Commits, QueueOffsets
from .context import QueryContext
from .marks import iso

log = logging.getLogger(__name__)

__all__ = ["DataLoss"]

#: A queue's mark is taken again after this long (seconds), when the queue has new messages:
#: retention then never leaves it behind
MARK_EVERY_S = 600.0
#: A mark that could not be taken is tried again after this long (seconds)
MARK_RETRY_S = 60.0
#: Queues are looked over for marks to take at most this often (seconds; a queue restarted at its
#: earliest offset at once)
MARK_SCAN_S = 5.0
#: Marks taken per trigger at most: one pull each, pipelined (many queues get theirs over a few triggers)
MARKS_PER_TRIGGER = 256
#: How long a restarted queue waits for its new store's mark before it is read unmarked
#: (seconds; see DataLoss.hold_unmarked)
UNMARKED_HOLD_S = 30.0


class DataLoss:
    """One query's checks for planned offsets the brokers no longer have, and its marks."""

    def __init__(self, ctx: QueryContext, availability: Availability, commits: Commits) -> None:
        self.ctx = ctx
        self.availability = availability
        self.commits = commits
        #: max offsets fetched with the min offsets by check(), for the planner's next latest() only
        self.highs: dict[MessageQueue, int] = {}
        #: min offsets of the latest check (a mark below its queue's is gone by retention)
        self.lows: dict[MessageQueue, int] = {}
        #: per queue, the mark of one message this query planned past: its offset and store time.
        #: Whenever there is a reason to doubt a broker (see note_doubts) the message at the mark is
        #: pulled again and compared before the queue is planned on. Kept in each batch's offsets
        #: (MARKS_KEY): a restarted query compares too
        self._marks: dict[MessageQueue, Mark] = {}
        self._marked_at: dict[MessageQueue, float] = {}  # when its mark was taken or last tried
        self._marks_scanned = -1e18  # when the queues were last looked over for marks to take
        self._marks_refused = False  # warned that a broker refuses the pulls marks are taken with
        #: queues whose marks are compared before they are planned on again
        self._doubts: set[MessageQueue] = set()
        #: broker -> its connection epoch when last seen (see BrokerClient.connection_epoch)
        self._epochs: dict[str, tuple[str, int]] = {}
        #: queues the next batch reads again from their min offset: their broker no longer has
        #: what the query planned past (see take_restarts)
        self._restarts: QueueOffsets = {}
        #: restarted queues (their broker lost its store) not planned past their start until
        #: they are marked again, with when that began (see hold_unmarked)
        self._unmarked: dict[MessageQueue, float] = {}

    def restarting(self, mq: MessageQueue) -> bool:
        """Whether the next batch reads ``mq`` again from its first offset (see take_restarts)."""
        return mq in self._restarts

    def _lows_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Min offsets of one broker's queues, from one offset-range round (GET_TOPIC_STATS_INFO
        per topic); the max offsets it also brought are kept for the planner's ``latest`` call of
        the same trigger (:meth:`highs_of`), so a trigger asks each broker once. A broker that
        answers without a topic the query reads (deleted, or its store lost, and not created
        again yet) counts as unavailable: its queues wait for the topic like a down broker's."""
        try:
            ranges = self.ctx.client.offset_ranges(mqs)
        except TopicNotFoundError as exc:
            raise ConnectionFailedError(exc.address, exc.operation,
                                        f"the broker does not have the topic now ({exc.remark}): deleted, or its "
                                        "store lost? Its queues wait until it is there again") from None
        self.highs.update({mq: hi for mq, (_lo, hi) in ranges.items()})
        return {mq: lo for mq, (lo, _hi) in ranges.items()}

    def highs_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Max offsets of one broker's queues: those the data-loss check of this trigger just
        fetched (used once), else asked now."""
        kept = {mq: self.highs.pop(mq) for mq in mqs if mq in self.highs}
        missing = [mq for mq in mqs if mq not in kept]
        if missing:
            kept.update(self.ctx.client.max_offsets(missing))
        return kept

    def check(self, start: QueueOffsets) -> QueueOffsets:
        """Starts whose messages the broker no longer has: below a queue's min offset (deleted
        by retention), or lost (:meth:`_lost_queues`: above its max offset, or past a message
        that is not the one this query planned past). With failOnDataLoss=true, DataLossError;
        else logged, and ``start`` is returned with the retention gaps skipped (moved up to the
        min offset) and the lost queues moved back to their min offset (:meth:`take_restarts`),
        a down broker's queues unchanged."""
        fixed = dict(start)
        self.highs.clear()
        was_down = set(self.availability.down)
        lows = self.availability.ask(sorted(start), self._lows_of)
        self.lows = lows
        self.note_doubts(start, was_down)
        suspect = [mq for mq in self._doubts if mq in lows]
        for mq, off in start.items():
            low = lows.get(mq)
            if low is None:
                continue  # its broker is down: next_end keeps the offset
            if off > self.highs.get(mq, off):
                suspect.append(mq)
            elif off < low:
                if self.ctx.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{mq}: offsets [{off}, {low}) were deleted by retention before they were read; "
                        "set failOnDataLoss=false to skip them")
                log.warning("%s: skipping offsets [%d, %d) deleted by retention (failOnDataLoss=false)",
                            mq, off, low)
                fixed[mq] = low
        ranges = {mq: (lows[mq], self.highs[mq]) for mq in suspect if mq in self.highs}
        fixed.update(self._lost_queues(start, ranges))
        return fixed

    def note_doubts(self, queues: Iterable[MessageQueue], was_down: set[str]) -> None:
        """Queues of ``queues`` whose broker may have changed under the query are doubted (their
        marks are compared before they are planned on, see :meth:`_lost_queues`): those of a
        broker that did not answer (down, or its queues gone from the routes; ``was_down``: the
        brokers noted down before the call that just asked them) and those of a broker the
        client had to connect to anew (it restarted or was replaced between two triggers).
        Costs no request: both are known from the planner's usual calls."""
        changed = was_down | set(self.availability.down)
        for broker in {mq.broker for mq in queues}:
            epoch = self.ctx.client.connection_epoch(broker)
            if epoch is None:
                continue
            before = self._epochs.get(broker)
            if before is not None and before != epoch:
                log.info("broker %s: connection %s replaced by %s; its queues' marks are compared", broker,
                         before, epoch)
                changed.add(broker)
            self._epochs[broker] = epoch
        if changed:
            self._doubts.update(mq for mq in queues if mq.broker in changed)

    def doubt(self, mq: MessageQueue) -> None:
        """Compare ``mq``'s mark before it is planned on (the broker lost the group's offset of
        it, say: a broker that lost its store lost those too)."""
        self._doubts.add(mq)

    def _lost_queues(self, start: QueueOffsets, ranges: dict[MessageQueue, tuple[int, int]]) -> QueueOffsets:
        """Queues of ``start`` with ``ranges`` (their min and max offsets now: those above their
        max and the doubted ones are enough) whose broker no longer has what the query planned
        past: a start above the max offset, or a doubted queue whose mark is no longer there
        (:meth:`_compare_marks`). With failOnDataLoss=true, DataLossError naming
        each queue, where the query stands and what the broker holds; else each is logged and
        restarted at its min offset (returned; :meth:`take_restarts`). A doubted queue whose
        mark cannot be read now (its broker does not answer the pull) stays doubted."""
        lost: dict[MessageQueue, str] = {}
        for mq, (_lo, hi) in ranges.items():
            off = start.get(mq)
            if off is not None and off > hi:
                lost[mq] = f"the query's next offset is {off}, the queue's max offset {hi}"
        doubted = sorted(mq for mq in self._doubts if mq in start and mq in ranges)
        for mq in doubted:
            if mq in lost:
                self._doubts.discard(mq)
        lost.update(self._compare_marks([mq for mq in doubted if mq not in lost], start, ranges))
        if not lost:
            return {}
        listed = "; ".join(f"{mq}: {why}; it holds offsets [{ranges[mq][0]}, {ranges[mq][1]}) now"
                           for mq, why in sorted(lost.items()))
        if self.ctx.options.fail_on_data_loss:
            raise DataLossError(
                f"the broker no longer has messages this query read or planned to read, and their offsets are "
                f"taken by other messages ({listed}). The broker lost its store (a replaced disk, a re-provisioned "
                f"broker) or the topic was deleted and re-created. To read these queues again from their earliest "
                f"offset, start the query on a new checkpoint with startingOffsets=earliest, or set "
                f"failOnDataLoss=false (they are then read from their earliest offset at once)")
        out: QueueOffsets = {}
        for mq, why in sorted(lost.items()):
            lo = ranges[mq][0]
            log.warning("%s: the broker no longer has messages this query read or planned to read (%s; it holds "
                        "offsets [%d, %d) now: its store was lost, or the topic deleted and re-created); "
                        "failOnDataLoss=false: reading the queue again from its earliest offset %d",
                        mq, why, lo, ranges[mq][1], lo)
            self._restart(mq, lo)
            out[mq] = lo
        return out

    def _compare_marks(self, mqs: list[MessageQueue], start: QueueOffsets,
                       ranges: dict[MessageQueue, tuple[int, int]]) -> dict[MessageQueue, str]:
        """Of doubted ``mqs``, those whose mark the broker serves as another message (another
        store time), with why. A queue without a mark inside its range (none taken, or gone by
        retention) has nothing to compare and is no longer doubted; one whose pull fails on the
        connection stays doubted."""
        due: dict[MessageQueue, Mark] = {}
        for mq in mqs:
            mark = self._marks.get(mq)
            lo, hi = ranges[mq]
            if mark is not None and lo <= mark[0] < min(hi, start[mq]):
                due[mq] = mark
                continue
            self._doubts.discard(mq)
            if mark is not None and mark[0] < lo:
                self._marks.pop(mq, None)  # retention took it: a new one is taken
        if not due:
            return {}
        times, failed = self._store_times({mq: m[0] for mq, m in due.items()})
        lost: dict[MessageQueue, str] = {}
        refused: list[MessageQueue] = []
        for mq, (off, ts) in sorted(due.items()):
            exc = failed.get(mq)
            if isinstance(exc, (ConnectionFailedError, TopicNotFoundError)):  # not now: asked again later
                log.info("%s: mark at offset %d not compared now: %s", mq, off, exc)
                continue
            self._doubts.discard(mq)
            if exc is not None:
                refused.append(mq)
                continue
            now = times.get(mq)
            if now is not None and now != ts:
                lost[mq] = (f"the query's next offset is {start[mq]}, and offset {off}, stored at {iso(ts)} when "
                            f"the query planned past it, holds a message stored at {iso(now)}")
        if refused:
            log.warning("%s (and %d more queues): the marked message cannot be pulled to compare it (%s); read on "
                        "without", refused[0], len(refused) - 1, failed[refused[0]])
        return lost

    def _store_times(self, offsets: dict[MessageQueue, int]
                     ) -> tuple[dict[MessageQueue, int | None], dict[MessageQueue, RocketMQSparkError]]:
        """Store time (epoch ms) of the message at each queue's offset, None where there is
        none, the pulls in flight together; and the queues whose pull failed, with the error."""
        pending: list[tuple[MessageQueue, Any]] = []
        failed: dict[MessageQueue, RocketMQSparkError] = {}
        for mq, off in sorted(offsets.items()):
            try:
                pending.append((mq, self.ctx.client.pull_async(mq, off, 1)))
            except RocketMQSparkError as exc:
                failed[mq] = exc
        out: dict[MessageQueue, int | None] = {}
        for mq, p in pending:
            try:
                res = self.ctx.client.pull_result(mq, p)
                if res.slave_lacks(offsets[mq]):  # the master has it and is down: not now
                    raise ConnectionFailedError(res.from_slave, f"pull of {mq}",
                                                f"the slave does not hold offset {offsets[mq]} (its master is down)")
                out[mq] = self.ctx.client.store_time_in(res, offsets[mq])
            except RocketMQSparkError as exc:
                failed[mq] = exc
        return out, failed

    def _restart(self, mq: MessageQueue, offset: int) -> None:
        """The queue is read again from ``offset`` (below where the query stood): what was
        planned or done before no longer counts for its commits (:meth:`.Commits.restart`), and
        its mark is taken anew."""
        self.commits.restart(mq, offset)
        self._marks.pop(mq, None)
        self._marked_at.pop(mq, None)
        self._marks_scanned = -1e18  # its new store is marked in this trigger's planning
        self._doubts.discard(mq)
        self._restarts[mq] = offset
        self._unmarked.setdefault(mq, time.monotonic())

    def take_restarts(self) -> QueueOffsets:
        """The queues restarted at their min offset since the last call (their broker lost what
        the query planned past, failOnDataLoss=false), with that offset: a stream's batch names
        them as reset starts, so its partitions begin there."""
        out, self._restarts = self._restarts, {}
        return out

    def adopt_marks(self, marks: dict[MessageQueue, Mark]) -> None:
        """Marks from a batch's start offsets: those this planner did not take (a restarted
        query's, from Spark's checkpoint) are kept and compared before their queues are planned
        on (the broker may have lost its store while the query was stopped)."""
        now = time.monotonic()
        for mq, mark in marks.items():
            if self._marks.get(mq) != mark:
                self._marks[mq] = mark
                self._marked_at[mq] = now
                self._doubts.add(mq)

    def marks_of(self, queues: Iterable[MessageQueue]) -> dict[MessageQueue, Mark]:
        """The marks of ``queues`` that have one (for a batch's offsets)."""
        return {mq: self._marks[mq] for mq in queues if mq in self._marks}

    def take_marks(self, begin: QueueOffsets, end: QueueOffsets) -> None:
        """Marks the last message of each queue's batch ``[begin, end)`` (the next batch starts
        past it) where the queue has no mark, or one outside [its min offset, ``end``), or, when
        the batch has new messages, one older than ``MARK_EVERY_S``: so a trigger asks nothing
        more but these rare pulls, and idle triggers leave the batch offsets as they were. At
        most ``MARKS_PER_TRIGGER`` per trigger; one that cannot be taken is tried again after
        ``MARK_RETRY_S``. The queues are looked over every ``MARK_SCAN_S`` (a few dict
        lookups per queue: not every trigger)."""
        now = time.monotonic()
        if now - self._marks_scanned < MARK_SCAN_S:
            return
        self._marks_scanned = now
        due: dict[MessageQueue, int] = {}
        for mq in end:
            e, lo = end[mq], self.lows.get(mq, 0)
            if e <= lo:
                continue  # no message before the end
            mark = self._marks.get(mq)
            since = now - self._marked_at.get(mq, -1e18)
            if mark is not None and lo <= mark[0] < e:
                if e == begin[mq] or since < MARK_EVERY_S:
                    continue
            elif since < MARK_RETRY_S:
                continue
            due[mq] = e - 1
            if len(due) >= MARKS_PER_TRIGGER:
                break
        if not due:
            return
        times, failed = self._store_times(due)
        for mq, off in due.items():
            self._marked_at[mq] = now
            ts = times.get(mq)
            if ts is not None:
                self._marks[mq] = (off, ts)
        refused = {mq: e for mq, e in failed.items() if not isinstance(e, ConnectionFailedError)}
        if refused and not self._marks_refused:
            self._marks_refused = True
            mq, exc = next(iter(sorted(refused.items())))
            log.warning("%s: the message at offset %d cannot be pulled to mark the queue (%s; %d queues alike): a "
                        "broker that loses its store is noticed by such queues only once the query's offset lies "
                        "above their max offset", mq, due[mq], exc, len(refused))
        if failed:
            log.debug("marks not taken now (tried again later): %s",
                      "; ".join(f"{mq}: {e}" for mq, e in failed.items()))

    def hold_unmarked(self, begin: QueueOffsets, end: QueueOffsets) -> bool:
        """Keeps each restarted queue at its start (``end[mq] = begin[mq]``, in place) until
        its new store is marked: its read task compares the mark before handing rows on, and
        without one a store lost again before the task reads (a broker restarted twice in a
        row) would be read as the planned one, then read again once the loss is seen. The
        mark is asked for at every trigger; a broker that does not answer the pull holds the
        queue, for up to ``UNMARKED_HOLD_S`` (then it is read unmarked, with a warning), one
        that refuses it (a permission) lets it go at once. True when a queue was held."""
        held = False
        due: dict[MessageQueue, int] = {}
        for mq in list(self._unmarked):
            if mq not in end or end[mq] <= begin[mq]:
                continue
            mark = self._marks.get(mq)
            if mark is not None and self.lows.get(mq, 0) <= mark[0] < end[mq]:
                del self._unmarked[mq]
            else:
                due[mq] = end[mq] - 1
        if not due:
            return False
        times, failed = self._store_times(due)
        now = time.monotonic()
        for mq, off in due.items():
            ts = times.get(mq)
            exc = failed.get(mq)
            self._marked_at[mq] = now
            if ts is not None:
                self._marks[mq] = (off, ts)
                del self._unmarked[mq]
            elif exc is not None and not isinstance(exc, ConnectionFailedError):  # timeouts too
                del self._unmarked[mq]  # refused: read unmarked, as take_marks says
            elif now - self._unmarked[mq] >= UNMARKED_HOLD_S:
                log.warning("%s: its new store could not be marked in %.0fs (%s); read on unmarked: a store "
                            "lost again before a batch reads it is not noticed by that batch", mq,
                            now - self._unmarked[mq], exc or f"no message at offset {off}")
                del self._unmarked[mq]
            else:
                log.info("%s: not planned past offset %d until its new store is marked (%s)", mq, begin[mq],
                         exc or f"no message at offset {off} yet")
                end[mq] = begin[mq]
                held = True
        return held

    def checked(self, start: QueueOffsets, latest: QueueOffsets, was_down: set[str]) -> QueueOffsets:
        """``start`` with the lost queues among those ``latest`` answered for restarted (see
        :meth:`_lost_queues`; a broker that answers again here, after the data-loss check of
        this trigger, is doubted now). Doubted queues that cannot be compared now are taken out
        of ``latest``: they wait like a down broker's (their broker noted down)."""
        self.note_doubts(start, was_down)
        doubted = sorted(mq for mq in self._doubts if mq in latest and mq in start)
        if not doubted:
            return start
        try:
            ranges = self.ctx.client.offset_ranges(doubted)
        except (ConnectionFailedError, TopicNotFoundError) as exc:
            ranges, why = {}, str(exc)
        else:
            why = "its queues' marks could not be compared"
        moved = self._lost_queues({mq: start[mq] for mq in doubted}, ranges)
        for mq in doubted:
            if mq in self._doubts:
                latest.pop(mq, None)
                self.availability.note_down(mq.broker, time.monotonic(), why)
        return {**start, **moved}
