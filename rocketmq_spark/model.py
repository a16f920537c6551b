"""Value objects shared by the client, the Spark source/sink and the offset side.

Offsets here are queue offsets (a message's index in its queue), counted in messages; where
a field holds a next-offset (one past the last message) its docstring says so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["MessageQueue", "PullResult", "SendResult", "Txn"]


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker: RocketMQ's unit of ordering and of offsets.

    Ordered by (topic, broker, queue_id), the canonical order of offsets JSON."""

    topic: str
    broker: str
    queue_id: int

    @property
    def key(self) -> str:
        """The queue's key inside a topic in offsets JSON: ``"broker-a:0"``."""
        return f"{self.broker}:{self.queue_id}"

    @classmethod
    def from_key(cls, topic: str, key: str) -> MessageQueue:
        """Inverse of :attr:`key`: ``"broker-a:0"`` of ``topic``. The last ``:`` splits (a
        broker name may hold one); the queue id is ASCII digits. Raises ValueError otherwise."""
        broker, sep, qid = key.rpartition(":")
        if not sep or not broker or not (qid.isascii() and qid.isdigit()):
            raise ValueError(f"queue key {key!r} of topic {topic!r} is not 'broker:queueId'")
        return cls(topic, broker, int(qid))

    def __str__(self) -> str:
        return f"{self.topic}/{self.broker}:{self.queue_id}"


@dataclass(frozen=True, slots=True)
class PullResult:
    """A pull's answer. ``body`` holds the records end to end, as the broker stored them.

    ``status``: ``FOUND``, ``NO_NEW_MSG`` (nothing at the offset yet), ``NO_MATCHED_MSG``
    (tag filter skipped a range; ``next_offset`` moved past it) or ``OFFSET_ILLEGAL``
    (``next_offset`` is where the queue really is).

    ``next_offset`` is the offset to pull next (one past the last message answered or
    skipped); ``min_offset`` and ``max_offset`` are the queue's, as next-offsets (max: one
    past its last message), -1 when the answer does not carry them (always over gRPC).
    """

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    body: bytes = b""
    #: gRPC pulls: the messages (``apache.rocketmq.v2.Message``) instead of record bytes.
    messages: tuple[Any, ...] = ()
    #: the address of the slave that answered ("": a master did); see :meth:`slave_lacks`
    from_slave: str = ""

    def slave_lacks(self, offset: int) -> bool:
        """Whether a slave answered a pull at ``offset`` without the message because it does not
        hold it (yet): the master had it (an ASYNC_MASTER's last messages not sent to the slave
        when it died), so the answer says nothing about the queue; ask again (the master, once
        it is back). A slave answers every such pull PULL_RETRY_IMMEDIATELY at the same offset."""
        return bool(self.from_slave) and self.status != "FOUND" and self.next_offset <= offset

    @property
    def size(self) -> int:
        """Bytes pulled: the record bytes, or the gRPC messages' bodies."""
        return len(self.body) if self.body else sum(len(m.body) for m in self.messages)


@dataclass(frozen=True, slots=True)
class SendResult:
    """One stored message of a send. ``queue_offset`` is the message's own offset (not a
    next-offset). Over remoting ``msg_id`` is the broker's offset message id and ``queue`` the
    queue the broker answered; over gRPC ``msg_id`` is the id the proxy gave and ``queue`` the
    queue the send named (the proxy picks the queue itself, so the offset may be another
    queue's). ``transaction_id``: the proxy's id of a half message (gRPC), else ""."""

    msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str = ""


class Txn(NamedTuple):
    """One half message (transactional send): enough to end it with END_TRANSACTION.

    Over remoting a transaction is named by its positions on the broker: ``queue_offset``
    the half message's offset as its send answered (END_TRANSACTION's tranStateTableOffset),
    ``commit_log_offset`` its byte position in the broker's commit log; over gRPC by the
    opaque ``transaction_id`` the proxy gave (``commit_log_offset`` is then 0).

    A named tuple rather than a frozen dataclass: a task makes one per row and the driver one
    per row of the batch, then sorts them (a frozen dataclass costs ~1 µs to build and
    compares through Python code)."""

    broker: str
    topic: str
    queue_offset: int  # tranStateTableOffset
    commit_log_offset: int
    msg_id: str  # UNIQ_KEY
    transaction_id: str = ""

    def to_list(self) -> list[object]:
        """The JSON form the writer's task reports and the sink's txlog keep:
        ``[broker, topic, queue_offset, commit_log_offset, msg_id]``, plus ``transaction_id``
        when there is one."""
        out: list[object] = [self.broker, self.topic, self.queue_offset, self.commit_log_offset, self.msg_id]
        if self.transaction_id:
            out.append(self.transaction_id)
        return out

    @classmethod
    def from_list(cls, raw: list[object]) -> Txn:
        """Inverse of :meth:`to_list`; ValueError (or TypeError) on a list not in that form."""
        b, t, q, c, m, *rest = raw
        return cls(str(b), str(t), int(q), int(c), str(m),  # type: ignore[call-overload]
                   str(rest[0]) if rest else "")
