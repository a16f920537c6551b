"""Consumer-group offsets kept on the broker (the Java client's RemoteBrokerOffsetStore)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from ..errors import AccessDeniedError, ConnectionFailedError, OffsetResetPendingError, RocketMQSparkError
from ..model import MessageQueue

log = logging.getLogger(__name__)

#: how long the reader's and the committer listener's stores leave a broker they could not
#: reach alone (seconds; see BrokerOffsetStore): a broker that stopped answering must not cost
#: every commit (every batch, every progress event) a request timeout
RETRY_AFTER_S = 5.0

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
    queue supersedes them). A refusal by the broker's ACL is no fault: it would come again,
    so it is raised (:class:`~rocketmq_spark.errors.AccessDeniedError`) and not kept. With
    ``retry_after_s``, a broker that could not be reached
    (a connection fault, none of its queues committed) is asked again only by the first
    commit that long after.

    Offsets are next offsets (the first message not yet consumed). Not thread-safe: one
    caller at a time (the reader's planner; the committer listener holds its own lock).
    """

    def __init__(self, client: OffsetClient, group: str, *, retry_after_s: float = 0.0) -> None:
        self.client = client
        self.group = group
        self.retry_after_s = retry_after_s
        self._pending: dict[MessageQueue, int] = {}
        self._written: dict[MessageQueue, int] = {}
        #: broker -> when a commit last found it unreachable, and why
        self._unreachable: dict[str, tuple[float, Exception]] = {}
        #: broker -> the address its group offsets went to last (see _follow_homes)
        self._homes: dict[str, str] = {}

    def read(self, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq`` on its broker, None when it has none; the
        client's errors are raised."""
        return self.client.query_consumer_offset(self.group, mq)

    def read_many(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        """:meth:`read` of many queues at once (the client pipelines the requests)."""
        return self.client.query_consumer_offsets(self.group, mqs)

    def commit(self, offsets: dict[MessageQueue, int]) -> dict[MessageQueue, Exception]:
        """Write ``offsets`` and the pending failures of earlier commits, skipping queues
        whose offset this store already wrote; returns this round's failures (queue -> error;
        a queue of a broker found unreachable less than ``retry_after_s`` ago is not sent and
        has that error), kept for the next commit. Offsets are written as given: nothing stops
        one moving back. Raises the first ACL refusal (after recording the rest)."""
        self._follow_homes(offsets)
        todo = dict(self._pending)
        todo.update(offsets)
        changed = {mq: off for mq, off in sorted(todo.items()) if self._written.get(mq) != off}
        for mq in todo.keys() - changed.keys():
            self._pending.pop(mq, None)
        failed: dict[MessageQueue, Exception] = {}
        now = time.monotonic()
        for mq in list(changed):
            seen = self._unreachable.get(mq.broker)
            if seen is not None and now - seen[0] < self.retry_after_s:
                failed[mq] = seen[1]
                self._pending[mq] = changed.pop(mq)
        if failed:
            log.debug("group %s: %d offsets wait for brokers found unreachable lately (%s)", self.group,
                      len(failed), ", ".join(sorted({mq.broker for mq in failed})))
        # A 5.x broker makes a group's offset table of a topic on its first commit without a lock:
        # two first commits handled at once keep only one of them (the full suite lost a queue's
        # offset that way, answered SUCCESS). The first commit of each topic on each broker goes
        # alone, then one pipelined round of requests for the rest, not one round trip per queue.
        known = {(mq.broker, mq.topic) for mq in self._written}  # each broker keeps a table per topic
        firsts: dict[tuple[str, str], MessageQueue] = {}
        for mq in changed:
            if (mq.broker, mq.topic) not in known:
                firsts.setdefault((mq.broker, mq.topic), mq)
        if firsts:
            failed.update(self._update({mq: changed[mq] for mq in firsts.values()}))
        alone = set(firsts.values())
        rest = {mq: off for mq, off in changed.items() if mq not in alone}
        for mq in list(rest):
            seen = self._unreachable.get(mq.broker)
            if seen is not None and seen[0] >= now:  # the first commits just found it unreachable
                failed[mq] = seen[1]
                del rest[mq]
        if rest:
            failed.update(self._update(rest))
        denied: AccessDeniedError | None = None
        for mq, offset in changed.items():
            exc = failed.get(mq)
            if isinstance(exc, AccessDeniedError):  # not kept: the next commit would be refused the same way
                denied = denied or exc
                self._pending.pop(mq, None)
                continue
            if isinstance(exc, OffsetResetPendingError):  # the broker holds a reset: never written over it
                log.info("commit of offset %d for %s (group %s) ignored by the broker: a reset of the queue waits "
                         "for the group's next pull", offset, mq, self.group)
                self._pending.pop(mq, None)
                self._written.pop(mq, None)
                continue
            if exc is not None:
                log.warning("commit of offset %d for %s (group %s) failed, will retry at the next "
                            "commit: %s", offset, mq, self.group, exc)
                self._pending[mq] = offset
                continue
            self._written[mq] = offset
            self._pending.pop(mq, None)
        if denied is not None:
            raise denied
        return failed

    def _follow_homes(self, offsets: dict[MessageQueue, int]) -> None:
        """Offsets written to a broker group's slave while its master was down are not on the
        master when it returns (a classic master/slave group does not copy them back: the slave
        copies the master's), so once the group's commits go to another member (the client's
        ``offsets_home``) every offset of the group is written again, not only those that moved."""
        home_of = getattr(self.client, "offsets_home", None)
        if home_of is None:
            return
        for broker in sorted({mq.broker for mq in offsets} | {mq.broker for mq in self._written}):
            home = home_of(broker)
            last = self._homes.get(broker)
            if home is None or home == last:
                continue
            self._homes[broker] = home
            if last is None:
                continue
            again = {mq: off for mq, off in self._written.items() if mq.broker == broker}
            for mq, off in again.items():
                del self._written[mq]
                self._pending.setdefault(mq, off)
            log.info("group %s: the offsets of broker %s go to %s now (went to %s): its %d offsets are written "
                     "there again", self.group, broker, home, last, len(again))

    def _update(self, offsets: dict[MessageQueue, int]) -> dict[MessageQueue, RocketMQSparkError]:
        """One round of commits; notes the brokers it could not reach (none of their queues
        committed, a connection fault), and forgets those that answered."""
        failed = self.client.update_consumer_offsets(self.group, offsets)
        done = time.monotonic()
        answered = {mq.broker for mq in offsets if mq not in failed}
        for mq, exc in failed.items():
            if isinstance(exc, ConnectionFailedError) and mq.broker not in answered:
                self._unreachable[mq.broker] = (done, exc)
        for broker in answered:
            self._unreachable.pop(broker, None)
        return failed

    def answered(self, broker: str) -> None:
        """``broker`` was heard from (e.g. by the reader's planner): the next commit asks it again."""
        self._unreachable.pop(broker, None)

    def forget(self, mq: MessageQueue) -> None:
        """The broker's offset of ``mq`` changed behind this store (a reset): the next commit
        writes whatever it is given, even a value written before."""
        self._written.pop(mq, None)
        self._pending.pop(mq, None)

    @property
    def pending(self) -> dict[MessageQueue, int]:
        """The offsets whose commit failed and waits for the next commit (a copy)."""
        return dict(self._pending)
