"""Message trace of a write (option traceEnabled): a Pub record for each message a task's send
stored, as a Java producer's trace hook records it (message id, tags, keys, store host, body
length, the send's time, the message type: normal, a transaction's half message, or delayed;
the broker's offset message id), and with delivery=exactly-once an EndTransaction record for
each transaction the driver's commit (or abort) ended. Sent by
:mod:`rocketmq_spark.client.trace`, off the send path; a task, and the commit, wait for them (a
few seconds at most) when they finish."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from ..client import BrokerClient
from ..client.trace import TraceDispatcher, arrow_records, dispatcher, found_by, or_null
from ..codec import BatchEntry, PropertyKey, TransactionType
from ..codec.trace import DEFAULT_REGION, MessageType, Pub, encode_pub, trace_keys
from ..model import SendResult, Txn
from ..namespaces import unwrap
from .encode import uniq_ids
from .options import WriterOptions

__all__ = ["PlainRows", "WriteTrace", "open_trace"]

log = logging.getLogger(__name__)

#: how long a task waits at its end for its trace records to be sent (seconds)
FLUSH_S = 5.0
_DELAY_KEYS = (PropertyKey.DELAY, "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")


class PlainRows(NamedTuple):
    """What Pub records need of rows sent as one encoded batch (the columnar path), in order:
    their message ids, tags and keys ("" where none), body lengths."""

    ids: pa.Array
    tags: pa.Array
    keys: pa.Array
    body_lengths: pa.Array

    @classmethod
    def of(cls, batch: pa.RecordBatch, uniq_prefix: str, first_seq: int) -> PlainRows:
        """The rows of ``batch`` whose message ids are ``uniq_prefix`` + the sequence numbers
        from ``first_seq`` (10 hex digits), as :func:`.encode.encode_plain_rows` names them."""
        n = batch.num_rows
        ids = uniq_ids(uniq_prefix, first_seq, n)

        def text(name: str) -> pa.Array:
            i = batch.schema.get_field_index(name)
            return pc.fill_null(batch.column(i).cast(pa.string()), "") if i >= 0 else pa.array([""] * n, pa.string())

        body = batch.column(batch.schema.get_field_index("body"))
        return cls(ids, text("tag"), text("keys"), pc.cast(pc.binary_length(body.cast(pa.binary())), pa.string()))

    def slice(self, start: int, count: int) -> PlainRows:
        return PlainRows(*(a.slice(start, count) for a in self))


class WriteTrace:
    """The trace of one task's sends (see the module docstring)."""

    def __init__(self, opts: WriterOptions) -> None:
        self.dispatcher: TraceDispatcher = dispatcher(opts.trace_topic or "", opts.namesrv_addr, opts.endpoints,
                                                      opts.credentials, opts.tls)
        self.namespace = opts.namespace
        self.group = unwrap(opts.namespace, opts.producer_group)

    def sent(self, client: BrokerClient, entries: Sequence[BatchEntry], results: Sequence[SendResult], sys_flag: int,
             started_ms: int, cost_ms: int) -> None:
        """Pub records of ``entries``, stored as ``results`` say, by a send that went out at
        ``started_ms`` (epoch ms) and took ``cost_ms``."""
        records = []
        half = bool(sys_flag & TransactionType.PREPARED)
        for entry, res in zip(entries, results, strict=False):
            props = entry.property_map()
            kind = (MessageType.TRANSACTION_HALF if half else
                    MessageType.DELAY if any(k in props for k in _DELAY_KEYS) else MessageType.NORMAL)
            msg_id = props.get(PropertyKey.UNIQ_KEY) or res.msg_id
            keys = props.get(PropertyKey.KEYS, "")
            mq = res.queue
            pub = Pub(started_ms, self.group, unwrap(self.namespace, mq.topic), msg_id, props.get(PropertyKey.TAGS, ""),
                      keys, client.broker_addr(mq.broker, mq.topic), len(entry.body), cost_ms, kind, res.msg_id)
            records.append((encode_pub(pub), list(trace_keys(msg_id, keys))))
        self.dispatcher.add(records)

    def sent_rows(self, client: BrokerClient, rows: PlainRows, results: Sequence[SendResult], started_ms: int,
                  cost_ms: int) -> None:
        """Pub records of plain ``rows`` one batch send stored as ``results`` say (column-wise)."""
        if not results:
            return
        mq = results[0].queue
        offset_ids = pa.array([r.msg_id for r in results], pa.string())
        records = arrow_records(["Pub", started_ms, DEFAULT_REGION, self.group, unwrap(self.namespace, mq.topic),
                                 rows.ids, or_null(rows.tags), or_null(rows.keys),
                                 client.broker_addr(mq.broker, mq.topic),
                                 rows.body_lengths, cost_ms, int(MessageType.NORMAL), offset_ids, "true"])
        self.dispatcher.add_arrays(records, found_by(rows.ids, rows.keys))

    def ended(self, client: BrokerClient, txns: Sequence[Txn], *, commit: bool) -> None:
        """EndTransaction records of ``txns``, committed or rolled back by the driver (not from
        a check-back). The driver knows no tags or keys of them: those fields are null."""
        if not txns:
            return
        hosts: dict[tuple[str, str], str] = {}
        for t in txns:
            if (t.broker, t.topic) not in hosts:
                hosts[(t.broker, t.topic)] = client.broker_addr(t.broker, t.topic)
        ids = pa.array([t.msg_id for t in txns], pa.string())
        none = pa.array([""] * len(txns), pa.string())
        records = arrow_records([
            "EndTransaction", int(time.time() * 1000), DEFAULT_REGION, self.group,
            pa.array([unwrap(self.namespace, t.topic) for t in txns], pa.string()), ids, "null", "null",
            pa.array([hosts[(t.broker, t.topic)] for t in txns], pa.string()), int(MessageType.TRANSACTION_COMMIT),
            pa.array([t.transaction_id or t.msg_id for t in txns], pa.string()),
            "COMMIT_MESSAGE" if commit else "ROLLBACK_MESSAGE", "false"])
        self.dispatcher.add_arrays(records, found_by(ids, none))

    def flush(self, timeout_s: float = FLUSH_S) -> None:
        self.dispatcher.flush(timeout_s)


def open_trace(opts: WriterOptions) -> WriteTrace | None:
    """The trace of a write with traceEnabled (None without; None, logged, when it cannot be
    opened: tracing never fails a write)."""
    if opts.trace_topic is None:
        return None
    try:
        return WriteTrace(opts)
    except Exception as exc:
        log.warning("message trace to %r cannot be opened (%s): this write is not traced", opts.trace_topic, exc)
        return None
