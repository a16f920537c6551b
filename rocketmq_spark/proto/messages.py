"""Conversions between RocketMQ's remoting message model (a properties string, a
stored record) and the gRPC ``apache.rocketmq.v2.Message``.

Both sides of the gRPC protocol use these: the client transport (what a producer
sends, what a pull returns) and the embedded broker's endpoint (what it stores, what
it serves). Times on the wire are Timestamp messages; here they are epoch millis.

Mapping of system properties (remoting property <-> gRPC system property):
TAGS <-> tag, KEYS (space separated) <-> keys, UNIQ_KEY <-> message_id,
__SHARDINGKEY <-> message_group, TIMER_DELIVER_MS <-> delivery_timestamp; a
transactional half message is message_type TRANSACTION. Every property that is not a
system property travels in ``user_properties``.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Mapping

from ..codec import SYSTEM_PROPERTY_KEYS, MessageRecord, PropertyKey, SysFlag, TransactionType
from ..errors import ProtocolError
from ..namespaces import namespace_of, unwrap
from . import pb

__all__ = [
    "check_timestamp",
    "crc32_checksum",
    "message_to_properties",
    "name_resource",
    "millis",
    "properties_to_message",
    "record_to_message",
    "set_millis",
]


def millis(ts: pb.Timestamp | pb.Duration) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


# google.protobuf.Timestamp's valid range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z
_TS_MIN_S, _TS_MAX_S = -62_135_596_800, 253_402_300_799


def check_timestamp(what: str, ts: pb.Timestamp) -> None:
    """Refuse a Timestamp outside protobuf's valid range (its millis would not fit a Java long)."""
    if not (_TS_MIN_S <= ts.seconds <= _TS_MAX_S and 0 <= ts.nanos < 1_000_000_000):
        raise ProtocolError(f"{what} (seconds={ts.seconds}, nanos={ts.nanos}) is not a valid timestamp: "
                            f"years 1 to 9999 and nanos 0..999999999 are accepted")


def set_millis(ts: pb.Timestamp | pb.Duration, ms: int) -> None:
    ts.seconds, rest = divmod(ms, 1000)
    ts.nanos = rest * 1_000_000


def crc32_checksum(body: bytes) -> str:
    """The body digest the SDKs verify: CRC32 as 8 upper-case hex digits."""
    return format(zlib.crc32(body) & 0xFFFFFFFF, "08X")


def properties_to_message(topic: str, body: bytes, properties: Mapping[str, str], *, prepared: bool = False,
                          born_ms: int = 0, born_host: str = "") -> pb.Message:
    """A message to send over gRPC from a body (as the producer means it, uncompressed)
    and remoting-style properties."""
    msg = pb.Message(body=body)
    msg.topic.name = topic
    sp = msg.system_properties
    sp.body_encoding = pb.IDENTITY
    sp.born_host = born_host
    set_millis(sp.born_timestamp, born_ms)
    message_type = pb.NORMAL
    for key, value in properties.items():
        if key == PropertyKey.TAGS:
            sp.tag = value
        elif key == PropertyKey.KEYS:
            sp.keys.extend(k for k in value.split(" ") if k)
        elif key == PropertyKey.UNIQ_KEY:
            sp.message_id = value
        elif key == PropertyKey.SHARDING_KEY:
            sp.message_group = value
            message_type = pb.FIFO
        elif key == PropertyKey.TIMER_DELIVER_MS:
            set_millis(sp.delivery_timestamp, int(value))
            message_type = pb.DELAY
        elif key not in SYSTEM_PROPERTY_KEYS:
            msg.user_properties[key] = value
    sp.message_type = pb.TRANSACTION if prepared else message_type
    return msg


def message_to_properties(msg: pb.Message) -> tuple[bytes, dict[str, str], int]:
    """What a broker stores for a message sent over gRPC: (body, properties, sysFlag).

    Raises :class:`ProtocolError` for a body it cannot decode or a timestamp out of range."""
    sp = msg.system_properties
    for name in ("born_timestamp", "delivery_timestamp"):
        if sp.HasField(name):
            check_timestamp(f"message {sp.message_id or '(no id)'}: {name}", getattr(sp, name))
    body = msg.body
    if sp.body_encoding == pb.GZIP:
        try:
            body = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else zlib.decompress(body)
        except (OSError, zlib.error) as exc:
            raise ProtocolError(f"message {sp.message_id}: GZIP body does not inflate: {exc}") from None
    props = dict(msg.user_properties)
    if sp.HasField("tag") and sp.tag:
        props[PropertyKey.TAGS] = sp.tag
    if sp.keys:
        props[PropertyKey.KEYS] = " ".join(sp.keys)
    if sp.message_id:
        props[PropertyKey.UNIQ_KEY] = sp.message_id
    if sp.HasField("message_group") and sp.message_group:
        props[PropertyKey.SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        props[PropertyKey.TIMER_DELIVER_MS] = str(millis(sp.delivery_timestamp))
    sys_flag = 0
    if sp.message_type == pb.TRANSACTION:
        props[PropertyKey.TRAN_MSG] = "true"
        sys_flag |= TransactionType.PREPARED
    return body, props, sys_flag


def name_resource(resource: pb.Resource, name: str) -> None:
    """Fill ``resource`` with a broker's ``name`` as a 5.x proxy hands it to clients: a name
    wrapped in a namespace (``ns%topic``, see rocketmq_spark.namespaces) as ``resource_namespace``
    ``ns`` and ``name`` ``topic``. (Requests are read by ``name`` alone, as 5.2+ proxies do.)"""
    space = namespace_of(name)
    resource.name = unwrap(space, name)
    resource.resource_namespace = space


def record_to_message(rec: MessageRecord, *, message_id: str | None = None) -> pb.Message:
    """A stored record as a gRPC consumer gets it (body inflated, digest filled in)."""
    props = rec.properties
    body = rec.payload() if rec.sys_flag & SysFlag.COMPRESSED else rec.body
    msg = pb.Message(body=body)
    name_resource(msg.topic, rec.topic)
    for k, v in props.items():
        if k not in SYSTEM_PROPERTY_KEYS:
            msg.user_properties[k] = v
    sp = msg.system_properties
    tag = props.get(PropertyKey.TAGS)
    if tag:
        sp.tag = tag
    keys = props.get(PropertyKey.KEYS)
    if keys:
        sp.keys.extend(k for k in keys.split(" ") if k)
    sp.message_id = message_id or rec.msg_id
    sp.body_digest.type = pb.CRC32
    sp.body_digest.checksum = crc32_checksum(body)
    sp.body_encoding = pb.IDENTITY
    group = props.get(PropertyKey.SHARDING_KEY)
    deliver = props.get(PropertyKey.TIMER_DELIVER_MS)
    if group:
        sp.message_group = group
        sp.message_type = pb.FIFO
    elif deliver or props.get(PropertyKey.DELAY):
        sp.message_type = pb.DELAY
    elif rec.sys_flag & SysFlag.TRANSACTION_MASK:
        sp.message_type = pb.TRANSACTION
    else:
        sp.message_type = pb.NORMAL
    if deliver and deliver.lstrip("-").isdigit():
        set_millis(sp.delivery_timestamp, int(deliver))
    set_millis(sp.born_timestamp, rec.born_timestamp)
    sp.born_host = rec.born_host
    set_millis(sp.store_timestamp, rec.store_timestamp)
    sp.store_host = rec.store_host
    sp.queue_id = rec.queue_id
    sp.queue_offset = rec.queue_offset
    return msg

