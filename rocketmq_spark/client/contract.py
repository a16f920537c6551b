"""The contract of a broker client: what the reader, the writer and the offset side use of a
broker, whichever transport carries it (:class:`~.remoting.RemotingClient`, the classic
protocol through name servers; :class:`~.grpc_client.GrpcClient`, the 5.x gRPC protocol
through proxy endpoints).

Both implement every method here with the same signature; only :class:`RocketMQSparkError`
(and its subclasses) escapes them, futures included. What differs between the transports
stays behind the contract: how a pull's answer becomes Arrow rows (:meth:`BrokerClient.rows`),
how transactions are named and ended and check-backs answered, how a group is made known.

Offsets are next-offsets throughout: a queue's max offset is one past its last message, a
committed offset is the first message not yet consumed. Times are epoch milliseconds.
A client is used from one thread at a time, except that futures it returned may be resolved
from another; it opens connections lazily and :meth:`BrokerClient.close` drops them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..codec import BatchEntry, EncodedBatch
from ..errors import RocketMQSparkError
from ..model import MessageQueue, PullResult, SendResult, Txn
from .retry import ClientConfig

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Answer", "BrokerClient", "CheckHandler", "GroupPresence", "QueueStatus", "ResetNotice"]


class Answer(Protocol):
    """The answer to come to a request sent without waiting: a Future, or a transport's
    lighter equivalent."""

    def result(self, timeout: float | None = None) -> Any:
        """The answer, waited for up to ``timeout`` seconds (TimeoutError past it); raises the
        request's failure."""

#: A transaction check-back: (the half message's properties, its message id) -> True to
#: commit, False to roll back, None when not known yet (the broker asks again later).
CheckHandler = Callable[[dict[str, str], str], "bool | None"]


@dataclass(slots=True)
class QueueStatus:
    """A queue as the query sees it (next-offsets; -1 when not known yet): what a group member
    answers a broker's GET_CONSUMER_RUNNING_INFO with (see :meth:`BrokerClient.join_group`)."""

    planned: int = -1  # end of the last planned batch
    processed: int = -1  # what Spark finished (what the query may commit)
    committed: int = -1  # what the broker holds for the group, as the query last wrote or read it
    last_planned_ms: int = 0
    last_committed_ms: int = 0


@dataclass(frozen=True, slots=True)
class ResetNotice:
    """A broker's RESET_CONSUMER_CLIENT_OFFSET: the group's new offsets of one topic's queues
    (next-offsets) and the time (epoch ms) they were computed for."""

    offsets: dict[MessageQueue, int]
    timestamp_ms: int
    broker_addr: str


class GroupPresence(Protocol):
    """What a reader holds of its membership, whichever transport: the resets pushed to it
    (oldest first, each once) and leaving the group."""

    def take_resets(self) -> list[ResetNotice]: ...

    def close(self) -> None: ...


