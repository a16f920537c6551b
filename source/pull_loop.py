"""The executor side of a read: one task reads its :class:`~.queue_range.QueueRange`.

:func:`read_range` connects, runs the pull loop (:class:`PullLoop`: the next pull in flight
while this one is decoded, pulls ahead of a broker that caps its answers, the wait for a broker
that stops answering, the comparison with the store the range was planned on) and decodes what
it pulled into Arrow batches, several pulls per call.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ..client import BrokerClient, connect
from ..codec import subscribed_tags
from ..codec.arrow import ARROW_SCHEMA, RETRY_COLUMNS, no_retry_origin
from ..codec.tags import only_subscribed, tag_set
from ..errors import (
    BrokerUnavailableError,
    ConnectionFailedError,
    DataLossError,
    OffsetResetError,
    ProtocolError,
)
from ..model import MessageQueue, PullResult
from ..names import RETRY_PREFIX
from ..namespaces import unwrap_columns
from ..offsets import Mark
from .context import client_config
from .marks import iso
from .packing import PackedRanges
from .queue_range import QueueRange
from .task_clients import kept_client
from .tracing import TRACE_COLUMNS, ReadTrace, flush_traces

log = logging.getLogger(__name__)

__all__ = ["PullLoop", "read_range"]

#: Pull bodies are decoded together once this many bytes are buffered (bounds task memory).
_DECODE_BYTES = 2 * 1024 * 1024

def read_range(part: QueueRange, client: BrokerClient | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``[part.start, part.end)`` of one queue in offset order, as Arrow batches
    of :data:`~rocketmq_spark.codec.arrow.ARROW_SCHEMA`, keeping the next pull in flight while
    decoding; rows whose tag the subscription does not name are left out (their offsets
    still pass). ``client`` is used and left open when given; otherwise one is opened from
    the partition and closed.

    Raises DataLossError when planned offsets are gone (deleted by retention, unless
    failOnDataLoss=false skips them; or never stored), OffsetResetError when the group's
    offset was reset meanwhile, BrokerUnavailableError when the broker stays unreachable past
    brokerDownTimeoutMs, ProtocolError on bytes that do not decode, and the client's other
    errors."""
    own = client is None
    c = client or _connect(part)
    if part.broker_addr:
        c.remember_broker_addr(part.mq.broker, part.broker_addr)
    tags = _tags(part)
    trace = ReadTrace(part) if part.trace_topic is not None else None
    try:
        for batch in _read(part, c, _decoded_columns(part, tags is not None)):
            batch = only_subscribed(batch, tags)
            started = trace.before(batch) if trace is not None else None  # (tracing never raises)
            if part.columns is not None and tuple(batch.schema.names) != part.columns:
                batch = batch.select(list(part.columns))
            if part.namespace and batch.num_rows:
                batch = unwrap_columns(batch, part.namespace)
            if batch.num_rows:
                yield batch
            if trace is not None:  # Spark asked for the next batch: this one is consumed
                trace.after(started)
    finally:
        if own:
            c.close()


def _connect(part: QueueRange) -> BrokerClient:
    """A client for ``part``'s tasks (its name servers or endpoints, credentials, TLS, namespace)."""
    return connect(part.namesrv, part.endpoints, client_config(part.broker_down_timeout_ms),
                   credentials=part.credentials, tls=part.tls, namespace=part.namespace)


