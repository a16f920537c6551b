"""The planning of a query's batches (driver side), in plain Python tested without Spark:
where each queue starts (:meth:`Planner.initial`), where the next batch ends
(:meth:`Planner.next_end`: every queue's latest offset, shared out by maxMessagesPerTrigger),
the :class:`QueueRange` partitions that read it, and the group's offsets written once Spark
processed a batch (:meth:`Planner.processed`, :meth:`Planner.commit`).

The :class:`Planner` puts together the parts of a query's planning, each in a module named
for it: :mod:`.availability` (brokers that do not answer), :mod:`.data_loss` (offsets a broker
no longer has; marks), :mod:`.commits` (the min-unconsumed rule and the writes),
:mod:`.resets` (resets of the group found and followed), :mod:`.membership` (the query in its
consumer group), over one :class:`.QueryContext` (options, client, offset store).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from ..checkpoints import BrokerOffsetStore, InFlightTracker
from ..client import BrokerClient
from ..client.membership import QueueStatus
from ..errors import AccessDeniedError, OptionError, RocketMQSparkError, TopicNotFoundError
from ..model import MessageQueue
from ..offsets import GroupAtPlanning, Mark
from .availability import Availability
from .commits import Commits, QueueOffsets
from .context import QueryContext
from .data_loss import DataLoss
from .marks import iso, mark_below
from .membership import Membership
from .options import ReaderOptions
from .pacing import Pacing, admit_bytes
from .patterns import matching_topics
from .queue_range import QueueRange
from .resets import Resets

log = logging.getLogger(__name__)

__all__ = ["Planner", "QueueOffsets"]

#: How often a planner waiting for a down broker's queues (a batch read, an AvailableNow run
#: with nothing else left) looks for it again (seconds).
POLL_S = 1.0
#: how old max offsets may be for Spark's progress report (seconds, see Planner.recent_latest)
RECENT_S = 1.0
#: while subscribePattern's topic list cannot be had, it is logged this often (seconds)
_LIST_WARN_EVERY_S = 60.0


class Planner:
    """Offsets and partitions for one query (driver side).

    Offsets are next-offsets throughout (a queue's latest offset is one past its last
    message). Spark calls the planning methods one after another, so a planner is used
    from one thread at a time; it opens its client lazily and pickles without it."""

    def __init__(self, options: ReaderOptions, client: BrokerClient | None = None) -> None:
        self.options = options
        self.ctx = QueryContext(options, client)
        self.availability = Availability(options, self._answered)
        self.commits = Commits(self.ctx, self.availability)
        self.membership = Membership(self.ctx, self.commits.running_info)
        self.data_loss = DataLoss(self.ctx, self.availability, self.commits)
        self.resets = Resets(self.ctx, self.availability, self.commits, self.data_loss, self.membership)
        self.target: QueueOffsets | None = None  # AvailableNow cap
        #: topics seen with a route (one gone later means its brokers are down, see queues())
        self._routed: set[str] = set()
        #: queues a batch read's pushed filters leave (None: every queue of the topics)
        self.keep: Callable[[MessageQueue], bool] | None = None
        #: when latest() last answered and what (see recent_latest)
        self._seen: tuple[float, QueueOffsets] | None = None
        #: subscribePattern: topics of the list it did not match, and the names of the cluster's
        #: clusters and brokers (never matched; see topics())
        self._not_matched: set[str] = set()
        self._cluster_names: set[str] = set()
        #: the brokers each topic's route listed last (a topic deleted, see topics())
        self._brokers_of: dict[str, set[str]] = {}
        #: when topics() last asked the name servers for their topic list
        self._listed_at: float | None = None
        #: while looks at the topic list fail: when that was last logged (once a minute)
        self._list_failing: float | None = None
        #: minMessagesPerTrigger's wait, with maxTriggerDelay (see .pacing)
        self.pacing = Pacing(options.min_messages_per_trigger, options.max_trigger_delay_ms)
        #: the starts next_end gave queues new to the query (see take_new_starts)
        self._new_starts: QueueOffsets = {}

    def _answered(self, broker: str) -> None:
        store = self.ctx.opened_store
        if store is not None:  # its commits need not wait any longer
            store.answered(broker)

    @property
    def client(self) -> BrokerClient:
        """The planner's client, connected on first use."""
        return self.ctx.client

    @property
    def store(self) -> BrokerOffsetStore:
        """The consumer group's offsets on the brokers; OptionError without a consumerGroup."""
        return self.ctx.store

    @property
    def tracker(self) -> InFlightTracker:
        """The ranges in flight per queue (the min-unconsumed rule, see :mod:`.commits`)."""
        return self.commits.tracker

    @staticmethod
    def _sleep(seconds: float) -> None:
        time.sleep(seconds)

    def queues(self) -> list[MessageQueue]:
        """The topics' queues the routes list now. A topic that had queues and has no route
        now is not an error: name servers drop a broker's routes when its connection closes
        (a restart), so its planned queues wait for it like any down broker's (see
        :meth:`.Availability.unavailable`). A topic never seen with a route raises TopicNotFoundError."""
        out: list[MessageQueue] = []
        for topic in self.topics():
            try:
                queues = self.client.message_queues(topic, refresh=True)
            except TopicNotFoundError:
                if topic not in self._routed and topic in self.options.topics:
                    raise
                if topic not in self._routed:  # matched by subscribePattern, not routed yet
                    log.debug("topic %s is listed and has no route yet; read once it has", topic)
                    continue
                log.debug("topic %s has no route now (its brokers restarting?); its queues wait", topic)
                continue
            self._routed.add(topic)
            self._brokers_of[topic] = {q.broker for q in queues}
            out.extend(q for q in queues if self.keep is None or self.keep(q))
        return sorted(out)

    def topics(self) -> tuple[str, ...]:
        """The topics read now: those named; with subscribePattern also those of the name
        servers' topic list it matches, looked up again when the last look is older than
        :data:`RECENT_S` (once per trigger, :mod:`.patterns`). A
        topic matched once stays read (a topic deleted meanwhile is a topic without a route,
        see :meth:`queues`); new ones join the group's subscriptions (:meth:`.Membership.topics_added`)."""
        o = self.options
        if o.topic_pattern is None or (self._listed_at is not None
                                       and time.monotonic() - self._listed_at <= RECENT_S):
            return self.ctx.topics  # (one topic list per trigger: latestOffset asks it first, then its planning)
        self._listed_at = time.monotonic()
        try:
            listed = self.client.topic_list()  # type: ignore[attr-defined]
            self._drop_deleted(set(listed))
            new = [t for t in listed if t not in self.ctx.topics and t not in self._not_matched]
            if new:  # never seen: the cluster's names are asked again (a broker may have joined)
                self._cluster_names = self.client.cluster_names()  # type: ignore[attr-defined]
        except AccessDeniedError:
            raise
        except RocketMQSparkError as exc:
            # the name servers restarting or out of reach: the topics matched so far are read on
            # (their routes are known, as a named topic's are), the list asked again next trigger
            now = time.monotonic()
            if self._list_failing is None or now - self._list_failing >= _LIST_WARN_EVERY_S:
                log.warning("subscribePattern %r: the name servers' topic list cannot be had now (%s); reading "
                            "the topics matched so far (%s) and asking again at every trigger", o.topic_pattern,
                            exc, ", ".join(self.ctx.topics) or "none yet")
                self._list_failing = now
            return self.ctx.topics
        if self._list_failing is not None:
            log.warning("subscribePattern %r: the name servers list topics again", o.topic_pattern)
            self._list_failing = None
        if new:
            matched = matching_topics(o.topic_pattern, new, o.namespace, self._cluster_names)
            self._not_matched.update(t for t in new if t not in matched)
            if matched:
                log.info("subscribePattern %r: reading topics %s too (from their earliest offsets when the query "
                         "has run before)", o.topic_pattern, ", ".join(matched))
                self.ctx.topics = tuple(sorted({*self.ctx.topics, *matched}))
                self.membership.topics_added()
        return self.ctx.topics

    def _drop_deleted(self, listed: set[str]) -> None:
        """Topics subscribePattern matched that were deleted stop being read: gone from the
        topic list while every broker their route listed is listed by the name servers (a
        broker's restart also takes its topics out of the list, for a while: those are kept,
        and wait for it like a named topic's queues)."""
        gone = [t for t in self.ctx.topics if t not in self.options.topics and t not in listed]
        if not gone:
            return
        alive = set(self.client.cluster_brokers())  # type: ignore[attr-defined]
        deleted = [t for t in gone if self._brokers_of.get(t, set()) <= alive]
        if deleted:
            log.warning("subscribePattern %r: topics %s were deleted; no longer read", self.options.topic_pattern,
                        ", ".join(deleted))
            self.ctx.topics = tuple(t for t in self.ctx.topics if t not in deleted)
            for t in deleted:
                self._routed.discard(t)
                self._brokers_of.pop(t, None)

    def reading(self, offsets: QueueOffsets) -> QueueOffsets:
        """``offsets`` without the queues of topics no longer read (a topic subscribePattern
        matched was deleted, see :meth:`topics`)."""
        if self.options.topic_pattern is None:
            return offsets
        now = set(self.topics())
        return {mq: off for mq, off in offsets.items() if mq.topic in now}

    def latest(self) -> QueueOffsets:
        """Max offsets of the queues the routes list now, without the brokers that do not
        answer (see :meth:`.Availability.ask`)."""
        latest = self.availability.ask(self.queues(), self.data_loss.highs_of)
        self._seen = (time.monotonic(), dict(latest))
        return latest

    def recent_latest(self) -> QueueOffsets:
        """:meth:`latest` as it was asked within the last :data:`RECENT_S` (Spark asks for the
        progress report right after it planned a batch, which asked it), else asked now."""
        if self._seen is not None and time.monotonic() - self._seen[0] <= RECENT_S:
            return dict(self._seen[1])
        return self.latest()

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
            self.availability.unavailable(missing)
            self._sleep(POLL_S)

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
        self.resets.started()  # a new query: the group's offsets are its own from here on
        while True:
            out = self.availability.ask(queues, self._starts_of)
            missing = [mq for mq in queues if mq not in out]
            if not missing:
                return out
            self.availability.unavailable(missing)
            self._sleep(POLL_S)

    def _starts_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Start offsets: startingTimestamp for every queue; else startingOffsetsByTimestamp
        for the queues it names, and startingOffsets (or the group's offsets) for the rest."""
        o = self.options
        by_time = o.starting_by_timestamp if o.starting_timestamp is None else None
        if by_time:
            timed = [mq for mq in mqs if mq in by_time]
            rest = [mq for mq in mqs if mq not in by_time]
            out = self._starts_without_times(rest) if rest else {}
            out.update({mq: self._start_at_time(mq, by_time[mq]) for mq in timed})
            return out
        return self._starts_without_times(mqs)

    def _start_at_time(self, mq: MessageQueue, ts: int) -> int:
        """startingOffsetsByTimestamp of ``mq``: its first message stored at or after ``ts``;
        none there: its latest offset with startingOffsetsByTimestampStrategy=latest, else an
        OptionError."""
        found = self.client.search_offset(mq, ts)
        if found < self.client.max_offset(mq) or self.options.starting_by_timestamp_strategy == "latest":
            return found
        last = self.client.store_time_at(mq, found - 1) if found > 0 else None
        held = f"its last message was stored at {iso(last)}" if last is not None else "it holds no message"
        raise OptionError("startingOffsetsByTimestamp", f"{mq.key}: {ts}",
                          f"{mq} has no message stored at or after {iso(ts)} ({held}); accepted: a time at or "
                          f"before its last message, or startingOffsetsByTimestampStrategy=latest to start such a "
                          f"queue at its latest offset")

    def _starts_without_times(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
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

    def next_end(self, start: QueueOffsets, limit: ReadLimit) -> QueueOffsets:
        """The end offsets of the next batch (registered as in flight).

        With minMessagesPerTrigger, fewer new messages than that end the batch where it starts
        until maxTriggerDelay has passed (:class:`.Pacing`); maxBytesPerTrigger caps it by the
        messages' stored size (:func:`.admit_bytes`). Queues of a broker that is down or
        gone from the routes keep their start offsets
        (:meth:`.Availability.unavailable` bounds that). Under Trigger.AvailableNow, a run with nothing
        else left to read waits for such a broker (polling every ``POLL_S``) rather than
        end with its queues unread."""
        while True:
            was_down = set(self.availability.down)
            latest = self.latest()
            start = self.data_loss.checked(start, latest, was_down)
            missing = [mq for mq in start if mq not in latest]
            if missing:
                self.availability.unavailable(missing)  # raises once the broker has been away too long
            if self.target is not None:
                latest = {mq: min(v, self.target.get(mq, v)) for mq, v in latest.items()}
            begin: QueueOffsets = {}
            new: QueueOffsets = {}
            for mq, hi in latest.items():
                s = start.get(mq)
                if s is None:  # a new queue: from its earliest offset
                    s = new[mq] = self.client.min_offset(mq)
                begin[mq] = min(s, hi) if s <= hi else s
            end = {mq: max(begin[mq], latest[mq]) for mq in latest}
            if self.pacing.holds(sum(end[mq] - begin[mq] for mq in end), available_now=self.target is not None):
                end = dict(begin)  # fewer than minMessagesPerTrigger, within maxTriggerDelay: they wait
            else:
                if isinstance(limit, ReadMaxRows):
                    end = self._admit(begin, end, limit.max_rows)
                if self.options.max_bytes_per_trigger:
                    end = admit_bytes(begin, end, self.options.max_bytes_per_trigger, self.client.stored_sizes)
            self.data_loss.take_marks(begin, end)
            held = self.data_loss.hold_unmarked(begin, end)
            if not ((missing or held) and self.target is not None and all(end[mq] == begin[mq] for mq in end)):
                break
            self._sleep(POLL_S)
        self.commits.planned(begin, end)
        self._new_starts = {mq: begin[mq] for mq in new}
        for mq in missing:  # carried as they are: a restarted broker's queues resume there
            end[mq] = start[mq]
        return end

    def take_new_starts(self) -> QueueOffsets:
        """Where the last :meth:`next_end` started the queues new to the query (their min offset
        then). The batch's offsets keep them: a replay asking the min offset anew could get
        another (retention, a lost store), and a range that moves renumbers the batch's
        partitions and rows, which an exactly-once writer's message ids are made of."""
        out, self._new_starts = self._new_starts, {}
        return out

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
        when it was planned; else this planner's), which its task compares (see :class:`.pull_loop.PullLoop`)."""
        o = self.options
        known = self.data_loss.marks_of(end) if marks is None else marks
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
        if o.max_records_per_partition:
            ranges = _split(ranges, o.max_records_per_partition)
        addrs = {} if o.endpoints else {mq.broker: self._known_addr(mq) for mq, _s, _e in ranges}
        silent = self.availability.silent_s()
        return [QueueRange(mq, s, e, o.namesrv_addr, o.endpoints, o.consumer_group or "", o.sub_expression,
                           o.pull_batch_size, o.fail_on_data_loss, o.broker_down_timeout_ms, o.credentials,
                           o.include_retry_topic, o.columns, addrs.get(mq.broker), silent.get(mq.broker, 0.0),
                           mark_below(known.get(mq), end[mq]), o.tls, o.namespace, o.sub_type,
                           o.trace_topic)
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
        run). Queues with a reset noted (see :meth:`.Resets.find`) are left to
        :meth:`.Resets.follow`, those read again from their first offset (their broker lost its
        store, see :meth:`.DataLoss.take_restarts`) to the batch that does; a queue is written only when
        the broker does not hold the offset already as far as the query knows (what it last wrote
        or read there). True when a broker ignored a write because a
        server-side reset of the queue waits (noted as a reset: :meth:`.Resets.follow` applies it)."""
        return self._done({mq: off for mq, off in start.items()
                           if mq not in self.resets.noted and not self.data_loss.restarting(mq)})

    def commit(self, end: QueueOffsets) -> None:
        """Spark's commit of the batches up to ``end`` (it comes as the batch after them starts,
        after :meth:`processed` wrote the same offsets at that batch's planning): what the
        broker does not hold yet is written (a commit that failed at planning). The end of a
        batch planned before a queue's reset no longer counts for that queue."""
        fresh = self.commits.fresh(end)  # without the ends of batches planned before a queue's reset
        # resets a commit would overwrite are left to the next batch (see Resets.follow): those
        # pushed since, and, before this run has read the group's offsets once (Spark plans, and
        # so reads them in latestOffset, before it commits), the broker's moved offsets
        self._done(fresh, find=True)

    def _done(self, end: QueueOffsets, *, find: bool = False) -> bool:
        """Spark processed everything below ``end``: with commitOffsets and a consumerGroup,
        each queue's committable offset (min-unconsumed rule, :class:`InFlightTracker`) goes to
        the brokers where they do not hold it as far as the query knows. Broker faults are
        logged and retried at the next write, not raised (:meth:`BrokerOffsetStore.commit`); a
        broker found unreachable is noted as down (asked again at the next trigger, see
        :meth:`.Availability.ask`)."""
        committable = self.commits.completed(end)
        if not self.options.commit_offsets or not self.options.consumer_group:
            return False
        if find:
            self.resets.find(committable, read=not self.resets.synced, fail=False)
        todo = {mq: off for mq, off in committable.items()
                if mq not in self.resets.noted and self.commits.status_of(mq).committed != off}
        return bool(todo or self.store.pending) and self.resets.write(todo)

    # -- the parts, as the readers call them --------------------------------------------

    def check_data_loss(self, start: QueueOffsets) -> QueueOffsets:
        """See :meth:`.DataLoss.check`."""
        return self.data_loss.check(start)

    def take_restarts(self) -> QueueOffsets:
        """See :meth:`.DataLoss.take_restarts`."""
        return self.data_loss.take_restarts()

    def adopt_marks(self, marks: dict[MessageQueue, Mark]) -> None:
        """See :meth:`.DataLoss.adopt_marks`."""
        self.data_loss.adopt_marks(marks)

    def marks_of(self, queues: Iterable[MessageQueue]) -> dict[MessageQueue, Mark]:
        """See :meth:`.DataLoss.marks_of`."""
        return self.data_loss.marks_of(queues)

    def doubt(self, mq: MessageQueue) -> None:
        """See :meth:`.DataLoss.doubt`."""
        self.data_loss.doubt(mq)

    def find_resets(self, expected: QueueOffsets, *, read: bool = True, fail: bool = True) -> None:
        """See :meth:`.Resets.find`."""
        self.resets.find(expected, read=read, fail=fail)

    def follow_resets(self, start: QueueOffsets) -> QueueOffsets:
        """See :meth:`.Resets.follow`."""
        return self.resets.follow(start)

    def adopt_group(self, at: GroupAtPlanning | None) -> None:
        """See :meth:`.Resets.adopt`."""
        self.resets.adopt(at)

    def group_at_planning(self, prev: QueueOffsets, end: QueueOffsets, restarted: Iterable[MessageQueue]
                          ) -> GroupAtPlanning | None:
        """See :meth:`.Resets.at_planning`."""
        return self.resets.at_planning(prev, end, restarted)

    def check_group(self) -> None:
        """See :meth:`.Membership.check` (of the topics subscribePattern matches now, too)."""
        if self.options.topic_pattern is not None and not self.membership.checked:
            self.topics()
        self.membership.check()

    def join_group(self) -> None:
        """See :meth:`.Membership.join`."""
        self.membership.join()

    def leave_group(self) -> None:
        self.membership.leave()

    def running_info(self) -> dict[MessageQueue, QueueStatus]:
        """See :meth:`.Commits.running_info`."""
        return self.commits.running_info()


def _split(ranges: list[tuple[MessageQueue, int, int]], most: int) -> list[tuple[MessageQueue, int, int]]:
    """``ranges`` with each one of more than ``most`` messages cut into equal pieces of at most
    ``most`` (maxRecordsPerPartition)."""
    out: list[tuple[MessageQueue, int, int]] = []
    for mq, s, e in ranges:
        pieces = -(-(e - s) // most)
        step = -(-(e - s) // pieces)
        out.extend((mq, a, min(e, a + step)) for a in range(s, e, step))
    return out
