"""``df.write`` / ``df.writeStream`` ``.format("rocketmq")``: tasks send, the driver commits.

at-least-once: rows are grouped into batch sends bounded by count and bytes, several
in flight per task; a failed send is retried (bounded, with backoff), moving to a queue
of another broker when the topic has several.

exactly-once: every row is sent as a transactional half message (invisible to
consumers) tagged with the batch; the driver's ``commit()`` records the batch's
transactions under the checkpoint location (:mod:`.txlog`) and then ends them with
commit; ``abort()`` rolls them back. A replayed batch commits nothing twice once its first
commit finished: the driver side is :mod:`.transactional`.
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
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
)

from ..client import BrokerClient
from ..client.contract import Answer
from ..codec import (
    BatchEntry,
    EncodedBatch,
    MessageRecord,
    PropertyKey,
    SysFlag,
    TransactionType,
    batch_entries,
    decode_records,
    encode_properties,
    java_string_hash,
    offset_msg_id,
)
from ..errors import (
    AccessDeniedError,
    BrokerError,
    ConnectionFailedError,
    DataLossError,
    OptionError,
    RocketMQSparkError,
)
from ..model import MessageQueue
from ..names import retry_topic
from ..namespaces import wrap
from ..options import topic_name
from .encode import (
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
from .tracing import PlainRows, open_trace
from .transactional import (
    BROKER_DOWN_S,
    TaskReport,
    _rows,
    _txns,
    abort_batch,
    check_decision,
    commit_batch,
    commit_once,
    describe,
    destination_marks,
    riding_out,
    row_sum,
    traced_ends,
)
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
    sent: float = 0.0  # when it went out (time.time(); traced sends only)
    rows: PlainRows | None = None  # traced sends of encoded rows: what their Pub records need


_WINDOW = 8  # batch sends in flight per task
_TX_WINDOW = 128  # half messages in flight per task (past _TX_BURST)
_TX_BURST = 32  # half messages written together (a request each, one write for all)
#: A broker whose send failed for want of a connection is skipped this long (seconds).
_BROKER_PAUSE_S = 5.0


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
        self.client: BrokerClient = opts.connect()
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
        #: half messages waiting to go out with their burst: (queue, request, entry, sysFlag, UNIQ_KEY, when)
        self._queued: list[tuple[MessageQueue, Any, list[BatchEntry], int, str, float]] = []
        self._buffers: dict[tuple[str, str | None], tuple[list[BatchEntry], int]] = {}
        #: a row's topic -> the name it is sent to (wrapped in the namespace), checked
        self._wire_topics: dict[str, str] = {}
        self._paused: dict[str, float] = {}  # broker -> monotonic time until which it is skipped
        #: what a half message's properties end with: TRAN_MSG, its producer group and the
        #: TX_TAG ``<batchId>:<partition>:<attempt>:<sinkId>:<nonce>`` check-backs are answered by
        tag = (f"{batch_id if batch_id is not None else -1}:{self.partition}:{self.attempt}:"
               f"{self.txlog.sink_id if self.txlog is not None else '-'}:{self.nonce}")
        self._half_suffix = half_properties(opts.producer_group, tag)
        #: traceEnabled: a Pub trace record of every message stored
        self.trace = open_trace(opts)

    # -- queues ---------------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        qs = self._queues.get(topic)
        if qs is None:
            # a task's client is new and knows no route: a name server restarting (seconds)
            # failed every task that started meanwhile, and then the query
            qs = riding_out(lambda: self.client.message_queues(topic, writable=True),
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
        # traceEnabled: the Pub records of each send's rows (ids from the same sequence)
        traced = self._plain_rows(batch) if self.trace is not None else None
        self._seq += batch.num_rows
        self.rows += batch.num_rows
        at = 0
        for sends in encoded:
            self._submit(self._next_queue(topic), sends, 0, ordered=False,
                         rows=traced.slice(at, sends.count) if traced is not None else None)
            at += sends.count
        return True

    def _plain_rows(self, batch: pa.RecordBatch) -> PlainRows | None:
        """What the Pub records of ``batch``'s rows need (None, logged, when it cannot be had:
        tracing never fails a write)."""
        try:
            return PlainRows.of(batch, self._uniq_prefix, self._seq + 1)
        except Exception as exc:
            log.warning("message trace: the Pub records of %d rows are left out: %s", batch.num_rows, exc)
            return None

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
            t = topic[i]
            if t:
                t = self._check_topic(t)
            elif default_topic:
                t = default_topic
            else:
                raise OptionError("column topic", None, f"partition {self.partition} row {row_index}: no topic "
                                  "(column null and no option topic)")
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

    def _check_topic(self, topic: str) -> str:
        """A row's topic as it travels (wrapped in the namespace); each distinct name checked
        once, before anything of it is sent."""
        wire = self._wire_topics.get(topic)
        if wire is None:
            wire = self._wire_topics[topic] = topic_name("column topic", topic, topic, self.opts.namespace)
        return wire

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
                batch_properties: str = "", uniq: str = "", rows: PlainRows | None = None) -> None:
        """Send ``entries`` to ``mq`` (``ordered``: a message group's, which waits for the sends
        before it to land; ``uniq``: a half message's UNIQ_KEY, which names its transaction)."""
        if ordered:
            # FIFO: the previous sends must have landed before this one goes out.
            self._drain(0)
        # each client's request is its own (a remoting frame, gRPC calls): opaque here
        req: Any = self.client.send_request(mq, entries, producer_group=self.opts.producer_group, sys_flag=sys_flag,
                                            batch_properties=batch_properties)
        if uniq and not ordered:  # a half message: written with the rest of its burst
            self._queued.append((mq, req, entries, sys_flag, uniq, time.time()))  # type: ignore[arg-type]
            if len(self._queued) >= _TX_BURST:
                self._drain(_TX_WINDOW)
            return
        try:
            fut = self.client.send_async(mq, req)
        except RocketMQSparkError as exc:  # e.g. no connection: retried (elsewhere) by _drain
            fut = Future()
            fut.set_exception(exc)
        self._inflight.append(_Send(fut, mq, entries, sys_flag, batch_properties, ordered, uniq, time.time(), rows))
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
        for (mq, _, entries, sys_flag, uniq, at), fut in zip(queued, futs, strict=True):
            self._inflight.append(_Send(fut, mq, entries, sys_flag, "", False, uniq, at))

    def _drain(self, keep: int) -> None:
        """Send the queued half messages, then wait for answers until ``keep`` are in flight."""
        if self._queued:
            self._send_queued()
        while len(self._inflight) > keep:
            send = self._inflight.popleft()
            prepared = bool(send.sys_flag & TransactionType.PREPARED)
            results: list[Any] | None = None
            try:
                resp = send.answer.result(self.client.config.request_timeout_s)
                # only the outcome here: a half message's transaction is read from an answer
                # that stored it, below (an answer it cannot be read from is not sent again)
                self.client.check_sent(send.queue, len(send.entries), resp)
            except AccessDeniedError:  # the same answer every time: fail the task at once
                raise
            except Exception as exc:  # retried below with bounds, then reported
                log.info("send of %d messages to %s failed (%s); retrying", len(send.entries), send.queue, exc)
                results = self._retry(send, exc)
                if prepared:  # a half message is sent alone
                    self.txns.append(self.client.transaction(results[0], send.uniq))
            else:
                if prepared:
                    self.txns.append(self.client.half_transaction(send.queue, resp, send.uniq))
                if self.trace is not None:
                    results = self._results_for_trace(send, resp)
            if self.trace is not None and results is not None:
                self._traced(send, results)

    def _results_for_trace(self, send: _Send, resp: Any) -> list[Any] | None:
        """Each message's result of an answer that stored the send, for its Pub records
        (None, logged, when the answer does not say: the send stands, its trace does not)."""
        try:
            return self.client.send_results(send.queue, len(send.entries), resp)
        except Exception as exc:
            log.warning("message trace: the results of a send to %s cannot be read (%s); its Pub records are "
                        "left out", send.queue, exc)
            return None

    def _retry(self, send: _Send, first: BaseException) -> list[Any]:
        """Send again, with backoff: three attempts, and while the broker cannot be reached
        (a restart: seconds on Apache RocketMQ) for up to :data:`BROKER_DOWN_S` from the
        first failure. An unordered batch whose broker cannot be reached moves to another
        broker at once; a message group's stays on its queue (its order), so it waits."""
        last: BaseException = first
        mq, entries = send.queue, send.entries
        target = mq
        move_now = self._pause(mq.broker, first) and not send.ordered
        deadline = time.monotonic() + BROKER_DOWN_S
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

    def _traced(self, send: _Send, results: list[Any]) -> None:
        """Pub trace records of a send that stored ``results`` (tracing never fails the task)."""
        if self.trace is None:
            return
        started, cost = int(send.sent * 1000), int((time.time() - send.sent) * 1000)
        try:
            if send.rows is not None:
                self.trace.sent_rows(self.client, send.rows, results, started, cost)
            else:
                self.trace.sent(self.client, batch_entries(send.entries), results, send.sys_flag, started, cost)
        except Exception as exc:
            log.warning("message trace: the Pub records of a send to %s were not made: %s", send.queue, exc)

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
        if self.trace is not None:
            try:
                self.trace.flush()
            except Exception as exc:  # tracing never fails a write
                log.warning("message trace: %s", exc)
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
    client = opts.connect(endpoints=False)
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
                # rows as the reader read them name the user's topic
                mq = MessageQueue(wrap(opts.namespace, str(topic[i])), str(broker[i]), int(qid[i]))
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
            client = self.opts.connect()
            try:
                txns = sorted(_txns(messages))
                marks = destination_marks(client, txns) if txns else {}
                lost = commit_once(client, self.opts, txns, 0, marks, look_first=False, what="the batch write")
                if lost:
                    raise DataLossError(
                        f"the batch write: the brokers hold no prepared (half) message for {len(lost)} of its "
                        f"{len(txns)} rows ({describe([txns[i] for i in lost])}), and their messages are not in the "
                        "destination: the broker lost them (its store wiped or replaced?) after the tasks sent them. "
                        "The other rows are written; these are not (a batch write is not replayed): write them again")
                traced_ends(self.opts, client, txns, commit=True)
            finally:
                client.close()

    def abort(self, messages: list[Any]) -> None:
        if self.opts.exactly_once:
            abort_batch(self.opts, _txns(messages), None)
