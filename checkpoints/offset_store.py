"""Consumer-group offsets kept on the broker (the Java client's RemoteBrokerOffsetStore)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from ..errors import RocketMQSparkError
from ..model import MessageQueue

log = logging.getLogger(__name__)

__all__ = ["BrokerOffsetStore", "OffsetClient", "OffsetStore"]


class OffsetClient(Protocol):
    """What :class:`BrokerOffsetStore` uses of a client (a :class:`~rocketmq_spark.client.BrokerClient`
    has it; see :mod:`rocketmq_spark.client.contract` for the semantics)."""

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None: ...

    def query_consumer_offsets(self, group: str, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]: ...

    def update_consumer_offsets(self, group: str, offsets: dict[MessageQueue, int]
                                ) -> dict[MessageQueue, RocketMQSparkError]: ...


class OffsetStore(Protocol):
    """A consumer group's committed offsets (next offsets: the first message not yet consumed)."""

    def read(self, mq: MessageQueue) -> int | None: ...

    def commit(self, offsets: dict[MessageQueue, int]) -> dict[MessageQueue, Exception]: ...


class BrokerOffsetStore:
    """Reads and writes ``group``'s next-to-consume offsets on the brokers owning the queues.

    :meth:`commit` never raises for a broker fault: failures are logged with the queue
    and offset, kept, and retried on the next commit (a later offset for the same
    queue supersedes them).

    Offsets are next offsets (the first message not yet consumed). Not thread-safe: one
    caller at a time (the reader's planner; the committer listener holds its own lock).
    """

    def __init__(self, client: OffsetClient, group: str) -> None:
        self.client = client
        self.group = group
        self._pending: dict[MessageQueue, int] = {}
        self._written: dict[MessageQueue, int] = {}

    def read(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq`` on its broker, None when it has none; the
        client's errors are raised."""
        return self.client.query_consumer_offset(self.group, mq)

    def read_many(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        """:meth:`read` of many queues at once (the client pipelines the requests)."""
        return self.client.query_consumer_offsets(self.group, mqs)

    def commit(self, offsets: dict[MessageQueue, int]) -> dict[MessageQueue, Exception]:
        """Write ``offsets`` and the pending failures of earlier commits, skipping queues
        whose offset this store already wrote; returns this round's failures (queue -> error),
        kept for the next commit. Offsets are written as given: nothing stops one moving back."""
        todo = dict(self._pending)
        todo.update(offsets)
        changed = {mq: off for mq, off in sorted(todo.items()) if self._written.get(mq) != off}
        for mq in todo.keys() - changed.keys():
            self._pending.pop(mq, None)
        # A 5.x broker makes a group's offset table of a topic on its first commit without a lock:
        # two first commits handled at once keep only one of them (the full suite lost a queue's
        # offset that way, answered SUCCESS). The first commit of each topic on each broker goes
        # alone, then one pipelined round of requests for the rest, not one round trip per queue.
        failed: dict[MessageQueue, Exception] = {}
        known = {(mq.broker, mq.topic) for mq in self._written}  # each broker keeps a table per topic
        firsts: dict[tuple[str, str], MessageQueue] = {}
        for mq in changed:
            if (mq.broker, mq.topic) not in known:
                firsts.setdefault((mq.broker, mq.topic), mq)
        if firsts:
            failed.update(self.client.update_consumer_offsets(self.group, {mq: changed[mq] for mq in firsts.values()}))
        alone = set(firsts.values())
        rest = {mq: off for mq, off in changed.items() if mq not in alone}
        if rest:
            failed.update(self.client.update_consumer_offsets(self.group, rest))
        for mq, offset in changed.items():
            exc = failed.get(mq)
            if exc is not None:
                log.warning("commit of offset %d for %s (group %s) failed, will retry at the next "
                            "commit: %s", offset, mq, self.group, exc)
                self._pending[mq] = offset
                continue
            self._written[mq] = offset
            self._pending.pop(mq, None)
        return failed

    def forget(self, mq: MessageQueue) -> None:
        """The broker's offset of ``mq`` changed behind this store (a reset): the next commit
        writes whatever it is given, even a value written before."""
        self._written.pop(mq, None)
        self._pending.pop(mq, None)

    @property
    def pending(self) -> dict[MessageQueue, int]:
        """The offsets whose commit failed and waits for the next commit (a copy)."""
        return dict(self._pending)