def _check_pull(part: QueueRange, offset: int, res: PullResult) -> bool:
    """A pull inside the planned range found no message: retention deleted them (fail, or
    with failOnDataLoss=false log the skip), or they were never there (always fail). True
    when the pull is to be sent again at the same offset: a 5.x broker answered the group's
    first pull after a server-side offset reset with the reset offset (and will serve the next);
    this batch reads its planned range, the planner applies the reset to the next one."""
    mq = part.mq
    if res.status == "OFFSET_ILLEGAL" and part.group and 0 <= res.min_offset <= offset < res.max_offset:
        log.info("%s: the broker moved consumer group %s's offset from %d to %d (an offset reset); this batch "
                 "reads its planned range [%d, %d), the next one follows onOffsetReset", mq, part.group, offset,
                 res.next_offset, part.start, part.end)
        return True
    past_end = (res.status == "NO_NEW_MSG" or (res.status == "OFFSET_ILLEGAL" and res.next_offset < offset)
                or (res.status == "OFFSET_ILLEGAL" and 0 <= res.max_offset <= offset))
    if past_end:
        # planned below the queue's max offset, now at or past it: the broker lost messages
        # (its store, or the topic deleted and re-created); new ones would take these offsets
        hi = "?" if res.max_offset < 0 else res.max_offset
        lo = "?" if res.min_offset < 0 else res.min_offset
        if part.fail_on_data_loss:
            raise DataLossError(
                f"{mq}: planned offsets [{offset}, {part.end}) are not on the broker: the queue holds offsets "
                f"[{lo}, {hi}) now. The broker lost messages this query planned to read (its store was lost, or "
                f"the topic deleted and re-created), and new messages take their offsets. To read the queue again "
                f"from its earliest offset, start the query on a new checkpoint with startingOffsets=earliest, or "
                f"set failOnDataLoss=false")
        log.warning("%s: planned offsets [%d, %d) are not on the broker (it holds [%s, %s) now: its store was "
                    "lost, or the topic deleted and re-created); failOnDataLoss=false: not read, the next batch "
                    "reads the queue from its earliest offset", mq, offset, part.end, lo, hi)
        raise _RangeGone
    if res.status == "OFFSET_ILLEGAL":
        if res.next_offset > offset and not part.fail_on_data_loss:
            log.warning("%s: skipping offsets [%d, %d) deleted by retention (failOnDataLoss=false)",
                        mq, offset, res.next_offset)
        else:
            lo = "?" if res.min_offset < 0 else res.min_offset
            hi = "?" if res.max_offset < 0 else res.max_offset
            raise DataLossError(f"{mq}: planned offsets [{offset}, {part.end}) are outside the queue's "
                                f"range [{lo}, {hi}) (deleted by retention?)")
    return False


class _RangeGone(Exception):
    """The rest of a task's range is past the queue's end or in a store that is gone
    (failOnDataLoss=false: logged by :func:`_check_pull` or :func:`_store_gone`): the task
    ends its range there."""


def _store_gone(part: QueueRange, offset: int, why: str) -> None:
    """The broker serves another store than the one ``part`` was planned on (``why``): the
    rest of the range, from ``offset``, is not there. DataLossError with failOnDataLoss=true,
    else logged and :class:`_RangeGone`."""
    if part.fail_on_data_loss:
        raise DataLossError(
            f"{part.mq}: planned offsets [{offset}, {part.end}) are not on the broker: {why}. The broker lost its "
            f"store (or the topic was deleted and re-created) while this batch read it, and other messages take "
            f"these offsets. To read the queue again from its earliest offset, start the query on a new checkpoint "
            f"with startingOffsets=earliest, or set failOnDataLoss=false")
    log.warning("%s: planned offsets [%d, %d) are not on the broker (%s: its store was lost, or the topic deleted "
                "and re-created, while this batch read it); failOnDataLoss=false: not read, the next batch reads "
                "the queue from its earliest offset", part.mq, offset, part.end, why)
    raise _RangeGone


