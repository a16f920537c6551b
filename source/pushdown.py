"""Filters a batch read pushes down (DataSourceReader.pushFilters, pyspark >= 4.1): what the
reader can use to read less. Spark still evaluates every filter on the rows read, so the
bounds taken here only need to keep every row that can match (never fewer): a read with
pushdown returns exactly what the same read without it returns.

- ``storeTimestamp`` compared with a timestamp (``=``, ``<``, ``<=``, ``>``, ``>=``, and so
  BETWEEN): a time window, turned into per-queue offset bounds by the broker's search by store
  time (the binary search of mqadmin resetOffsetByTime);
- ``tag`` equal to or IN strings: the subscription's tags, so the broker filters by tag hash;
- ``topic``, ``broker`` and ``queueId`` equal to or IN values: queues pruned before planning.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

from ..codec import subscribed_tags
from ..model import MessageQueue

__all__ = ["Pushed", "pushed_of"]


@dataclass(frozen=True)
class Pushed:
    """What pushed filters allow: a store-time window ``[time_lo, time_hi)`` in epoch ms (None:
    open), the tags, topics, brokers and queue ids a row may have (None: any)."""

    time_lo: int | None = None
    time_hi: int | None = None
    tags: frozenset[str] | None = None
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None

    @property
    def nothing(self) -> bool:
        """The filters contradict each other: no row can match."""
        return (self.time_lo is not None and self.time_hi is not None and self.time_lo >= self.time_hi) or any(
            s is not None and not s for s in (self.tags, self.topics, self.brokers, self.queue_ids))

    def keeps(self, mq: MessageQueue) -> bool:
        return ((self.topics is None or mq.topic in self.topics)
                and (self.brokers is None or mq.broker in self.brokers)
                and (self.queue_ids is None or mq.queue_id in self.queue_ids))

    def sub_expression(self, given: str, sub_type: str = "TAG") -> str:
        """The subscription to read with: the option's (``given``) narrowed to the pushed tags
        (an SQL92 filter is kept as it is: Spark filters the rows by tag after it)."""
        if self.tags is None or sub_type != "TAG":
            return given
        allowed = subscribed_tags(given)
        tags = self.tags if allowed is None else self.tags & allowed
        return " || ".join(sorted(tags)) if tags else ""


def _ms(value: Any) -> float | None:
    """A timestamp filter value as epoch ms (fractional); None for anything else. Spark hands
    TIMESTAMP values as datetimes (naive ones in the local time zone, as pyspark makes them)."""
    return value.timestamp() * 1000 if isinstance(value, datetime) else None


def _values(f: Filter) -> tuple[Any, ...]:
    return tuple(f.value) if isinstance(f, In) else (f.value,)  # type: ignore[attr-defined]


def _narrow(current: frozenset[Any] | None, values: Iterable[Any]) -> frozenset[Any]:
    got = frozenset(values)
    return got if current is None else current & got


def pushed_of(filters: Sequence[Filter]) -> Pushed:
    """The :class:`Pushed` of ``filters`` (their AND); filters of other columns or forms,
    and values of other types, are left out (Spark evaluates them all anyway)."""
    p = Pushed()
    for f in filters:
        column: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
        if len(column) != 1:
            continue
        name = column[0]
        if name == "storeTimestamp" and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                                        LessThanOrEqual)):
            ms = _ms(f.value)
            if ms is None:
                continue
            # store times are whole milliseconds: widen to the ms around the value (never narrower)
            if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
                lo = math.floor(ms)
                p = replace(p, time_lo=lo if p.time_lo is None else max(p.time_lo, lo))
            if isinstance(f, (LessThan, LessThanOrEqual, EqualTo)):
                hi = math.floor(ms) + 1
                p = replace(p, time_hi=hi if p.time_hi is None else min(p.time_hi, hi))
        elif isinstance(f, (EqualTo, In)):
            values = _values(f)
            if name == "tag" and all(isinstance(v, str) for v in values):
                p = replace(p, tags=_narrow(p.tags, values))
            elif name == "topic" and all(isinstance(v, str) for v in values):
                p = replace(p, topics=_narrow(p.topics, values))
            elif name == "broker" and all(isinstance(v, str) for v in values):
                p = replace(p, brokers=_narrow(p.brokers, values))
            elif name == "queueId" and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                p = replace(p, queue_ids=_narrow(p.queue_ids, values))
    return p
