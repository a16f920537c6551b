"""The exception tree of rocketmq-spark.

Every error the library raises derives from :class:`RocketMQSparkError`::

    RocketMQSparkError
    ├── OptionError                 an option or column is missing, unknown or invalid
    ├── ProtocolError               a frame, record or body could not be decoded
    │   └── FrameTooLargeError      a frame announced more bytes than the cap allows
    ├── ConnectionFailedError       connect/read/write to an address failed (retriable)
    │   └── RequestTimeoutError     no answer within the request timeout (retriable)
    ├── TlsError                    TLS on one side only, a certificate not trusted, a TLS file unusable
    ├── BrokerError                 a broker or name server answered with an error code
    │   ├── TopicNotFoundError          TOPIC_NOT_EXIST (17)
    │   ├── OffsetNotFoundError         QUERY_NOT_FOUND (22)
    │   ├── GroupNotFoundError          SUBSCRIPTION_GROUP_NOT_EXIST (26)
    │   ├── SystemBusyError             SYSTEM_BUSY (2), retriable
    │   ├── NoPermissionError           NO_PERMISSION (16)
    │   ├── RequestNotSupportedError    REQUEST_CODE_NOT_SUPPORTED (3)
    │   ├── MessageIllegalError         MESSAGE_ILLEGAL (13)
    │   └── OffsetResetPendingError     a commit ignored: a server-side reset waits (SUCCESS)
    ├── BrokerUnavailableError      a broker's queues stayed unreachable past the bound
    ├── GroupInUseError             other clients consume in the consumer group
    ├── OffsetResetError            the group's offsets were reset while the query read them
    └── DataLossError               planned offsets were deleted by retention or lost by the broker

Broker errors carry the response ``code``, the peer ``address``, the ``operation``
that failed and whether it is ``retriable``. Codes map to classes through
:data:`BROKER_ERRORS`, with :class:`BrokerError` as the fallback for unknown codes.
"""

from __future__ import annotations

__all__ = [
    "BROKER_ERRORS",
    "BrokerError",
    "BrokerUnavailableError",
    "ConnectionFailedError",
    "DataLossError",
    "FrameTooLargeError",
    "GroupInUseError",
    "GroupNotFoundError",
    "MessageIllegalError",
    "NoPermissionError",
    "OffsetNotFoundError",
    "OffsetResetError",
    "OffsetResetPendingError",
    "OptionError",
    "ProtocolError",
    "TlsError",
    "RequestNotSupportedError",
    "RequestTimeoutError",
    "RocketMQSparkError",
    "SystemBusyError",
    "TopicNotFoundError",
    "broker_error",
    "explain",
]


class RocketMQSparkError(Exception):
    """Root of every error raised by rocketmq-spark."""

    retriable: bool = False


class OptionError(RocketMQSparkError, ValueError):
    """An option (or a DataFrame column) is unknown, missing or has an invalid value.

    The message names the option, the value given and what is accepted.
    """

    def __init__(self, option: str, value: object, accepted: str) -> None:
        self.option = option
        self.value = value
        self.accepted = accepted
        super().__init__(f"invalid option {option}={value!r}: {accepted}")


class ProtocolError(RocketMQSparkError):
    """Bytes on the wire or on disk that do not follow the RocketMQ formats."""


class FrameTooLargeError(ProtocolError):
    """A frame's length prefix exceeds the configured cap (checked before allocating)."""


class ConnectionFailedError(RocketMQSparkError):
    """A connection to ``address`` failed while doing ``operation``."""

    retriable = True

    def __init__(self, address: str, operation: str, cause: object = None) -> None:
        self.address = address
        self.operation = operation
        detail = f": {cause}" if cause is not None else ""
        super().__init__(f"{operation} to {address} failed{detail}")


class RequestTimeoutError(ConnectionFailedError):
    """No response arrived within the request timeout."""


class TlsError(RocketMQSparkError):
    """A connection to ``address`` cannot work as set up: the server requires TLS and the client
    speaks plaintext (or the reverse), the server's certificate fails verification, or a TLS
    file is missing. Not retriable, and not a :class:`ConnectionFailedError` (which callers
    treat as a peer that may come back): asking again cannot help until the settings change."""

    def __init__(self, address: str, operation: str, detail: str) -> None:
        self.address = address
        self.operation = operation
        super().__init__(f"{operation} with {address} failed: {detail}")