def _other_store(c: BrokerClient, mq: MessageQueue, mark: Mark) -> str | None:
    """None when the broker still holds the message ``mark`` names in ``mq`` (or cannot tell:
    retention deleted it); else what it holds instead. Raises the client's errors."""
    off, ts = mark
    res = c.pull_result(mq, c.pull_async(mq, off, 1))
    if res.slave_lacks(off):
        raise _slave_lacks(mq, off, res)
    if res.status == "FOUND":
        now = c.store_time_in(res, off)
        if now is None or now == ts:
            return None
        return f"offset {off}, stored at {iso(ts)} when the batch was planned, holds a message stored at {iso(now)}"
    if res.status == "NO_NEW_MSG" or (res.status == "OFFSET_ILLEGAL" and (0 <= res.max_offset <= off or
                                                                          0 <= res.next_offset < off)):
        hi = "?" if res.max_offset < 0 else res.max_offset
        return f"offset {off}, stored at {iso(ts)} when the batch was planned, is past the queue's max offset {hi}"
    return None


def _slave_lacks(mq: MessageQueue, offset: int, res: PullResult) -> ConnectionFailedError:
    """A slave answered without the message at ``offset`` (see PullResult.slave_lacks): the
    broker group cannot serve it now, as a broker that does not answer."""
    return ConnectionFailedError(res.from_slave, f"pull of {mq}",
                                 f"the slave holds offsets below {res.max_offset} and offset {offset} only its "
                                 f"master has, which is down")


class _Failed:
    """A pull that could not even be sent (the connection failed): raised when finished."""

    __slots__ = ("exc",)

    def __init__(self, exc: ConnectionFailedError) -> None:
        self.exc = exc


class _InFlight(NamedTuple):
    """A pull sent and not answered yet."""

    offset: int  # the offset it asks for
    pending: Any  # the transport's pending pull (a _Failed when it could not be sent)
    sent: float  # when it went out (time.monotonic())
    conn: object  # the connection it went out on (``epoch()``; None when not sent)


#: pulls in flight per queue once the broker serves fewer messages per pull than asked (see PullLoop)
_CAPPED_AHEAD = 16

#: pause between pull attempts while a broker is unreachable (seconds, doubling up to the max)
_OUTAGE_BACKOFF_S = (0.2, 2.0)


