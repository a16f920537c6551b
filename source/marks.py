"""A queue's mark: the offset and store time of one message a query planned past. A broker
that lost its store (or whose topic was deleted and re-created) serves other messages at the
same offsets once new ones arrive; the message at the mark, pulled again, then has another
store time. The planner takes and compares marks (:mod:`.data_loss`); a read task compares its
range's mark before it hands rows on (:mod:`.reader`)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..offsets import Mark

__all__ = ["iso", "mark_below"]


def iso(ms: int) -> str:
    """Epoch millis as ISO-8601 UTC (for messages)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def mark_below(mark: Mark | None, end: int) -> Mark | None:
    """``mark`` when it names a message below ``end`` (one the planned range's store held)."""
    return mark if mark is not None and mark[0] < end else None
