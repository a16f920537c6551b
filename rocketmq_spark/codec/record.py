"""The message record: one layout, stored in the commit log and sent in pull responses
(big-endian)::

    int32 totalSize | int32 magic | int32 bodyCRC | int32 queueId | int32 flag
    int64 queueOffset | int64 physicalOffset | int32 sysFlag | int64 bornTimestamp (ms)
    bornHost  (4-byte IPv4 + int32 port, or 16 + 4 with SysFlag.BORN_HOST_V6)
    int64 storeTimestamp (ms) | storeHost (as bornHost, SysFlag.STORE_HOST_V6)
    int32 reconsumeTimes | int64 preparedTransactionOffset
    int32 bodyLength + body | topic length (1 byte V1, 2 bytes V2) + topic
    int16 propertiesLength + properties

:data:`RECORD_FIELDS` and the constants beside it are the one definition of this layout that
every walk of it uses (the scalar code here, :mod:`.arrow`'s decoders, :mod:`.batch_kernels`).
Bodies are kept as stored: ``MessageRecord.body`` is the wire body (zlib when
``sys_flag & SysFlag.COMPRESSED``); :meth:`MessageRecord.payload` inflates it. The scalar
encoder and decoder are here; the vectorised ones are :mod:`.arrow` (records to Arrow
columns, for the reader) and :mod:`.batch_kernels` (batch entries to records, for the broker).
"""

from __future__ import annotations

import ipaddress
import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..errors import ProtocolError
from .properties import SYSTEM_PROPERTY_KEYS, PropertyKey, decode_properties, encode_properties

__all__ = [
    "BLANK_MAGIC",
    "HEAD",
    "HEAD_OFFSETS",
    "HOST_V4_BYTES",
    "HOST_V6_BYTES",
    "MAGIC_V1",
    "MAGIC_V2",
    "MAX_PROPERTIES_BYTES",
    "MAX_V1_TOPIC_BYTES",
    "PROPERTIES_LENGTH_BYTES",
    "RECORD_FIELDS",
    "TAIL_OFFSETS",
    "TOPIC_LENGTH_V1_BYTES",
    "TOPIC_LENGTH_V2_BYTES",
    "MessageRecord",
    "SysFlag",
    "TransactionType",
    "body_crc",
    "body_span",
    "decode_record",
    "decode_records",
    "encode_record",
    "fixed_fields",
    "fixed_size",
    "iter_records",
    "offset_msg_id",
    "parse_offset_msg_id",
    "pack_host",
    "properties_text",
    "record_parts",
    "record_size",
    "split_host",
]

MAGIC_V1 = 0xDAA320A7 - (1 << 32)  # as a signed int32, the way Java writes it
MAGIC_V2 = 0xDAA320AB - (1 << 32)
BLANK_MAGIC = 0xCBD43194 - (1 << 32)

# -- the layout -------------------------------------------------------------------------------
#
# One definition of where a record's fields lie, for every walk of it: the scalar encoder and
# decoders below, the reader's decoders (.arrow) and the broker's batch kernel (.batch_kernels).

#: a packed host (:func:`pack_host`): IPv4 address + int32 port, or IPv6 address + int32 port
#: (the record's sysFlag says which: SysFlag.BORN_HOST_V6, SysFlag.STORE_HOST_V6)
HOST_V4_BYTES = 4 + 4
HOST_V6_BYTES = 16 + 4
_HOST = "host"
#: The fixed part of every record, field by field: (name, struct code, or "host" for a packed
#: host). The variable part follows: the body (bodyLength bytes), the topic's length (1 byte
#: with MAGIC_V1, an int16 with MAGIC_V2: see MAX_V1_TOPIC_BYTES) and the topic, the
#: properties' length (an int16) and the properties.
RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("totalSize", "i"), ("magic", "i"), ("bodyCRC", "i"), ("queueId", "i"), ("flag", "i"),
    ("queueOffset", "q"), ("physicalOffset", "q"), ("sysFlag", "i"), ("bornTimestamp", "q"),
    ("bornHost", _HOST), ("storeTimestamp", "q"), ("storeHost", _HOST),
    ("reconsumeTimes", "i"), ("preparedTransactionOffset", "q"), ("bodyLength", "i"),
)
#: a topic longer than this (UTF-8 bytes) takes MAGIC_V2 and a 2-byte length (1 byte with MAGIC_V1)
MAX_V1_TOPIC_BYTES = 127
TOPIC_LENGTH_V1_BYTES = 1
TOPIC_LENGTH_V2_BYTES = 2
PROPERTIES_LENGTH_BYTES = 2


