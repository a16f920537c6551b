"""Message properties: the ``key\x01value\x02`` text every record and batch entry carries,
the system keys (MessageConst), and Java's String.hashCode (consume queues keep it per tag;
the tag filter is :mod:`.tags`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping

__all__ = ["SYSTEM_PROPERTY_KEYS", "PropertyKey", "decode_properties", "encode_properties", "java_string_hash",
           "join_properties", "needs_parsing", "property_of"]

NAME_SEP = "\x01"
PROP_SEP = "\x02"


class PropertyKey:
    """System property keys (MessageConst)."""

    TAGS = "TAGS"
    KEYS = "KEYS"
    UNIQ_KEY = "UNIQ_KEY"
    WAIT = "WAIT"
    DELAY = "DELAY"
    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    REAL_TOPIC = "REAL_TOPIC"
    REAL_QID = "REAL_QID"
    MIN_OFFSET = "MIN_OFFSET"
    MAX_OFFSET = "MAX_OFFSET"
    SHARDING_KEY = "__SHARDINGKEY"
    TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
    TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
    TIMER_DELAY_MS = "TIMER_DELAY_MS"
    TRANSACTION_ID = "__transactionId__"
    CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    RECONSUME_TIME = "RECONSUME_TIME"
    MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
    RETRY_TOPIC = "RETRY_TOPIC"
    ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
    MSG_REGION = "MSG_REGION"
    TRACE_SWITCH = "TRACE_ON"


#: Property keys the broker or SDKs set; everything else is a user property.
SYSTEM_PROPERTY_KEYS = frozenset(
    {
        "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "DELAY", "TRAN_MSG", "PGROUP", "REAL_TOPIC",
        "REAL_QID", "MIN_OFFSET", "MAX_OFFSET", "__SHARDINGKEY", "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "__transactionId__", "TRANSACTION_CHECK_TIMES",
        "RECONSUME_TIME", "MSG_REGION", "TRACE_ON", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID",
        "BUYER_ID", "CORRECTION_FLAG", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME",
        "INNER_NUM", "INNER_MULTI_DISPATCH", "INNER_MULTI_QUEUE_OFFSET", "TRACE_CONTEXT",
        "CLUSTER", "INSTANCE_ID", "__STARTDELIVERTIME", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY", "BORN_HOST",
        "bornHost", "REPLY_TO_CLIENT", "CORRELATION_ID", "MSG_TYPE", "TTL",
        "__BORNHOST", "DUP_INFO", "POP_CK", "1ST_POP_TIME",
        # the rest of Java's MessageConst.STRING_HASH_SET (5.3.3); a 5.x proxy adds BORN_TIMESTAMP
        "ARRIVE_TIME", "BORN_TIMESTAMP", "DLQ_ORIGIN_MESSAGE_ID", "DLQ_ORIGIN_TOPIC", "EXTEND_UNIQ_INFO",
        "MQ2_FLAG", "POP_CK_OFFSET", "PUSH_REPLY_TIME", "TIMER_DELAY_LEVEL", "TRANSFER_FLAG",
        "TRAN_PREPARED_QUEUE_OFFSET", "__CRC32#",
        # added to the set by 5.5.0: the group a POP retry came from (the broker sets it when it
        # revives a message), a priority message's priority, and a Lite Topic message's lite topic
        "ORIGIN_GROUP", "_SYS_MSG_PRIORITY_", "__LITE_TOPIC",
    }
)


# Memoised at module level: a pure function of its argument, called per message by the broker
# (each stored message's tag, each gRPC message group) and the writer (each row's messageGroup),
# where a few values repeat. The cache keeps the 4096 most recent strings (their hash an int);
# lru_cache is thread-safe.
@functools.lru_cache(maxsize=4096)
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed int32.

    Brokers keep this hash of the tag in each consume-queue entry.
    """
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def encode_properties(props: Mapping[str, str]) -> str:
    """``key\\x01value\\x02`` repeated. Nothing is escaped: keys and values must not hold
    ``\\x01`` or ``\\x02`` (not checked)."""
    return "".join(f"{k}{NAME_SEP}{v}{PROP_SEP}" for k, v in props.items())


def decode_properties(text: str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerant of a missing final separator. A key
    given twice keeps its last value; an item without ``\\x01`` is dropped."""
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(PROP_SEP):
        if not item:
            continue
        key, sep, value = item.partition(NAME_SEP)
        if sep:
            out[key] = value
    return out


def join_properties(props: str, more: str) -> str:
    """Two properties strings (``k\\x01v\\x02...``) one after the other (``more`` wins a key
    both hold, as decoders keep the last)."""
    if not more:
        return props
    return f"{props}\x02{more}" if props and not props.endswith("\x02") else props + more




def property_of(props: str, key: str) -> str | None:
    """The value of ``key`` in a properties text (the last one when repeated, as
    :func:`decode_properties` and Java's property map keep it), without building the whole map;
    None when absent."""
    needle = key + NAME_SEP
    i = props.rfind(needle)
    while i > 0 and props[i - 1] != PROP_SEP:
        i = props.rfind(needle, 0, i)
    if i < 0:
        return None
    start = i + len(needle)
    end = props.find(PROP_SEP, start)
    return props[start:] if end < 0 else props[start:end]


#: the broker's own properties, which it sets on every message it stores
BROKER_PROPERTY_KEYS = ("MSG_REGION", "CLUSTER", "TRACE_ON")
#: properties a broker must parse per message: delays and timers it acts on, its own it replaces
PER_MESSAGE_MARKERS = ("DELAY\x01", "TIMER_", *(f"{k}\x01" for k in BROKER_PROPERTY_KEYS))


#: the markers one by one (unpacking fails loudly when their number changes: see needs_parsing)
_M0, _M1, _M2, _M3, _M4 = PER_MESSAGE_MARKERS


def needs_parsing(props: str) -> bool:
    """Whether a broker must parse these properties per message (see PER_MESSAGE_MARKERS)
    rather than append its own to them as they are. (One ``in`` per marker, written out: a
    generator over them costs twice as much, and a broker asks once per message.)"""
    return _M0 in props or _M1 in props or _M2 in props or _M3 in props or _M4 in props