class BrokerError(RocketMQSparkError):
    """A broker or name server answered ``operation`` with a non-success ``code``."""

    def __init__(
        self,
        code: int,
        remark: str | None = None,
        *,
        address: str = "?",
        operation: str = "request",
    ) -> None:
        self.code = code
        self.remark = remark or ""
        self.address = address
        self.operation = operation
        super().__init__(
            f"{operation} at {address} failed with code {code}"
            + (f" ({self.remark})" if self.remark else "")
        )


class TopicNotFoundError(BrokerError):
    """TOPIC_NOT_EXIST: the topic has no route (and auto-creation is off)."""


class OffsetNotFoundError(BrokerError):
    """QUERY_NOT_FOUND: the group has no committed offset for the queue."""


class GroupNotFoundError(BrokerError):
    """SUBSCRIPTION_GROUP_NOT_EXIST: the broker does not know the consumer group. Brokers
    create a group on its first pull or consumer heartbeat when autoCreateSubscriptionGroup
    is on (the default); otherwise an administrator creates it (mqadmin updateSubGroup)."""

    def __init__(self, code: int, remark: str | None = None, *, address: str = "?",
                 operation: str = "request") -> None:
        hint = ("the broker creates a consumer group on its first pull or heartbeat only with "
                "autoCreateSubscriptionGroup=true; otherwise create it first (mqadmin updateSubGroup)")
        super().__init__(code, f"{remark}; {hint}" if remark else hint, address=address, operation=operation)


class SystemBusyError(BrokerError):
    """SYSTEM_BUSY: the broker is overloaded; try again later."""

    retriable = True


class NoPermissionError(BrokerError):
    """NO_PERMISSION: the request was refused (ACL or queue permissions)."""


class RequestNotSupportedError(BrokerError):
    """REQUEST_CODE_NOT_SUPPORTED: the peer does not implement the request."""


class MessageIllegalError(BrokerError):
    """MESSAGE_ILLEGAL: the message was rejected (too large, bad topic, ...)."""


class BrokerUnavailableError(RocketMQSparkError):
    """A broker's queues were unreachable (or gone from the routes) for longer than the
    reader waits; names the broker, its address and the queues not read."""


class GroupInUseError(RocketMQSparkError):
    """Other clients consume in the consumer group; their commits would interleave with
    Spark's (option allowSharedGroup=true accepts that)."""


class OffsetResetError(RocketMQSparkError):
    """The broker moved the consumer group's offset of a queue a read task was reading: an
    offset reset (mqadmin resetOffsetByTime, ``rocketmq-spark reset-offset``) made while the
    query runs, which a 5.x broker hands to the group's next pull of the queue."""


class OffsetResetPendingError(BrokerError):
    """A broker answered a commit of the group's offset with success but ignored it: a
    server-side reset of the queue (5.x ``useServerSideResetOffset``, the embedded broker) waits
    for the group's next pull, and the broker holds the reset offset until then."""


class DataLossError(RocketMQSparkError):
    """Messages a query read or planned to read are no longer on the broker: deleted by
    retention, or lost with the broker's store (or the topic deleted and re-created), their
    offsets now taken by other messages. Raised with failOnDataLoss=true, naming each queue,
    the offsets the query expected and what the broker holds now."""


#: Response code -> exception class. Unknown codes fall back to :class:`BrokerError`.
BROKER_ERRORS: dict[int, type[BrokerError]] = {
    2: SystemBusyError,
    3: RequestNotSupportedError,
    13: MessageIllegalError,
    16: NoPermissionError,
    17: TopicNotFoundError,
    22: OffsetNotFoundError,
    26: GroupNotFoundError,
}


def broker_error(
    code: int, remark: str | None, *, address: str, operation: str
) -> BrokerError:
    """Build the exception for a non-success response code."""
    cls = BROKER_ERRORS.get(code, BrokerError)
    return cls(code, explain(remark), address=address, operation=operation)


def explain(remark: str | None) -> str | None:
    """A server's remark with what to do about it, where the remark alone does not say."""
    if remark and "TopicMessageType validate failed" in remark:  # a 5.x proxy's check
        return remark + (" (a 5.x proxy takes FIFO, DELAY and TRANSACTION messages only on topics of that "
                         "message.type, e.g. mqadmin updateTopic -t TOPIC -a +message.type=FIFO, or MIXED)")
    return remark
