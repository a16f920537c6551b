"""``df.write`` / ``df.writeStream`` ``.format("rocketmq")``: tasks send, the driver commits.

at-least-once: rows are grouped into batch sends bounded by count and bytes, several
in flight per task; a failed send is retried (bounded, with backoff), moving to a queue
of another broker when the topic has several.

exactly-once: every row is sent as a transactional half message (invisible to
consumers) tagged with the batch; the driver's ``commit()`` records the batch's
transactions under the checkpoint location (:mod:`.txlog`) and then ends them with
commit; ``abort()`` rolls them back. A replayed batch commits nothing twice once its first
commit finished (see :func:`commit_batch`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ..client import BrokerClient, connect
from ..client.contract import Answer
from ..codec import (
    BatchEntry,
    EncodedBatch,
    MessageRecord,
    PropertyKey,
    SysFlag,
    TransactionType,
    decode_records,
    encode_properties,
    java_string_hash,
    offset_msg_id,
)
from ..errors import (
    BrokerError,
    ConnectionFailedError,
    DataLossError,
    NoPermissionError,
    OptionError,
    RequestNotSupportedError,
    RocketMQSparkError,
    TopicNotFoundError,
)
from ..model import MessageQueue
from ..names import retry_topic
from ..options import topic_name
from .encode import (
    TX_TAG,
    SetByColumnError,
    deliver_millis,
    encode_plain_rows,
    half_properties,
    keys_text,
    property_item,
    rest_properties,
    row_properties,
)
from .options import WriterOptions
from .txlog import TxLog, Txn

log = logging.getLogger(__name__)

__all__ = ["RocketMQBatchWriter", "RocketMQStreamWriter", "TaskReport", "write_rows"]

#: the columns a row's message is made of, the body first (the others are optional)
_ROW_COLUMNS = ("body", "topic", "tag", "keys", "properties", "messageGroup", "deliveryTimestamp")


class _Send(NamedTuple):
    """A send in flight: what a retry or a half message's transaction needs of it."""

    answer: Answer
    queue: MessageQueue
    entries: list[BatchEntry] | EncodedBatch
    sys_flag: int
    batch_properties: str
    ordered: bool  # a message group's: retried on its queue, never moved
    uniq: str  # a half message's UNIQ_KEY ("" otherwise)


_WINDOW = 8  # batch sends in flight per task
_TX_WINDOW = 128  # half messages in flight per task (past _TX_BURST)
_TX_BURST = 32  # half messages written together (a request each, one write for all)
#: A broker whose send failed for want of a connection is skipped this long (seconds).
_BROKER_PAUSE_S = 5.0


@dataclass
class TaskReport(WriterCommitMessage):
    """What a task hands the driver (Spark's commit message): its partition id, the rows it
    sent, and in exactly-once mode its half messages (:meth:`Txn.to_list` form), which the
    driver commits or rolls back, each row's checksum by message id (:func:`row_sum`) and the
    nonce its half messages' tag carries (which attempt of the task sent them)."""

    partition: int
    rows: int
    txns: list[list[Any]] = field(default_factory=list)
    sums: dict[str, str] = field(default_factory=dict)
    nonce: str = ""


#: what each letter of a row checksum (:func:`row_sum`) covers, for the error that names a difference
_SUM_PARTS = {"b": "body", "t": "tag", "k": "keys",
              "p": "properties (messageGroup, deliveryTimestamp or the properties column)"}


def row_sum(body: bytes, tag: str = "", keys: str = "", props: str = "") -> str:
    """A short checksum of an exactly-once row as written (the body before compression; the
    tag, keys and the other properties it sets, each as the message carries it): a letter
    and 8 hex digits (CRC-32) per part set, so a replay's row of the same message id can be
    told the same, and a difference named (:data:`_SUM_PARTS`)."""
    out = f"b{zlib.crc32(body):08x}"
    if tag or keys or props:  # (a body-only row's half message is sent without the loop's cost)
        for letter, part in (("t", tag), ("k", keys), ("p", props)):
            if part:
                out += f"{letter}{zlib.crc32(part.encode()):08x}"
    return out


