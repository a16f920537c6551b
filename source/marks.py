"""A queue's mark: the offset and store time of one message a query planned past. A broker
that lost its store (or whose topic was deleted and re-created) serves other messages at the
same offsets once new ones arrive; the message at the mark, pulled again, then has another
store time. The planner takes and compares marks (:mod:`.data_loss`); a read task compares its
range's mark before it hands rows on (:mod:`.reader`)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..codec.record import iter_records
from ..model import PullResult
from ..offsets import Mark

__all__ = ["iso", "mark_below", "store_time_in"]


def iso(ms: int) -> str:
    """Epoch millis as ISO-8601 UTC (for messages)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def store_time_in(offset: int, res: PullResult) -> int | None:
    """Store time (epoch ms) of the message at ``offset`` in a pull's answer, None when it has none.

    Read from the records' heads (or, over gRPC, the messages' system properties), not through
    Arrow: the planner calls this in the process Spark starts for each query, where building an
    Arrow array from Python values would import pandas first (pyarrow checks its input for
    pandas objects), ~0.2 s of every query's start. ProtocolError on bytes that do not decode."""
    if res.status != "FOUND":
        return None
    for m in res.messages:  # gRPC
        sp = m.system_properties
        if sp.queue_offset == offset:
            ts = sp.store_timestamp
            return ts.seconds * 1000 + ts.nanos // 1_000_000 if sp.HasField("store_timestamp") else None
    for rec in iter_records(res.body):
        if rec.queue_offset == offset:
            return rec.store_timestamp
    return None


def mark_below(mark: Mark | None, end: int) -> Mark | None:
    """``mark`` when it names a message below ``end`` (one the planned range's store held)."""
    return mark if mark is not None and mark[0] < end else None
