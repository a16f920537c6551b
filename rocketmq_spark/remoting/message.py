"""Message records, properties, batch bodies and message ids.

The same record layout is stored in the commit log and sent in pull responses
(big-endian)::

    int32 totalSize | int32 magic | int32 bodyCRC | int32 queueId | int32 flag
    int64 queueOffset | int64 physicalOffset | int32 sysFlag | int64 bornTimestamp (ms)
    bornHost  (4-byte IPv4 + int32 port, or 16 + 4 with SysFlag.BORN_HOST_V6)
    int64 storeTimestamp (ms) | storeHost (as bornHost, SysFlag.STORE_HOST_V6)
    int32 reconsumeTimes | int64 preparedTransactionOffset
    int32 bodyLength + body | topic length (1 byte V1, 2 bytes V2) + topic
    int16 propertiesLength + properties

Bodies are kept as stored: ``MessageRecord.body`` is the wire body (zlib when
``sys_flag & SysFlag.COMPRESSED``); :meth:`MessageRecord.payload` inflates it.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import ProtocolError
from .codes import SysFlag

__all__ = [
    "BLANK_MAGIC",
    "COMPRESS_THRESHOLD",
    "MAGIC_V1",
    "MAGIC_V2",
    "BatchEntry",
    "EncodedBatch",
    "MessageRecord",
    "PropertyKey",
    "body_crc",
    "decode_batch",
    "decode_properties",
    "decode_records",
    "encode_batch",
    "encode_properties",
    "encode_record",
    "iter_records",
    "batch_entries",
    "join_properties",
    "java_string_hash",
    "offset_msg_id",
    "parse_offset_msg_id",
    "split_host",
]

MAGIC_V1 = 0xDAA320A7 - (1 << 32)  # as a signed int32, the way Java writes it
MAGIC_V2 = 0xDAA320AB - (1 << 32)
BLANK_MAGIC = 0xCBD43194 - (1 << 32)
#: Producers compress bodies larger than this (bytes).
COMPRESS_THRESHOLD = 4 * 1024

_NAME_SEP = "\x01"
_PROP_SEP = "\x02"

_HEAD = struct.Struct(">iiiiiqqiq")  # totalSize .. bornTimestamp: 48 bytes
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BATCH_HEAD = struct.Struct(">iiiii")  # total, magic, bodyCRC, flag, bodyLen


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
    }
)


@functools.lru_cache(maxsize=4096)  # tags repeat: the broker hashes one per stored message
def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as a signed int32.

    Brokers keep this hash of the tag in each consume-queue entry.
    """
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def subscribed_tags(expression: str) -> frozenset[str] | None:
    """The tags a TAG subscription expression names (``"A || B"``); None for every tag (``*``,
    empty, or ``*`` among the names), as brokers and the Java client read it."""
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return None if not tags or "*" in tags else tags


def body_crc(body: bytes) -> int:
    """The record's bodyCRC: CRC-32 of the stored body, masked to a positive int32."""
    return zlib.crc32(body) & 0x7FFFFFFF


def encode_properties(props: Mapping[str, str]) -> str:
    """``key\\x01value\\x02`` repeated."""
    return "".join(f"{k}{_NAME_SEP}{v}{_PROP_SEP}" for k, v in props.items())


def decode_properties(text: str) -> dict[str, str]:
    """Inverse of :func:`encode_properties`; tolerant of a missing final separator."""
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(_PROP_SEP):
        if not item:
            continue
        key, sep, value = item.partition(_NAME_SEP)
        if sep:
            out[key] = value
    return out


