"""Message trace of a read task (option traceEnabled): what a Java consumer's trace hook
records, with a batch of rows handed to Spark as the consumption.

Each Arrow batch a task hands on is one request: its SubBefore records (time, group, request
id, each message's id, reconsume times and keys) go to the trace dispatcher as it is handed
on, its SubAfter records (the time until Spark asked for the next batch, divided among the
messages as the Java client divides a consumption's time) once Spark asks for more, or the
task ends. A batch Spark never finished with (a failed task) gets no SubAfter. Records are
sent by :mod:`rocketmq_spark.client.trace`, off the task's path; the task waits for them (a
few seconds at most) at its end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pyarrow as pa

from ..client import BrokerClient, connect
from ..client.trace import TraceDispatcher, dispatcher
from ..codec.trace import Sub, encode_sub, trace_keys
from ..namespaces import unwrap
from .context import client_config
from .queue_range import QueueRange

__all__ = ["TRACE_COLUMNS", "ReadTrace", "flush_traces"]

#: the columns a traced read decodes whatever the query asks for
TRACE_COLUMNS = ("messageId", "keys")
#: how long a task waits at its end for its trace records to be sent (seconds)
FLUSH_S = 5.0


def _dispatcher(part: QueueRange) -> TraceDispatcher:
    topic = part.trace_topic or ""

    def open_client() -> BrokerClient:
        return connect(part.namesrv, part.endpoints, client_config(part.broker_down_timeout_ms),
                       credentials=part.credentials, tls=part.tls)

    key = (part.namesrv, part.endpoints, part.credentials, part.tls, part.trace_topic)
    return dispatcher(key, open_client, topic)


class ReadTrace:
    """The trace of one task's read of ``part`` (see the module docstring)."""

    def __init__(self, part: QueueRange) -> None:
        self.dispatcher = _dispatcher(part)
        self.group = unwrap(part.namespace, part.group)

    def before(self, batch: pa.RecordBatch) -> tuple[Sub, float] | None:
        """SubBefore records of ``batch`` (rows about to be handed on), queued; what
        :meth:`after` needs (None for an empty batch)."""
        n = batch.num_rows
        if not n:
            return None
        ids = batch.column(batch.schema.get_field_index("messageId")).to_pylist()
        keys = [" ".join(k) if k else "" for k in batch.column(batch.schema.get_field_index("keys")).to_pylist()]
        at = batch.schema.get_field_index("reconsumeTimes")
        retries = batch.column(at).to_pylist() if at >= 0 else [0] * n
        sub = Sub(int(time.time() * 1000), self.group, uuid.uuid4().hex.upper(), tuple(ids), tuple(keys),
                  tuple(r or 0 for r in retries))
        self.dispatcher.add(_records(sub, encode_sub(sub, after=False)))
        return sub, time.monotonic()

    def after(self, started: tuple[Sub, float]) -> None:
        """SubAfter records of a batch Spark took (``started``: what :meth:`before` returned)."""
        sub, t0 = started
        cost = int((time.monotonic() - t0) * 1000 / len(sub.msg_ids))
        self.dispatcher.add(_records(sub, encode_sub(sub, after=True, cost_ms=cost, done_ms=int(time.time() * 1000))))


def _records(sub: Sub, records: list[str]) -> Iterator[tuple[str, list[str]]]:
    """``records`` (of ``sub``, one per message) with the keys each is found by."""
    for rec, msg_id, keys in zip(records, sub.msg_ids, sub.keys, strict=True):
        yield rec, list(trace_keys(msg_id, keys))


def flush_traces(part: QueueRange) -> None:
    """Wait (up to :data:`FLUSH_S`) for the trace records of ``part``'s settings to be sent."""
    if part.trace_topic is not None:
        _dispatcher(part).flush(FLUSH_S)