class BrokerClient(Protocol):
    config: ClientConfig
    #: whether a body may be sent zlib-compressed with ``SysFlag.COMPRESSED`` (the classic
    #: protocol); the 5.x protocol carries bodies as given
    compresses_bodies: bool

    def close(self) -> None:
        """Close every connection; the client opens new ones if used again."""

    # -- routes -----------------------------------------------------------------------

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        """The topic's readable (or ``writable``) queues, from a cached route unless ``refresh``.
        Raises TopicNotFoundError, or NoPermissionError when every queue refuses the access."""

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        """The address requests for ``broker`` go to (for messages that name it)."""

    def connection_epoch(self, broker: str) -> tuple[str, int] | None:
        """(address, how many connections this client opened to it) for ``broker``: a change
        means the connection was replaced (the broker restarted, was replaced, or the network
        dropped it). None when not known: no connection yet, or a transport whose connections
        reconnect out of sight (gRPC channels)."""

    def broker_boot_ms(self, broker: str) -> int | None:
        """When ``broker`` started (epoch ms; a different one later means it restarted), or None
        when the transport or the broker does not say. Asked once per connection."""

    def remember_broker_addr(self, broker: str, addr: str) -> None:
        """Requests for ``broker`` go to ``addr`` (one another client's route gave) without a
        route lookup, until a route lookup of this client says otherwise."""

    # -- offsets ----------------------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        """The offset of the queue's first message still stored."""

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the queue's last message."""

    def min_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """:meth:`min_offset` of many queues; raises the first failure."""

    def max_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """:meth:`max_offset` of many queues; raises the first failure."""

    def offset_ranges(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        """queue -> (min offset, max offset), asked together."""

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The offset of the first message stored at or after ``timestamp_ms``."""

    def store_time_at(self, mq: MessageQueue, offset: int) -> int | None:
        """Store time of the message at ``offset``, None when there is none."""

    @staticmethod
    def store_time_in(res: PullResult, offset: int) -> int | None:
        """Store time (epoch ms) of the message at ``offset`` in a pull's answer, None when the
        answer does not hold it. Read from the answer as it came (the records' heads, or the
        messages' system properties), not through Arrow: a planner calls this in the process
        Spark starts for each query, where building an Arrow array from Python values imports
        pandas first (~0.2 s). ProtocolError on bytes that do not decode."""

    def stored_sizes(self, mq: MessageQueue, start: int, count: int) -> list[int]:
        """Stored sizes (bytes) of up to ``count`` messages from ``start`` (fewer where the queue
        ends); RequestNotSupportedError where the protocol cannot tell (gRPC)."""

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The group's committed offset of ``mq``; None when the group has none there."""

    def query_consumer_offsets(self, group: str, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        """:meth:`query_consumer_offset` of many queues; raises the first failure."""

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        """Commit ``offset`` (the first message not yet consumed) as the group's offset of ``mq``."""

    def update_consumer_offsets(self, group: str, offsets: dict[MessageQueue, int]
                                ) -> dict[MessageQueue, RocketMQSparkError]:
        """Every queue's offset; the failures are returned (queue -> error), not raised."""

    def send_back(self, mq: MessageQueue, commit_log_offset: int, group: str, *, origin_msg_id: str,
                  max_reconsume_times: int = 16, delay_level: int = 0) -> None:
        """Give the message of ``mq`` stored at ``commit_log_offset`` back to consumer group
        ``group`` (CONSUMER_SEND_MSG_BACK, what the Java consumer does with a message it could
        not process): its broker redelivers it through the group's retry topic after the delay
        (``delay_level`` 0: 3 + its reconsume times), or puts it in the group's dead-letter topic
        once it was reconsumed ``max_reconsume_times`` times. Raises the broker's error."""

    def send_to_retry(self, mq: MessageQueue, group: str, entry: BatchEntry, *, sys_flag: int, reconsume_times: int,
                      max_reconsume_times: int, producer_group: str = "rocketmq-spark") -> SendResult:
        """Send ``entry`` to ``group``'s retry topic on ``mq``'s broker, what the Java consumer
        sends when a send-back fails: the reconsume times travel in the request, and the broker
        puts it in the group's dead-letter topic once they pass ``max_reconsume_times``."""

    # -- consumer group ---------------------------------------------------------------

    def group_consumers(self, group: str, topics: Sequence[str]) -> dict[str, list[str]] | None:
        """Client ids of the group's online consumers by broker name, on the brokers serving
        ``topics`` (brokers that cannot be reached are logged and left out); None where the
        transport cannot list them (gRPC)."""

    def join_group(self, group: str, subscriptions: dict[str, str],
                   running_info: Callable[[], dict[MessageQueue, QueueStatus]], *,
                   expression_type: str = "TAG") -> GroupPresence | None:
        """Become an online consumer of ``group`` (topic -> expression subscriptions, tag
        expressions or, with ``expression_type`` SQL92, property filters) on
        the brokers serving the topics, until the returned member is closed: brokers and their
        tools list it, its resets are pushed to it, ``running_info`` answers what it has
        planned, processed and committed (see :mod:`.membership`). Over gRPC the member is a
        simple consumer's session: listed, but no reset is pushed to it and no running info
        asked of it (resets are found by the group's offsets changing)."""

    def make_group_known(self, group: str, mq: MessageQueue, subscriptions: dict[str, str]) -> None:
        """Have the broker of ``mq`` create ``group`` (and its retry topic) as a consumer's
        first contact would, without staying listed as an online consumer; fails with
        GroupNotFoundError where the broker does not create groups."""

    # -- reading ----------------------------------------------------------------------

    def pull_async(self, mq: MessageQueue, offset: int, max_nums: int, *, group: str = "",
                   subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> Any:
        """Start a pull of up to ``max_nums`` messages from ``offset`` and return at once; the
        opaque pending pull is resolved by :meth:`pull_result` (several may be in flight)."""

    def pull_async_many(self, mq: MessageQueue, offsets: Sequence[int], max_nums: int, *, group: str = "",
                        subscription: str = "*", expression_type: str = "TAG") -> list[Any]:
        """:meth:`pull_async` at several offsets of one queue at once (a transport may write
        them together), in order; each resolved with :meth:`pull_result`."""

    def pull_result(self, mq: MessageQueue, pending: Any) -> PullResult:
        """Wait for a pull :meth:`pull_async` started (a broker that does not answer in time
        raises ConnectionFailedError)."""

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, group: str = "",
             subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> PullResult:
        """A pull, waited for, retried on transient faults."""

    def rows(self, mq: MessageQueue, results: Sequence[PullResult], end: int | None = None,
             columns: Sequence[str] | None = None) -> pa.RecordBatch:
        """The messages of ``results`` (pulls of ``mq``, in order) as rows of the reader's
        schema, those at or after offset ``end`` left out; ``columns``: only those, in that
        order (None: all of ARROW_SCHEMA; the retry columns of RETRY_FIELDS only when named).
        Raises ProtocolError on bytes that do not decode."""

    # -- writing ----------------------------------------------------------------------

    def send_request(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *,
                     producer_group: str = "rocketmq-spark", sys_flag: int = 0, born_ts: int | None = None,
                     batch_properties: str = "") -> Any:
        """The opaque request that sends ``entries`` to ``mq`` (``batch_properties``: the
        batch's own properties, appended to each message's by brokers)."""

    def send_async(self, mq: MessageQueue, request: Any) -> Future[Any]:
        """Send without waiting; the future's answer goes to :meth:`send_results`."""

    def send_async_many(self, sends: Sequence[tuple[MessageQueue, Any]]) -> Sequence[Answer]:
        """:meth:`send_async` for several requests at once, one answer each, in order (a
        transport may write those for one broker together)."""

    def send_results(self, mq: MessageQueue, count: int, answer: Any) -> list[SendResult]:
        """One result per message of an answer; a refusal raises the broker's error."""

    def check_sent(self, mq: MessageQueue, count: int, answer: Any) -> None:
        """Raise the broker's error if the answer refused the send (results not built)."""

    def send_batch(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *,
                   producer_group: str = "rocketmq-spark", sys_flag: int = 0, born_ts: int | None = None,
                   batch_properties: str = "") -> list[SendResult]:
        """Send and wait, retried on transient faults."""

    # -- transactions -----------------------------------------------------------------

    def start_producer(self, group: str, topics: Sequence[str], on_check: CheckHandler | None = None) -> None:
        """Announce a producer of ``group`` for ``topics`` to the brokers (repeatable, for
        more topics); with ``on_check`` the brokers' transaction check-backs are answered
        by it, on this client's connections."""

    def transaction(self, result: SendResult, msg_id: str) -> Txn:
        """The half message a prepared send's ``result`` stored (``msg_id``: its UNIQ_KEY),
        named as this transport ends it."""

    def half_transaction(self, mq: MessageQueue, answer: Any, msg_id: str) -> Txn:
        """``transaction(send_results(mq, 1, answer)[0], msg_id)``: the half message a single
        prepared send to ``mq`` stored, straight from its answer (a writer turns thousands of
        answers a second into transactions); a refusal raises the broker's error."""

    def end_transactions(self, txns: Sequence[Txn], *, commit: bool, producer_group: str = "rocketmq-spark",
                         window: int = 256, on_progress: Callable[[int], None] | None = None,
                         retry_failed: bool = True, on_applied: Callable[[int], None] | None = None) -> list[Txn]:
        """Commit or roll back every half message, up to ``window`` requests in flight; returns
        the ones the broker answered it does not hold (gone: not "ended before", since brokers
        apply a second END of a half still in their commit log; the half went with its store,
        or retention deleted it; a caller committing looks for their messages in the
        destination); a failed one is retried alone, or,
        with ``retry_failed=False``, not: no more are sent, those in flight are waited for and
        the first failure is raised (a commit whose answer was lost may have been applied: a
        second one would store its message twice). ``on_progress(n)``: the first ``n`` of
        ``txns`` had their ENDs applied (called as that grows, at most once per
        ``window // 2``; never past a failure or a gone half). ``on_applied(i)``: the END of
        ``txns[i]`` was answered as applied, past a failure or a gone half too (a caller that
        looks for the others in a destination that may have lost its store must not take
        these for unsent; an Apache 5.x proxy answers OK for an END it relays oneway, so there
        it says the END was taken, not applied)."""