def split_host(address: str) -> tuple[str, int]:
    """``"127.0.0.1:10911"`` or ``"[::1]:10911"`` -> (host, port)."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def _pack_host(address: str) -> tuple[bytes, bool]:
    host, port = split_host(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = ipaddress.ip_address("127.0.0.1") if host == "localhost" else ipaddress.ip_address("0.0.0.0")
    return ip.packed + _I32.pack(port), ip.version == 6


def _unpack_host(buf: bytes | memoryview, pos: int, v6: bool) -> tuple[str, int]:
    n = 16 if v6 else 4
    ip = ipaddress.ip_address(bytes(buf[pos : pos + n]))
    (port,) = _I32.unpack_from(buf, pos + n)
    text = f"[{ip}]:{port}" if v6 else f"{ip}:{port}"
    return text, pos + n + 4


def offset_msg_id(store_host: str, physical_offset: int) -> str:
    """The broker's message id: hex(store IP + port + physical offset), upper case."""
    packed, _ = _pack_host(store_host)
    return (packed + _I64.pack(physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`offset_msg_id` -> (store host ``ip:port``, physical offset)."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ProtocolError(f"message id {msg_id!r} is not hex") from None
    if len(raw) == 16:
        host, _ = _unpack_host(raw, 0, False)
    elif len(raw) == 28:
        host, _ = _unpack_host(raw, 0, True)
    else:
        raise ProtocolError(f"message id {msg_id!r} has {len(raw)} bytes, expected 16 or 28")
    (offset,) = _I64.unpack_from(raw, len(raw) - 8)
    return host, offset


@dataclass(slots=True)
class MessageRecord:
    """One decoded message record (times in epoch milliseconds)."""

    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    physical_offset: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:0"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    body_crc: int = 0
    magic: int = MAGIC_V1
    total_size: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PropertyKey.TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PropertyKey.KEYS)
        return [k for k in raw.split(" ") if k] if raw else []

    @property
    def msg_id(self) -> str:
        """The client message id (UNIQ_KEY) when present, else the offset id."""
        return self.properties.get(PropertyKey.UNIQ_KEY) or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    def payload(self) -> bytes:
        """The body as the producer meant it: inflated when the compressed bit is set."""
        if self.sys_flag & SysFlag.COMPRESSED:
            try:
                return zlib.decompress(self.body)
            except zlib.error as exc:
                raise ProtocolError(
                    f"compressed body of {self.topic}:{self.queue_id}@{self.queue_offset} "
                    f"does not inflate: {exc}"
                ) from None
        return self.body

    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTY_KEYS}


def encode_record(
    *,
    topic: str,
    queue_id: int,
    queue_offset: int,
    body: bytes,
    properties: str | Mapping[str, str] = "",
    flag: int = 0,
    sys_flag: int = 0,
    physical_offset: int = 0,
    born_timestamp: int = 0,
    born_host: str = "127.0.0.1:0",
    store_timestamp: int = 0,
    store_host: str = "127.0.0.1:0",
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    crc: int | None = None,
) -> bytes:
    """Encode one record. The host bits of ``sys_flag`` are derived from the hosts."""
    props = properties if isinstance(properties, str) else encode_properties(properties)
    props_b = props.encode()
    topic_b = topic.encode()
    born_b, born_v6 = _pack_host(born_host)
    store_b, store_v6 = _pack_host(store_host)
    sys_flag &= ~(SysFlag.BORN_HOST_V6 | SysFlag.STORE_HOST_V6)
    if born_v6:
        sys_flag |= SysFlag.BORN_HOST_V6
    if store_v6:
        sys_flag |= SysFlag.STORE_HOST_V6
    v2 = len(topic_b) > 127
    if len(topic_b) > 32767 or len(props_b) > 32767:
        raise ProtocolError("topic or properties longer than 32767 bytes")
    size = (
        _HEAD.size + len(born_b) + 8 + len(store_b) + 4 + 8
        + 4 + len(body) + (2 if v2 else 1) + len(topic_b) + 2 + len(props_b)
    )
    head = _HEAD.pack(
        size,
        MAGIC_V2 if v2 else MAGIC_V1,
        body_crc(body) if crc is None else crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sys_flag,
        born_timestamp,
    )
    topic_len = struct.pack(">h", len(topic_b)) if v2 else bytes((len(topic_b),))
    return b"".join(
        (
            head,
            born_b,
            _I64.pack(store_timestamp),
            store_b,
            _I32.pack(reconsume_times),
            _I64.pack(prepared_transaction_offset),
            _I32.pack(len(body)),
            body,
            topic_len,
            topic_b,
            struct.pack(">h", len(props_b)),
            props_b,
        )
    )


