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
    │   │   └── AccessDeniedError           refused by ACL: names the user, resource and action
    │   │       ├── AuthenticationError         the user is unknown, or the signature is wrong or missing
    │   │       └── AuthorizationError          the user may not do that action on that resource
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

import re
from collections.abc import Sequence

__all__ = [
    "BROKER_ERRORS",
    "AccessDeniedError",
    "AuthenticationError",
    "AuthorizationError",
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
    "access_denied",
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


class AccessDeniedError(NoPermissionError):
    """A broker with ACL on refused the request (NO_PERMISSION). ``user`` is the access key the
    request was signed with (None: unsigned; never the secret), ``resource`` what was refused
    (``Topic:NAME``, ``Group:NAME``; several joined by " and " when the broker does not say which)
    and ``action`` what the request needed there (``Pub``, ``Sub``, ``Get``, ...; "Sub or Get"
    when the broker accepts either). Never retried: the same request gets the same answer until
    an administrator changes the users or their policies."""

    def __init__(self, code: int, remark: str | None = None, *, address: str = "?", operation: str = "request",
                 user: str | None = None, resource: str = "", action: str = "", reason: str = "") -> None:
        self.user = user
        self.resource = resource
        self.action = action
        #: the broker's own words (its remark)
        self.reason = reason or (remark or "")
        super().__init__(code, remark, address=address, operation=operation)


class AuthenticationError(AccessDeniedError):
    """The broker could not tell who sent the request: the user is unknown (or disabled), the
    signature does not match (a wrong secret key), or the request was not signed at all."""


class AuthorizationError(AccessDeniedError):
    """The broker knows the user, whose policies do not allow ``action`` on ``resource``."""


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


#: what a request asked of the broker's ACL: (resource key, the actions any of which it accepts)
Needs = Sequence[tuple[str, Sequence[str]]]


def broker_error(
    code: int, remark: str | None, *, address: str, operation: str, user: str | None = None,
    needs: Needs | None = None,
) -> BrokerError:
    """Build the exception for a non-success response code. For NO_PERMISSION, ``user`` (the
    access key the request was signed with) and ``needs`` (see :data:`Needs`, from
    :func:`rocketmq_spark.remoting.acl.request_needs`) make an ACL refusal an
    :class:`AccessDeniedError` naming the user, the resource and the action."""
    if code == _NO_PERMISSION and needs is not None:
        denied = access_denied(code, remark, address=address, operation=operation, user=user, needs=needs)
        if denied is not None:
            return denied
    cls = BROKER_ERRORS.get(code, BrokerError)
    return cls(code, explain(remark), address=address, operation=operation)


_NO_PERMISSION = 16
#: an ACL 2.0 broker's remark for a policy refusal (org.apache.rocketmq.auth AclAuthorizationHandler):
#: "User:alice has no permission to access Topic:T from 127.0.0.1, no matched policies."
_NO_PERMISSION_TO = re.compile(r"^(?:User:)?(?P<user>.*?) has no permission to access (?P<resource>\S+)"
                               r"(?: from (?P<ip>\S+?))?,\s*(?P<detail>.*)$", re.S)
#: remarks of a broker that does not know who asks (ACL 2.0's DefaultAuthenticationHandler and
#: context builders; ACL 1.0 brokers and the embedded broker) -> what the user can do about it
_AUTHENTICATION = (
    ("check signature failed", "is the secret key right?"),
    ("signature mismatch", ""),  # the embedded broker's remark asks already
    ("signature-failed", "is the secret key right?"),
    ("not found", "the broker has no such user: create it (mqadmin createUser) or fix the access key"),
    ("is unknown", "the broker has no such user: fix the access key"),
    ("is disabled", "the user is disabled on the broker (mqadmin updateUser -s enable)"),
    ("username cannot be null", "the broker requires authentication: set the options accessKey and secretKey"),
    ("is not signed", "the broker requires authentication: set the options accessKey and secretKey"),
    ("no accesskey", "the broker requires authentication: set the options accessKey and secretKey"),
    ("authentication", "check the access key and secret key"),
)


def _actions_text(actions: Sequence[str]) -> str:
    return " or ".join(actions) if actions else "access"


def access_denied(code: int, remark: str | None, *, address: str, operation: str, user: str | None,
                  needs: Needs, peer: str = "broker") -> AccessDeniedError | None:
    """The :class:`AccessDeniedError` for a NO_PERMISSION answer whose remark is an ACL refusal
    (None for other refusals, e.g. a topic whose permission forbids writes). The message names
    the user (the access key only), the resource and the action, then the broker's remark.
    ``peer`` names who refused in the text (a 5.x ``proxy`` checks gRPC calls itself, answering
    UNAUTHORIZED with the same words an ACL 2.0 broker's remark has)."""
    text = (remark or "").strip()
    m = _NO_PERMISSION_TO.match(text)
    if m is not None:
        resource = m.group("resource")
        kind = resource.partition(":")[0] + ":"
        actions = next((a for r, a in needs if r == resource), None)
        if actions is None:  # the request named it in a way not given here: its type tells the action
            actions = next((a for r, a in needs if r == kind), ())
        who = user or m.group("user")
        action = _actions_text(actions)
        why = (f"user {who!r} may not {action} on {resource}: {text} (an administrator grants it with "
               f"mqadmin createAcl -s User:{who} -r {resource} -a {actions[0] if actions else 'ACTION'} -d Allow)")
        return AuthorizationError(code, why, address=address, operation=operation, user=who, resource=resource,
                                  action=action, reason=text)
    low = text.lower()
    hint = next((h for key, h in _AUTHENTICATION if key in low), None)
    if hint is None:
        return None
    named = [(r, a) for r, a in needs if not r.endswith(":")]
    resource = " and ".join(r for r, _ in named)
    action = " and ".join(dict.fromkeys(_actions_text(a) for _, a in named))
    wanted = f" for {action} on {resource}" if resource else ""
    who = f"user {user!r}" if user else "an unsigned request"
    why = f"the {peer} did not authenticate {who}{wanted}: {text}" + (f" ({hint})" if hint else "")
    return AuthenticationError(code, why, address=address, operation=operation, user=user, resource=resource,
                               action=action, reason=text)


def explain(remark: str | None) -> str | None:
    """A server's remark with what to do about it, where the remark alone does not say."""
    if remark and "TopicMessageType validate failed" in remark:  # a 5.x proxy's check
        return remark + (" (a 5.x proxy takes FIFO, DELAY and TRANSACTION messages only on topics of that "
                         "message.type, e.g. mqadmin updateTopic -t TOPIC -a +message.type=FIFO, or MIXED)")
    return remark
