"""``format("rocketmq")``: the stream and batch readers.

Spark-facing methods (camelCase) are thin; the planning is plain Python in
:class:`Planner`, tested without Spark. Planning calls run in one long-lived
process on the driver side; ``read()`` runs in executors on an unpickled copy, so
nothing here opens a socket in ``__init__``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..checkpoints import BrokerOffsetStore, InFlightTracker
from ..checkpoints.offset_store import RETRY_AFTER_S
from ..client import BrokerClient, connect
from ..client.membership import GroupPresence, QueueStatus, crashed_member
from ..client.retry import bounded
from ..errors import (
    BrokerUnavailableError,
    ConnectionFailedError,
    DataLossError,
    GroupInUseError,
    OffsetResetError,
    OffsetResetPendingError,
    OptionError,
    RocketMQSparkError,
    TopicNotFoundError,
)
from ..model import MessageQueue, PullResult
from ..offsets import (
    EARLIEST,
    LATEST,
    GroupAtPlanning,
    Mark,
    Offsets,
    batch_end_json,
    group_of,
    marks_of,
    split_batch_end,
)
from .options import ReaderOptions
from .pull_loop import _read_partition, read_range
from .pushdown import Pushed, pushed_of
from .queue_range import QueueRange, _client_config, _iso, _store_time_in

log = logging.getLogger(__name__)

__all__ = ["Planner", "QueueRange", "RocketMQBatchReader", "RocketMQStreamReader", "read_range"]

QueueOffsets = dict[MessageQueue, int]
V = TypeVar("V")
#: How often an AvailableNow run with only a down broker's queues left looks for it again.
_POLL_S = 1.0
#: A broker known to be down is asked again at most this often (seconds).
_REPROBE_S = 2.0
#: A queue's mark (see Planner._marks) is taken again after this long (seconds), when the queue
#: has new messages: retention then never leaves it behind
_MARK_EVERY_S = 600.0
#: A mark that could not be taken is tried again after this long (seconds)
_MARK_RETRY_S = 60.0
#: Queues are looked over for marks to take at most this often (seconds; a queue restarted at its
#: earliest offset at once)
_MARK_SCAN_S = 5.0
#: Marks taken per trigger at most: one pull each, pipelined (many queues get theirs over a few triggers)
_MARKS_PER_TRIGGER = 256
#: How long a restarted queue waits for its new store's mark before it is read unmarked
#: (seconds; see Planner._hold_unmarked)
_UNMARKED_HOLD_S = 30.0
#: the retry budget of asking a broker known to be down again (seconds): quick faults (a
#: refused connection) are retried within it, a request that times out is not asked again
#: (brokerDownTimeoutMs bounds the wait for the broker, not a chain of timeouts per trigger)
_REPROBE_BUDGET_S = 1.0
# how often the "broker unavailable" warning repeats while the broker stays down (triggers
# come every few milliseconds when the other queues are busy; DEBUG in between)
_WARN_EVERY_S = 10.0


def _to_json(offsets: QueueOffsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark keeps them in its checkpoint (the canonical form, see :mod:`..offsets`)."""
    return Offsets(offsets).to_json()


def _mark_below(mark: Mark | None, end: int) -> Mark | None:
    """``mark`` when it names a message below ``end`` (one the planned range's store held)."""
    return mark if mark is not None and mark[0] < end else None


