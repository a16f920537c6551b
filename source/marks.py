"""A queue's mark: the offset and store time of one message a query planned past. A broker
that lost its store (or whose topic was deleted and re-created) serves other messages at the
same offsets once new ones arrive; the message at the mark, pulled again, then has another
store time. The planner takes and compares marks (:mod:`.data_loss`); a read task compares its
range's mark before it hands rows on (:mod:`.reader`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from ..client import BrokerClient
from ..model import MessageQueue, PullResult
from ..offsets import Mark

__all__ = ["iso", "mark_below", "store_time_in"]


def iso(ms: int) -> str:
    """Epoch millis as ISO-8601 UTC (for messages)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def store_time_in(client: BrokerClient, mq: MessageQueue, offset: int, res: PullResult) -> int | None:
    """Store time (epoch ms) of the message at ``offset`` in a pull's answer, None when it has none."""
    if res.status != "FOUND":
        return None
    rows = client.rows(mq, [res], offset + 1, ["queueOffset", "storeTimestamp"])
    offs = rows.column(0).to_pylist()
    if offset not in offs:
        return None
    us = rows.column(1).cast(pa.int64()).to_pylist()[offs.index(offset)]
    return None if us is None else int(us) // 1000


def mark_below(mark: Mark | None, end: int) -> Mark | None:
    """``mark`` when it names a message below ``end`` (one the planned range's store held)."""
    return mark if mark is not None and mark[0] < end else None