def decode_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = False) -> MessageRecord:
    """Decode the record starting at ``pos`` of ``buf``."""
    try:
        (size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = _HEAD.unpack_from(
            buf, pos
        )
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise ProtocolError(f"bad message magic {magic & 0xFFFFFFFF:#x} at byte {pos}")
        if size < _HEAD.size or pos + size > len(buf):
            raise ProtocolError(f"record size {size} at byte {pos} overruns {len(buf)} bytes")
        p = pos + _HEAD.size
        born_host, p = _unpack_host(buf, p, bool(sys_flag & SysFlag.BORN_HOST_V6))
        (store_ts,) = _I64.unpack_from(buf, p)
        store_host, p = _unpack_host(buf, p + 8, bool(sys_flag & SysFlag.STORE_HOST_V6))
        (reconsume,) = _I32.unpack_from(buf, p)
        (prepared,) = _I64.unpack_from(buf, p + 4)
        (body_len,) = _I32.unpack_from(buf, p + 12)
        p += 16
        if body_len < 0 or p + body_len > pos + size:
            raise ProtocolError(f"body length {body_len} overruns the record at byte {pos}")
        body = bytes(buf[p : p + body_len])
        p += body_len
        if magic == MAGIC_V2:
            (topic_len,) = struct.unpack_from(">h", buf, p)
            p += 2
        else:
            topic_len = buf[p]
            p += 1
        topic = bytes(buf[p : p + topic_len]).decode()
        p += topic_len
        (props_len,) = struct.unpack_from(">h", buf, p)
        p += 2
        if props_len < 0 or p + props_len > pos + size:
            raise ProtocolError(f"properties length {props_len} overruns the record at byte {pos}")
        props = decode_properties(bytes(buf[p : p + props_len]).decode())
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, ProtocolError):
            raise
        raise ProtocolError(f"malformed message record at byte {pos}: {exc}") from None
    if check_crc and body_crc(body) != crc:
        raise ProtocolError(f"body CRC mismatch in the record at byte {pos}")
    return MessageRecord(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        body=body,
        properties=props,
        flag=flag,
        sys_flag=sys_flag,
        physical_offset=phys,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
        magic=magic,
        total_size=size,
    )


def iter_records(buf: bytes | memoryview, *, check_crc: bool = False) -> Iterator[MessageRecord]:
    """Records laid end to end, as in a pull response body."""
    pos = 0
    n = len(buf)
    while pos < n:
        rec = decode_record(buf, pos, check_crc=check_crc)
        pos += rec.total_size
        yield rec


def decode_records(buf: bytes | memoryview, *, check_crc: bool = False) -> list[MessageRecord]:
    return list(iter_records(buf, check_crc=check_crc))


@dataclass(slots=True)
class BatchEntry:
    """One message of a batch send body (before the broker stores it)."""

    body: bytes
    properties: str = ""
    flag: int = 0

    def property_map(self) -> dict[str, str]:
        return decode_properties(self.properties)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Plain messages already laid out as a batch body (see :func:`encode_batch`), ``count``
    of them; sent as one SEND_BATCH_MESSAGE like a list of :class:`BatchEntry`."""

    body: bytes
    count: int

    def __len__(self) -> int:
        return self.count

    def entries(self) -> list[BatchEntry]:
        """The messages one by one (for a transport that does not send batch bodies)."""
        return decode_batch(self.body)


def join_properties(props: str, more: str) -> str:
    """Two properties strings (``k\\x01v\\x02...``) one after the other (``more`` wins a key
    both hold, as decoders keep the last)."""
    if not more:
        return props
    return f"{props}\x02{more}" if props and not props.endswith("\x02") else props + more


def batch_entries(entries: list[BatchEntry] | EncodedBatch) -> list[BatchEntry]:
    """``entries`` as a list, an :class:`EncodedBatch` decoded."""
    return entries.entries() if isinstance(entries, EncodedBatch) else entries


def encode_batch(entries: list[BatchEntry]) -> bytes:
    """A batch body: per message int32 total, magic, bodyCRC, flag, bodyLen+body, int16 propLen+props."""
    out = bytearray()
    for e in entries:
        props = e.properties.encode()
        total = _BATCH_HEAD.size + len(e.body) + 2 + len(props)
        out += _BATCH_HEAD.pack(total, 0, 0, e.flag, len(e.body))
        out += e.body
        out += struct.pack(">h", len(props))
        out += props
    return bytes(out)


def decode_batch(body: bytes | memoryview) -> list[BatchEntry]:
    """Inverse of :func:`encode_batch`; rejects entries that overrun their total size."""
    out: list[BatchEntry] = []
    pos = 0
    n = len(body)
    try:
        while pos < n:
            total, _magic, _crc, flag, body_len = _BATCH_HEAD.unpack_from(body, pos)
            end = pos + total
            p = pos + _BATCH_HEAD.size
            if total < _BATCH_HEAD.size + 2 or end > n or body_len < 0 or p + body_len + 2 > end:
                raise ProtocolError(f"batch entry at byte {pos} overruns the body ({total} bytes)")
            msg_body = bytes(body[p : p + body_len])
            p += body_len
            (props_len,) = struct.unpack_from(">h", body, p)
            p += 2
            if props_len < 0 or p + props_len > end:
                raise ProtocolError(f"batch entry properties at byte {pos} overrun the entry")
            props = bytes(body[p : p + props_len]).decode()
            out.append(BatchEntry(body=msg_body, properties=props, flag=flag))
            pos = end
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed batch body at byte {pos}: {exc}") from None
    return out