class Planner:
    """Offsets and partitions for one query (driver side).

    Offsets are next-offsets throughout (a queue's latest offset is one past its last
    message). Spark calls the planning methods one after another, so a planner is used
    from one thread at a time; it opens its client lazily and pickles without it."""

    def __init__(self, options: ReaderOptions, client: BrokerClient | None = None) -> None:
        self.options = options
        self._client = client
        self.tracker = InFlightTracker()
        self._store: BrokerOffsetStore | None = None
        self.target: QueueOffsets | None = None  # AvailableNow cap
        #: broker -> (monotonic time it was first found unavailable, why)
        self._down: dict[str, tuple[float, str]] = {}
        self._warned: dict[str, float] = {}
        self._probed: dict[str, float] = {}  # broker -> when a down broker was last asked
        #: max offsets fetched with the min offsets by check_data_loss, for the next latest() only
        self._highs: dict[MessageQueue, int] = {}
        self._group_checked = False
        #: topics seen with a route (one gone later means its brokers are down, see queues())
        self._routed: set[str] = set()
        #: a streaming query's membership of its group (see join_group), and what it knows of
        #: each queue: the offset the broker holds for the group as this query last wrote or
        #: read it (a different one later is a reset), what it planned and processed
        self._member: GroupPresence | None = None
        self._joined = False
        self._status: dict[MessageQueue, QueueStatus] = {}
        #: resets seen and not yet applied: queue -> (new offset, where it came from)
        self._resets: dict[MessageQueue, tuple[int, str]] = {}
        #: True once the broker's offsets were compared with this run's first offsets
        self._synced = False
        #: a new query (initialOffset ran in this run): the group's offsets it finds are its own
        self._fresh = False
        #: queues whose offset on the broker this run has read once (a restarted query compares
        #: each with its checkpoint at that first look, see _earlier_at_restart)
        self._looked: set[MessageQueue] = set()
        #: per queue, the offsets whose commit failed since the last one that went through (the
        #: broker may have applied one all the same, its answer lost): the broker holding one of
        #: them is not a reset
        self._unsure: dict[MessageQueue, set[int]] = {}
        #: queues whose reset the next batch follows: Spark's commit of the batch before it
        #: (it comes after the next batch is planned) no longer counts for them
        self._stale: set[MessageQueue] = set()
        #: queues a batch read's pushed filters leave (None: every queue of the topics)
        self.keep: Callable[[MessageQueue], bool] | None = None
        #: per queue, the mark of one message this query planned past: its offset and store time.
        #: A broker that lost its store (or whose topic was deleted and re-created) serves other
        #: messages at the same offsets once new ones arrive; whenever there is a reason to doubt a
        #: broker (see _note_doubts) the message at the mark is pulled again and compared before the
        #: queue is planned on. Kept in each batch's offsets (MARKS_KEY): a restarted query compares too
        self._marks: dict[MessageQueue, Mark] = {}
        self._marked_at: dict[MessageQueue, float] = {}  # when its mark was taken or last tried
        self._marks_scanned = -1e18  # when the queues were last looked over for marks to take
        self._marks_refused = False  # warned that a broker refuses the pulls marks are taken with
        #: queues whose marks are compared before they are planned on again
        self._doubts: set[MessageQueue] = set()
        #: broker -> its connection epoch when last seen (see BrokerClient.connection_epoch)
        self._epochs: dict[str, tuple[str, int]] = {}
        #: broker -> when it started (epoch ms), as it said at the query's last look (see _boot_now)
        self._boots: dict[str, int] = {}
        #: the group's offsets at the planning of the batch a restarted query starts from (adopt_group)
        self._at_planning: GroupAtPlanning | None = None
        #: broker -> its connection epoch when find_resets last read the group's offsets there
        self._offsets_read_over: dict[str, tuple[str, int] | None] = {}
        #: min offsets of the latest data-loss check (a mark below its queue's is gone by retention)
        self._lows: dict[MessageQueue, int] = {}
        #: queues the next batch reads again from their min offset: their broker no longer has
        #: what the query planned past (see take_restarts)
        self._restarts: QueueOffsets = {}
        #: restarted queues (their broker lost its store) not planned past their start until
        #: they are marked again, with when that began (see _hold_unmarked)
        self._unmarked: dict[MessageQueue, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader into its planning process: sockets open lazily there.
        state = dict(self.__dict__)
        state["_client"] = None
        state["_store"] = None
        state["_member"] = None
        state["_joined"] = False
        return state

    @property
    def client(self) -> BrokerClient:
        """The planner's client, connected on first use."""
        if self._client is None:
            self._client = connect(self.options.namesrv_addr, self.options.endpoints,
                                   _client_config(self.options.broker_down_timeout_ms),
                                   credentials=self.options.credentials)
        return self._client

    @property
    def store(self) -> BrokerOffsetStore:
        """The consumer group's offsets on the brokers; OptionError without a consumerGroup."""
        if self._store is None:
            if not self.options.consumer_group:
                raise OptionError("consumerGroup", None, "required to read or commit a group's offsets")
            self._store = BrokerOffsetStore(self.client, self.options.consumer_group,
                                            retry_after_s=RETRY_AFTER_S)
        return self._store

    def queues(self) -> list[MessageQueue]:
        """The topics' queues the routes list now. A topic that had queues and has no route
        now is not an error: name servers drop a broker's routes when its connection closes
        (a restart), so its planned queues wait for it like any down broker's (see
        :meth:`_unavailable`). A topic never seen with a route raises TopicNotFoundError."""
        out: list[MessageQueue] = []
        for topic in self.options.topics:
            try:
                queues = self.client.message_queues(topic, refresh=True)
            except TopicNotFoundError:
                if topic not in self._routed:
                    raise
                log.debug("topic %s has no route now (its brokers restarting?); its queues wait", topic)
                continue
            self._routed.add(topic)
            out.extend(q for q in queues if self.keep is None or self.keep(q))
        return sorted(out)

    def latest(self) -> QueueOffsets:
        """Max offsets of the queues the routes list now, without the brokers that do not
        answer (see :meth:`_ask_brokers`)."""
        return self._ask_brokers(self.queues(), self._highs_of)

    def latest_of(self, queues: Iterable[MessageQueue]) -> QueueOffsets:
        """Max offsets with every one of ``queues`` in: a broker that does not answer is waited
        for (polling, up to brokerDownTimeoutMs, then BrokerUnavailableError), as a batch read
        must not end without its queues."""
        wanted = list(queues)
        while True:
            latest = self.latest()
            missing = [mq for mq in wanted if mq not in latest]
            if not missing:
                return latest
            self._unavailable(missing)
            self._sleep(_POLL_S)

    def _lows_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Min offsets of one broker's queues, from one offset-range round (GET_TOPIC_STATS_INFO
        per topic); the max offsets it also brought are kept for the :meth:`latest` call of the
        same trigger (:meth:`_highs_of`), so a trigger asks each broker once. A broker that
        answers without a topic the query reads (deleted, or its store lost, and not created
        again yet) counts as unavailable: its queues wait for the topic like a down broker's."""
        try:
            ranges = self.client.offset_ranges(mqs)
        except TopicNotFoundError as exc:
            raise ConnectionFailedError(exc.address, exc.operation,
                                        f"the broker does not have the topic now ({exc.remark}): deleted, or its "
                                        "store lost? Its queues wait until it is there again") from None
        self._highs.update({mq: hi for mq, (_lo, hi) in ranges.items()})
        return {mq: lo for mq, (lo, _hi) in ranges.items()}

    def _highs_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Max offsets of one broker's queues: those the data-loss check of this trigger just
        fetched (used once), else asked now."""
        kept = {mq: self._highs.pop(mq) for mq in mqs if mq in self._highs}
        missing = [mq for mq in mqs if mq not in kept]
        if missing:
            kept.update(self.client.max_offsets(missing))
        return kept

    def _ask_brokers(self, queues: list[MessageQueue],
                     ask: Callable[[list[MessageQueue]], dict[MessageQueue, V]], *,
                     fail: bool = True) -> dict[MessageQueue, V]:
        """``ask(queues of one broker)`` for every broker (the client pipelines the per-queue
        requests); a broker that fails with a transient fault (after the client's retries,
        bounded by brokerDownTimeoutMs) is noted as down since the request that failed went
        out, and the caller reads on with the rest. A broker known to be down is asked again
        only every ``_REPROBE_S`` and then once (no chain of request timeouts), so a broker
        that stopped answering neither slows every trigger down nor stretches the wait
        brokerDownTimeoutMs bounds. With ``fail``, a down broker is said (:meth:`_unavailable`:
        a warning when it is found, BrokerUnavailableError once it has been down for longer
        than brokerDownTimeoutMs and did not answer the last time it was asked)."""
        out: dict[MessageQueue, V] = {}
        now = time.monotonic()
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_broker.setdefault(mq.broker, []).append(mq)
        for b, mqs in by_broker.items():
            down = self._down.get(b)
            if down is not None and now - self._probed.get(b, 0.0) < _REPROBE_S:
                if fail:
                    self._unavailable(mqs)
                continue
            asked = time.monotonic()
            try:
                if down is None:
                    out.update(ask(mqs))
                else:
                    with bounded(_REPROBE_BUDGET_S):
                        out.update(ask(mqs))
            except RocketMQSparkError as exc:
                if not exc.retriable:
                    raise
                self._probed[b] = time.monotonic()
                if down is None:
                    self._down[b] = (asked, str(exc))
                if fail:
                    self._unavailable(mqs)
        for broker in {mq.broker for mq in out}:
            if self._down.pop(broker, None) is not None:
                self._warned.pop(broker, None)
                if self._store is not None:  # its commits need not wait any longer
                    self._store.answered(broker)
                log.warning("broker %s answers again; reading its queues", broker)
        return out

    def _unavailable(self, queues: list[MessageQueue]) -> None:
        """Queues with planned offsets that cannot be read now (their broker is down or gone
        from the routes): they keep their offsets (never skipped) for up to
        brokerDownTimeoutMs, then the query fails naming the broker."""
        now = time.monotonic()
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_broker.setdefault(mq.broker, []).append(mq)
        for broker, mqs in sorted(by_broker.items()):
            since, why = self._down.setdefault(broker, (now, "its queues are no longer in the topic's route"))
            waited = now - since
            names = ", ".join(str(m) for m in sorted(mqs))
            if waited * 1000 >= self.options.broker_down_timeout_ms:
                raise BrokerUnavailableError(
                    f"broker {broker} has been unavailable for {waited:.0f}s ({why}); its queues {names} are not "
                    f"read and keep their offsets in the checkpoint: restart the query when the broker is back "
                    f"(brokerDownTimeoutMs={self.options.broker_down_timeout_ms} bounds the wait)")
            last = self._warned.get(broker)
            level = logging.WARNING if last is None or now - last >= _WARN_EVERY_S else logging.DEBUG
            if level == logging.WARNING:
                self._warned[broker] = now
            log.log(level, "broker %s unavailable for %.0fs (%s): queues %s wait at their offsets, the others "
                    "are read", broker, waited, why, names)

    def _start_for(self, mq: MessageQueue, how: str) -> int:
        if how == "earliest":
            return self.client.min_offset(mq)
        if how == "latest":
            return self.client.max_offset(mq)
        raise AssertionError(how)

    def initial(self) -> QueueOffsets:
        """Start offsets of every queue (startingTimestamp, startingOffsets, or the group's
        offsets with consumeFromWhere). A queue's start cannot be guessed, so a broker that
        is down is waited for (polling, up to brokerDownTimeoutMs), then the query fails."""
        queues = self.queues()
        self._synced = True  # a new query: the group's offsets are its own from here on
        self._fresh = True
        while True:
            out = self._ask_brokers(queues, self._starts_of)
            missing = [mq for mq in queues if mq not in out]
            if not missing:
                return out
            self._unavailable(missing)
            self._sleep(_POLL_S)

    def _starts_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        o = self.options
        if o.starting == "group" and o.starting_timestamp is None:
            committed = self.store.read_many(mqs)
            out = {mq: off for mq, off in committed.items() if off is not None}
            rest = [mq for mq in mqs if mq not in out]
            if rest:
                ask = self.client.min_offsets if o.consume_from_where == "earliest" else self.client.max_offsets
                out.update(ask(rest))
            return out
        if o.starting_timestamp is None and o.starting in ("earliest", "latest"):
            return (self.client.min_offsets if o.starting == "earliest" else self.client.max_offsets)(mqs)
        return {mq: self._start_of(mq) for mq in mqs}

    def _start_of(self, mq: MessageQueue) -> int:
        o = self.options
        if o.starting_timestamp is not None:
            return self.client.search_offset(mq, o.starting_timestamp)
        if o.starting == "group":
            committed = self.store.read(mq)
            return committed if committed is not None else self._start_for(mq, o.consume_from_where)
        if o.starting == "json":
            given = o.starting_json.get(mq) if o.starting_json is not None else None
            if given is None or given == -2:
                return self.client.min_offset(mq)
            if given == -1:
                return self.client.max_offset(mq)
            return given
        return self._start_for(mq, o.starting)

    def check_data_loss(self, start: QueueOffsets) -> QueueOffsets:
        """Starts whose messages the broker no longer has: below a queue's min offset (deleted
        by retention), or lost (:meth:`_lost_queues`: above its max offset, or past a message
        that is not the one this query planned past). With failOnDataLoss=true, DataLossError;
        else logged, and ``start`` is returned with the retention gaps skipped (moved up to the
        min offset) and the lost queues moved back to their min offset (:meth:`take_restarts`),
        a down broker's queues unchanged."""
        fixed = dict(start)
        self._highs.clear()
        was_down = set(self._down)
        lows = self._ask_brokers(sorted(start), self._lows_of)
        self._lows = lows
        self._note_doubts(start, was_down)
        suspect = [mq for mq in self._doubts if mq in lows]
        for mq, off in start.items():
            low = lows.get(mq)
            if low is None:
                continue  # its broker is down: next_end keeps the offset
            if off > self._highs.get(mq, off):
                suspect.append(mq)
            elif off < low:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{mq}: offsets [{off}, {low}) were deleted by retention before they were read; "
                        "set failOnDataLoss=false to skip them")
                log.warning("%s: skipping offsets [%d, %d) deleted by retention (failOnDataLoss=false)",
                            mq, off, low)
                fixed[mq] = low
        ranges = {mq: (lows[mq], self._highs[mq]) for mq in suspect if mq in self._highs}
        fixed.update(self._lost_queues(start, ranges))
        return fixed

    # -- a broker that lost what the query planned past ---------------------------------

    def _note_doubts(self, queues: Iterable[MessageQueue], was_down: set[str]) -> None:
        """Queues of ``queues`` whose broker may have changed under the query are doubted (their
        marks are compared before they are planned on, see :meth:`_lost_queues`): those of a
        broker that did not answer (down, or its queues gone from the routes; ``was_down``: the
        brokers noted down before the call that just asked them) and those of a broker the
        client had to connect to anew (it restarted or was replaced between two triggers).
        Costs no request: both are known from the planner's usual calls."""
        changed = was_down | set(self._down)
        for broker in {mq.broker for mq in queues}:
            epoch = self.client.connection_epoch(broker)
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
        if self.options.fail_on_data_loss:
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
                lost[mq] = (f"the query's next offset is {start[mq]}, and offset {off}, stored at {_iso(ts)} when "
                            f"the query planned past it, holds a message stored at {_iso(now)}")
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
                pending.append((mq, self.client.pull_async(mq, off, 1)))
            except RocketMQSparkError as exc:
                failed[mq] = exc
        out: dict[MessageQueue, int | None] = {}
        for mq, p in pending:
            try:
                res = self.client.pull_result(mq, p)
                out[mq] = self._store_time_in(mq, offsets[mq], res)
            except RocketMQSparkError as exc:
                failed[mq] = exc
        return out, failed

    def _store_time_in(self, mq: MessageQueue, offset: int, res: PullResult) -> int | None:
        return _store_time_in(self.client, mq, offset, res)

    def _restart(self, mq: MessageQueue, offset: int) -> None:
        """The queue is read again from ``offset`` (below where the query stood): what was
        planned or done before no longer counts for its commits (Spark's commit of the batch
        planned before is dropped, see :meth:`commit`), and its mark is taken anew."""
        self.tracker.reset(mq, offset)
        self._stale.add(mq)
        if self._store is not None:
            self._store.forget(mq)
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

    def _take_marks(self, begin: QueueOffsets, end: QueueOffsets) -> None:
        """Marks the last message of each queue's batch ``[begin, end)`` (the next batch starts
        past it) where the queue has no mark, or one outside [its min offset, ``end``), or, when
        the batch has new messages, one older than ``_MARK_EVERY_S``: so a trigger asks nothing
        more but these rare pulls, and idle triggers leave the batch offsets as they were. At
        most ``_MARKS_PER_TRIGGER`` per trigger; one that cannot be taken is tried again after
        ``_MARK_RETRY_S``. The queues are looked over every ``_MARK_SCAN_S`` (a few dict
        lookups per queue: not every trigger)."""
        now = time.monotonic()
        if now - self._marks_scanned < _MARK_SCAN_S:
            return
        self._marks_scanned = now
        due: dict[MessageQueue, int] = {}
        for mq in end:
            e, lo = end[mq], self._lows.get(mq, 0)
            if e <= lo:
                continue  # no message before the end
            mark = self._marks.get(mq)
            since = now - self._marked_at.get(mq, -1e18)
            if mark is not None and lo <= mark[0] < e:
                if e == begin[mq] or since < _MARK_EVERY_S:
                    continue
            elif since < _MARK_RETRY_S:
                continue
            due[mq] = e - 1
            if len(due) >= _MARKS_PER_TRIGGER:
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

    def _hold_unmarked(self, begin: QueueOffsets, end: QueueOffsets) -> bool:
        """Keeps each restarted queue at its start (``end[mq] = begin[mq]``, in place) until
        its new store is marked: its read task compares the mark before handing rows on, and
        without one a store lost again before the task reads (a broker restarted twice in a
        row) would be read as the planned one, then read again once the loss is seen. The
        mark is asked for at every trigger; a broker that does not answer the pull holds the
        queue, for up to ``_UNMARKED_HOLD_S`` (then it is read unmarked, with a warning), one
        that refuses it (a permission) lets it go at once. True when a queue was held."""
        held = False
        due: dict[MessageQueue, int] = {}
        for mq in list(self._unmarked):
            if mq not in end or end[mq] <= begin[mq]:
                continue
            mark = self._marks.get(mq)
            if mark is not None and self._lows.get(mq, 0) <= mark[0] < end[mq]:
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
                del self._unmarked[mq]  # refused: read unmarked, as _take_marks says
            elif now - self._unmarked[mq] >= _UNMARKED_HOLD_S:
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

    def next_end(self, start: QueueOffsets, limit: ReadLimit) -> QueueOffsets:
        """The end offsets of the next batch (registered as in flight).

        Queues of a broker that is down or gone from the routes keep their start offsets
        (:meth:`_unavailable` bounds that). Under Trigger.AvailableNow, a run with nothing
        else left to read waits for such a broker (polling every ``_POLL_S``) rather than
        end with its queues unread."""
        while True:
            was_down = set(self._down)
            latest = self.latest()
            start = self._checked(start, latest, was_down)
            missing = [mq for mq in start if mq not in latest]
            if missing:
                self._unavailable(missing)  # raises once the broker has been away too long
            if self.target is not None:
                latest = {mq: min(v, self.target.get(mq, v)) for mq, v in latest.items()}
            begin: QueueOffsets = {}
            for mq, hi in latest.items():
                s = start.get(mq)
                if s is None:  # a new queue: from its earliest offset
                    s = self.client.min_offset(mq)
                begin[mq] = min(s, hi) if s <= hi else s
            end = {mq: max(begin[mq], latest[mq]) for mq in latest}
            if isinstance(limit, ReadMaxRows):
                end = self._admit(begin, end, limit.max_rows)
            self._take_marks(begin, end)
            held = self._hold_unmarked(begin, end)
            if not ((missing or held) and self.target is not None and all(end[mq] == begin[mq] for mq in end)):
                break
            self._sleep(_POLL_S)
        now = int(time.time() * 1000)
        for mq in end:
            self.tracker.register(mq, begin[mq], end[mq])
            st = self._status_of(mq)
            st.planned, st.last_planned_ms = end[mq], now
        for mq in missing:  # carried as they are: a restarted broker's queues resume there
            end[mq] = start[mq]
        return end

    def _checked(self, start: QueueOffsets, latest: QueueOffsets, was_down: set[str]) -> QueueOffsets:
        """``start`` with the lost queues among those ``latest`` answered for restarted (see
        :meth:`_lost_queues`; a broker that answers again here, after the data-loss check of
        this trigger, is doubted now). Doubted queues that cannot be compared now are taken out
        of ``latest``: they wait like a down broker's (their broker noted down)."""
        self._note_doubts(start, was_down)
        doubted = sorted(mq for mq in self._doubts if mq in latest and mq in start)
        if not doubted:
            return start
        try:
            ranges = self.client.offset_ranges(doubted)
        except (ConnectionFailedError, TopicNotFoundError) as exc:
            ranges, why = {}, str(exc)
        else:
            why = "its queues' marks could not be compared"
        moved = self._lost_queues({mq: start[mq] for mq in doubted}, ranges)
        for mq in doubted:
            if mq in self._doubts:
                latest.pop(mq, None)
                self._down.setdefault(mq.broker, (time.monotonic(), why))
        return {**start, **moved}

    @staticmethod
    def _sleep(seconds: float) -> None:
        time.sleep(seconds)

    def check_group(self) -> None:
        """Once per query, of every broker serving the topics: fail when other clients consume
        in the group (their commits would interleave with Spark's), unless allowSharedGroup
        (remoting only: gRPC has no consumer-list call; members of gone processes of this host are
        passed, see :func:`~..client.membership.crashed_member`); and make sure the brokers know the
        group before its offsets are committed (see :meth:`_make_group_known`)."""
        if self._group_checked or not self.options.consumer_group:
            return
        self._group_checked = True
        group = self.options.consumer_group
        if not self.options.allow_shared_group:
            self._refuse_other_consumers(group)
        if self.options.commit_offsets:
            self._make_group_known(group)

    def _refuse_other_consumers(self, group: str) -> None:
        others = self.client.group_consumers(group, self.options.topics)
        if others is None:
            log.info("consumer group %s: online consumers cannot be listed over gRPC; not checked", group)
            return
        live: dict[str, list[str]] = {}
        for broker, ids in sorted(others.items()):
            for cid in ids:
                if crashed_member(cid):
                    log.warning("consumer group %s: broker %s still lists %s, of a process of this host that is gone "
                                "(a crash it did not see): passed", group, broker, cid)
                else:
                    live.setdefault(broker, []).append(cid)
        if live:
            listed = "; ".join(f"{b}: {', '.join(ids)}" for b, ids in sorted(live.items()))
            raise GroupInUseError(
                f"consumer group {group!r} has online consumers ({listed}); their offset commits would interleave "
                f"with this query's. Use a consumerGroup of its own, or set allowSharedGroup=true to accept that (a "
                f"driver of this group that crashed on another host where a broker could not see it stays listed "
                f"there for up to 2 minutes)")

    def _make_group_known(self, group: str) -> None:
        """Brokers refuse offset commits of a consumer group they do not know and create one
        only on a consumer's heartbeat or pull (autoCreateSubscriptionGroup), its retry topic
        %RETRY%<group> (which mqadmin consumerProgress needs) only on a heartbeat. A broker
        whose queues get no data would never see either, so each broker is told of the group
        once (:meth:`BrokerClient.make_group_known`: the query does not stay listed as an online
        consumer); where the broker does not create groups that fails at once with
        :class:`GroupNotFoundError` naming the group."""
        subs = self.options.subscriptions
        seen: set[str] = set()
        for topic in self.options.topics:
            for mq in self.client.message_queues(topic):
                if mq.broker in seen:
                    continue
                seen.add(mq.broker)
                try:
                    self.client.make_group_known(group, mq, subs)
                except ConnectionFailedError as exc:  # its queues wait for it (see _unavailable)
                    log.warning("consumer group %s not checked on broker %s: %s", group, mq.broker, exc)

    @staticmethod
    def _admit(begin: QueueOffsets, end: QueueOffsets, budget: int) -> QueueOffsets:
        """Split ``budget`` messages across queues in proportion to their backlog."""
        backlog = {mq: end[mq] - begin[mq] for mq in end}
        total = sum(backlog.values())
        if total <= budget:
            return end
        share = {mq: backlog[mq] * budget // total for mq in backlog}
        left = budget - sum(share.values())
        for mq in sorted(backlog, key=lambda m: (-(backlog[m] - share[m]), m)):
            if left <= 0:
                break
            if share[mq] < backlog[mq]:
                share[mq] += 1
                left -= 1
        return {mq: begin[mq] + share[mq] for mq in end}

    def partitions(self, start: QueueOffsets, end: QueueOffsets,
                   marks: dict[MessageQueue, Mark] | None = None) -> list[QueueRange]:
        """A :class:`QueueRange` per queue of ``end`` that has messages to read (``end`` above
        its start; a queue missing from ``start`` starts at its min offset, asked now), cut
        into about minPartitions pieces in proportion to their size when that asks for more.
        Each carries its queue's mark below ``end`` (``marks``: those the batch's offsets kept
        when it was planned; else this planner's), which its task compares (see _pulls)."""
        o = self.options
        known = self._marks if marks is None else marks
        ranges = []
        for mq in sorted(end):
            s = start.get(mq)
            if s is None:
                s = self.client.min_offset(mq)
            if end[mq] > s:
                ranges.append((mq, s, end[mq]))
        want = o.min_partitions or 0
        if want > len(ranges) and ranges:
            total = sum(e - s for _, s, e in ranges)
            split = []
            for mq, s, e in ranges:
                pieces = max(1, min(e - s, round(want * (e - s) / total)))
                step = -(-(e - s) // pieces)
                for a in range(s, e, step):
                    split.append((mq, a, min(e, a + step)))
            ranges = split
        addrs = {} if o.endpoints else {mq.broker: self._known_addr(mq) for mq, _s, _e in ranges}
        now = time.monotonic()
        silent = {b: now - since for b, (since, _why) in self._down.items()}
        return [QueueRange(mq, s, e, o.namesrv_addr, o.endpoints, o.consumer_group or "", o.sub_expression,
                           o.pull_batch_size, o.fail_on_data_loss, o.broker_down_timeout_ms, o.credentials,
                           o.include_retry_topic, o.columns, addrs.get(mq.broker), silent.get(mq.broker, 0.0),
                           _mark_below(known.get(mq), end[mq]))
                for mq, s, e in ranges]

    def _known_addr(self, mq: MessageQueue) -> str | None:
        """The address the routes give ``mq``'s broker (None: none now; the task looks it up)."""
        try:
            return self.client.broker_addr(mq.broker, mq.topic)
        except RocketMQSparkError:
            return None

    def processed(self, start: QueueOffsets) -> bool:
        """The batch ending at ``start`` finished: Spark plans a batch (latestOffset) only once
        the one before it is done, and a restarted query runs the batch its offset log planned
        before it plans again. So the group's offsets go to the brokers at every trigger, an
        idle one included, not only when Spark commits a batch as the next one starts (it
        never does for the last batch before an idle stretch or the end of an AvailableNow
        run). Queues with a reset noted (see :meth:`find_resets`) are left to
        :meth:`follow_resets`, those read again from their first offset (their broker lost its
        store, see :meth:`take_restarts`) to the batch that does; a queue is written only when
        the broker does not hold the offset already as far as the query knows (what it last wrote
        or read there). True when a broker ignored a write because a
        server-side reset of the queue waits (noted as a reset: :meth:`follow_resets` applies it)."""
        return self._done({mq: off for mq, off in start.items()
                           if mq not in self._resets and mq not in self._restarts})

    def commit(self, end: QueueOffsets) -> None:
        """Spark's commit of the batches up to ``end`` (it comes as the batch after them starts,
        after :meth:`processed` wrote the same offsets at that batch's planning): what the
        broker does not hold yet is written (a commit that failed at planning). The end of a
        batch planned before a queue's reset no longer counts for that queue."""
        fresh: QueueOffsets = {}
        for mq, off in end.items():
            if mq in self._stale:  # the end of a batch planned before the queue's reset
                self._stale.discard(mq)
                continue
            fresh[mq] = off
        # resets a commit would overwrite are left to the next batch (see follow_resets): those
        # pushed since, and, before this run has read the group's offsets once (Spark plans, and
        # so reads them in latestOffset, before it commits), the broker's moved offsets
        self._done(fresh, find=True)

    def _done(self, end: QueueOffsets, *, find: bool = False) -> bool:
        """Spark processed everything below ``end``: with commitOffsets and a consumerGroup,
        each queue's committable offset (min-unconsumed rule, :class:`InFlightTracker`) goes to
        the brokers where they do not hold it as far as the query knows. Broker faults are
        logged and retried at the next write, not raised (:meth:`BrokerOffsetStore.commit`); a
        broker found unreachable is noted as down (asked again at the next trigger, see
        :meth:`_ask_brokers`)."""
        committable: QueueOffsets = {}
        for mq, off in end.items():
            self.tracker.complete_through(mq, off)
            self._status_of(mq).processed = off
            c = self.tracker.committable(mq)
            if c is not None:
                committable[mq] = c
        if not self.options.commit_offsets or not self.options.consumer_group:
            return False
        if find:
            self.find_resets(committable, read=not self._synced, fail=False)
        todo = {mq: off for mq, off in committable.items()
                if mq not in self._resets and self._status_of(mq).committed != off}
        return bool(todo or self.store.pending) and self._write_offsets(todo)

    def _write_offsets(self, offsets: QueueOffsets) -> bool:
        """Write ``offsets`` as the group's (:meth:`BrokerOffsetStore.commit`: failures logged and
        retried at the next write); a broker found unreachable is noted down, and what each broker
        took is what the query expects it to hold (see find_resets). A write a broker ignored
        because a server-side reset of the queue waits for the group's next pull is that reset,
        noted (True returned): the broker holds the reset offset until then."""
        asked = time.monotonic()
        with bounded(_REPROBE_BUDGET_S):  # a failed commit waits for the next commit, not a chain of timeouts
            failed = self.store.commit(offsets)
        waiting = sorted(mq for mq, exc in failed.items() if isinstance(exc, OffsetResetPendingError))
        if waiting:
            try:
                with bounded(_REPROBE_BUDGET_S):
                    held = self.store.read_many(waiting)
            except RocketMQSparkError as why:
                log.warning("group %s: resets wait on the brokers of %s, their offsets not readable now (the next "
                            "trigger compares them): %s", self.options.consumer_group, waiting, why)
                held = {}
            for mq in waiting:
                off = held.get(mq)
                if off is not None:
                    self._note_reset(mq, off, f"the broker ignored the query's commit of {offsets.get(mq)}: a "
                                              f"server-side reset to {off} waits for the group's next pull")
        for mq, exc in failed.items():
            if isinstance(exc, OffsetResetPendingError):
                continue
            if isinstance(exc, ConnectionFailedError):  # the next batch's tasks count from here
                self._down.setdefault(mq.broker, (asked, str(exc)))
            if mq in offsets:
                self._unsure.setdefault(mq, set()).add(offsets[mq])
        now = int(time.time() * 1000)
        for mq, off in offsets.items():
            if mq not in failed:
                st = self._status_of(mq)
                st.committed, st.last_committed_ms = off, now
                self._unsure.pop(mq, None)
        return any(mq in self._resets for mq in waiting)

    # -- the group: membership and offset resets ---------------------------------------

    def _status_of(self, mq: MessageQueue) -> QueueStatus:
        st = self._status.get(mq)
        if st is None:
            st = self._status[mq] = QueueStatus()
        return st

    def running_info(self) -> dict[MessageQueue, QueueStatus]:
        """What the query has planned, processed and committed per queue (for the brokers'
        GET_CONSUMER_RUNNING_INFO: mqadmin consumerStatus, rocketmq-spark progress)."""
        return {mq: replace(st) for mq, st in list(self._status.items())}

    def join_group(self) -> None:
        """Once per streaming query with a consumerGroup: become an online consumer of it on
        its brokers (after the shared-group check, which would otherwise see this query)."""
        if self._joined or not self.options.consumer_group:
            return
        self._joined = True
        subs = self.options.subscriptions
        try:
            self._member = self.client.join_group(self.options.consumer_group, subs, self.running_info)
        except RocketMQSparkError as exc:  # presence is for the tools: reading goes on without it
            log.warning("consumer group %s: not registered as an online consumer: %s", self.options.consumer_group,
                        exc)

    def leave_group(self) -> None:
        if self._member is not None:
            self._member.close()
            self._member = None

    def find_resets(self, expected: QueueOffsets, *, read: bool = True, fail: bool = True) -> None:
        """Note the resets of the group's offsets since the last look: those brokers pushed
        (RESET_CONSUMER_CLIENT_OFFSET), and, with ``read``, queues whose offset on the broker is
        not the one this query last wrote or read there (a 5.x broker's server-side reset, an
        operator's direct write). ``expected`` are the offsets the query stands at (a batch's end).
        A broker that does not answer is compared later; with ``fail`` it may fail the query
        (see :meth:`_ask_brokers`)."""
        group = self.options.consumer_group
        if not group:
            return
        if self._member is not None:
            for notice in self._member.take_resets():
                for mq, off in notice.offsets.items():
                    when = "now" if notice.timestamp_ms < 0 else f"timestamp {notice.timestamp_ms}"
                    self._note_reset(mq, off, f"RESET_CONSUMER_CLIENT_OFFSET from {notice.broker_addr} ({when})")
        if not read or not self.options.commit_offsets or self.options.allow_shared_group:
            return  # not asked, or the group's offsets are not this query's alone to compare
        mqs = sorted(mq for mq in expected if mq not in self._resets)
        if not mqs:
            return
        held = self._ask_brokers(mqs, self.store.read_many, fail=fail)  # a down broker's: compared later
        reconnected = self._reconnected_since_read({mq.broker for mq in held})
        # whether each broker reached anew restarted (its boot time; None: it does not say)
        restarted = {broker: self._restarted_since(broker) for broker in reconnected}
        for broker in {mq.broker for mq in held} - reconnected:
            if broker not in self._boots:
                self._boot_now(broker)
        behind: QueueOffsets = {}  # queues the broker holds below the checkpoint at this run's first look
        for mq in mqs:
            if mq not in held:
                continue
            now_held = held[mq]
            st = self._status_of(mq)
            first = not self._fresh and mq not in self._looked  # this run's first look at a restart
            self._looked.add(mq)
            if now_held is None:
                if st.committed >= 0:  # the broker lost an offset it took (see BrokerOffsetStore.commit)
                    self.store.forget(mq)
                    self.doubt(mq)  # as a broker that lost its store does: compare the queue's mark
                    st.committed = -1  # written again by the next commit
                continue
            if st.committed < 0:
                st.committed = now_held
                if first and now_held > expected[mq]:
                    # the broker holds a later offset than the checkpoint: never one this query
                    # wrote (it commits what its checkpoint holds): a reset while it was stopped
                    self._note_reset(mq, now_held, f"the group's offset on the broker ({now_held}) is past the "
                                                   f"checkpoint's ({expected[mq]}): reset while the query was stopped")
                elif first and now_held < expected[mq]:
                    why = self._earlier_at_restart(mq, now_held, expected[mq])
                    if why is None:
                        behind[mq] = expected[mq]
                    else:
                        self._note_reset(mq, now_held, why)
                continue
            if now_held == st.committed:
                continue
            if now_held in self._unsure.get(mq, ()):
                # a commit of this query whose answer was lost: the broker applied it
                log.info("%s: group %s's offset on the broker is %d, a commit of this query whose answer was lost, "
                         "not a reset", mq, group, now_held)
                st.committed = now_held
                del self._unsure[mq]
                continue
            if now_held < st.committed and mq.broker in reconnected and restarted.get(mq.broker) is not False:
                # lower, read over a new connection: the broker restarted (or was reached anew)
                # since the last read. A broker killed before it flushed its consumer offsets
                # (every 5 s on Apache RocketMQ) comes back with an older one, which a query
                # restarted meanwhile never wrote itself: followed as a reset, its Parquet output
                # got 620 rows twice (the fault suite, seed 2912). The next commit writes this
                # query's offset again; a reset made while the broker restarted goes unseen
                log.warning("%s: group %s's offset on broker %s is %d after it was reached anew, not %d: taken for "
                            "commits the broker lost in a restart, not a reset; the next commit writes the query's "
                            "offset again", mq, group, mq.broker, now_held, st.committed)
                st.committed = now_held
                self.store.forget(mq)
                continue
            self._note_reset(mq, now_held, f"the group's offset on the broker changed from {st.committed} to "
                                           f"{now_held} (a server-side reset or a direct write)")
        self._synced = True
        if behind:
            # the checkpoint's offsets go to the broker now: Spark processed everything below
            # them and commits a batch only when the next one starts, so a driver killed after
            # its last batch left the broker behind for good when no new message came (the
            # driver-kill test: 3,250 of 3,750 on every queue after the final AvailableNow run)
            self._write_offsets(behind)

    def _note_reset(self, mq: MessageQueue, offset: int, why: str) -> None:
        """A reset of ``mq`` to ``offset``, followed by the next batch (see follow_resets): no
        write of the query's, a retried one included, overwrites it meanwhile."""
        self._resets[mq] = (offset, why)
        if self._store is not None:
            self._store.forget(mq)
        self._unsure.pop(mq, None)

    def _boot_now(self, broker: str) -> int | None:
        """When ``broker`` started, as it says now (asked once per connection); None when it does
        not say or does not answer. Noted as the broker's boot time the query knows."""
        try:
            with bounded(_REPROBE_BUDGET_S):
                boot = self.client.broker_boot_ms(broker)
        except RocketMQSparkError as exc:
            log.debug("boot time of broker %s not known: %s", broker, exc)
            return None
        if boot is not None:
            self._boots[broker] = boot
        return boot

    def _restarted_since(self, broker: str) -> bool | None:
        """Whether ``broker`` restarted since the query last asked (its boot time changed); None
        when that is not known (the broker or the transport does not say)."""
        then = self._boots.get(broker)
        now = self._boot_now(broker)
        if then is None or now is None:
            return None
        return now != then

    def adopt_group(self, at: GroupAtPlanning | None) -> None:
        """The group's offsets on the brokers when the batch ``start`` ends was planned, from
        Spark's offset log (see :data:`~rocketmq_spark.offsets.GROUP_KEY`): a restarted query
        compares them at its first look (see :meth:`_earlier_at_restart`)."""
        if not self._fresh and at is not None and self._at_planning is None:
            self._at_planning = at

    def _earlier_at_restart(self, mq: MessageQueue, now_held: int, expected: int) -> str | None:
        """At a restart's first look the broker holds ``now_held`` for ``mq``, below the
        checkpoint's ``expected``: a reset made while the query was stopped (returned: why), or
        an offset the query wrote itself (None: the query reads on from its checkpoint and writes
        it). It wrote the ones the offset log's last batch names (the previous batch's end, what the
        broker held then); a broker that restarted since may hold an older one (its last commits
        lost), and where that cannot be known (a checkpoint written before this, the gRPC
        transport) the checkpoint wins, logged."""
        group = self.options.consumer_group
        at = self._at_planning
        own = at.held.get(mq) if at is not None else None
        if own is not None and now_held in own:
            if self._reset_pending(mq, now_held, expected):
                return (f"the broker answered the group's pull at {expected} with a reset to {now_held} (a server-side "
                        f"reset made while the query was stopped)")
            log.info("%s: group %s holds %d on the broker, the checkpoint %d: the query stopped before it wrote its "
                     "last batch's end (or a reset to exactly that offset the broker keeps no trace of); the query "
                     "reads on from the checkpoint and writes its offset there", mq, group, now_held, expected)
            return None
        then = at.boot.get(mq.broker) if at is not None else None
        now = self._boot_now(mq.broker) if then is not None else None
        if own is not None and then is not None and now == then:
            return (f"the group's offset on the broker ({now_held}) is before the checkpoint's ({expected}) and not "
                    f"one the query wrote ({', '.join(map(str, own))}), on a broker that has not restarted since: "
                    f"reset while the query was stopped")
        log.info("%s: group %s holds %d on the broker, the checkpoint %d: commits the broker lost in a restart, or a "
                 "reset to an earlier time made while the query was stopped; %s, so the query reads on from the "
                 "checkpoint and writes its offset there", mq, group, now_held, expected,
                 "the broker restarted since" if then is not None and now is not None else
                 "the two cannot be told apart here")
        return None

    def _reset_pending(self, mq: MessageQueue, offset: int, at: int) -> bool:
        """Whether ``mq``'s broker has a server-side reset of the group to ``offset`` waiting for
        its next pull (5.x brokers and the embedded one: the pull is answered PULL_OFFSET_MOVED
        with the reset offset, once). The group's pull at ``at`` asks; a broker without such
        resets answers it as any pull."""
        try:
            with bounded(_REPROBE_BUDGET_S):
                res = self.client.pull(mq, at, 1, group=self.options.consumer_group or "",
                                       subscription=self.options.sub_expression)
        except RocketMQSparkError as exc:
            log.info("%s: not asked whether a reset waits on the broker: %s", mq, exc)
            return False
        return (res.status == "OFFSET_ILLEGAL" and res.next_offset == offset != at
                and 0 <= res.min_offset <= at <= res.max_offset)

    def group_at_planning(self, prev: QueueOffsets, end: QueueOffsets, restarted: Iterable[MessageQueue]
                          ) -> GroupAtPlanning | None:
        """What a batch's offsets keep of the group (see :meth:`adopt_group`): per queue of
        ``end``, the offsets the broker may hold from the query's writes until the next batch is
        planned (what it holds as the query knows it, those whose write failed since, which it may
        have applied, and ``prev``, the previous batch's end, that Spark's commit may still
        write), and the boot time of each broker."""
        if not self.options.consumer_group or not self.options.commit_offsets or self.options.allow_shared_group:
            return None
        skip = set(restarted)
        held: dict[MessageQueue, tuple[int, ...]] = {}
        for mq in end:
            offs = {self._status_of(mq).committed, *self._unsure.get(mq, ())}
            if mq in prev and mq not in skip:
                offs.add(prev[mq])
            held[mq] = tuple(sorted(o for o in offs if o >= 0))
        boot = {b: self._boots[b] for b in {mq.broker for mq in end} if b in self._boots}
        return GroupAtPlanning({mq: o for mq, o in held.items() if o}, boot)

    def _reconnected_since_read(self, brokers: Iterable[str]) -> set[str]:
        """Brokers of ``brokers`` the client reached over another connection than at the
        previous read of the group's offsets (restarted, or reached anew after a fault); notes
        the connection of this read."""
        out: set[str] = set()
        for broker in brokers:
            epoch = self.client.connection_epoch(broker)
            if broker in self._offsets_read_over and self._offsets_read_over[broker] != epoch:
                out.add(broker)
            self._offsets_read_over[broker] = epoch
        return out

    def follow_resets(self, start: QueueOffsets) -> QueueOffsets:
        """Apply the resets noted (see :meth:`find_resets`) to the next batch's ``start``, as
        onOffsetReset says: follow (the batch starts each reset queue at its new offset; returned,
        they go into the batch's offsets, so a restart replays the same ranges), fail, or
        ignore. Either way the broker's hold on a reset queue is released (a pull of the group),
        so the query's later commits are taken."""
        if not self._resets:
            return {}
        # a pushed reset names every queue of its topic; those this query does not read are not its
        resets = {mq: v for mq, v in self._resets.items() if mq in start}
        self._resets = {}
        if not resets:
            return {}
        group = self.options.consumer_group or ""
        how = self.options.on_offset_reset
        if how == "fail":
            listed = "; ".join(f"{mq}: {start.get(mq, '?')} -> {off} ({why})"
                               for mq, (off, why) in sorted(resets.items()))
            raise OffsetResetError(
                f"the offsets of consumer group {group!r} were reset while this query reads it ({listed}); "
                f"onOffsetReset=fail stops the query. Restart it to read from the reset offsets (startingOffsets="
                f"group on a new checkpoint), or set onOffsetReset=follow or ignore")
        followed: QueueOffsets = {}
        for mq, (off, why) in sorted(resets.items()):
            self._release(mq, off)
            self.store.forget(mq)
            st = self._status_of(mq)
            if how == "ignore":
                log.warning("%s: consumer group %s's offset was reset to %d (%s); onOffsetReset=ignore: the query "
                            "reads on from %d and its next commit overwrites the reset", mq, group, off, why,
                            start[mq])
                st.committed = off  # the broker holds it until the next commit
                continue
            log.warning("%s: consumer group %s's offset was reset from %d to %d (%s); the next batch reads the "
                        "queue from %d", mq, group, start[mq], off, why, off)
            self.tracker.reset(mq, off)
            self._stale.add(mq)
            st.committed = off
            followed[mq] = off
        return followed

    def _release(self, mq: MessageQueue, offset: int) -> None:
        """A pull of the group at the queue takes a 5.x broker's pending server-side reset
        (it ignores the group's commits of the queue until then); elsewhere an empty read."""
        try:
            self.client.pull(mq, offset, 1, group=self.options.consumer_group or "",
                             subscription=self.options.sub_expression)
        except RocketMQSparkError as exc:
            log.info("%s: reset not released on the broker (its commits may be ignored until the next "
                     "pull of the group): %s", mq, exc)


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("rocketmq")``. Offsets cross Spark as the offsets JSON form
    (:mod:`rocketmq_spark.offsets`: next-offsets); a batch that follows an offset reset also
    names the queues it reads from the reset offset (``"@reset"``). Everything but :meth:`read`
    runs in the driver-side planning process, one call at a time; :meth:`read` runs in executors."""

    def __init__(self, options: ReaderOptions) -> None:
        self.planner = Planner(options)

    def _started(self) -> None:
        """Checks the group once (:meth:`Planner.check_group`: GroupInUseError,
        GroupNotFoundError), then joins it as an online consumer (:meth:`Planner.join_group`)."""
        self.planner.check_group()
        self.planner.join_group()

    def initialOffset(self) -> dict:
        """Where a query without a checkpoint starts: every queue's first offset to read
        (startingTimestamp, startingOffsets, or the group's committed offsets with
        consumeFromWhere). A down broker is waited for; BrokerUnavailableError past
        brokerDownTimeoutMs; TopicNotFoundError for a topic without a route."""
        self._started()
        return _to_json(self.planner.initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.planner.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch from ``start``. Resets of the group's offsets seen since the
        last batch are applied to its start (onOffsetReset; OffsetResetError with fail). Spark
        calls it once the batch ending at ``start`` is done, so ``start``'s offsets then go to the
        brokers as the group's (:meth:`Planner.processed`: exact at every trigger, idle ones
        included; a write a broker ignores for a waiting reset is that reset, applied too). Then
        each queue's latest offset now, capped by ``limit`` (messages shared across queues by
        backlog) and, under AvailableNow, by the target
        :meth:`prepareForTriggerAvailableNow` fixed; a new queue starts at its min offset. The
        planned ranges are registered for :meth:`commit`. A start below the queue's min offset
        raises DataLossError (failOnDataLoss=false: skipped, logged). Queues of a down broker
        keep their offset; BrokerUnavailableError past brokerDownTimeoutMs."""
        self._started()
        ends = dict(split_batch_end(start)[0])
        self.planner.adopt_marks(marks_of(start))
        self.planner.adopt_group(group_of(start))
        self.planner.find_resets(ends)
        restarted = self.planner.follow_resets(ends)
        begin = self.planner.check_data_loss({**ends, **restarted})
        # the batch ending at `start` is done: its offsets go to the brokers, but for the queues
        # read again from a reset offset or from a lost store's first message
        if self.planner.processed({mq: off for mq, off in ends.items() if mq not in restarted}):
            # a broker ignored a write: a server-side reset waits for the group's next pull, which
            # this batch's tasks would make. The batch follows it instead
            more = self.planner.follow_resets(ends)
            restarted.update(more)
            begin = self.planner.check_data_loss({**begin, **more})
        end = self.planner.next_end(begin, limit)
        starts = {mq: begin[mq] for mq in restarted if mq in begin}
        restarts = self.planner.take_restarts()
        starts.update(restarts)
        if not starts and end == ends:  # nothing new: the offsets as they were (Spark plans no batch)
            at = group_of(start)
        else:
            at = self.planner.group_at_planning(ends, end, set(restarted) | set(restarts))
        return batch_end_json(end, starts, self.planner.marks_of(end), at)

    def reportLatestOffset(self) -> dict | None:
        """Every queue's max offset now (one past its last message), for Spark's progress;
        queues of brokers that do not answer are left out."""
        return _to_json(self.planner.latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.target = self.planner.latest()

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        """The batch ``[start, end)`` as :class:`QueueRange` partitions (:meth:`Planner.partitions`);
        a queue the batch reads from a reset offset starts there."""
        begin = dict(split_batch_end(start)[0])
        ends, restarted = split_batch_end(end)
        begin.update(restarted)
        # the marks the batch was planned with (a replayed batch's too, from Spark's offset log)
        return self.planner.partitions(begin, dict(ends), marks_of(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor side: the partition's rows (:func:`read_range`, which says what it raises)."""
        return _read_partition(partition)

    def commit(self, end: dict) -> None:
        """Spark finished the batches up to ``end``: the group's offsets follow
        (:meth:`Planner.commit`; broker faults are logged, not raised)."""
        self.planner.commit(dict(split_batch_end(end)[0]))

    def stop(self) -> None:
        """The query stops: leave the consumer group (the brokers stop listing it)."""
        self.planner.leave_group()


def _time_bounds(client: BrokerClient, start: QueueOffsets, end: QueueOffsets, pushed: Pushed
                 ) -> tuple[QueueOffsets, QueueOffsets]:
    """Each queue's ``[start, end)`` narrowed to the messages the store-time window can hold:
    from the first offset stored at or after its start, to one past the first stored at or
    after its end (one more than needed: a broker that answers the last offset, not the max,
    for a time past it loses nothing). Queues left empty drop out."""
    lo: QueueOffsets = {}
    hi: QueueOffsets = {}
    for mq in start:
        if start[mq] >= end[mq]:
            continue
        a = start[mq] if pushed.time_lo is None else max(start[mq], client.search_offset(mq, pushed.time_lo))
        b = end[mq] if pushed.time_hi is None else min(end[mq], client.search_offset(mq, pushed.time_hi) + 1)
        if a < b:
            lo[mq], hi[mq] = a, b
    return lo, hi


def _check_ending(given: QueueOffsets, start: QueueOffsets, latest: QueueOffsets) -> None:
    """endingOffsets must lie within each queue's range: past its end nothing is lost, the
    request is wrong; say so at planning time rather than fail reading."""
    for mq, off in sorted(given.items()):
        if off in (LATEST, EARLIEST) or mq not in latest:
            continue
        lo = start.get(mq, 0)
        if off > latest[mq] or off < lo:
            raise OptionError("endingOffsets", f"{mq.key}: {off}",
                              f"{mq} holds offsets [{lo}, {latest[mq]}) to read from here (its next message will "
                              f"be offset {latest[mq]}): accepted: an offset in {lo}..{latest[mq]}, -1 (latest) "
                              "or -2 (earliest)")


class RocketMQBatchReader(DataSourceReader):
    """``spark.read.format("rocketmq")``: one batch from the stream's initial offsets (after
    the data-loss check) to endingOffsets or every queue's max offset now. It does not check
    the consumer group for other consumers, nor commit its offsets."""

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self.pushed = Pushed()

    def partitions(self) -> list[QueueRange]:
        """Plans on the driver with a client of its own, closed after. Raises as
        :meth:`RocketMQStreamReader.initialOffset` does (without the group check), DataLossError
        for starts deleted by retention, OptionError for endingOffsets outside a queue's range.
        Pushed filters and endingTimestamp narrow the queues, tags and offsets read."""
        o, pushed = self.options, self.pushed
        if o.ending_timestamp is not None:
            hi = o.ending_timestamp if pushed.time_hi is None else min(pushed.time_hi, o.ending_timestamp)
            pushed = replace(pushed, time_hi=hi)
        sub = pushed.sub_expression(o.sub_expression)
        if pushed.nothing or not sub:
            return []
        planner = Planner(replace(o, sub_expression=sub))
        planner.keep = pushed.keeps
        try:
            start = planner.check_data_loss(planner.initial())
            latest = planner.latest_of(start)
            if o.ending == "json":
                given = dict(o.ending_json or {})
                end = {mq: (latest[mq] if given.get(mq, LATEST) == LATEST else given[mq]) for mq in latest}
                _check_ending(given, start, latest)
            else:
                end = latest
            if pushed.time_lo is not None or pushed.time_hi is not None:
                start, end = _time_bounds(planner.client, start, end, pushed)
            return planner.partitions(start, end)
        finally:
            planner.client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Executor side: the partition's rows (:func:`read_range`)."""
        return _read_partition(partition)


class RocketMQPushdownBatchReader(RocketMQBatchReader):
    """The batch reader with filterPushdown=true: it takes the filters Spark pushes down
    (which needs spark.sql.python.filterPushdown.enabled=true; Spark refuses a reader that
    implements pushFilters without it, so the plain reader does not)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Spark's filters on the rows (their AND), kept to read less (see
        :mod:`rocketmq_spark.source.pushdown`): a storeTimestamp window, tags, topics, brokers,
        queue ids. All are given back: Spark evaluates each on the rows read, so what a query
        returns never depends on this."""
        self.pushed = pushed_of(filters)
        return filters