class PullLoop:
    """Every pull of ``[part.start, part.end)`` with the next offset, the next pull already in
    flight (``start(offset)``) while the caller handles this one (``finish(pending)``). Iterate
    it once: ``for res, next_offset in PullLoop(...)``.

    A broker that serves fewer messages per pull than asked while more are planned (Apache
    RocketMQ caps a pull at 32, whatever pullBatchSize says) gets up to ``ahead`` pulls in
    flight at offsets computed from that cap: a round trip per 32 messages is otherwise what
    a read costs. Offsets of a queue are contiguous, so a computed pull starts exactly where
    the one before it ends; when one does not (a shorter answer: the byte cap, the end of the
    queue), the pulls ahead are dropped and pulling goes on from the real next offset. Only
    for reads without a tag filter (a filtered pull's next offset skips what did not match).
    The pulls ahead go out half a window at a time through ``start_many`` when given (one
    write for several pulls, instead of a write and a thread hand-off per answer).

    A broker that becomes unreachable mid-range (restart, network outage, a paused process
    whose pulls time out) is asked again from the same offset, one pull at a time with
    backoff, for up to ``part.broker_down_timeout_ms`` counted from when it was last heard
    of (its last answer, or the failed pull going out if that was later; before any answer,
    ``part.broker_silent_s`` before the read began): nothing already yielded is read twice,
    nothing skipped. Past that the task fails with :class:`BrokerUnavailableError` naming the
    broker's address and the operation, at most one pull attempt (a request timeout) after
    the bound.

    A broker that comes back may come back without its store (a lost disk): the planned
    offsets then hold other messages. ``other_store()`` (None: the range has no mark) compares
    the mark of the store the range was planned on (None: the same store; else why not) before
    the first answer is handed on, and again before the first answer over a replaced connection
    (``epoch()``: the client's connection to the broker, None when not known: then after every
    failed pull) and the answer must come over the connection the comparison went over. Another
    store: what the range has left is gone (failOnDataLoss=true: DataLossError; else logged, the
    task ends there, and the planner reads the queue again from its new start), nothing of
    the other store is handed on as the planned messages."""

    def __init__(self, part: QueueRange, start: Callable[[int], Any], finish: Callable[[Any], PullResult],
                 ahead: int = 1, start_many: Callable[[list[int]], list[Any]] | None = None,
                 other_store: Callable[[], str | None] | None = None,
                 epoch: Callable[[], object] = lambda: None) -> None:
        self.part = part
        self.ahead = ahead
        self._start, self._finish, self._start_many = start, finish, start_many
        self._other_store, self._epoch = other_store, epoch
        #: the offset the answer at the head of ``inflight`` starts at: the next one handed on
        self.offset = part.start
        #: pulls sent and not answered yet, in offset order (filled when the iteration starts)
        self.inflight: deque[_InFlight] = deque()
        #: the broker's last answer, as far as known (time.monotonic(); set when the iteration starts)
        self.heard = 0.0
        self.answered = False  # the broker answered this loop at least once
        #: when the broker was last heard of, while it does not answer (None: it answers)
        self.down_since: float | None = None
        self.pause = _OUTAGE_BACKOFF_S[0]  # the wait before the broker is asked again
        #: the store is to be compared before an answer is handed on
        self.compare = other_store is not None
        self.compared: object = None  # the connection over which it was compared last
        self.frontier = part.start  # where the next pull ahead starts (with ``step``)
        self.step = 0  # messages the broker serves per pull, once it served fewer than asked
        self.repulls = 0  # pulls sent again at the same offset after a reset answer

    def __iter__(self) -> Iterator[tuple[PullResult, int]]:
        part = self.part
        self.heard = time.monotonic() - part.broker_silent_s
        self.inflight = deque([self._send(self.offset)])
        while self.offset < part.end:
            try:
                res = self._answer()
            except ConnectionFailedError as exc:
                self._wait_for_broker(exc)
                continue
            if res.slave_lacks(self.offset):
                self._wait_for_broker(_slave_lacks(part.mq, self.offset, res))
                continue
            self._heard_from()
            if _check_pull(part, self.offset, res):
                self._pull_again(res)
                continue
            nxt = max(res.next_offset, self.offset)
            self._pull_ahead(res, nxt)
            yield res, nxt
            self.offset = nxt

    def _send(self, offset: int) -> _InFlight:
        """A pull at ``offset``, sent (a _Failed one when the connection failed)."""
        sent = time.monotonic()
        try:
            return _InFlight(offset, self._start(offset), sent, self._epoch())
        except ConnectionFailedError as exc:
            return _InFlight(offset, _Failed(exc), sent, None)

    def _answer(self) -> PullResult:
        """The answer to the pull at the head of ``inflight``, the store compared first when it
        is to be. Raises ConnectionFailedError when the broker did not answer."""
        head = self.inflight[0]
        if isinstance(head.pending, _Failed):
            raise head.pending.exc
        res = self._finish(head.pending)
        if self._other_store is not None and (self.compare or head.conn != self.compared):
            self._compare_store(self._other_store, head.conn)
        return res

    def _compare_store(self, other_store: Callable[[], str | None], over: object) -> None:
        """Compare the store with the one the range was planned on, for an answer that came
        over connection ``over`` (see the class's docstring)."""
        other = other_store()
        if over != self._epoch():  # compared over another connection than the answer came on
            raise ConnectionFailedError(self.part.broker_addr or self.part.mq.broker, f"pull of {self.part.mq}",
                                        "the connection was replaced while the store was compared")
        if other is not None:
            _store_gone(self.part, self.offset, other)
        self.compare, self.compared = False, over

    def _wait_for_broker(self, exc: ConnectionFailedError) -> None:
        """The broker did not answer the pull at ``offset``: wait (with backoff) and send it
        again, or raise BrokerUnavailableError once it has been silent past brokerDownTimeoutMs."""
        part = self.part
        self.compare = True
        now = time.monotonic()
        if self.down_since is None:
            self.down_since = max(self.heard, self.inflight[0].sent) if self.answered else self.heard
            log.warning("%s: broker unreachable at offset %d (%s); asking again for up to %d ms",
                        part.mq, self.offset, exc, part.broker_down_timeout_ms)
        waited = now - self.down_since
        if waited * 1000 >= part.broker_down_timeout_ms:
            raise BrokerUnavailableError(
                f"{part.mq}: broker {part.mq.broker} unreachable for {waited:.0f}s while reading offset "
                f"{self.offset} of [{part.start}, {part.end}): {exc} (brokerDownTimeoutMs="
                f"{part.broker_down_timeout_ms} bounds the wait)") from exc
        time.sleep(self.pause)
        self.pause = min(self.pause * 2, _OUTAGE_BACKOFF_S[1])
        self.inflight = deque([self._send(self.offset)])

    def _heard_from(self) -> None:
        """The pull at the head of ``inflight`` was answered: the broker is heard from (again)."""
        self.heard, self.answered = time.monotonic(), True
        self.inflight.popleft()
        if self.down_since is not None:
            log.warning("%s: broker answers again after %.1fs; reading on from offset %d", self.part.mq,
                        time.monotonic() - self.down_since, self.offset)
            self.down_since, self.pause = None, _OUTAGE_BACKOFF_S[0]

    def _pull_again(self, res: PullResult) -> None:
        """The broker answered with a reset offset (see _check_pull): the same pull once more."""
        self.repulls += 1
        if self.repulls > 3:
            raise OffsetResetError(f"{self.part.mq}: the broker keeps answering the pull at {self.offset} with a "
                                   f"moved offset ({res.next_offset}) for consumer group {self.part.group}")
        self.inflight = deque([self._send(self.offset)])

    def _pull_ahead(self, res: PullResult, nxt: int) -> None:
        """After an answer from ``offset`` to ``nxt``: learn the broker's cap from it, drop the
        pulls ahead when their offsets did not hold, and send what the window has room for."""
        part, inflight = self.part, self.inflight
        got = nxt - self.offset
        if self.ahead > 1 and res.status == "FOUND" and 0 < got < part.pull_batch_size and nxt < part.end:
            self.step = got
        if inflight and inflight[0].offset != nxt:
            inflight.clear()  # the computed offsets did not hold: go on from where this pull ended
        if not inflight:
            self.frontier = nxt
        if (self.step and self._start_many is not None and len(inflight) <= self.ahead // 2
                and self.frontier < part.end):
            self._send_many(self._start_many)
        while self.frontier < part.end and (not inflight or (self.step and len(inflight) < self.ahead
                                                             and self._start_many is None)):
            inflight.append(self._send(self.frontier))
            if not self.step:
                break  # the next offset is known only from this pull's answer
            self.frontier += self.step

    def _send_many(self, start_many: Callable[[list[int]], list[Any]]) -> None:
        """Pulls ahead from ``frontier`` that fill the window, sent together."""
        offsets = list(range(self.frontier, self.part.end, self.step)[:self.ahead - len(self.inflight)])
        sent = time.monotonic()
        try:
            many = start_many(offsets)
            conn = self._epoch()
            self.inflight.extend(_InFlight(off, pending, sent, conn) for off, pending in zip(offsets, many))
        except ConnectionFailedError as exc:
            self.inflight.extend(_InFlight(off, _Failed(exc), sent, None) for off in offsets)
        self.frontier = offsets[-1] + self.step


