"""Message trace records in the Java client's format, so ``mqadmin queryMsgTraceById`` and the
RocketMQ dashboard show a Spark query's sends and reads as they show a Java producer's and
consumer's.

A trace message is one or more records, each ended by ``\\x02``, with fields split by ``\\x01``;
its KEYS are the traced messages' ids and their own keys (how a trace is found: the broker
indexes KEYS, ``queryMsgTraceById`` asks for the message id). Records (field order as the Java
client's trace encoder writes them, which its decoder reads by position):

    Pub        type, time, region, producer group, topic, message id, tags, keys, store host,
               body length, cost (ms), message type, offset message id, success
    SubBefore  type, time, region, consumer group, request id, message id, retry times, keys
    SubAfter   type, request id, message id, cost (ms), success, keys, context code, time,
               consumer group
    EndTransaction  type, time, region, producer group, topic, message id, tags, keys, store
               host, message type, transaction id, state (COMMIT_MESSAGE, ROLLBACK_MESSAGE),
               from a check-back

Names are the user's (no namespace), as the Java client writes them, and a message without tags
or keys has ``null`` there, as Java writes a missing value.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

__all__ = ["DEFAULT_REGION", "DEFAULT_TRACE_TOPIC", "FIELD_END", "FIELD_SPLIT", "MessageType", "Pub", "Sub",
           "TraceRecord", "decode_trace", "field_text", "encode_pub", "encode_sub", "trace_keys"]

#: where traces go unless traceTopic says otherwise (Apache RocketMQ's trace topic)
DEFAULT_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
#: the region a broker names when it names none (a broker's regionId default)
DEFAULT_REGION = "DefaultRegion"
FIELD_SPLIT = "\x01"
FIELD_END = "\x02"


class MessageType(IntEnum):
    """The Java client's message types (a Pub record carries the ordinal)."""

    NORMAL = 0
    TRANSACTION_HALF = 1
    TRANSACTION_COMMIT = 2
    DELAY = 3
    ORDER = 4


@dataclass(frozen=True, slots=True)
class Pub:
    """One message sent: the producer side of its trace."""

    timestamp_ms: int
    group: str
    topic: str
    msg_id: str
    tags: str
    keys: str  # the message's keys, space-separated as in its KEYS property
    store_host: str
    body_length: int
    cost_ms: int
    msg_type: MessageType
    offset_msg_id: str
    success: bool = True
    region: str = DEFAULT_REGION


@dataclass(frozen=True, slots=True)
class Sub:
    """Messages handed to one consumer in one go (a request): their SubBefore records, and the
    SubAfter records once consumed (``cost_ms`` per message, as the Java client divides it)."""

    timestamp_ms: int
    group: str
    request_id: str
    msg_ids: tuple[str, ...]
    keys: tuple[str, ...]
    retry_times: tuple[int, ...]
    region: str = DEFAULT_REGION


def field_text(value: object) -> str:
    """A record field's text: ``null`` for None, separators blanked."""
    # the Java encoder appends a null as "null"; a separator inside a value would split the record
    s = "null" if value is None else str(value)
    return s.replace(FIELD_SPLIT, " ").replace(FIELD_END, " ")


def encode_pub(p: Pub) -> str:
    """A Pub record, ended."""
    fields = ("Pub", p.timestamp_ms, p.region, p.group, p.topic, p.msg_id, p.tags or None, p.keys or None, p.store_host,
              p.body_length, p.cost_ms, int(p.msg_type), p.offset_msg_id, "true" if p.success else "false")
    return FIELD_SPLIT.join(map(field_text, fields)) + FIELD_END


def encode_sub(s: Sub, *, after: bool, cost_ms: int = 0, done_ms: int = 0, success: bool = True) -> list[str]:
    """The SubBefore records of ``s`` (``after`` False) or its SubAfter records, one per
    message, each ended."""
    out = []
    for msg_id, text, retries in zip(s.msg_ids, s.keys, s.retry_times, strict=True):
        keys = text or None
        if after:
            fields: tuple[object, ...] = ("SubAfter", s.request_id, msg_id, cost_ms, "true" if success else "false",
                                          keys, 0, done_ms, s.group)
        else:
            fields = ("SubBefore", s.timestamp_ms, s.region, s.group, s.request_id, msg_id, retries, keys)
        out.append(FIELD_SPLIT.join(map(field_text, fields)) + FIELD_END)
    return out


def trace_keys(msg_id: str, keys: str) -> Iterable[str]:
    """What a record is found by: the message id and each of its keys."""
    yield msg_id
    if keys and keys != "null":
        yield from (k for k in keys.split(" ") if k)


@dataclass(frozen=True)
class TraceRecord:
    """A record read back (tests, tools): its type and fields by the Java decoder's names."""

    type: str
    fields: dict[str, str] = field(default_factory=dict)


_NAMES = {
    "Pub": ("timestamp", "region", "group", "topic", "msgId", "tags", "keys", "storeHost", "bodyLength", "costTime",
            "msgType", "offsetMsgId", "success"),
    "SubBefore": ("timestamp", "region", "group", "requestId", "msgId", "retryTimes", "keys"),
    "SubAfter": ("requestId", "msgId", "costTime", "success", "keys", "contextCode", "timestamp", "group"),
    "EndTransaction": ("timestamp", "region", "group", "topic", "msgId", "tags", "keys", "storeHost", "msgType",
                       "transactionId", "transactionState", "fromTransactionCheck"),
}


def decode_trace(body: str) -> list[TraceRecord]:
    """The records of a trace message's body (other types kept with no fields)."""
    out = []
    for rec in body.split(FIELD_END):
        if not rec:
            continue
        kind, *values = rec.split(FIELD_SPLIT)
        names = _NAMES.get(kind, ())
        out.append(TraceRecord(kind, dict(zip(names, values, strict=False))))
    return out
