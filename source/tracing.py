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

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from ..client.trace import TraceDispatcher, arrow_records, dispatcher, found_by, or_null
from ..codec.trace import DEFAULT_REGION
from ..namespaces import unwrap
from .context import client_config
from .queue_range import QueueRange

__all__ = ["TRACE_COLUMNS", "ReadTrace", "flush_traces"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: the columns a traced read decodes whatever the query asks for
TRACE_COLUMNS = ("messageId", "keys")
#: how long a task waits at its end for its trace records to be sent (seconds)
FLUSH_S = 5.0


def _dispatcher(part: QueueRange) -> TraceDispatcher:
    return dispatcher(part.trace_topic or "", part.namesrv, part.endpoints, part.credentials, part.tls,
                      client_config(part.broker_down_timeout_ms))


class _Handed(NamedTuple):
    """A batch handed on: what its SubAfter records need."""

    request_id: str
    ids: pa.Array
    keys: pa.Array  # each message's keys, space-separated ("" for none)
    found_by: pa.Array  # per message: its id and keys, each followed by a space
    since: float  # time.monotonic() when handed on


def sub_records(kind: str, head: Sequence[object], ids: pa.Array, middle: Sequence[object] | pa.Array,
                keys: pa.Array, tail: Sequence[object]) -> pa.Array:
    """One record per message: ``kind``, the ``head`` fields, the message id, ``middle``
    (fields, or a string array of one field per message), its keys, the ``tail`` fields (what
    :func:`~rocketmq_spark.codec.trace.encode_sub` writes one by one)."""
    mid: list[object] = [middle] if isinstance(middle, pa.Array) else list(middle)
    return arrow_records([kind, *head, ids, *mid, or_null(keys), *tail])


class ReadTrace:
    """The trace of one task's read of ``part`` (see the module docstring). It never raises:
    an error making or queueing records is logged and turns the task's tracing off."""

    def __init__(self, part: QueueRange) -> None:
        self.part = part
        self.group = unwrap(part.namespace, part.group)
        self.dispatcher: TraceDispatcher | None = None
        self._guarded(self._open)

    def _open(self) -> None:
        self.dispatcher = _dispatcher(self.part)

    def _guarded(self, fn: Callable[[], _T]) -> _T | None:
        if self.part.trace_topic is None:
            return None
        try:
            return fn()
        except Exception as exc:  # tracing never fails a read
            log.warning("message trace of %s: %s; this task traces no more", self.part.mq, exc, exc_info=True)
            self.part = replace(self.part, trace_topic=None)
            return None

    def before(self, batch: pa.RecordBatch) -> _Handed | None:
        """SubBefore records of ``batch`` (rows about to be handed on), queued; what
        :meth:`after` needs (None for an empty batch, or when not tracing)."""
        return self._guarded(lambda: self._before(batch)) if batch.num_rows else None

    def after(self, handed: _Handed | None) -> None:
        """SubAfter records of a batch Spark took (``handed``: what :meth:`before` returned)."""
        if handed is not None:
            self._guarded(lambda: self._after(handed))

    def _before(self, batch: pa.RecordBatch) -> _Handed:
        dispatcher = self.dispatcher
        if dispatcher is None:
            raise RuntimeError("no trace dispatcher")
        ids = pc.fill_null(batch.column(batch.schema.get_field_index("messageId")), "")
        keys = pc.fill_null(pc.binary_join(batch.column(batch.schema.get_field_index("keys")), " "), "")
        at = batch.schema.get_field_index("reconsumeTimes")
        retries: Sequence[object] | pa.Array = (pc.fill_null(pc.cast(batch.column(at), pa.string()), "0")
                                                if at >= 0 else ["0"])
        handed = _Handed(uuid.uuid4().hex.upper(), ids, keys, found_by(ids, keys), time.monotonic())
        head = (int(time.time() * 1000), DEFAULT_REGION, self.group, handed.request_id)
        dispatcher.add_arrays(sub_records("SubBefore", head, ids, retries, keys, ()), handed.found_by)
        return handed

    def _after(self, handed: _Handed) -> None:
        if self.dispatcher is None:
            return
        cost = int((time.monotonic() - handed.since) * 1000 / len(handed.ids))
        # fields: request id, id, cost, success, keys, context code (0: SUCCESS), time, group
        records = sub_records("SubAfter", (handed.request_id,), handed.ids, (cost, "true"), handed.keys,
                              (0, int(time.time() * 1000), self.group))
        self.dispatcher.add_arrays(records, handed.found_by)


def flush_traces(part: QueueRange) -> None:
    """Wait (up to :data:`FLUSH_S`) for the trace records of ``part``'s settings to be sent
    (never raises)."""
    if part.trace_topic is not None:
        try:
            _dispatcher(part).flush(FLUSH_S)
        except Exception as exc:  # tracing never fails a read
            log.warning("message trace of %s: %s", part.mq, exc)