def _tags(part: QueueRange) -> frozenset[int] | None:
    """The tags a TAG subscription names, to drop the others a broker's hash filter lets by
    (None: every tag; an SQL92 filter is the broker's alone)."""
    return tag_set(subscribed_tags(part.sub_expression)) if part.sub_type == "TAG" else None


def _retry_asked(part: QueueRange) -> bool:
    """Whether the rows carry the retry columns (includeRetryTopic) and the query asks for one."""
    return part.retry_columns and (part.columns is None or bool({"retryTopic", "reconsumeTimes"} & set(part.columns)))


def _decoded_columns(part: QueueRange, tag_filter: bool) -> tuple[str, ...] | None:
    """The columns of :data:`ARROW_SCHEMA` to decode for ``part``: those asked, plus the tag to
    filter by, and with the retry columns the queue offset (the rows of a topic's own messages
    are counted by it when only retry columns are asked) (None: all)."""
    if part.columns is None:
        return None
    need = set(part.columns) | ({"tag"} if tag_filter else set()) | ({"queueOffset"} if _retry_asked(part) else set())
    if part.trace_topic is not None:
        need |= set(TRACE_COLUMNS)
    decoded = tuple(c for c in part.columns if c in ARROW_SCHEMA.names)
    return decoded + tuple(c for c in ARROW_SCHEMA.names if c in need and c not in decoded)


