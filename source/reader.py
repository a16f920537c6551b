"""``format("rocketmq")``: the stream and batch readers.

Spark-facing methods (camelCase) are thin; the planning is plain Python in
:class:`Planner`, tested without Spark. Planning calls run in one long-lived
process on the driver side; ``read()`` runs in executors on an unpickled copy, so
nothing here opens a socket in ``__init__``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..checkpoints import BrokerOffsetStore, InFlightTracker
from ..client import BrokerClient, Credentials, connect
from ..codec import subscribed_tags
from ..codec.arrow import only_subscribed, tag_set
from ..errors import (
    BrokerUnavailableError,
    ConnectionFailedError,
    DataLossError,
    GroupInUseError,
    OffsetResetError,
    OptionError,
    ProtocolError,
    TopicNotFoundError,
)
from ..model import MessageQueue, PullResult
from ..offsets import EARLIEST, LATEST, Offsets
from .options import ReaderOptions

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = ["Planner", "QueueRange", "RocketMQBatchReader", "RocketMQStreamReader", "read_range"]

QueueOffsets = dict[MessageQueue, int]
#: Pull bodies are decoded together once this many bytes are buffered (bounds task memory).
_DECODE_BYTES = 2 * 1024 * 1024
#: How often an AvailableNow run with only a down broker's queues left looks for it again.
_POLL_S = 1.0
#: A broker known to be down is asked again at most this often (seconds).
_REPROBE_S = 2.0
# how often the "broker unavailable" warning repeats while the broker stays down (triggers
# come every few milliseconds when the other queues are busy; DEBUG in between)
_WARN_EVERY_S = 10.0


def _to_json(offsets: QueueOffsets) -> dict[str, dict[str, int]]:
    """Offsets as Spark keeps them in its checkpoint (the canonical form, see :mod:`..offsets`)."""
    return Offsets(offsets).to_json()


def _from_json(obj: Mapping[str, Any]) -> QueueOffsets:
    """Offsets from Spark's checkpoint, as a dict the planner updates."""
    return dict(Offsets.from_json(obj))


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: queue ``mq`` over ``[start, end)``."""

    mq: MessageQueue
    start: int
    end: int
    namesrv: tuple[str, ...]
    endpoints: str | None
    group: str
    sub_expression: str
    pull_batch_size: int
    fail_on_data_loss: bool
    #: how long a task keeps retrying pulls from an unreachable broker (brokerDownTimeoutMs)
    broker_down_timeout_ms: int = 30_000
    #: ACL credentials the task signs its requests with (repr masks the secret)
    credentials: Credentials | None = None


class Planner:
    """Offsets and partitions for one query (driver side)."""

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

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader into its planning process: sockets open lazily there.
        state = dict(self.__dict__)
        state["_client"] = None
        state["_store"] = None
        return state

    @property
    def client(self) -> BrokerClient:
        if self._client is None:
            self._client = connect(self.options.namesrv_addr, self.options.endpoints,
                                   credentials=self.options.credentials)
        return self._client

    @property
    def store(self) -> BrokerOffsetStore:
        """The consumer group's offsets on the brokers (only planned with a consumerGroup)."""
        if self._store is None:
            if not self.options.consumer_group:
                raise OptionError("consumerGroup", None, "required to read or commit a group's offsets")
            self._store = BrokerOffsetStore(self.client, self.options.consumer_group)
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
            out.extend(queues)
        return sorted(out)

    def latest(self) -> QueueOffsets:
        """Max offsets of the queues the routes list now, without the brokers that do not
        answer (see :meth:`_ask_brokers`)."""
        return self._ask_brokers(self.queues(), self._highs_of)

    def _lows_of(self, mqs: list[MessageQueue]) -> dict[MessageQueue, int]:
        """Min offsets of one broker's queues, from one offset-range round (GET_TOPIC_STATS_INFO
        per topic); the max offsets it also brought are kept for the :meth:`latest` call of the
        same trigger (:meth:`_highs_of`), so a trigger asks each broker once."""
        ranges = self.client.offset_ranges(mqs)
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
                     ask: Callable[[list[MessageQueue]], dict[MessageQueue, int]]) -> QueueOffsets:
        """``ask(queues of one broker)`` for every broker (the client pipelines the per-queue
        requests); a broker that fails (after the client's bounded retries) is noted as down
        and the caller reads on with the rest (see :meth:`_unavailable`). A broker known to
        be down is asked again only every ``_REPROBE_S``, so its retries do not slow every
        trigger down."""
        out: QueueOffsets = {}
        failed: dict[str, str] = {}
        now = time.monotonic()
        by_broker: dict[str, list[MessageQueue]] = {}
        for mq in queues:
            by_broker.setdefault(mq.broker, []).append(mq)
        for b, mqs in by_broker.items():
            if b in self._down and now - self._probed.get(b, 0.0) < _REPROBE_S:
                failed[b] = self._down[b][1]
                continue
            try:
                out.update(ask(mqs))
            except ConnectionFailedError as exc:
                failed[b] = str(exc)
                self._probed[b] = time.monotonic()
        for broker in {mq.broker for mq in out}:
            if self._down.pop(broker, None) is not None:
                self._warned.pop(broker, None)
                log.warning("broker %s answers again; reading its queues", broker)
        for broker, why in failed.items():
            self._down.setdefault(broker, (now, why))
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
        """Starts below a queue's min offset: fail, or skip (logged) with failOnDataLoss=false."""
        fixed = dict(start)
        self._highs.clear()
        lows = self._ask_brokers(sorted(start), self._lows_of)
        for mq, off in start.items():
            low = lows.get(mq)
            if low is None:
                continue  # its broker is down: next_end keeps the offset
            if off < low:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{mq}: offsets [{off}, {low}) were deleted by retention before they were read; "
                        "set failOnDataLoss=false to skip them")
                log.warning("%s: skipping offsets [%d, %d) deleted by retention (failOnDataLoss=false)",
                            mq, off, low)
                fixed[mq] = low
        return fixed

    def next_end(self, start: QueueOffsets, limit: ReadLimit) -> QueueOffsets:
        """The end offsets of the next batch (registered as in flight).

        Queues of a broker that is down or gone from the routes keep their start offsets
        (:meth:`_unavailable` bounds that). Under Trigger.AvailableNow, a run with nothing
        else left to read waits for such a broker (polling every ``_POLL_S``) rather than
        end with its queues unread."""
        while True:
            latest = self.latest()
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
            if not (missing and self.target is not None and all(end[mq] == begin[mq] for mq in end)):
                break
            self._sleep(_POLL_S)
        if isinstance(limit, ReadMaxRows):
            end = self._admit(begin, end, limit.max_rows)
        for mq in end:
            self.tracker.register(mq, begin[mq], end[mq])
        for mq in missing:  # carried as they are: a restarted broker's queues resume there
            end[mq] = start[mq]
        return end

    @staticmethod
    def _sleep(seconds: float) -> None:
        time.sleep(seconds)

    def check_group(self) -> None:
        """Once per query, of every broker serving the topics: fail when other clients consume
        in the group (their commits would interleave with Spark's), unless allowSharedGroup
        (remoting only: gRPC has no consumer-list call); and make sure the brokers know the
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
        if others:
            listed = "; ".join(f"{b}: {', '.join(ids)}" for b, ids in sorted(others.items()))
            raise GroupInUseError(
                f"consumer group {group!r} has online consumers ({listed}); their offset commits would interleave "
                f"with this query's. Use a consumerGroup of its own, or set allowSharedGroup=true to accept that")

    def _make_group_known(self, group: str) -> None:
        """Brokers refuse offset commits of a consumer group they do not know and create one
        only on a consumer's heartbeat or pull (autoCreateSubscriptionGroup), its retry topic
        %RETRY%<group> (which mqadmin consumerProgress needs) only on a heartbeat. A broker
        whose queues get no data would never see either, so each broker is told of the group
        once (:meth:`BrokerClient.make_group_known`: the query does not stay listed as an online
        consumer); where the broker does not create groups that fails at once with
        :class:`GroupNotFoundError` naming the group."""
        subs = {t: self.options.sub_expression for t in self.options.topics}
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

    def partitions(self, start: QueueOffsets, end: QueueOffsets) -> list[QueueRange]:
        o = self.options
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
        return [QueueRange(mq, s, e, o.namesrv_addr, o.endpoints, o.consumer_group or "", o.sub_expression,
                           o.pull_batch_size, o.fail_on_data_loss, o.broker_down_timeout_ms, o.credentials)
                for mq, s, e in ranges]

    def commit(self, end: QueueOffsets) -> None:
        if not self.options.commit_offsets or not self.options.consumer_group:
            return
        committable: QueueOffsets = {}
        for mq, off in end.items():
            self.tracker.complete_through(mq, off)
            c = self.tracker.committable(mq)
            if c is not None:
                committable[mq] = c
        self.store.commit(committable)


def read_range(part: QueueRange, client: BrokerClient | None = None) -> Iterator[pa.RecordBatch]:
    """Pull ``[start, end)`` of one queue, keeping the next pull in flight while decoding;
    rows whose tag the subscription does not name are left out."""
    own = client is None
    c = client or connect(part.namesrv, part.endpoints, credentials=part.credentials)
    tags = tag_set(subscribed_tags(part.sub_expression))
    try:
        for batch in _read(part, c):
            batch = only_subscribed(batch, tags)
            if batch.num_rows:
                yield batch
    finally:
        if own:
            c.close()


def _check_pull(part: QueueRange, offset: int, res: PullResult) -> None:
    """A pull inside the planned range found no message: retention deleted them (fail, or
    with failOnDataLoss=false log the skip), or they were never there (always fail)."""
    mq = part.mq
    if res.status == "OFFSET_ILLEGAL" and part.group and 0 <= res.min_offset <= offset < res.max_offset:
        # not retention (the offset is on the broker): a 5.x broker moves the group's next pull of
        # a queue to the offset an operator reset the group to
        raise OffsetResetError(
            f"{mq}: the broker moved consumer group {part.group}'s offset from {offset} to {res.next_offset}: an "
            f"offset reset (mqadmin resetOffsetByTime, rocketmq-spark reset-offset) made while this query reads "
            f"the queue. The query keeps its own offsets in its checkpoint and does not follow resets: restart it "
            f"on a new checkpoint (startingOffsets=group) to start from the reset offsets, or on this one to go on "
            f"from where it was")
    if res.status == "OFFSET_ILLEGAL":
        if res.next_offset > offset and not part.fail_on_data_loss:
            log.warning("%s: skipping offsets [%d, %d) deleted by retention (failOnDataLoss=false)",
                        mq, offset, res.next_offset)
        else:
            lo = "?" if res.min_offset < 0 else res.min_offset
            hi = "?" if res.max_offset < 0 else res.max_offset
            raise DataLossError(f"{mq}: planned offsets [{offset}, {part.end}) are outside the queue's "
                                f"range [{lo}, {hi}) (deleted by retention?)")
    elif res.status == "NO_NEW_MSG":
        raise DataLossError(f"{mq}: planned offsets [{offset}, {part.end}) are not on the broker "
                            f"(its max offset is {'?' if res.max_offset < 0 else res.max_offset})")


class _Failed:
    """A pull that could not even be sent (the connection failed): raised when finished."""

    __slots__ = ("exc",)

    def __init__(self, exc: ConnectionFailedError) -> None:
        self.exc = exc


#: pause between pull attempts while a broker is unreachable (seconds, doubling up to the max)
_OUTAGE_BACKOFF_S = (0.2, 2.0)


def _pulls(part: QueueRange, start: Callable[[int], Any], finish: Callable[[Any], PullResult]
           ) -> Iterator[tuple[PullResult, int]]:
    """Every pull of ``[part.start, part.end)`` with the next offset, the next pull already in
    flight (``start(offset)``) while the caller handles this one (``finish(pending)``).

    A broker that becomes unreachable mid-range (restart, network outage; the client's own
    quick retries spent) is asked again from the same offset with backoff for up to
    ``part.broker_down_timeout_ms``: nothing already yielded is read twice, nothing skipped.
    Past that the task fails with :class:`BrokerUnavailableError` naming the broker's
    address and the operation."""

    def begin(off: int) -> Any:
        try:
            return start(off)
        except ConnectionFailedError as exc:
            return _Failed(exc)

    offset = part.start
    pending = begin(offset)
    down_since: float | None = None
    pause = _OUTAGE_BACKOFF_S[0]
    while offset < part.end:
        try:
            if isinstance(pending, _Failed):
                raise pending.exc
            res = finish(pending)
        except ConnectionFailedError as exc:
            now = time.monotonic()
            if down_since is None:
                down_since = now
                log.warning("%s: broker unreachable at offset %d (%s); retrying for up to %d ms",
                            part.mq, offset, exc, part.broker_down_timeout_ms)
            waited = now - down_since
            if waited * 1000 >= part.broker_down_timeout_ms:
                raise BrokerUnavailableError(
                    f"{part.mq}: broker {part.mq.broker} unreachable for {waited:.0f}s while reading offset "
                    f"{offset} of [{part.start}, {part.end}): {exc} (brokerDownTimeoutMs="
                    f"{part.broker_down_timeout_ms} bounds the wait)") from exc
            time.sleep(pause)
            pause = min(pause * 2, _OUTAGE_BACKOFF_S[1])
            pending = begin(offset)
            continue
        if down_since is not None:
            log.warning("%s: broker answers again after %.1fs; reading on from offset %d", part.mq,
                        time.monotonic() - down_since, offset)
            down_since, pause = None, _OUTAGE_BACKOFF_S[0]
        _check_pull(part, offset, res)
        nxt = max(res.next_offset, offset)
        if nxt < part.end:
            pending = begin(nxt)
        yield res, nxt
        offset = nxt


def _read(part: QueueRange, c: BrokerClient) -> Iterator[pa.RecordBatch]:
    """The rows of ``[part.start, part.end)``, several pulls decoded at once (the decoder's
    fixed cost per call is large)."""
    mq = part.mq
    pulled: list[PullResult] = []
    buffered = 0
    first = part.start  # offset of the first message in ``pulled``

    def decode(upto: int) -> pa.RecordBatch:
        try:
            return c.rows(mq, pulled, part.end)
        except ProtocolError as exc:
            raise ProtocolError(f"{mq}: the messages the broker {c.broker_addr(mq.broker, mq.topic)} returned for "
                                f"offsets [{first}, {upto}) do not decode: {exc}") from None

    for res, nxt in _pulls(part,
                           lambda off: c.pull_async(mq, off, part.pull_batch_size, group=part.group,
                                                    subscription=part.sub_expression),
                           lambda pending: c.pull_result(mq, pending)):
        if res.size:
            pulled.append(res)
            buffered += res.size
            if buffered >= _DECODE_BYTES or nxt >= part.end:
                batch = decode(nxt)
                pulled, buffered, first = [], 0, nxt
                if batch.num_rows:
                    yield batch
        elif not pulled:
            first = nxt
    if pulled:
        batch = decode(part.end)
        if batch.num_rows:
            yield batch


def _read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A planned queue range; any other partition is the one Spark makes up when partitions()
    found nothing to read (an empty topic): it reads as no rows."""
    if isinstance(partition, QueueRange):
        return read_range(partition)
    return iter(())


class RocketMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: ReaderOptions) -> None:
        self.planner = Planner(options)

    def initialOffset(self) -> dict:
        self.planner.check_group()
        return _to_json(self.planner.initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.planner.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self.planner.check_group()
        begin = self.planner.check_data_loss(_from_json(start))
        return _to_json(self.planner.next_end(begin, limit))

    def reportLatestOffset(self) -> dict | None:
        return _to_json(self.planner.latest())

    def prepareForTriggerAvailableNow(self) -> None:
        self.planner.target = self.planner.latest()

    def partitions(self, start: dict, end: dict) -> list[QueueRange]:
        return self.planner.partitions(_from_json(start), _from_json(end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)

    def commit(self, end: dict) -> None:
        self.planner.commit(_from_json(end))


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
    def __init__(self, options: ReaderOptions) -> None:
        self.options = options

    def partitions(self) -> list[QueueRange]:
        planner = Planner(self.options)
        try:
            start = planner.check_data_loss(planner.initial())
            if self.options.ending == "json":
                given = dict(self.options.ending_json or {})
                latest = planner.latest()
                end = {mq: (latest[mq] if given.get(mq, LATEST) == LATEST else given[mq]) for mq in latest}
                _check_ending(given, start, latest)
            else:
                end = planner.latest()
            return planner.partitions(start, end)
        finally:
            planner.client.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)
