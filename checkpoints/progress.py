"""How far a consumer group is behind, per queue: the broker's min and max offsets, the
group's committed offset, the lag in messages and the store times around it.

One implementation for the ``rocketmq-spark progress`` command (mqadmin consumerProgress)
and the :class:`~rocketmq_spark.checkpoints.committer.RocketMQOffsetCommitter`'s lag. It
never imports pyspark: the command line shows progress without loading Spark.

Units throughout: offsets are next-offsets (a committed offset is the next message the
group will consume; a queue's max offset is the offset its next message will get, so
``max - committed`` messages are unread); times are milliseconds since the epoch (UTC).
The clients' many-queue calls are pipelined: one round of requests per call, not per queue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import AccessDeniedError
from ..model import MessageQueue

if TYPE_CHECKING:
    from ..client import BrokerClient

log = logging.getLogger(__name__)

__all__ = ["QueueLag", "QueueProgress", "StoreTimes", "group_progress", "queue_lag", "queue_lags"]


class StoreTimes:
    """Store times read by single-message pulls, which pull as the library's own consumer group
    (never the user's: a 5.x broker hands a pending offset reset of a group to its next pull).
    A user without Sub on that group under ACL is refused: the times are then unknown (None) and
    not asked again in this call, the offsets still count."""

    def __init__(self, client: BrokerClient) -> None:
        self.client = client
        self.refused: AccessDeniedError | None = None

    def at(self, mq: MessageQueue, offset: int) -> int | None:
        if self.refused is not None:
            return None
        try:
            return self.client.store_time_at(mq, offset)
        except AccessDeniedError as exc:
            self.refused = exc
            log.info("store times unknown (the lag in milliseconds is 0): %s", exc)
            return None


def _behind(offset: int | None, min_offset: int, max_offset: int) -> int:
    """Unread messages from ``offset`` (None: never committed, so from ``min_offset``) to ``max_offset``."""
    return max(0, max_offset - (min_offset if offset is None else offset))


@dataclass(frozen=True, slots=True)
class QueueLag:
    """One queue's lag at a next-offset ``offset``."""

    queue: MessageQueue
    offset: int  # next offset to consume
    max_offset: int
    messages_behind: int
    ms_behind: int  # how long the oldest unread message has been stored; 0 when caught up


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """One queue of a consumer group, as mqadmin consumerProgress shows it."""

    queue: MessageQueue
    min_offset: int
    max_offset: int  # the broker offset
    consumer_offset: int | None  # None: the group never committed this queue
    last_store_time: int | None  # store time of the last consumed message (at consumer_offset - 1), if any

    @property
    def lag(self) -> int:
        """Unread messages: from the committed offset (from ``min_offset`` when there is none) to the max."""
        return _behind(self.consumer_offset, self.min_offset, self.max_offset)


def queue_lags(client: BrokerClient, offsets: Mapping[MessageQueue, int],
               now_ms: int | None = None) -> dict[MessageQueue, QueueLag]:
    """The lag of each queue at its next-offset in ``offsets``.

    ``messages_behind`` counts from that offset to the queue's max offset; ``ms_behind`` is
    ``now_ms`` (default: now) minus the store time of the oldest unread message (the one at
    the offset, or the queue's first when older ones are gone), 0 when caught up or when
    that message cannot be read (nor under ACL, see :class:`StoreTimes`). One pipelined
    min/max request round for all the queues, then one single-message pull per queue that is
    behind. Raises the client's first
    failure (:class:`~rocketmq_spark.errors.RocketMQSparkError`).
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ranges = client.offset_ranges(list(offsets)) if offsets else {}
    out: dict[MessageQueue, QueueLag] = {}
    times = StoreTimes(client)
    for mq, offset in offsets.items():
        lo, hi = ranges[mq]
        behind = _behind(offset, lo, hi)
        waited = 0
        if behind:
            stored = times.at(mq, max(offset, lo))
            if stored is not None:
                waited = max(0, now_ms - stored)
        out[mq] = QueueLag(mq, offset, hi, behind, waited)
    return out


def queue_lag(client: BrokerClient, mq: MessageQueue, offset: int, now_ms: int | None = None) -> QueueLag:
    """:func:`queue_lags` of one queue."""
    return queue_lags(client, {mq: offset}, now_ms)[mq]


def group_progress(client: BrokerClient, group: str, topics: Sequence[str]) -> list[QueueProgress]:
    """Every queue of the ``topics`` on which ``group`` has committed at least one offset
    (a topic where it committed none is left out), in topic order, then the client's queue
    order. ``last_store_time`` is the store time of the last consumed message, None when
    the group never committed the queue or that message is gone.

    The committed offsets of all the topics' queues are asked in one pipelined call, the
    min/max offsets in another; then one single-message pull per committed queue. Raises
    the client's first failure (a topic without a route: :class:`~rocketmq_spark.errors.TopicNotFoundError`).
    """
    queues = [mq for topic in topics for mq in client.message_queues(topic)]
    committed = client.query_consumer_offsets(group, queues) if queues else {}
    read = {mq.topic for mq, offset in committed.items() if offset is not None}
    queues = [mq for mq in queues if mq.topic in read]
    ranges = client.offset_ranges(queues) if queues else {}
    rows: list[QueueProgress] = []
    times = StoreTimes(client)
    for mq in queues:
        (lo, hi), offset = ranges[mq], committed[mq]
        last = times.at(mq, offset - 1) if offset is not None and offset - 1 >= lo else None
        rows.append(QueueProgress(mq, lo, hi, offset, last))
    return rows