def sum_difference(recorded: str, replayed: str) -> list[str]:
    """The parts (:data:`_SUM_PARTS` names) in which two :func:`row_sum` checksums differ."""
    def split(s: str) -> dict[str, str]:
        return {s[i]: s[i + 1:i + 9] for i in range(0, len(s), 9)}

    a, b = split(recorded), split(replayed)
    return [_SUM_PARTS.get(k, k) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def _task_identity() -> tuple[int, int]:
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            return ctx.partitionId(), ctx.attemptNumber()
    except Exception:  # outside a Spark task (unit tests)
        pass
    return 0, 0


class _Column:
    """A column as Python values, or a constant None when the column is absent."""

    def __init__(self, batch: pa.RecordBatch, name: str) -> None:
        idx = batch.schema.get_field_index(name)
        self.values: list[Any] | None = batch.column(idx).to_pylist() if idx >= 0 else None

    def __getitem__(self, i: int) -> Any:
        return None if self.values is None else self.values[i]


class _Sender:
    """Sends one task's rows; see the module docstring for the two delivery modes."""

    def __init__(self, opts: WriterOptions, batch_id: int | None) -> None:
        self.opts = opts
        self.batch_id = batch_id
        self.partition, self.attempt = _task_identity()
        self.txlog = TxLog(opts.checkpoint_location) if opts.exactly_once and opts.checkpoint_location else None
        self.client: BrokerClient = connect(opts.namesrv_addr, opts.endpoints, credentials=opts.credentials)
        self._queues: dict[str, list[MessageQueue]] = {}
        self._rr = random.randrange(1 << 16)  # tasks start at different queues (and brokers)
        #: which attempt of the task sent a half message (in its tag): ids repeat across attempts
        self.nonce = uuid.uuid4().hex[:8]
        if self.txlog is not None and batch_id is not None:
            # a streaming batch's rows get the same ids each time the batch is written (its
            # tasks retried, or the batch replayed after a restart): a replay's half of a row
            # whose recorded half its broker lost is found by its id and committed instead
            self._uniq_prefix = hashlib.sha1(f"{self.txlog.sink_id}:{batch_id}:{self.partition}".encode()
                                             ).hexdigest()[:22].upper()
        else:
            self._uniq_prefix = uuid.uuid4().hex[:22].upper()
        self._seq = 0
        #: exactly-once rows' checksums by message id (see row_sum)
        self.sums: dict[str, str] = {}
        self.rows = 0
        self.txns: list[Txn] = []
        #: sends in flight: (answer, queue, messages, sysFlag, the batch's own properties)
        self._inflight: deque[_Send] = deque()
        #: half messages waiting to go out with their burst: (queue, request, entry, sysFlag, UNIQ_KEY)
        self._queued: list[tuple[MessageQueue, Any, list[BatchEntry], int, str]] = []
        self._buffers: dict[tuple[str, str | None], tuple[list[BatchEntry], int]] = {}
        self._checked_topics: set[str] = set()
        self._paused: dict[str, float] = {}  # broker -> monotonic time until which it is skipped
        #: what a half message's properties end with: TRAN_MSG, its producer group and the
        #: TX_TAG ``<batchId>:<partition>:<attempt>:<sinkId>:<nonce>`` check-backs are answered by
        tag = (f"{batch_id if batch_id is not None else -1}:{self.partition}:{self.attempt}:"
               f"{self.txlog.sink_id if self.txlog is not None else '-'}:{self.nonce}")
        self._half_suffix = half_properties(opts.producer_group, tag)

    # -- queues ---------------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        qs = self._queues.get(topic)
        if qs is None:
            # a task's client is new and knows no route: a name server restarting (seconds)
            # failed every task that started meanwhile, and then the query
            qs = _riding_out(lambda: self.client.message_queues(topic, writable=True),
                             f"partition {self.partition}: route lookup of topic {topic!r}")
            if not qs:
                raise BrokerError(17, f"topic {topic!r} has no writable queue", address="?", operation="send")
            self._queues[topic] = qs
            if self.opts.exactly_once:
                self._refuse_proxy_port(topic, qs)
                self.client.start_producer(self.opts.producer_group, [topic], self._on_check)
        return qs

    def _refuse_proxy_port(self, topic: str, queues: list[MessageQueue]) -> None:
        """A 5.x proxy's remoting port routes every broker to itself and drops the
        END_TRANSACTIONs it did not relay a check-back for (answering SUCCESS), and check-backs
        never commit here: exactly-once through it would commit nothing. Refused before any
        half message is sent."""
        namesrvs = set(getattr(self.client, "namesrv_addrs", ()))
        through = sorted({self.client.broker_addr(q.broker, topic) for q in queues} & namesrvs)
        if through:
            raise OptionError("namesrvAddr", ";".join(self.opts.namesrv_addr or ()),
                              f"the route of topic {topic!r} sends its brokers' requests to {', '.join(through)}, "
                              "the address given as a name server: a 5.x proxy's remoting port, which does not pass "
                              "a commit (END_TRANSACTION) on to the broker. delivery=exactly-once needs the name "
                              "servers' addresses, or the proxy's gRPC endpoint in the option endpoints")

    def _next_queue(self, topic: str, avoid: str | None = None) -> MessageQueue:
        """Round-robin over the writable queues, skipping ``avoid`` and paused brokers while
        another broker has queues."""
        qs = self.queues(topic)
        self._rr += 1
        if self._paused or avoid is not None:
            now = time.monotonic()
            live = [q for q in qs if q.broker != avoid and self._paused.get(q.broker, 0.0) <= now]
            qs = live or [q for q in qs if q.broker != avoid] or qs
        return qs[self._rr % len(qs)]

    def _pause(self, broker: str, exc: BaseException) -> bool:
        """Skip ``broker`` for a while when ``exc`` says it cannot be reached; True if so."""
        unreachable = isinstance(exc, ConnectionFailedError)
        if unreachable:
            if broker not in self._paused or self._paused[broker] <= time.monotonic():
                log.warning("broker %s unreachable (%s): sending to the other brokers for %.0fs", broker, exc,
                            _BROKER_PAUSE_S)
            self._paused[broker] = time.monotonic() + _BROKER_PAUSE_S
        return unreachable

    def _group_queue(self, topic: str, group: str) -> MessageQueue:
        qs = self.queues(topic)
        return qs[(java_string_hash(group) & 0x7FFFFFFF) % len(qs)]

    # -- rows -----------------------------------------------------------------------

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Send ``batch``'s rows: plain at-least-once rows encoded all at once (:meth:`_add_plain`),
        exactly-once rows that have only a body as half messages without a look at the other
        columns (:meth:`_add_halves`), any other row by itself (:meth:`_add_rows`). Every message
        carries the properties :mod:`.encode` defines."""
        option_topic = self.opts.topic
        if not self.opts.exactly_once and self.client.compresses_bodies and option_topic \
                and self._add_plain(batch, option_topic):
            return
        if self.opts.exactly_once and option_topic and self._bodies_only(batch):
            self._add_halves(option_topic, batch.column(batch.schema.get_field_index("body")).to_pylist())
            return
        self._add_rows(batch)

    def _add_plain(self, batch: pa.RecordBatch, topic: str) -> bool:
        """At-least-once rows that need no per-row decision (:func:`.encode.encode_plain_rows`),
        to the option topic, with no per-row Python; False (nothing sent) for any other batch."""
        opts = self.opts
        encoded = encode_plain_rows(batch, uniq_prefix=self._uniq_prefix, first_seq=self._seq + 1,
                                    compress_threshold=opts.compress_threshold, max_message_size=opts.max_message_size,
                                    max_batch_messages=opts.max_batch_messages, max_batch_bytes=opts.max_batch_bytes)
        if encoded is None:
            return False
        self._seq += batch.num_rows
        self.rows += batch.num_rows
        for sends in encoded:
            self._submit(self._next_queue(topic), sends, 0, ordered=False)
        return True

    def _add_rows(self, batch: pa.RecordBatch) -> None:
        """Each row by itself (its columns' values): buffered into a batch send, sent alone (a
        compressed body, a delivery time), or as a half message (exactly-once). OptionError
        naming the row for a null or too large body, no topic, or a properties key a column sets."""
        body, topic, tag, keys, props, group, deliver = (_Column(batch, name) for name in _ROW_COLUMNS)
        default_topic, exactly_once = self.opts.topic, self.opts.exactly_once
        for i in range(batch.num_rows):
            row_index = self.rows
            self.rows += 1
            raw_body = body[i]
            b, sys_flag = self._body(raw_body, row_index)
            t = topic[i] or default_topic
            if not t:
                raise OptionError("column topic", None, f"partition {self.partition} row {row_index}: no topic "
                                  "(column null and no option topic)")
            self._check_topic(t)
            tg, ks, g = tag[i], keys_text(keys[i]), group[i]
            uniq = self._uniq()
            ms = deliver_millis(deliver[i])
            # rows that go into a batch send: their group is named once, in the batch's own
            # properties (see _flush_buffer); a row sent alone carries it
            alone = exactly_once or bool(sys_flag) or ms is not None
            try:
                rest = rest_properties(g if alone else None, ms, props[i], tag=bool(tg), keys=bool(ks))
            except SetByColumnError as exc:
                raise OptionError("column properties", None,
                                  f"partition {self.partition} row {row_index}: {exc}; a message carries it once "
                                  "(brokers and readers would disagree on which of two counts): leave it out of "
                                  "properties") from None
            entry = BatchEntry(b, row_properties(uniq, tg, ks, rest))
            if exactly_once:
                self.sums[uniq] = row_sum(raw_body.encode() if isinstance(raw_body, str) else raw_body, tg or "", ks,
                                          rest)
                self._send_half(t, g, entry, sys_flag, uniq)
            elif sys_flag or ms is not None:
                # compressed bodies travel alone (a batch has one sysFlag)
                q = self._group_queue(t, g) if g else self._next_queue(t)
                self._submit(q, [entry], sys_flag, ordered=bool(g))
            else:
                self._buffer(t, g, entry)

    @staticmethod
    def _bodies_only(batch: pa.RecordBatch) -> bool:
        """Rows with a body each and nothing else set: what :meth:`_add_halves` sends."""
        schema, n = batch.schema, batch.num_rows
        idx = schema.get_field_index("body")
        if idx < 0 or batch.column(idx).null_count:
            return False
        for name in _ROW_COLUMNS[1:]:
            idx = schema.get_field_index(name)
            if idx >= 0 and batch.column(idx).null_count != n:
                return False
        return True

    def _add_halves(self, topic: str, bodies: list[Any]) -> None:
        """Exactly-once rows that have only a body (:meth:`_bodies_only`), to the option topic:
        each sent as :meth:`_add_rows` sends it, without the per-row look at the other columns
        (the properties are the message id's and the half message's)."""
        self._check_topic(topic)
        suffix = self._half_suffix
        prepared = int(TransactionType.PREPARED)
        next_queue, submit, sums = self._next_queue, self._submit, self.sums
        for raw in bodies:
            b, sys_flag = self._body(raw, self.rows)
            self.rows += 1
            uniq = self._uniq()
            sums[uniq] = row_sum(raw.encode() if isinstance(raw, str) else raw)
            # a body-only row has no rest: the half message's own keys follow its UNIQ_KEY
            submit(next_queue(topic), [BatchEntry(b, row_properties(uniq, rest=suffix))], sys_flag | prepared,
                   ordered=False, uniq=uniq)

    def _body(self, b: Any, row_index: int) -> tuple[bytes, int]:
        """A row's body as sent (a string UTF-8 encoded, compressed past compressThreshold) and
        the sysFlag that says so; OptionError when null or past maxMessageSize."""
        if b is None:
            raise OptionError("column body", None,
                              f"partition {self.partition} row {row_index}: body is null; a BINARY or STRING "
                              "value is required")
        if isinstance(b, str):
            b = b.encode()
        if len(b) > self.opts.max_message_size:
            raise OptionError("column body", f"{len(b)} bytes",
                              f"partition {self.partition} row {row_index} exceeds maxMessageSize="
                              f"{self.opts.max_message_size} bytes")
        if len(b) > self.opts.compress_threshold and self.client.compresses_bodies:
            return zlib.compress(b), int(SysFlag.COMPRESSED)
        return b, 0

    def _uniq(self) -> str:
        """The next message's UNIQ_KEY (the task's prefix and a sequence number)."""
        self._seq += 1
        return f"{self._uniq_prefix}{self._seq:010X}"

    def _check_topic(self, topic: str) -> None:
        """Each distinct topic name checked once, before anything of it is sent."""
        if topic not in self._checked_topics:
            topic_name("column topic", topic, topic)
            self._checked_topics.add(topic)

    def _buffer(self, topic: str, group: str | None, entry: BatchEntry) -> None:
        key = (topic, group or None)  # one batch never mixes message groups
        entries, size = self._buffers.get(key, ([], 0))
        entries.append(entry)
        size += len(entry.body) + len(entry.properties) + 24
        if len(entries) >= self.opts.max_batch_messages or size >= self.opts.max_batch_bytes:
            self._buffers.pop(key, None)
            self._flush_buffer(key, entries)
        else:
            self._buffers[key] = (entries, size)

    def _flush_buffer(self, key: tuple[str, str | None], entries: list[BatchEntry]) -> None:
        topic, group = key
        if group is not None:
            # the batch's own properties name its group: a 5.x proxy types a batch (FIFO) by them
            self._submit(self._group_queue(topic, group), entries, 0, ordered=True,
                         batch_properties=property_item(PropertyKey.SHARDING_KEY, group))
        else:
            self._submit(self._next_queue(topic), entries, 0, ordered=False)

    def _submit(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, sys_flag: int, *, ordered: bool,
                batch_properties: str = "", uniq: str = "") -> None:
        """Send ``entries`` to ``mq`` (``ordered``: a message group's, which waits for the sends
        before it to land; ``uniq``: a half message's UNIQ_KEY, which names its transaction)."""
        if ordered:
            # FIFO: the previous sends must have landed before this one goes out.
            self._drain(0)
        # each client's request is its own (a remoting frame, gRPC calls): opaque here
        req: Any = self.client.send_request(mq, entries, producer_group=self.opts.producer_group, sys_flag=sys_flag,
                                            batch_properties=batch_properties)
        if uniq and not ordered:  # a half message: written with the rest of its burst
            self._queued.append((mq, req, entries, sys_flag, uniq))  # type: ignore[arg-type]
            if len(self._queued) >= _TX_BURST:
                self._drain(_TX_WINDOW)
            return
        try:
            fut = self.client.send_async(mq, req)
        except RocketMQSparkError as exc:  # e.g. no connection: retried (elsewhere) by _drain
            fut = Future()
            fut.set_exception(exc)
        self._inflight.append(_Send(fut, mq, entries, sys_flag, batch_properties, ordered, uniq))
        self._drain(0 if ordered else (_TX_WINDOW if self.opts.exactly_once else _WINDOW))

    def _send_queued(self) -> None:
        queued, self._queued = self._queued, []
        futs: Sequence[Answer]
        try:
            futs = self.client.send_async_many([(mq, req) for mq, req, *_ in queued])
        except RocketMQSparkError as exc:  # e.g. no route: each retried by _drain
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            futs = [failed] * len(queued)
        for (mq, _, entries, sys_flag, uniq), fut in zip(queued, futs, strict=True):
            self._inflight.append(_Send(fut, mq, entries, sys_flag, "", False, uniq))

    def _drain(self, keep: int) -> None:
        """Send the queued half messages, then wait for answers until ``keep`` are in flight."""
        if self._queued:
            self._send_queued()
        while len(self._inflight) > keep:
            send = self._inflight.popleft()
            prepared = bool(send.sys_flag & TransactionType.PREPARED)
            try:
                resp = send.answer.result(self.client.config.request_timeout_s)
                # only the outcome here: a half message's transaction is read from an answer
                # that stored it, below (an answer it cannot be read from is not sent again)
                self.client.check_sent(send.queue, len(send.entries), resp)
            except Exception as exc:  # retried below with bounds, then reported
                log.info("send of %d messages to %s failed (%s); retrying", len(send.entries), send.queue, exc)
                results = self._retry(send, exc)
                if prepared:  # a half message is sent alone
                    self.txns.append(self.client.transaction(results[0], send.uniq))
            else:
                if prepared:
                    self.txns.append(self.client.half_transaction(send.queue, resp, send.uniq))

    def _retry(self, send: _Send, first: BaseException) -> list[Any]:
        """Send again, with backoff: three attempts, and while the broker cannot be reached
        (a restart: seconds on Apache RocketMQ) for up to :data:`_BROKER_DOWN_S` from the
        first failure. An unordered batch whose broker cannot be reached moves to another
        broker at once; a message group's stays on its queue (its order), so it waits."""
        last: BaseException = first
        mq, entries = send.queue, send.entries
        target = mq
        move_now = self._pause(mq.broker, first) and not send.ordered
        deadline = time.monotonic() + _BROKER_DOWN_S
        attempt = 0
        while attempt < 3 or (isinstance(last, ConnectionFailedError) and time.monotonic() < deadline):
            if attempt or not move_now:
                time.sleep(max(0.0, min(2.0, 0.1 * (2 ** attempt), deadline - time.monotonic())))
            try:
                if not send.ordered and (attempt or move_now):
                    self._queues.pop(mq.topic, None)
                    with contextlib.suppress(ConnectionFailedError):  # a name server down: the routes known
                        self.client.message_queues(mq.topic, refresh=True, writable=True)
                    target = self._next_queue(mq.topic, avoid=target.broker)
                return self.client.send_batch(target, entries, producer_group=self.opts.producer_group,
                                              sys_flag=send.sys_flag, batch_properties=send.batch_properties)
            except RocketMQSparkError as exc:
                last = exc
                self._pause(target.broker, exc)
            attempt += 1
        raise RocketMQSparkError(f"partition {self.partition}: sending {len(entries)} messages to {target} "
                                 f"failed after {attempt + 1} attempts: {last}") from last

    def _send_half(self, topic: str, group: str | None, entry: BatchEntry, sys_flag: int, uniq: str) -> None:
        entry.properties += self._half_suffix
        q = self._group_queue(topic, group) if group else self._next_queue(topic)
        self._submit(q, [entry], sys_flag | TransactionType.PREPARED, ordered=bool(group), uniq=uniq)

    def finish(self) -> TaskReport:
        for key, (entries, _) in list(self._buffers.items()):
            self._flush_buffer(key, entries)
        self._buffers.clear()
        self._drain(0)
        self.client.close()
        return TaskReport(self.partition, self.rows, [t.to_list() for t in self.txns], self.sums, self.nonce)

    def abort_own(self) -> None:
        """After a failure inside the task: roll back the half messages it already sent."""
        try:
            self._drain(0)
        except Exception:
            pass
        self.client.end_transactions(self.txns, commit=False, producer_group=self.opts.producer_group)
        self.client.close()

    # -- check-backs ----------------------------------------------------------------

    def _on_check(self, properties: dict[str, str], msg_id: str) -> bool | None:
        """A broker's check-back of one of this task's half messages, answered from the
        batch record (:func:`check_decision`)."""
        return check_decision(self.txlog, properties, msg_id) if self.txlog is not None else None


def check_decision(txlog: TxLog, properties: dict[str, str], msg_id: str) -> bool | None:
    """The fate of a half message a broker asks about (a check-back), never a commit (only
    the driver commits, see :meth:`TxLog.decide`): roll back (False) when its batch is
    recorded without it, None while its batch is not recorded yet or is recorded with it
    (the broker asks again) or when it is not this sink's (the tag names another checkpoint
    location, or none)."""
    fields = properties.get(TX_TAG, "").split(":")
    try:
        batch_id = int(fields[0])
    except ValueError:
        return None  # not one of ours
    if len(fields) > 3 and fields[3] != txlog.sink_id:
        return None  # another query's (same producer group, another checkpoint location): its writers answer
    if batch_id < 0:
        # a batch write's (df.write): its driver ends its transactions without a record, so the
        # stream records that may share the checkpoint location say nothing of it
        return None
    try:
        partition: int | None = int(fields[1])
    except (IndexError, ValueError):
        partition = None
    # an earlier version's tag has no nonce: its ids were the task attempt's own
    return txlog.decide(batch_id, msg_id, partition, fields[4] if len(fields) > 4 and fields[4] else None)


def _stored(client: BrokerClient, mq: MessageQueue, offset: int) -> MessageRecord:
    """The message a row names, as its broker stores it (its commit-log position, reconsume
    times and properties are what a send-back needs); RocketMQSparkError when it is gone."""
    res = client.pull(mq, offset, 1)
    for rec in (decode_records(res.body) if res.status == "FOUND" else ()):
        if rec.queue_offset == offset:
            return rec
    raise DataLossError(f"{mq}: the message at offset {offset} is not on the broker ({res.status}; deleted by "
                        "retention?): it cannot be given back")


def send_back_rows(opts: WriterOptions, batches: Iterator[pa.RecordBatch]) -> TaskReport:
    """delivery=send-back (executor side): give every row's message back to the consumer group,
    as the Java consumer does with one it could not process: CONSUMER_SEND_MSG_BACK (the
    broker redelivers it through the group's retry topic after a delay, or puts it in the
    dead-letter topic past maxReconsumeTimes); when that fails, or the row has an error value
    to carry (a property named after errorColumn), a send to the group's retry topic with
    RETRY_TOPIC, ORIGIN_MESSAGE_ID and the reconsume times, delayed by level 3 + those times."""
    group = opts.send_back_group or ""
    partition, _ = _task_identity()
    client = connect(opts.namesrv_addr, None, credentials=opts.credentials)
    rows = 0
    try:
        for batch in batches:
            topic, broker = _Column(batch, "topic"), _Column(batch, "broker")
            qid, off = _Column(batch, "queueId"), _Column(batch, "queueOffset")
            error = _Column(batch, opts.error_column)
            for i in range(batch.num_rows):
                where = (topic[i], broker[i], qid[i], off[i])
                if any(v is None for v in where):
                    raise OptionError("columns topic, broker, queueId, queueOffset", None,
                                      f"partition {partition} row {rows}: null in {where}; delivery=send-back needs "
                                      "where the reader read the row")
                mq = MessageQueue(str(topic[i]), str(broker[i]), int(qid[i]))
                rec = _stored(client, mq, int(off[i]))
                origin = (rec.properties.get(PropertyKey.ORIGIN_MESSAGE_ID) or "").strip() or \
                    offset_msg_id(rec.store_host, rec.physical_offset)
                why = error[i]
                if why is None:
                    try:
                        client.send_back(mq, rec.physical_offset, group, origin_msg_id=origin,
                                         max_reconsume_times=opts.max_reconsume_times)
                        rows += 1
                        continue
                    except BrokerError as exc:  # as the Java consumer: send it to the retry topic instead
                        log.warning("%s offset %d: send-back to group %s refused (%s); sending it to %s", mq,
                                    rec.queue_offset, group, exc, retry_topic(group))
                elif "\x01" in why or "\x02" in why:
                    raise OptionError(f"column {opts.error_column}", None, f"partition {partition} row {rows}: holds "
                                      "\\x01 or \\x02, which a message property cannot carry")
                props = {k: v for k, v in rec.properties.items() if k != PropertyKey.TRAN_MSG}
                props.setdefault(PropertyKey.RETRY_TOPIC, rec.topic)
                props[PropertyKey.ORIGIN_MESSAGE_ID] = origin
                props[PropertyKey.DELAY] = str(3 + rec.reconsume_times)
                if why is not None:
                    props[opts.error_column] = why
                client.send_to_retry(mq, group, BatchEntry(rec.body, encode_properties(props), rec.flag),
                                     sys_flag=rec.sys_flag & SysFlag.COMPRESSED,
                                     reconsume_times=rec.reconsume_times + 1,
                                     max_reconsume_times=opts.max_reconsume_times, producer_group=opts.producer_group)
                rows += 1
    finally:
        client.close()
    return TaskReport(partition, rows)


def write_rows(opts: WriterOptions, batches: Iterator[pa.RecordBatch], batch_id: int | None) -> TaskReport:
    """One task's work (executor side): send every row of ``batches`` and return once every
    send is acknowledged; in exactly-once mode every row is a half message tagged with
    ``batch_id`` (-1 when None) and reported in :attr:`TaskReport.txns`.

    Raises OptionError naming the row for a null body, a body over maxMessageSize or a
    missing or invalid topic; the client's errors (RocketMQSparkError) when a topic has no
    writable queue or a send still fails after its retries. On any error the task's half
    messages sent so far are rolled back (exactly-once) before it propagates. at-least-once:
    a send retried after a lost answer may store its messages twice. delivery=send-back:
    :func:`send_back_rows`."""
    if opts.send_back:
        return send_back_rows(opts, batches)
    sender = _Sender(opts, batch_id)
    try:
        for batch in batches:
            sender.add_batch(batch)
        return sender.finish()
    except BaseException:
        if opts.exactly_once:
            sender.abort_own()
        else:
            sender.client.close()
        raise


def _txns(messages: list[Any]) -> list[Txn]:
    out: list[Txn] = []
    for m in messages:
        if isinstance(m, TaskReport):
            out.extend(Txn.from_list(t) for t in m.txns)
    return out


class _Rows(NamedTuple):
    """What the tasks reported of their rows beside their transactions (see TaskReport)."""

    sums: dict[str, str]  # message id -> row checksum
    nonces: dict[int, str]  # partition -> the nonce of the attempt whose halves these are
    reports: tuple[TaskReport, ...] = ()

    def nonce_by_id(self) -> dict[str, str]:
        """Message id -> the nonce of the task attempt that wrote that row (built once per
        replay that has twins to choose, not scanned per row)."""
        return {m: r.nonce for r in self.reports for m in r.sums}


def _rows(messages: list[Any]) -> _Rows:
    sums: dict[str, str] = {}
    nonces: dict[int, str] = {}
    reports = tuple(m for m in messages if isinstance(m, TaskReport))
    for m in reports:
        sums.update(getattr(m, "sums", None) or {})  # a report pickled by an earlier version has none
        if getattr(m, "nonce", ""):
            nonces[m.partition] = m.nonce
    return _Rows(sums, nonces, reports)


class RocketMQStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("rocketmq")``: tasks send (:meth:`write`), the driver ends the
    batch (:meth:`commit` / :meth:`abort`); see the module docstring."""

    def __init__(self, opts: WriterOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Executor side: :func:`write_rows` of the task's rows, with the micro-batch id
        Spark sets on the task (``streaming.sql.batchId``)."""
        from pyspark import TaskContext

        ctx = TaskContext.get()
        batch_id = None
        if ctx is not None:
            raw = ctx.getLocalProperty("streaming.sql.batchId")
            batch_id = int(raw) if raw is not None else None
        return write_rows(self.opts, iterator, batch_id)

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Driver side, once every task of the batch succeeded: exactly-once runs
        :func:`commit_batch` on the tasks' half messages; at-least-once has nothing to do."""
        if not self.opts.exactly_once:
            return
        commit_batch(self.opts, _txns(messages), batchId, _rows(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Driver side, when the batch failed: exactly-once runs :func:`abort_batch` on the
        half messages the successful tasks reported; at-least-once has nothing to undo."""
        if not self.opts.exactly_once:
            return
        abort_batch(self.opts, _txns(messages), batchId)


#: how long a broker may still apply an END it received before its sender stopped (in its
#: sockets and END thread pool, then its consume queues): the destination queues are looked at
#: only this long after the last END of a stopped commit went out (seconds)
_SETTLE_S = 3.0
#: how often one commit sends the ENDs still missing again after a fault (each time after
#: looking at the destination), before the batch fails (a replay goes on from there)
_END_ROUNDS = 3
#: messages asked per pull while looking at the destination queues (brokers cap it lower)
_SCAN_PULL = 1024


#: destinations already warned about (see destination_marks): once per driver process
_UNMARKED: set[tuple[str, str]] = set()


def destination_marks(client: BrokerClient, txns: Sequence[Txn]) -> dict[MessageQueue, int] | None:
    """The max offset of every queue the committed messages of ``txns`` can land in (each
    (broker, topic) pair's readable queues), asked before any is committed: where a later look
    for them starts. None when the destination cannot be read back (a 5.x proxy over gRPC serves
    no offsets; a write-only topic): replays of the batch then commit without looking."""
    pairs = {(t.broker, t.topic) for t in txns}
    try:
        queues = [q for topic in sorted({t for _, t in pairs}) for q in client.message_queues(topic)
                  if (q.broker, q.topic) in pairs]
        return client.max_offsets(queues)
    except (RequestNotSupportedError, NoPermissionError, TopicNotFoundError) as exc:
        if pairs <= _UNMARKED:
            return None
        _UNMARKED.update(pairs)
        log.warning("exactly-once: the destination queues of %s cannot be read back (%s); a replay of an "
                    "interrupted commit will commit its ENDs in flight without looking (a row may be stored twice)",
                    sorted(pairs), exc)
        return None


def committed_ids(client: BrokerClient, marks: Mapping[MessageQueue, int], pairs: set[tuple[str, str]]
                  ) -> set[str]:
    """The message ids (UNIQ_KEY) stored past ``marks`` in the queues of the (broker, topic)
    ``pairs`` (the whole of a queue the marks lack): what a batch's committed transactions put
    there. Raises the client's errors;
    DataLossError when retention deleted messages past a mark (they can no longer be looked at)."""
    queues = {mq for mq in marks if (mq.broker, mq.topic) in pairs}
    for topic in sorted({t for _, t in pairs}):  # a queue added since the marks: looked at whole
        queues.update(q for q in client.message_queues(topic, refresh=True) if (q.broker, q.topic) in pairs)
    ends = client.offset_ranges(sorted(queues)) if queues else {}
    seen: set[str] = set()
    for mq in sorted(queues):
        lo, end = ends[mq]
        at = marks.get(mq, lo)
        while at < end:
            res = client.pull(mq, at, _SCAN_PULL)
            if res.status == "OFFSET_ILLEGAL" and res.next_offset > at:
                raise DataLossError(f"{mq}: offsets [{at}, {res.next_offset}) were deleted before the commit of "
                                    "an exactly-once batch could look at them")
            if res.status != "FOUND" or res.next_offset <= at:
                break
            ids = client.rows(mq, [res], end, ["messageId"]).column(0).to_pylist()
            seen.update(i for i in ids if i)
            at = res.next_offset
    return seen


#: how long the driver's commit (or abort) of an exactly-once batch waits for a broker that
#: cannot be reached (refused, reset, gone from the routes: a restart) before the batch fails
#: (seconds; the reader's brokerDownTimeoutMs default)
_BROKER_DOWN_S = 30.0
_T = TypeVar("_T")


def _riding_out(fn: Callable[[], _T], what: str) -> _T:
    """``fn()``, called again while it fails for want of a broker or name server
    (ConnectionFailedError, after the client's own retries) for up to :data:`_BROKER_DOWN_S`
    from the first failure, then its error. Only for calls that may be repeated: reads, route
    lookups, rollbacks."""
    deadline: float | None = None
    pause = 0.2
    while True:
        try:
            return fn()
        except ConnectionFailedError as exc:
            now = time.monotonic()
            if deadline is None:
                deadline = now + _BROKER_DOWN_S
                log.warning("%s failed (%s); asking again for up to %.0fs", what, exc, _BROKER_DOWN_S)
            if now >= deadline:
                raise
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 2.0)


def _wait_answering(client: BrokerClient, queues: Sequence[MessageQueue]) -> None:
    """Until the brokers of ``queues`` answer a request again (up to :data:`_BROKER_DOWN_S`;
    the client's error when they do not), then :data:`_SETTLE_S` for ENDs they received before."""
    if queues:
        _riding_out(lambda: client.max_offsets(list(queues)), "reading the destination's offsets")
    time.sleep(_SETTLE_S)


def _end_recorded(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, record: list[Txn],
                  done: int, marks: Mapping[MessageQueue, int] | None, *, look_first: bool,
                  skip: frozenset[int] = frozenset()) -> list[int]:
    """:func:`commit_once` of a recorded batch, its progress marked in ``txlog``; the indices
    of the record it found lost."""
    return commit_once(client, opts, record, done, marks, look_first=look_first, what=f"batch {batch_id}",
                       on_progress=lambda n: txlog.mark_progress(batch_id, n), skip=skip)


def _replaced_stores(client: BrokerClient, marks: Mapping[MessageQueue, int], pairs: set[tuple[str, str]]
                     ) -> dict[str, str]:
    """The brokers among ``pairs`` holding a destination queue whose max offset is now below
    its mark (a queue's offsets only grow in one store: the broker lost the store the marks
    were taken on), each with what says so. An END sent there by position could end another
    half message that now sits where the recorded one was."""
    queues = sorted(mq for mq in marks if (mq.broker, mq.topic) in pairs)
    now = _riding_out(lambda: client.max_offsets(queues), "reading the destination's offsets") if queues else {}
    out: dict[str, str] = {}
    for mq in queues:
        if mq in now and now[mq] < marks[mq] and mq.broker not in out:
            out[mq.broker] = f"{mq} holds up to offset {now[mq]}, below its mark {marks[mq]}"
    return out


def commit_once(client: BrokerClient, opts: WriterOptions, record: list[Txn], done: int,
                marks: Mapping[MessageQueue, int] | None, *, look_first: bool, what: str,
                on_progress: Callable[[int], None] | None = None, skip: frozenset[int] = frozenset()) -> list[int]:
    """Commit the transactions of ``record`` from index ``done`` on, each once, but those at
    the indices in ``skip``; return the indices of those found lost.

    With ``marks``, a transaction whose END may have been applied is committed only if its
    message is not in the destination past the marks: before the first round when
    ``look_first`` (a replay: the commit before it may have had ENDs in flight), and after any
    round a fault stopped (an END whose answer was lost may have been applied). A replay sends
    no END to a broker whose store changed since the marks (:func:`_replaced_stores`). A
    transaction whose broker holds no half message for it (gone, see the client's
    ``end_transactions``) was committed before if its message is in the destination past the
    marks, and is lost otherwise (returned; the caller decides). Without marks (the destination
    cannot be read back) a failed END is retried alone, as ever, and a gone half cannot be told
    from one ended before: it is taken as committed, with a warning.
    ``on_progress(n)``: the first ``n`` of ``record`` are committed (never past a skipped, gone
    or lost one; ``what`` names them in logs)."""
    pending = [i for i in range(done, len(record)) if i not in skip]
    ending = _Ending(record, on_progress, limit=min((i for i in skip if i >= done), default=len(record)))
    if marks is None:
        _end_unlooked(client, opts, record, pending, ending, what)
        return []
    pairs = {(t.broker, t.topic) for t in record}
    for round_ in range(_END_ROUNDS):
        if look_first or round_:
            pending = _not_seen(client, record, pending, marks, pairs, what, done)
            if round_ == 0:
                pending = _off_replaced_stores(client, record, pending, marks, pairs, ending, what)
        if not pending:
            break
        rest = _end_round(client, opts, record, pending, ending, what, last=round_ == _END_ROUNDS - 1)
        if rest is None:
            break
        pending = rest
        _wait_answering(client, sorted(mq for mq in marks if (mq.broker, mq.topic) in pairs))
    if not ending.gone:
        return []
    # a half gone from its broker: its message is in the destination (committed before), or it
    # went with the broker's store before its END was applied
    seen = _riding_out(lambda: committed_ids(client, marks, pairs), f"{what}: looking its messages up in the "
                       "destination")
    lost = sorted(i for i in ending.gone if record[i].msg_id not in seen)
    log.warning("%s: the brokers hold no half message for %d of its transactions: %d of them committed before "
                "(seen in the destination), %d lost", what, len(ending.gone), len(ending.gone) - len(lost), len(lost))
    return lost


class _Ending:
    """What one :func:`commit_once` learns as it goes: the indices of its record found gone
    (no half message on their broker), and how far its progress may be marked (never past a
    skipped or gone one)."""

    def __init__(self, record: list[Txn], on_progress: Callable[[int], None] | None, limit: int) -> None:
        self.where = {t: i for i, t in enumerate(record)}
        self.on_progress = on_progress
        self.limit = limit
        self.gone: set[int] = set()

    def mark(self, n: int) -> None:
        """The first ``n`` of the record are committed."""
        if self.on_progress is not None:
            self.on_progress(min(n, self.limit))

    def note_gone(self, halves: Sequence[Txn]) -> None:
        """These transactions of the record have no half message on their broker."""
        for t in halves:
            i = self.where[t]
            self.gone.add(i)
            self.limit = min(self.limit, i)


def _end_unlooked(client: BrokerClient, opts: WriterOptions, record: list[Txn], pending: list[int],
                  ending: _Ending, what: str) -> None:
    """Commit ``pending`` when the destination cannot be read back: a failed END retried alone,
    a gone half taken as committed (with a warning)."""
    halves = client.end_transactions([record[i] for i in pending], commit=True, producer_group=opts.producer_group,
                                     on_progress=lambda n: ending.mark(pending[n - 1] + 1)) or []
    if halves:
        log.warning("%s: the brokers hold no half message for %d of its transactions (first %s on %s): ended "
                    "before, or lost with the broker's store; the destination cannot be read back to tell, so "
                    "they are taken as committed", what, len(halves), halves[0].msg_id, halves[0].broker)


def _not_seen(client: BrokerClient, record: list[Txn], pending: list[int], marks: Mapping[MessageQueue, int],
              pairs: set[tuple[str, str]], what: str, done: int) -> list[int]:
    """``pending`` but those whose message is in the destination past the marks (committed)."""
    seen = _riding_out(lambda: committed_ids(client, marks, pairs), f"{what}: looking its messages up "
                       "in the destination")
    already = [i for i in pending if record[i].msg_id in seen]
    pending = [i for i in pending if record[i].msg_id not in seen]
    log.info("%s: %d of its transactions past %d are committed already (seen in the destination), "
             "%d to commit", what, len(already), done, len(pending))
    return pending


def _off_replaced_stores(client: BrokerClient, record: list[Txn], pending: list[int],
                         marks: Mapping[MessageQueue, int], pairs: set[tuple[str, str]], ending: _Ending,
                         what: str) -> list[int]:
    """``pending`` but those on a broker whose store changed since the marks (noted gone: an
    END by position could end another half there)."""
    replaced = _replaced_stores(client, marks, pairs)
    stale = [i for i in pending if record[i].broker in replaced]
    if stale:
        log.warning("%s: %d of its transactions are on brokers whose store changed since the batch "
                    "was recorded (%s): not ended there (an END by position could end another half)",
                    what, len(stale), "; ".join(replaced.values()))
        ending.note_gone([record[i] for i in stale])
        pending = [i for i in pending if record[i].broker not in replaced]
    return pending


def _end_round(client: BrokerClient, opts: WriterOptions, record: list[Txn], pending: list[int], ending: _Ending,
               what: str, *, last: bool) -> list[int] | None:
    """Send the ENDs of ``pending`` once (no retry of a failed one): None when they are all
    answered; those after the answered ones when a retriable fault stopped the round (the
    fault raised in the ``last`` round, or when it is not retriable)."""
    answered = 0

    def progress(n: int) -> None:
        nonlocal answered
        answered = n
        # every transaction of the record before pending[n - 1] is committed: seen, or answered
        ending.mark(pending[n - 1] + 1)

    try:
        ending.note_gone(client.end_transactions([record[i] for i in pending], commit=True,
                                                 producer_group=opts.producer_group, on_progress=progress,
                                                 retry_failed=False) or [])
        return None
    except RocketMQSparkError as exc:
        if not exc.retriable or last:
            raise
        log.warning("%s: committing its transactions from %d stopped after %d answered (%s); looking "
                    "at the destination before sending the rest again", what, pending[0], answered, exc)
        return pending[answered:]


def _describe(txns: Sequence[Txn]) -> str:
    """``<n> on <broker> topic <topic>, ...``: where lost transactions were to be committed."""
    pairs: dict[tuple[str, str], int] = {}
    for t in txns:
        pairs[(t.broker, t.topic)] = pairs.get((t.broker, t.topic), 0) + 1
    return ", ".join(f"{n} on broker {b} topic {tp}" for (b, tp), n in sorted(pairs.items()))


def _lost_error(batch_id: int, record: Sequence[Txn], lost: Sequence[Txn]) -> DataLossError:
    return DataLossError(
        f"exactly-once batch {batch_id}: the brokers hold no prepared (half) message for {len(lost)} of the batch's "
        f"{len(record)} rows ({_describe(lost)}), and their messages are not in the destination: the broker lost "
        "them (its store wiped or replaced?) after the tasks sent them and before this commit. The other rows "
        f"are committed; these are not, and the driver holds no bodies to send them again. The batch is not "
        f"marked committed: restart the query; its replay of batch {batch_id} writes the rows again and commits "
        "the lost ones from it, once each")


def _unmatched_error(batch_id: int, txlog: TxLog, unmatched: Mapping[str, str]) -> DataLossError:
    first = "; ".join(f"{m}: {why}" for m, why in sorted(unmatched.items())[:3])
    more = f" (and {len(unmatched) - 3} more)" if len(unmatched) > 3 else ""
    return DataLossError(
        f"exactly-once batch {batch_id}: {len(unmatched)} rows whose prepared messages their broker lost cannot be "
        f"committed from this replay of the batch: {first}{more}. A replay's row stands in for a lost one only when "
        "it has the same message id (partition and row number) and the same topic and checksum: the query must "
        "write the same rows in the same order on a re-run (deterministic), and its source must still hold them "
        "(a broker that lost its store loses the source rows it held too). The batch is not marked committed. To "
        f"end it without these rows (they stay lost), create the file {txlog.accept_lost_path(batch_id)} and "
        "restart the query, or write with failOnDataLoss=false")


def _row_number(msg_id: str) -> str:
    """The row number in its task a writer's deterministic message id ends with (hex)."""
    try:
        return str(int(msg_id[22:], 16) - 1)
    except ValueError:
        return "?"


def _substitute_twins(client: BrokerClient, txlog: TxLog, batch_id: int, record: list[Txn], replay: Sequence[Txn],
                      rows: _Rows) -> tuple[list[Txn], dict[str, str]]:
    """Put the replay's twin of each lost transaction of the record in its place (recorded
    before any END, with its destination's marks, see :meth:`TxLog.substitute`); returns the
    record and, by message id, why a lost one has no twin."""
    lost = txlog.lost(batch_id)
    if not lost:
        return record, {}
    sums = txlog.sums(batch_id)
    by_id = {t.msg_id: t for t in replay}
    nonces = rows.nonce_by_id()
    twins: dict[int, tuple[Txn, str]] = {}
    unmatched: dict[str, str] = {}
    for i, t in enumerate(record):
        if t.msg_id not in lost:
            continue
        twin = by_id.get(t.msg_id)
        if sums is None:
            unmatched[t.msg_id] = "the batch was recorded by an earlier version, without row checksums"
        elif twin is None:
            unmatched[t.msg_id] = (f"the replay wrote no row of this id (row {_row_number(t.msg_id)} of its task): "
                                   "fewer rows in its partition")
        elif twin.topic != t.topic:
            unmatched[t.msg_id] = f"the replay's row of this id goes to topic {twin.topic!r}, not {t.topic!r}"
        else:
            differ = sum_difference(sums.get(t.msg_id, ""), rows.sums.get(t.msg_id, ""))
            if differ:
                unmatched[t.msg_id] = f"the replay's row of this id differs in its {', '.join(differ)}"
            else:
                twins[i] = (twin, nonces.get(t.msg_id, ""))
    if twins:
        chosen = [tw for tw, _ in twins.values()]
        fresh = _riding_out(lambda: destination_marks(client, chosen), f"batch {batch_id}: reading the "
                            "destination's offsets") or {}
        record = txlog.substitute(batch_id, twins, fresh)
        log.warning("batch %d: %d rows its brokers lost are committed from the replay's rows of the same ids "
                    "(checksums equal): %s", batch_id, len(twins), _describe(chosen))
    return record, unmatched


def commit_batch(opts: WriterOptions, txns: list[Txn], batch_id: int, rows: _Rows | None = None) -> None:
    """Record the batch (once), then commit its transactions, each once.

    First time: the destination queues' max offsets are taken (:func:`destination_marks`) and
    ``txns`` recorded with them and the tasks' ``rows`` (checksums, nonces) under the checkpoint
    (:class:`TxLog`), then committed in the
    record's order with the progress marked as their ENDs are answered, and the batch marked
    ended. A replay of a recorded batch rolls back the ``txns`` not in the record and commits
    the recorded ones past the marked progress whose messages are not in the destination past
    the marks (an END the first commit had in flight was applied, or is sent now), waiting
    first until :data:`_SETTLE_S` after the first commit's last write; none once the batch was
    marked ended. A fault part-way (a lost answer) is handled the same way within the commit
    (:func:`_end_recorded`). A broker that cannot be reached (a restart) is waited for up to
    :data:`_BROKER_DOWN_S` at each step.

    Recorded transactions whose broker lost their half messages (:func:`commit_once`) are
    listed as lost in the record; a replay commits, in place of each, its own transaction of
    the same message id when the row's topic and checksum match (:func:`_substitute_twins`).
    Raises DataLossError while lost ones remain (the batch not marked ended; the rest
    committed), unless an operator accepted their loss (:meth:`TxLog.lost_accepted`);
    OptionError without a checkpointLocation, OSError when the
    record cannot be written, the client's errors when ENDs still fail (the batch is then not
    marked ended; its replay goes on from the progress mark)."""
    if not opts.checkpoint_location:
        raise OptionError("checkpointLocation", None, "delivery=exactly-once needs a checkpointLocation")
    rows = rows if rows is not None else _Rows({}, {})
    txlog = TxLog(opts.checkpoint_location)
    client = connect(opts.namesrv_addr, opts.endpoints, credentials=opts.credentials)
    try:
        if txlog.read(batch_id) is None:
            _commit_first(client, opts, txlog, batch_id, txns, rows)
            unmatched: dict[str, str] = {}
        else:
            unmatched = _commit_replay(client, opts, txlog, batch_id, txns, rows)
        if unmatched:  # lost message id -> why the replay has no twin for it
            accepted = txlog.lost_accepted(batch_id)
            if not accepted and opts.fail_on_data_loss:
                raise _unmatched_error(batch_id, txlog, unmatched)
            log.error("batch %d: ended without %d rows its brokers lost, as %s (first: %s)", batch_id,
                      len(unmatched), f"{txlog.accept_lost_path(batch_id)} says" if accepted else
                      "failOnDataLoss=false allows", next(iter(sorted(unmatched.items()))))
        txlog.mark_ended(batch_id)
    finally:
        client.close()


def _commit_first(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, txns: list[Txn],
                  rows: _Rows) -> None:
    """The first commit of a batch: the destination's marks taken, the batch recorded with them
    and the tasks' ``rows``, then its transactions committed; DataLossError (the lost ones
    marked in the record) when a broker lost half messages."""
    taken = _riding_out(lambda: destination_marks(client, txns), f"batch {batch_id}: reading the "
                        "destination's offsets") if txns else {}
    record = txlog.record(batch_id, txns, taken, sums=rows.sums, nonces=rows.nonces)
    lost = _end_recorded(client, opts, txlog, batch_id, record, 0, taken, look_first=False)
    if lost:
        txlog.mark_lost(batch_id, {record[i].msg_id for i in lost})
        raise _lost_error(batch_id, record, [record[i] for i in lost])


def _commit_replay(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, txns: list[Txn],
                   rows: _Rows) -> dict[str, str]:
    """A replay of a recorded batch: the recorded transactions committed from the marked
    progress (none once the batch was marked ended), then the replay's own rolled back but the
    twins that stand in for lost ones. Returns, by message id, why a lost one has no twin."""
    record = txlog.txns(batch_id)
    unmatched: dict[str, str] = {}
    if txlog.ended(batch_id):
        log.info("batch %d was already recorded and committed: rolling back the transactions of its replay",
                 batch_id)
    elif txlog.marks(batch_id) is None:  # an earlier version's record: its check-backs' commits are left out
        done = txlog.progress(batch_id)
        checked = txlog.legacy_checked(batch_id)
        record = record[:done] + [t for t in record[done:] if t.msg_id not in checked]
        _end_recorded(client, opts, txlog, batch_id, record, done, None, look_first=True)
    else:
        record, unmatched = _commit_recorded(client, opts, txlog, batch_id, record, txns, rows)
    kept = set(record)
    # halves are told apart by position: a replay's carry the recorded ids again
    _roll_back(client, opts, [t for t in txns if t not in kept],
               f"batch {batch_id}: rolling back its replay's transactions")
    return unmatched


def _commit_recorded(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, record: list[Txn],
                     txns: list[Txn], rows: _Rows) -> tuple[list[Txn], dict[str, str]]:
    """Commit a recorded batch (with marks) from its marked progress, once :data:`_SETTLE_S`
    passed since the first commit's last write, the replay's twins in place of lost ones
    (:func:`_substitute_twins`); the record as committed and, by message id, why a lost one
    has no twin."""
    wait = txlog.last_written(batch_id) + _SETTLE_S - time.time()
    if wait > 0:
        time.sleep(wait)
    unmatched: dict[str, str] = {}
    # at most twice: a half found lost by this commit is replaced from the replay at once
    for _ in range(2):
        record, unmatched = _substitute_twins(client, txlog, batch_id, record, txns, rows)
        lost_ids = txlog.lost(batch_id)
        skip = frozenset(i for i, t in enumerate(record) if t.msg_id in lost_ids)
        done = txlog.progress(batch_id)
        log.info("batch %d was already recorded; %d of its %d transactions are known committed: "
                 "committing the rest once each (%d lost are left out), then rolling back the "
                 "replay's", batch_id, done, len(record), len(skip))
        found = _end_recorded(client, opts, txlog, batch_id, record, done,
                              txlog.marks(batch_id), look_first=True, skip=skip)
        if not found:
            break
        txlog.mark_lost(batch_id, {record[i].msg_id for i in found})
    unmatched = {m: unmatched.get(m, "lost again while this replay committed it") for m in txlog.lost(batch_id)}
    return record, unmatched


def abort_batch(opts: WriterOptions, txns: list[Txn], batch_id: int | None) -> None:
    """Roll back ``txns``, except those recorded for ``batch_id`` under the checkpoint (a
    recorded batch is committed, never aborted); all of them without a checkpointLocation or
    a batch id. A rollback that fails is left to the brokers' check-backs (see :func:`_roll_back`)."""
    log_ = TxLog(opts.checkpoint_location) if opts.checkpoint_location and batch_id is not None else None
    recorded = set(log_.txns(batch_id)) if log_ is not None and batch_id is not None and \
        log_.read(batch_id) is not None else set()
    client = connect(opts.namesrv_addr, opts.endpoints, credentials=opts.credentials)
    # by position: a replay's halves carry the recorded ids again
    todo = [t for t in txns if t not in recorded]
    try:
        _roll_back(client, opts, todo, f"batch {batch_id}: rolling back its transactions")
    finally:
        client.close()


def _roll_back(client: BrokerClient, opts: WriterOptions, txns: list[Txn], what: str) -> None:
    """Roll back ``txns``, riding out an unreachable broker (:func:`_riding_out`). One that
    still fails, or that the broker refuses, is logged and left to the brokers: they ask
    about a half message until it is ended, and a check-back rolls back any half its batch
    record does not name (a batch write's are discarded after the broker's last check). A
    rollback sent by position to a broker that lost its store can hit other bytes there
    (Apache RocketMQ answered one with IllegalArgumentException "newLimit < 0"), and failed
    the query though nothing was left to undo."""
    try:
        _riding_out(lambda: client.end_transactions(txns, commit=False, producer_group=opts.producer_group), what)
    except RocketMQSparkError as exc:
        log.warning("%s failed (%s): the brokers roll those half messages back when they ask about them", what, exc)


class RocketMQBatchWriter(DataSourceArrowWriter):
    """``df.write.format("rocketmq")``: tasks send (:func:`write_rows`, no batch id); with
    exactly-once the driver commits every reported half message, or rolls them back on
    abort, without a batch record (Spark does not replay a batch write)."""

    def __init__(self, opts: WriterOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        return write_rows(self.opts, iterator, None)

    def commit(self, messages: list[Any]) -> None:
        """Every task succeeded: exactly-once commits their half messages, each once
        (:func:`commit_once`: an END whose answer was lost is looked up, not sent again)."""
        if self.opts.exactly_once:
            client = connect(self.opts.namesrv_addr, self.opts.endpoints, credentials=self.opts.credentials)
            try:
                txns = sorted(_txns(messages))
                marks = destination_marks(client, txns) if txns else {}
                lost = commit_once(client, self.opts, txns, 0, marks, look_first=False, what="the batch write")
                if lost:
                    raise DataLossError(
                        f"the batch write: the brokers hold no prepared (half) message for {len(lost)} of its "
                        f"{len(txns)} rows ({_describe([txns[i] for i in lost])}), and their messages are not in the "
                        "destination: the broker lost them (its store wiped or replaced?) after the tasks sent them. "
                        "The other rows are written; these are not (a batch write is not replayed): write them again")
            finally:
                client.close()

    def abort(self, messages: list[Any]) -> None:
        if self.opts.exactly_once:
            abort_batch(self.opts, _txns(messages), None)