def _struct_of(first: str, last: str) -> struct.Struct:
    """The fields ``first`` .. ``last`` of :data:`RECORD_FIELDS` (no host among them), big-endian."""
    names = [name for name, _ in RECORD_FIELDS]
    codes = [code for _, code in RECORD_FIELDS[names.index(first) : names.index(last) + 1]]
    if _HOST in codes:
        raise ValueError(f"{first} .. {last} holds a host, which has no struct code")
    return struct.Struct(">" + "".join(codes))


#: totalSize .. bornTimestamp, the fixed head of every record (48 bytes)
HEAD = _struct_of("totalSize", "bornTimestamp")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
#: the longest topic or properties (UTF-8 bytes) a record holds: it stores their length as an int16
MAX_PROPERTIES_BYTES = 0x7FFF
_TAIL_LEN = _struct_of("reconsumeTimes", "bodyLength")
#: the fixed part's bytes but for its two hosts
_FIXED_BUT_HOSTS = HEAD.size + _struct_of("storeTimestamp", "storeTimestamp").size + _TAIL_LEN.size
_NUMPY_TYPES = {"i": ">i4", "q": ">i8"}


def fixed_fields(born_host: int = HOST_V4_BYTES, store_host: int = HOST_V4_BYTES) -> list[tuple[str, str, int]]:
    """Each field of the fixed part of a record whose hosts pack to these many bytes: (name,
    its type as numpy spells it: ``>i4``, ``>i8``, ``V<bytes>`` for a host, byte offset in the
    record). The fixed part ends at :func:`fixed_size`."""
    out: list[tuple[str, str, int]] = []
    at = 0
    for name, code in RECORD_FIELDS:
        if code == _HOST:
            size = born_host if name == "bornHost" else store_host
            out.append((name, f"V{size}", at))
        else:
            size = struct.calcsize(">" + code)
            out.append((name, _NUMPY_TYPES[code], at))
        at += size
    return out


def fixed_size(born_host: int = HOST_V4_BYTES, store_host: int = HOST_V4_BYTES) -> int:
    """The bytes of a record's fixed part (totalSize .. bodyLength) with hosts of these sizes."""
    return _FIXED_BUT_HOSTS + born_host + store_host


#: byte offsets of the fields of :data:`HEAD` (before the first host: the same in every record)
HEAD_OFFSETS = {name: at for name, _, at in fixed_fields() if at < HEAD.size}
_SYS_FLAG_AT = HEAD_OFFSETS["sysFlag"]
_MAGIC_AT = HEAD_OFFSETS["magic"]
#: byte offsets of the fields after the store host, from its end (the same in every record)
TAIL_OFFSETS = {name: at - fixed_size() + _TAIL_LEN.size for name, _, at in fixed_fields()
                if at >= fixed_size() - _TAIL_LEN.size}
_PREPARED_AT = TAIL_OFFSETS["preparedTransactionOffset"]
_BODY_LENGTH_AT = TAIL_OFFSETS["bodyLength"]


class SysFlag:
    """Bits of a record's sysFlag (also sent in send and pull request headers)."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_MASK = 0xC
    BORN_HOST_V6 = 0x10
    STORE_HOST_V6 = 0x20


class TransactionType:
    """Values of ``sysFlag & SysFlag.TRANSACTION_MASK`` and of END_TRANSACTION's commitOrRollback."""

    NOT_TYPE = 0
    PREPARED = 0x4
    COMMIT = 0x8
    ROLLBACK = 0xC


def body_crc(body: bytes) -> int:
    """The record's bodyCRC: CRC-32 of the stored body, masked to a positive int32."""
    return zlib.crc32(body) & 0x7FFFFFFF