def _read(part: QueueRange, c: BrokerClient, columns: tuple[str, ...] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of ``[part.start, part.end)``, several pulls decoded at once (the decoder's
    fixed cost per call is large)."""
    mq = part.mq
    retry = _retry_asked(part)
    # a retry topic's records say where each message was given back from: decoded with the rest
    origin = retry and mq.topic.startswith(RETRY_PREFIX)
    if origin:
        columns = (*(ARROW_SCHEMA.names if columns is None else columns), *RETRY_COLUMNS)
    pulled: list[PullResult] = []
    buffered = 0
    first = part.start  # offset of the first message in ``pulled``

    def decode(upto: int) -> pa.RecordBatch:
        try:
            batch = c.rows(mq, pulled, part.end, columns)
        except ProtocolError as exc:
            raise ProtocolError(f"{mq}: the messages the broker {c.broker_addr(mq.broker, mq.topic)} returned for "
                                f"offsets [{first}, {upto}) do not decode: {exc}") from None
        return no_retry_origin(batch) if retry and not origin else batch

    # a filtered pull's next offset skips what did not match: offsets ahead cannot be computed
    unfiltered = part.sub_type == "TAG" and _tags(part) is None
    kind = part.sub_type
    pulls = PullLoop(part,
                     lambda off: c.pull_async(mq, off, part.pull_batch_size, group=part.group,
                                              subscription=part.sub_expression, expression_type=kind),
                     lambda pending: c.pull_result(mq, pending), _CAPPED_AHEAD if unfiltered else 1,
                     lambda offs: c.pull_async_many(mq, offs, part.pull_batch_size, group=part.group,
                                                    subscription=part.sub_expression, expression_type=kind),
                     None if (mark := part.mark) is None else lambda: _other_store(c, mq, mark),
                     lambda: c.connection_epoch(mq.broker))
    for res, nxt in _until_gone(pulls):
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


def _until_gone(pulls: Iterable[tuple[PullResult, int]]) -> Iterator[tuple[PullResult, int]]:
    """``pulls`` until the range's rest is gone from the broker (see :class:`_RangeGone`)."""
    try:
        yield from pulls
    except _RangeGone:
        return


def _read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """A planned queue range, or ranges packed together (read one after the other), over a client
    the worker keeps between tasks (:mod:`.task_clients`); any other partition is the one Spark
    makes up when partitions() found nothing to read (an empty topic): it reads as no rows."""
    if isinstance(partition, QueueRange):
        return _flushing(partition, kept_client(partition, _connect, lambda c: read_range(partition, c)))
    if isinstance(partition, PackedRanges):
        ranges = partition.ranges
        return _flushing(ranges[0], kept_client(ranges[0], _connect,
                                                lambda c: (b for part in ranges for b in read_range(part, c))))
    return iter(())


def _flushing(part: QueueRange, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches``, then (traceEnabled) a wait for the task's trace records to be sent."""
    if part.trace_topic is None:
        return batches
    return _then_flush(part, batches)


def _then_flush(part: QueueRange, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches
    flush_traces(part)