def split_host(address: str) -> tuple[str, int]:
    """``"127.0.0.1:10911"`` or ``"[::1]:10911"`` -> (host, port); ValueError when the port
    is not an integer."""
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def pack_host(address: str) -> tuple[bytes, bool]:
    """``host:port`` as a record stores it: (the IP's 4 or 16 bytes + int32 port, whether it
    is IPv6). No name lookup: ``localhost`` packs as 127.0.0.1, any other name as 0.0.0.0."""
    host, port = split_host(address)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = ipaddress.ip_address("127.0.0.1") if host == "localhost" else ipaddress.ip_address("0.0.0.0")
    return ip.packed + _I32.pack(port), ip.version == 6


def _unpack_host(buf: bytes | memoryview, pos: int, v6: bool) -> tuple[str, int]:
    n = (HOST_V6_BYTES if v6 else HOST_V4_BYTES) - _I32.size  # the address, then the port
    ip = ipaddress.ip_address(bytes(buf[pos : pos + n]))
    (port,) = _I32.unpack_from(buf, pos + n)
    text = f"[{ip}]:{port}" if v6 else f"{ip}:{port}"
    return text, pos + n + 4


def offset_msg_id(store_host: str, physical_offset: int) -> str:
    """The broker's message id: hex(store IP + port + physical offset), upper case
    (``physical_offset``: the record's byte position in the commit log)."""
    packed, _ = pack_host(store_host)
    return (packed + _I64.pack(physical_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[str, int]:
    """Inverse of :func:`offset_msg_id` -> (store host ``ip:port``, physical offset);
    ProtocolError when it is not 16 or 28 bytes of hex."""
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


def offset_of_msg_id(msg_id: str) -> int:
    """The commit-log offset in an offset message id (its last 8 bytes), without the host
    :func:`parse_offset_msg_id` also formats; ProtocolError when it is not 16 or 28 bytes of hex."""
    if len(msg_id) not in (32, 56):
        raise ProtocolError(f"message id {msg_id!r} has {len(msg_id) // 2} bytes, expected 16 or 28")
    try:
        value = int(msg_id[-16:], 16)
    except ValueError:
        raise ProtocolError(f"message id {msg_id!r} is not hex") from None
    return value - (1 << 64) if value >> 63 else value


@dataclass(slots=True)
class MessageRecord:
    """One decoded message record (times in epoch milliseconds).

    ``queue_offset`` is the message's own offset in its queue (not a next-offset);
    ``physical_offset`` its byte position in the commit log; ``total_size`` the record's
    bytes; ``flag`` the producer's message flag; ``sys_flag`` the :class:`SysFlag` bits."""

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
        """The TAGS property, None without one."""
        return self.properties.get(PropertyKey.TAGS)

    @property
    def keys(self) -> list[str]:
        """The KEYS property split on spaces (empty keys dropped); [] without one."""
        raw = self.properties.get(PropertyKey.KEYS)
        return [k for k in raw.split(" ") if k] if raw else []

    @property
    def msg_id(self) -> str:
        """The client message id (UNIQ_KEY) when present, else the offset id."""
        return self.properties.get(PropertyKey.UNIQ_KEY) or self.offset_msg_id

    @property
    def offset_msg_id(self) -> str:
        """The broker's id of this record (:func:`offset_msg_id` of its store host and position)."""
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
        """The properties that are not system keys (:data:`SYSTEM_PROPERTY_KEYS`)."""
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
    """Encode one record. The host bits of ``sys_flag`` are derived from the hosts (packed
    by :func:`pack_host`); ``crc`` defaults to :func:`body_crc` of ``body``, stored as given
    (compress it first for ``SysFlag.COMPRESSED``). ProtocolError when the topic or the
    properties exceed 32767 bytes."""
    props = properties if isinstance(properties, str) else encode_properties(properties)
    props_b = props.encode()
    topic_b = topic.encode()
    born_b, born_v6 = pack_host(born_host)
    store_b, store_v6 = pack_host(store_host)
    sys_flag &= ~(SysFlag.BORN_HOST_V6 | SysFlag.STORE_HOST_V6)
    if born_v6:
        sys_flag |= SysFlag.BORN_HOST_V6
    if store_v6:
        sys_flag |= SysFlag.STORE_HOST_V6
    if len(topic_b) > MAX_PROPERTIES_BYTES or len(props_b) > MAX_PROPERTIES_BYTES:
        raise ProtocolError(f"topic or properties longer than {MAX_PROPERTIES_BYTES} bytes")
    size = record_size(len(topic_b), len(born_b), len(body), len(props_b), len(store_b))
    parts = record_parts(size, topic_b, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp,
                         born_b, _I64.pack(store_timestamp) + store_b, reconsume_times,
                         prepared_transaction_offset, body, props_b, body_crc(body) if crc is None else crc)
    return b"".join(parts)


def record_size(topic_len: int, born_host_len: int, body_len: int, properties_len: int,
                store_host_len: int = 8) -> int:
    """The size of a record of these field lengths (hosts packed: 8 bytes IPv4, 20 IPv6)."""
    topic_len_bytes = TOPIC_LENGTH_V2_BYTES if topic_len > MAX_V1_TOPIC_BYTES else TOPIC_LENGTH_V1_BYTES
    return (_FIXED_BUT_HOSTS + born_host_len + store_host_len + body_len + topic_len_bytes + topic_len
            + PROPERTIES_LENGTH_BYTES + properties_len)


def record_parts(size: int, topic: bytes, queue_id: int, flag: int, queue_offset: int, physical_offset: int,
                 sys_flag: int, born_timestamp: int, born_host: bytes, store_time_host: bytes, reconsume_times: int,
                 prepared_transaction_offset: int, body: bytes, properties: bytes, crc: int) -> tuple[bytes, ...]:
    """The record's bytes in pieces (to join, or to write with others), from already packed
    parts: hosts as :func:`pack_host` gives them (``sys_flag`` must carry their IPv6 bits),
    ``store_time_host`` the int64 store time followed by the store host; ``size`` as
    :func:`record_size` gives it (the caller needs it first, to place the record). The topic
    takes the V2 magic (2-byte length) when longer than 127 bytes."""
    v2 = len(topic) > MAX_V1_TOPIC_BYTES
    return (
        HEAD.pack(size, MAGIC_V2 if v2 else MAGIC_V1, crc, queue_id, flag, queue_offset, physical_offset,
                  sys_flag, born_timestamp),
        born_host,
        store_time_host,
        _TAIL_LEN.pack(reconsume_times, prepared_transaction_offset, len(body)),
        body,
        _I16.pack(len(topic)) if v2 else bytes((len(topic),)),
        topic,
        _I16.pack(len(properties)),
        properties,
    )


def decode_record(buf: bytes | memoryview, pos: int = 0, *, check_crc: bool = False) -> MessageRecord:
    """Decode the record starting at ``pos`` of ``buf``; ProtocolError when it is malformed
    (bad magic, a length that overruns the record, text that is not UTF-8) or, with
    ``check_crc``, when its body does not match its CRC."""
    try:
        (size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = HEAD.unpack_from(
            buf, pos
        )
        _check_head(buf, pos, size, magic)
        p = pos + HEAD.size
        born_host, p = _unpack_host(buf, p, bool(sys_flag & SysFlag.BORN_HOST_V6))
        (store_ts,) = _I64.unpack_from(buf, p)
        store_host, p = _unpack_host(buf, p + _I64.size, bool(sys_flag & SysFlag.STORE_HOST_V6))
        (reconsume,) = _I32.unpack_from(buf, p)
        (prepared,) = _I64.unpack_from(buf, p + _PREPARED_AT)
        body, topic, props_text = _tail(buf, p + _BODY_LENGTH_AT, pos, pos + size, magic)
        props = decode_properties(props_text)
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
    """Records laid end to end, as in a pull response body; ProtocolError (see
    :func:`decode_record`) at the first malformed one."""
    pos = 0
    n = len(buf)
    while pos < n:
        rec = decode_record(buf, pos, check_crc=check_crc)
        pos += rec.total_size
        yield rec


def decode_records(buf: bytes | memoryview, *, check_crc: bool = False) -> list[MessageRecord]:
    """:func:`iter_records` as a list."""
    return list(iter_records(buf, check_crc=check_crc))




class RecordParts(NamedTuple):
    """A stored record's fields as a broker copies them into another record: hosts left packed
    (as :func:`pack_host` gives them), properties as text (see :func:`split_record`)."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    flag: int
    sys_flag: int
    born_timestamp: int
    born_host: bytes
    reconsume_times: int
    body: bytes
    properties: str


def _check_head(buf: bytes | memoryview, pos: int, size: int, magic: int) -> None:
    """ProtocolError unless the record at ``pos`` has a known magic and fits ``buf``."""
    if magic not in (MAGIC_V1, MAGIC_V2):
        raise ProtocolError(f"bad message magic {magic & 0xFFFFFFFF:#x} at byte {pos}")
    if size < HEAD.size or pos + size > len(buf):
        raise ProtocolError(f"record size {size} at byte {pos} overruns {len(buf)} bytes")


def _tail(buf: bytes | memoryview, p: int, pos: int, end: int, magic: int) -> tuple[bytes, str, str]:
    """The body, topic and properties text of the record at ``pos`` (ending at ``end``), read
    from its body length at ``p``; ProtocolError when a length overruns the record."""
    (body_len,) = _I32.unpack_from(buf, p)
    p += _I32.size
    if body_len < 0 or p + body_len > end:
        raise ProtocolError(f"body length {body_len} overruns the record at byte {pos}")
    body = bytes(buf[p : p + body_len])
    p += body_len
    if magic == MAGIC_V2:
        (topic_len,) = _I16.unpack_from(buf, p)
        p += TOPIC_LENGTH_V2_BYTES
    else:
        topic_len = buf[p]
        p += TOPIC_LENGTH_V1_BYTES
    topic = bytes(buf[p : p + topic_len]).decode()
    p += topic_len
    (props_len,) = _I16.unpack_from(buf, p)
    p += PROPERTIES_LENGTH_BYTES
    if props_len < 0 or p + props_len > end:
        raise ProtocolError(f"properties length {props_len} overruns the record at byte {pos}")
    return body, topic, bytes(buf[p : p + props_len]).decode()


def split_record(buf: bytes | memoryview, pos: int = 0) -> RecordParts:
    """The record at ``pos`` as :class:`RecordParts` (cheaper than :func:`decode_record`: no
    host formatting, no property map, no store fields); ProtocolError when it is malformed."""
    try:
        (size, magic, _crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = HEAD.unpack_from(buf, pos)
        _check_head(buf, pos, size, magic)
        end = pos + size
        p = pos + HEAD.size
        host_end = p + (HOST_V6_BYTES if sys_flag & SysFlag.BORN_HOST_V6 else HOST_V4_BYTES)
        born_host = bytes(buf[p:host_end])
        p = host_end + _I64.size + (HOST_V6_BYTES if sys_flag & SysFlag.STORE_HOST_V6 else HOST_V4_BYTES)
        (reconsume,) = _I32.unpack_from(buf, p)
        body, topic, props = _tail(buf, p + _BODY_LENGTH_AT, pos, end, magic)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed message record at byte {pos}: {exc}") from None
    return RecordParts(topic, queue_id, queue_offset, phys, flag, sys_flag, born_ts, born_host, reconsume, body,
                       props)


def body_span(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    """(start, length) of the body of the record at ``pos``, read from its sysFlag's host
    widths; ``struct.error`` when ``buf`` ends first (no other check: for callers that
    walk records they wrote themselves)."""
    (sys_flag,) = _I32.unpack_from(buf, pos + _SYS_FLAG_AT)
    q = pos + _FIXED_BUT_HOSTS + (HOST_V6_BYTES if sys_flag & SysFlag.BORN_HOST_V6 else HOST_V4_BYTES)
    q += HOST_V6_BYTES if sys_flag & SysFlag.STORE_HOST_V6 else HOST_V4_BYTES
    (blen,) = _I32.unpack_from(buf, q - _I32.size)  # bodyLength ends the fixed part
    return q, blen


def properties_text(record: bytes | memoryview, pos: int = 0) -> str:
    """The properties text of the record at ``pos``, the rest of it not decoded (no checks
    beyond :func:`body_span`'s: for records the caller wrote)."""
    q, blen = body_span(record, pos)
    q += blen
    (magic,) = _I32.unpack_from(record, pos + _MAGIC_AT)
    if magic == MAGIC_V2:
        (tlen,) = _I16.unpack_from(record, q)
        q += TOPIC_LENGTH_V2_BYTES + tlen
    else:
        q += TOPIC_LENGTH_V1_BYTES + record[q]
    (plen,) = _I16.unpack_from(record, q)
    q += PROPERTIES_LENGTH_BYTES
    return bytes(record[q : q + plen]).decode()
