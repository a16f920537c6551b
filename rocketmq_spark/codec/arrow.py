"""The decoding of pulled record bytes into Arrow RecordBatches of the row schema
(:mod:`.schema`, re-exported here): the reader's kernel of the record codec (:mod:`.record`
has the layout and the scalar decoder).

The Arrow form matches what Spark expects for the schema exactly (string, int32,
timestamp[us, tz=UTC], list<string>, map<string,string>, all nullable). A row's
``queueOffset`` is the message's own offset; its timestamps are the records' epoch
milliseconds as microseconds.

The decoders may run in several threads at once; the module-level caches below say why
that is safe.
"""

from __future__ import annotations

import functools
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ProtocolError
from .properties import SYSTEM_PROPERTY_KEYS, PropertyKey
from .record import (
    HEAD,
    HOST_V4_BYTES,
    HOST_V6_BYTES,
    MAGIC_V1,
    MAGIC_V2,
    PROPERTIES_LENGTH_BYTES,
    TAIL_OFFSETS,
    TOPIC_LENGTH_V1_BYTES,
    TOPIC_LENGTH_V2_BYTES,
    SysFlag,
    fixed_fields,
    fixed_size,
)
from .schema import ARROW_SCHEMA, RETRY_COLUMNS, RETRY_FIELDS, RETRY_SCHEMA, RETRY_SCHEMA_DDL, SCHEMA_DDL, TIMESTAMP

# decode_to_batch_reference is not public: the reference the vectorised decoder is held to
# (tests import it from here) and its fallback
__all__ = ["ARROW_SCHEMA", "RETRY_COLUMNS", "RETRY_FIELDS", "RETRY_SCHEMA_DDL", "SCHEMA_DDL", "columns_to_batch",
           "decode_to_batch", "no_retry_origin", "string_constant"]


_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")
_TS_LIMIT_MS = (2**63 - 1) // 1000


def _host(buf: bytes, p: int, v6: bool) -> tuple[str, int]:
    """The packed host at ``p`` as text, and where it ends."""
    if v6:
        import ipaddress

        ip = ipaddress.IPv6Address(buf[p : p + HOST_V6_BYTES - 4])
        (port,) = _I.unpack_from(buf, p + HOST_V6_BYTES - 4)
        return f"[{ip}]:{port}", p + HOST_V6_BYTES
    (port,) = _I.unpack_from(buf, p + HOST_V4_BYTES - 4)
    return f"{buf[p]}.{buf[p + 1]}.{buf[p + 2]}.{buf[p + 3]}:{port}", p + HOST_V4_BYTES


# -- the reference decoder ---------------------------------------------------------------------
#
# Per record in Python: a walk of the layout and of the properties into column lists
# (:func:`_reference_columns`), then one Arrow array per column. It is the
# definition the vectorised decoder below is held to (tests/unit/test_arrow.py and
# tests/reliability/test_decoders_fuzz.py compare them), and it decodes what that one leaves:
# small inputs, IPv6 hosts, V2 magic, and every malformed input (its errors are the errors).


def decode_to_batch_reference(
    chunks: Iterable[bytes], broker: str, end: int | None = None, retry: bool = False
) -> pa.RecordBatch:
    """Decode record bytes (pull bodies) into one RecordBatch; records at/after ``end`` are dropped.

    The per-record reference implementation: :func:`decode_to_batch` must give the same batch.
    Raises ProtocolError naming the byte position of the first malformed record. ``retry``:
    the batch has :data:`RETRY_FIELDS` after :data:`ARROW_SCHEMA`'s columns (each record's
    RETRY_TOPIC property, its last one when repeated, and its reconsume times).
    """
    columns = _reference_columns(chunks, end, retry)
    columns.insert(1, [broker] * len(columns[0]))
    types = _RETRY_TYPES if retry else _TYPES
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(columns, types, strict=True)],
                                      schema=RETRY_SCHEMA if retry else ARROW_SCHEMA)


# the column types, listed once (a schema's fields are built anew each time it is iterated)
_TYPES = [f.type for f in ARROW_SCHEMA]
_RETRY_TYPES = [f.type for f in RETRY_SCHEMA]


def _reference_columns(chunks: Iterable[bytes], end: int | None, retry: bool) -> list[list[object]]:
    """The columns of the records of ``chunks`` (pull bodies) but those at/after queue offset
    ``end`` (walked all the same: a malformed one raises), as lists: :data:`ARROW_SCHEMA`'s but
    broker, then :data:`RETRY_FIELDS`' with ``retry``. ProtocolError naming the position of the
    first bad record.

    Longer than 80 lines for speed: one loop, in it the walk of a record's fields (as
    :data:`.record.RECORD_FIELDS` lays them out), its checks, its properties and one append of
    its row. As functions of their own, a call per record for the walk cost +6%, one for the
    properties +1.5%, a row tuple per record transposed at the end +8% (the client_decode
    benchmark's records, one core: 2.8 us a record in 1024-record pull bodies, 4.7 us in
    32-record ones, the small pulls this decoder serves in production)."""
    values: list[object] = []  # the columns interleaved: one extend per record is the cheapest
    add = values.extend
    hosts: dict[bytes, str] = {}  # packed host -> text: a pull body holds a few hosts, many times
    # the loop runs per record and per property: constants bound to locals, not looked up
    head, head_size, ts_limit = HEAD.unpack_from, HEAD.size, _TS_LIMIT_MS
    born_v6, store_v6, compressed = SysFlag.BORN_HOST_V6, SysFlag.STORE_HOST_V6, SysFlag.COMPRESSED
    host_v4, host_v6, ts_size = HOST_V4_BYTES, HOST_V6_BYTES, _Q.size
    body_length_at = TAIL_OFFSETS["bodyLength"]  # from the end of the store host
    body_at = body_length_at + _I.size
    topic_v1, topic_v2, props_at = TOPIC_LENGTH_V1_BYTES, TOPIC_LENGTH_V2_BYTES, PROPERTIES_LENGTH_BYTES
    tags_key, keys_key, uniq_key = PropertyKey.TAGS, PropertyKey.KEYS, PropertyKey.UNIQ_KEY
    retry_key, system_keys = PropertyKey.RETRY_TOPIC, SYSTEM_PROPERTY_KEYS
    for buf in chunks:
        p = 0
        n = len(buf)
        while p < n:
            # one try around the record (free in Python 3.11 unless it raises): damaged input
            # of any kind becomes a ProtocolError naming the record's position
            try:
                size, magic, _crc, qid, _flag, qoff, phys, sys_flag, bts = head(buf, p)
                if magic != MAGIC_V1 and magic != MAGIC_V2:
                    raise ValueError(f"bad message magic {magic & 0xFFFFFFFF:#x}")
                if size < head_size or p + size > n:
                    raise ValueError(f"its size {size} overruns the body's {n} bytes")
                q = p + head_size
                if sys_flag & born_v6:
                    born, q = _host(buf, q, True)
                else:
                    key = buf[q : q + host_v4]
                    born = hosts.get(key) or hosts.setdefault(key, _host(buf, q, False)[0])
                    q += host_v4
                (sts,) = _Q.unpack_from(buf, q)
                q += ts_size
                width = host_v6 if sys_flag & store_v6 else host_v4
                store_raw = buf[q : q + width]
                q += width
                store = hosts.get(store_raw)
                if store is None:
                    store = hosts.setdefault(store_raw, _host(store_raw, 0, bool(sys_flag & store_v6))[0])
                if retry:
                    (reconsumed,) = _I.unpack_from(buf, q)
                (blen,) = _I.unpack_from(buf, q + body_length_at)
                q += body_at
                if blen < 0:
                    raise ValueError(f"body length {blen}")
                body = buf[q : q + blen]
                q += blen
                if magic == MAGIC_V2:
                    (tlen,) = _H.unpack_from(buf, q)
                    q += topic_v2
                else:
                    tlen = buf[q]
                    q += topic_v1
                topic = buf[q : q + tlen].decode()
                q += tlen
                (plen,) = _H.unpack_from(buf, q)
                q += props_at
                raw_props = buf[q : q + plen].decode()
                q += plen
                if q != p + size or tlen < 0 or plen < 0:
                    raise ValueError(f"its fields end at {q - p} bytes, its size says {size}")
            except (struct.error, IndexError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
                raise ProtocolError(f"pull body: malformed record at byte {p}: {exc}") from None
            p += size
            if end is not None and qoff >= end:
                continue
            if not (-ts_limit <= bts <= ts_limit and -ts_limit <= sts <= ts_limit):
                raise ProtocolError(f"pull body: the record at byte {p - size} has timestamps {bts}/{sts} ms, "
                                    f"out of range")
            user: list[tuple[str, str]] = []
            tag = key_list = uniq = retry_topic = None
            for item in raw_props.split("\x02"):
                if not item:
                    continue
                k, _, v = item.partition("\x01")
                if k == tags_key:
                    tag = v
                elif k == keys_key:
                    key_list = [x for x in v.split(" ") if x]
                elif k == uniq_key:
                    uniq = v
                elif k not in system_keys:
                    user.append((k, v))
                elif k == retry_key:
                    retry_topic = v
            if sys_flag & compressed:
                body = _inflate(body, p - size)
            if uniq is None:  # the offset message id: store host + physical offset, in hex
                uniq = store_raw.hex().upper() + _Q.pack(phys).hex().upper()
            add((topic, qid, qoff, uniq, tag, key_list if key_list is not None else [], body, user, bts * 1000,
                 sts * 1000, born, store))
            if retry:
                add((retry_topic, reconsumed))
    width = 14 if retry else 12
    return [values[i::width] for i in range(width)]


def _inflate(body: bytes, pos: int) -> bytes:
    try:
        return zlib.decompress(body)
    except zlib.error as exc:
        raise ProtocolError(f"pull body: the compressed body of the record at byte {pos} does not inflate: "
                            f"{exc}") from None


def no_retry_origin(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with :data:`RETRY_FIELDS` for messages that were not given back: retryTopic
    null, reconsumeTimes 0 (a topic's own messages; and every row the gRPC transport builds,
    whose pulls carry no record bytes)."""
    n = batch.num_rows
    return pa.RecordBatch.from_arrays([*batch.columns, pa.nulls(n, pa.string()), pa.array(np.zeros(n, np.int32))],
                                      schema=pa.schema([*batch.schema, *RETRY_FIELDS]))


def columns_to_batch(cols: dict[str, list[object]], broker: str, end: int | None = None) -> pa.RecordBatch:
    """Column lists (gRPC pulls: see ``rocketmq_spark.client.grpc_client.message_columns``,
    times in epoch millis) -> one RecordBatch; rows at/after queue offset ``end`` are dropped."""
    offsets = cols["queueOffset"]
    if end is not None and offsets and int(offsets[-1]) >= end:  # type: ignore[call-overload]
        keep = [i for i, o in enumerate(offsets) if int(o) < end]  # type: ignore[call-overload]
        cols = {k: [v[i] for i in keep] for k, v in cols.items()}
    n = len(cols["topic"])
    ms = pa.int64()
    return pa.RecordBatch.from_arrays(
        [
            pa.array(cols["topic"], pa.string()),
            _repeat_string(broker, n),
            pa.array(cols["queueId"], pa.int32()),
            pa.array(cols["queueOffset"], pa.int64()),
            pa.array(cols["messageId"], pa.string()),
            pa.array(cols["tag"], pa.string()),
            pa.array(cols["keys"], _KEYS_TYPE),
            pa.array(cols["body"], pa.binary()),
            pa.array(cols["properties"], _PROPS_TYPE),
            pc.multiply(pa.array(cols["bornTimestamp"], ms), 1000).cast(TIMESTAMP),
            pc.multiply(pa.array(cols["storeTimestamp"], ms), 1000).cast(TIMESTAMP),
            pa.array(cols["bornHost"], pa.string()),
            pa.array(cols["storeHost"], pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


# -- the vectorised decoder -------------------------------------------------------------------
#
# All the records of a call go through one fixed sequence of numpy / pyarrow kernels; there is
# no per-record Python on the fast path:
#
# 1. The chunks are joined into one (reused, per-thread) buffer. Record starts are the
#    positions of the magic (a byte scan for its first byte, 8 bytes at a time, then the whole
#    int32 checked) when they chain exactly: start[0] = 0, start[i] + totalSize[i] =
#    start[i + 1], the last record ends the buffer. Otherwise (a body holds a magic) a Python
#    loop over the sizes finds them.
# 2. The fixed 88-byte heads (IPv4 hosts) are gathered as opaque 88-byte items from a stride-1
#    view of the buffer and seen through a structured dtype: every fixed-offset field becomes a
#    big-endian numpy column.
# 3. Body, topic and properties are ranges of the buffer: a binary array over the buffer itself,
#    whose offsets interleave [body, gap, topic, gap, properties, gap] per record, is built
#    from buffers, and one ``take`` copies the bodies, topics and properties out.
# 4. Properties: the positions of \x01 and \x02 in the properties bytes give each item's key
#    and value ranges (the item's first \x01 splits it). A string array over those bytes that
#    interleaves [key, \x01, value, \x02] per item gives the keys (a ``take``), which
#    ``index_in`` classifies against the system keys; a second ``take`` copies the TAGS, KEYS and
#    UNIQ_KEY values (the last of each per record, as the reference keeps) and the user items.
#
# Records this layout does not cover (IPv6 hosts, V2 magic) send their chunks to the reference
# decoder; compressed bodies are inflated one by one; anything malformed goes to the reference
# decoder, so errors are the reference's.
#
# Cost (see benchmarks/client_decode.py): a call pays ~0.3 ms of kernel launches, then about a
# microsecond per record on a slow core, most of it in the byte scans (magic, separators), the
# three takes and index_in; hence SMALL_INPUT_BYTES, and callers should pass thousands of
# records per call.

#: where each fixed field lies in a record with IPv4 hosts (the only one this path reads)
_AT = {name: at for name, _, at in fixed_fields()}
_FIXED = fixed_size()  # the fixed part of a record with IPv4 hosts, up to and including bodyLength
_MIN_RECORD = _FIXED + TOPIC_LENGTH_V1_BYTES + PROPERTIES_LENGTH_BYTES  # with an empty body, topic, properties
_MAGIC_AT = _AT["magic"]
_MAX_FAST_BYTES = 1 << 30  # Arrow int32 offsets over the joined buffer; larger inputs are split
#: Below this many input bytes the reference decoder is used: it is faster on a few records
#: (the fast path costs a fixed few hundred microseconds of kernel calls).
SMALL_INPUT_BYTES = 16 * 1024
#: Inputs larger than this are decoded in blocks of about this size (whole chunks), then joined.
BLOCK_BYTES = 4 << 20

#: the fixed part of an all-IPv4 record (:data:`.record.RECORD_FIELDS`), as numpy reads it: the
#: magic and sysFlag by their low byte (+3 in a big-endian int32), a host as one big-endian uint64
_HDR_FIELDS = [
    ("magicLow", "u1", _AT["magic"] + 3),
    ("queueId", ">i4", _AT["queueId"]),
    ("queueOffset", ">i8", _AT["queueOffset"]),
    ("sysLow", "u1", _AT["sysFlag"] + 3),
    ("bornTs", ">i8", _AT["bornTimestamp"]),
    ("born", ">u8", _AT["bornHost"]),
    ("storeTs", ">i8", _AT["storeTimestamp"]),
    ("store", ">u8", _AT["storeHost"]),
    ("reconsumeTimes", ">i4", _AT["reconsumeTimes"]),
    ("bodyLen", ">i4", _AT["bodyLength"]),
]
_HDR = np.dtype({"names": [f[0] for f in _HDR_FIELDS], "formats": [f[1] for f in _HDR_FIELDS],
                 "offsets": [f[2] for f in _HDR_FIELDS], "itemsize": _FIXED})
#: the bytes of an offset message id in a record's fixed part: the store host, then the physical offset
_OFFSET_ID_PARTS = ((_AT["storeHost"], HOST_V4_BYTES), (_AT["physicalOffset"], _Q.size))
_V88 = np.dtype((np.void, _FIXED))
_LITTLE = sys.byteorder == "little"
_MAGIC_BYTE0 = (MAGIC_V1 >> 24) & 0xFF  # 0xDA, as in V2
_MAGIC_ANY = MAGIC_V1 | 0x0C  # V1 (..A7) and V2 (..AB) both give ..AF
_MAGIC_V1_LOW = MAGIC_V1 & 0xFF
_COMPRESSED = SysFlag.COMPRESSED
_HOSTS_V6 = SysFlag.BORN_HOST_V6 | SysFlag.STORE_HOST_V6
_KEYS_TYPE = ARROW_SCHEMA.field("keys").type
_PROPS_TYPE = ARROW_SCHEMA.field("properties").type
_ENTRY = [_PROPS_TYPE.key_field, _PROPS_TYPE.item_field]
_HEX = np.frombuffer("".join(f"{i:02X}" for i in range(256)).encode(), np.uint8).reshape(256, 2)
# index_in codes: 0 TAGS, 1 KEYS, 2 UNIQ_KEY, 3 RETRY_TOPIC, > 3 the other system keys, null a user property


def _strings(offsets: np.ndarray, data: object, n: int, typ: pa.DataType | None = None) -> pa.Array:
    return pa.Array.from_buffers(typ or pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def string_constant(values: Sequence[str]) -> pa.Array:
    """A string array built from buffers: pa.array() would import pandas (~0.4 s in every
    fresh planner process, which never decodes anything)."""
    raw = [v.encode() for v in values]
    offsets = np.zeros(len(raw) + 1, np.int32)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return _strings(offsets, b"".join(raw), len(raw))


_FIRST_KEYS = [PropertyKey.TAGS, PropertyKey.KEYS, PropertyKey.UNIQ_KEY, PropertyKey.RETRY_TOPIC]
_KEY_SET = string_constant(_FIRST_KEYS + sorted(SYSTEM_PROPERTY_KEYS - set(_FIRST_KEYS)))
_RETRY_TOPIC_CODE = 3
_EMPTY_STRINGS = string_constant([])

# -- state kept between calls ------------------------------------------------------------------
#
# The decoders are module functions that any thread may call (a Spark task, the benchmarks,
# tests), so what is worth keeping from one call to the next lives at module level rather than
# in an object every caller would have to carry. What the caches hand out, returned batches
# included, cannot be changed (numpy arrays read-only, Arrow arrays and strings immutable);
# the per-thread scratch buffers never reach a returned batch.

#: np.arange for :func:`_arange`: read-only, replaced by a longer one (twice the need) when a
#: call needs more, and kept: 16 bytes per record of the largest call that inflated compressed
#: bodies. Threads: a call uses the array it read or built, so a race only builds one twice.
_arange_cache = np.arange(1 << 16, dtype=np.int64)
_arange_cache.setflags(write=False)
#: small arrays that depend on the row count only (:func:`_take3`, :func:`_steps`,
#: :func:`_repeat_string`): at most 64 entries of at most _CACHE_MAX_ROWS rows each (a few
#: hundred KiB apiece), all dropped when full. Threads: single dict operations, each atomic,
#: on immutable values; a race at worst builds a value twice.
_cache: dict[tuple[object, ...], object] = {}
_CACHE_MAX_ROWS = 1 << 14


class _Scratch(threading.local):
    """Per-thread buffers reused across calls for the largest temporaries (fresh big allocations
    cost a page fault per 4 KiB each time, which dominates on some machines).

    Per thread because two threads decoding at once must not share them, and at module level
    because they outlive a call. They grow, never shrink, and go with their thread: the join
    buffer stays below 2 * BLOCK_BYTES (only inputs of several chunks, at most BLOCK_BYTES,
    are joined), the masks below twice the largest input the thread decoded (a bool per
    byte). A call reads them only while it runs: the batch it returns holds copies (takes)."""

    def __init__(self) -> None:
        self.join = bytearray()
        self.masks: list[np.ndarray] = [np.empty(0, np.bool_) for _ in range(3)]

    def joined(self, parts: Sequence[bytes], total: int) -> memoryview:
        if len(self.join) < total:
            self.join = bytearray(max(total, 2 * len(self.join)))
        mv = memoryview(self.join)
        p = 0
        for c in parts:
            mv[p : p + len(c)] = c
            p += len(c)
        return mv[:total]

    def mask(self, i: int, n: int) -> np.ndarray:
        if len(self.masks[i]) < n:
            self.masks[i] = np.empty(max(n, 2 * len(self.masks[i])), np.bool_)
        return self.masks[i][:n]


_scratch = _Scratch()


def _arange(n: int) -> np.ndarray:
    """np.arange(n) (int64), read-only, shared (see ``_arange_cache``)."""
    global _arange_cache
    table = _arange_cache
    if n > len(table):
        table = np.arange(2 * n, dtype=np.int64)
        table.setflags(write=False)
        _arange_cache = table
    return table[:n]


def _cached(key: tuple[object, ...], make: Callable[[], object], rows: int) -> object:
    """``make()``, kept for the next calls when it is small (it depends on ``rows`` only)."""
    if rows > _CACHE_MAX_ROWS:
        return make()
    value = _cache.get(key)
    if value is None:
        if len(_cache) >= 64:
            _cache.clear()
        value = _cache[key] = make()
    return value


class _Unsupported(Exception):
    """Some records need the reference decoder (their positions in the joined buffer)."""

    def __init__(self, positions: np.ndarray) -> None:
        super().__init__()
        self.positions = positions


class _Malformed(Exception):
    """Leave the whole input to the reference decoder (it decides what malformed input gives)."""


def decode_to_batch(chunks: Iterable[bytes], broker: str, end: int | None = None,
                    columns: Sequence[str] | None = None) -> pa.RecordBatch:
    """Decode record bytes (pull bodies) into one RecordBatch; records at/after ``end`` are dropped.

    Vectorised (numpy + pyarrow.compute): gives the same batch as
    :func:`decode_to_batch_reference`, bit for bit. A call costs a fixed few hundred
    microseconds of kernel launches plus well under a microsecond per record, so pass many
    pull bodies per call (a few thousand records). Each chunk must hold whole records.
    Malformed input raises the reference decoder's ProtocolError.

    ``columns``: only these of :data:`ARROW_SCHEMA` and :data:`RETRY_FIELDS`, in this order
    (the rest is not decoded: no properties parsed without tag, keys, messageId, properties or
    retryTopic, no hosts formatted without bornHost or storeHost); None: every column of
    :data:`ARROW_SCHEMA`. retryTopic is a record's RETRY_TOPIC property (its last one when
    repeated; null without one), reconsumeTimes its reconsume times.
    """
    parts = [c for c in chunks if len(c)]
    total = sum(len(c) for c in parts)
    retry = columns is not None and not _RETRY_NAMES.isdisjoint(columns)
    if total < SMALL_INPUT_BYTES:
        return _project(decode_to_batch_reference(parts, broker, end, retry), columns)
    if total > BLOCK_BYTES and len(parts) > 1:
        # blocks of about BLOCK_BYTES keep the temporaries cache-sized (and clear of fresh pages)
        return _concat([decode_to_batch(g, broker, end, columns) for g in _groups(parts, BLOCK_BYTES)])
    if total > _MAX_FAST_BYTES:  # one huge chunk
        return _project(decode_to_batch_reference(parts, broker, end, retry), columns)
    try:
        return _decode_fast(parts, broker, end, columns)
    except _Malformed:
        return _project(decode_to_batch_reference(parts, broker, end, retry), columns)
    except _Unsupported as exc:
        return _project(_decode_mixed(parts, broker, end, exc.positions, retry), columns)


def _project(batch: pa.RecordBatch, columns: Sequence[str] | None) -> pa.RecordBatch:
    return batch if columns is None else batch.select(list(columns))


#: the columns read from a record's properties
_PROPERTY_COLUMNS = frozenset({"tag", "keys", "messageId", "properties", "retryTopic"})
_RETRY_NAMES = frozenset(RETRY_COLUMNS)


def _groups(parts: list[bytes], limit: int) -> list[list[bytes]]:
    groups: list[list[bytes]] = [[]]
    size = 0
    for c in parts:
        if size + len(c) > limit and groups[-1]:
            groups.append([])
            size = 0
        groups[-1].append(c)
        size += len(c)
    return groups


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    batches = [b for b in batches if b.num_rows] or batches[:1]
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _decode_mixed(parts: list[bytes], broker: str, end: int | None, bad: np.ndarray,
                  retry: bool = False) -> pa.RecordBatch:
    """Chunks holding unsupported records go through the reference decoder, runs of the others
    not (every column of :data:`ARROW_SCHEMA`, and with ``retry`` :data:`RETRY_FIELDS` too)."""
    bounds = np.cumsum([len(c) for c in parts])
    bad_chunks = set(np.searchsorted(bounds, bad, side="right").tolist())
    columns = RETRY_SCHEMA.names if retry else None
    batches: list[pa.RecordBatch] = []
    run: list[bytes] = []
    for i, c in enumerate(parts):
        if i in bad_chunks:
            if run:
                batches.append(decode_to_batch(run, broker, end, columns))
                run = []
            batches.append(decode_to_batch_reference([c], broker, end, retry))
        else:
            run.append(c)
    if run:
        batches.append(decode_to_batch(run, broker, end, columns))
    return _concat(batches)


def _record_starts(buf: bytes | memoryview, u8: np.ndarray, n: int) -> np.ndarray:
    """Start of every record: the magic positions when they chain exactly, else a loop over sizes."""
    # a record starting at p has its magic at p + _MAGIC_AT, p <= n - _MIN_RECORD; scan whole uint64 words
    span = (n - _MIN_RECORD + 8) & ~7
    hit = np.equal(u8[_MAGIC_AT : _MAGIC_AT + span], _MAGIC_BYTE0, out=_scratch.mask(0, span))
    w64 = hit.view(np.uint64)
    words = np.flatnonzero(np.not_equal(w64, 0, out=_scratch.mask(1, span >> 3)))
    hits = w64[words]
    single = (hits & (hits - np.uint64(1))) == 0  # one 0xDA in the word: 1 << 8j, j = log2 / 8
    if _LITTLE and single.all():
        cand = words * 8 + (np.log2(hits.astype(np.float64)).astype(np.int64) >> 3)
    else:
        within = np.flatnonzero(hit.reshape(-1, 8)[words])
        cand = words[within >> 3] * 8 + (within & 7)
    cand = cand[: np.searchsorted(cand, n - _MIN_RECORD, "right")]
    i32 = np.ndarray((n - 3,), ">i4", buf, 0, (1,))  # an int32 at every byte
    cand = cand[(i32[cand + _MAGIC_AT] | 0x0C) == _MAGIC_ANY]
    if len(cand) and cand[0] == 0:
        nxt = cand + i32[cand]
        if nxt[-1] == n and np.array_equal(nxt[:-1], cand[1:]):
            return cand
    # A body holds a magic (or the buffer is malformed): follow the sizes.
    unpack = struct.Struct(">i").unpack_from
    starts: list[int] = []
    add = starts.append
    p = 0
    magic_at = struct.Struct(">i").unpack_from
    while p < n:
        if n - p < _MIN_RECORD:
            raise _Malformed()
        (size,) = unpack(buf, p)
        if size < _MIN_RECORD or p + size > n or (magic_at(buf, p + _MAGIC_AT)[0] | 0x0C) != _MAGIC_ANY:
            raise _Malformed()
        add(p)
        p += size
    return np.array(starts, np.int64)


#: IPv4 + port (as :func:`_host_column` reads it) -> "a.b.c.d:port": a reader sees a few hosts
#: (the producers, its brokers), so the names are kept for every later call; no more than 4096
#: are added. Threads: single dict operations, each atomic, on strings.
_host_names: dict[int, str] = {}


def _host_name(v: int) -> str:
    name = _host_names.get(v)
    if name is None:
        ip, port = v >> 32, v & 0xFFFFFFFF
        if port & 0x80000000:
            port -= 1 << 32
        name = f"{ip >> 24}.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}:{port}"
        if len(_host_names) < 4096:
            _host_names[v] = name
    return name


def _repeat_string(text: str, n: int) -> pa.Array:
    def make() -> pa.Array:
        raw = text.encode()
        offsets = np.arange(n + 1, dtype=np.int32)
        offsets *= len(raw)
        return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])

    return _cached(("repeat", text, n), make, n)


_take_fn = pc.get_function("array_take")
_index_in_fn = pc.get_function("index_in")
_KEY_LOOKUP = pc.SetLookupOptions(value_set=_KEY_SET)


def _take(values: pa.Array, indices: pa.Array) -> pa.Array:
    return _take_fn.call([values, indices])


def _int32s(a: np.ndarray) -> pa.Array:
    """A non-null int32 Arrow array over ``a`` (converted to int32 if it is not)."""
    a = a.astype(np.int32, copy=False)
    return pa.Array.from_buffers(pa.int32(), len(a), [None, pa.py_buffer(a)])


def _host_column(raw: np.ndarray) -> pa.Array:
    """IPv4 + port as one big-endian uint64 per row -> "a.b.c.d:port" strings."""
    first = raw[0]
    if (raw == first).all():
        return _repeat_string(_host_name(int(first)), len(raw))
    enc = pc.dictionary_encode(pa.array(raw.astype(np.uint64)))
    names = pa.array([_host_name(v) for v in enc.dictionary.to_pylist()], pa.string())
    return _take(names, enc.indices)


def _list(offsets: np.ndarray, values: pa.Array, n: int) -> pa.Array:
    return pa.Array.from_buffers(_KEYS_TYPE, n, [None, pa.py_buffer(offsets.astype(np.int32, copy=False))],
                                 children=[values])


def _offsets_of(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int32)
    np.cumsum(counts, out=out[1:])
    return out


def _take3(k: int) -> pa.Array:
    """Elements 6i, 6i + 2, 6i + 4 (body, topic, properties of record i) of the interleaved array."""
    def make() -> pa.Array:
        six = np.arange(0, 6 * k, 6, dtype=np.int32)
        return _int32s(np.concatenate([six, six + 2, six + 4]))

    return _cached(("take3", k), make, k)


def _steps(n: int, step: int) -> np.ndarray:
    """np.arange(0, n * step, step) as int32 (shared, read-only)."""
    def make() -> np.ndarray:
        out = np.arange(0, n * step, step, dtype=np.int32)
        out.setflags(write=False)
        return out

    return _cached(("steps", n, step), make, n)  # type: ignore[return-value]


def _decode_fast(parts: Sequence[bytes], broker: str, end: int | None,
                 columns: Sequence[str] | None = None) -> pa.RecordBatch:
    """:func:`decode_to_batch` of whole pull bodies, in the steps the comment above lists;
    _Unsupported or _Malformed when the reference decoder must take them (checked in the
    reference's order of the fields, so the fallback is the same whichever step finds it)."""
    buf = parts[0] if len(parts) == 1 else _scratch.joined(parts, sum(len(c) for c in parts))
    u8 = np.frombuffer(buf, np.uint8)
    starts = _starts_of_parts(buf, u8, parts)
    heads = np.ndarray((len(u8) - _FIXED + 1,), _V88, buf, 0, (1,))[starts]  # opaque: all 88 bytes are kept
    flagged = _flagged(heads.view(_HDR), starts)
    src = _field_ranges(buf, u8, starts, heads.view(_HDR)["bodyLen"])
    qoff = heads.view(_HDR)["queueOffset"].astype(np.int64)
    take = None
    if end is not None and not (keep := qoff < end).all():
        rows = _kept_rows(src, keep)
        if not len(rows):
            return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA if columns is None
                                              else _schema_of(tuple(columns)))
        heads, qoff = heads[rows], qoff[rows]
        six = rows.astype(np.int32) * 6
        take = _int32s(np.concatenate([six, six + 2, six + 4]))
    return _batch_of(src, take, heads, qoff, flagged, broker, columns)


def _starts_of_parts(buf: bytes | memoryview, u8: np.ndarray, parts: Sequence[bytes]) -> np.ndarray:
    """Where each record of the joined ``parts`` starts (:func:`_record_starts`); _Malformed
    when one runs across two parts (each part is a pull body of whole records)."""
    n = len(u8)
    if n < _MIN_RECORD:
        raise _Malformed()
    starts = _record_starts(buf, u8, n)
    if len(parts) > 1:
        bounds = np.cumsum([len(c) for c in parts[:-1]])
        at = np.searchsorted(starts, bounds)
        if (at >= len(starts)).any() or not np.array_equal(starts[np.minimum(at, len(starts) - 1)], bounds):
            raise _Malformed()
    return starts


def _flagged(h: np.ndarray, starts: np.ndarray) -> bool:
    """Whether a record has a compressed body; _Unsupported naming those with an IPv6 host or
    the V2 magic (the reference decoder reads them)."""
    flags = h["sysLow"] & (_HOSTS_V6 | _COMPRESSED)
    flags |= h["magicLow"] ^ _MAGIC_V1_LOW
    flagged = bool(flags.any())
    if flagged:
        bad = ((h["sysLow"] & _HOSTS_V6) != 0) | (h["magicLow"] != _MAGIC_V1_LOW)
        if bad.any():
            raise _Unsupported(starts[bad])
    return flagged


def _field_ranges(buf: bytes | memoryview, u8: np.ndarray, starts: np.ndarray, body_len: np.ndarray) -> pa.Array:
    """A binary array over ``buf`` interleaving [body, gap, topic, gap, properties, gap] per
    record (the topic's length is 1 byte with V1, the properties' an int16); _Malformed unless
    the properties of each record end where the next record starts, the last at the end."""
    n = len(u8)
    if body_len.min() < 0:
        raise _Malformed()
    m = len(starts)
    off = np.empty((m, 6), np.int32)
    try:
        np.add(starts, _FIXED, out=off[:, 0], casting="unsafe")
        be = starts + body_len
        be += _FIXED
        te = u8[be] + be
        te += TOPIC_LENGTH_V1_BYTES
        pe = np.ndarray((n - 1,), ">u2", buf, 0, (1,))[te] + te
        pe += PROPERTIES_LENGTH_BYTES
    except IndexError:
        raise _Malformed() from None
    if pe[-1] != n or not np.array_equal(pe[:-1], starts[1:]):
        raise _Malformed()
    off[:, 1] = be
    np.add(be, TOPIC_LENGTH_V1_BYTES, out=off[:, 2], casting="unsafe")
    off[:, 3] = te
    np.add(te, PROPERTIES_LENGTH_BYTES, out=off[:, 4], casting="unsafe")
    off[:, 5] = pe
    return _strings(off, buf, 6 * m - 1, pa.binary())


def _kept_rows(src: pa.Array, keep: np.ndarray) -> np.ndarray:
    """The records ``keep`` keeps; _Malformed when a dropped one's topic or properties are not
    UTF-8 (the reference decodes the records it drops too)."""
    drop = np.flatnonzero(~keep).astype(np.int32) * 6
    try:
        _take(src, _int32s(np.concatenate([drop + 2, drop + 4]))).view(pa.string()).validate(full=True)
    except pa.ArrowInvalid:
        raise _Malformed() from None
    return np.flatnonzero(keep)


def _batch_of(src: pa.Array, take: pa.Array | None, heads: np.ndarray, qoff: np.ndarray, flagged: bool,
              broker: str, columns: Sequence[str] | None) -> pa.RecordBatch:
    """The batch of the records ``take`` picks of ``src`` (every record when None; ``heads``
    and ``qoff`` theirs): their bodies, topics and properties copied out, then the columns."""
    h = heads.view(_HDR)
    k = len(qoff)
    got, gdata, goff = _gathered(src, take, k)
    body = got.slice(0, k)
    want = _ALL_COLUMNS if columns is None else frozenset(columns)
    if flagged and "body" in want:  # compressed bodies are inflated only when the body is read
        body = _inflated(body, h["sysLow"] & _COMPRESSED, k)
    if want & _PROPERTY_COLUMNS:
        tag, keys, user, uniq, retry_topic = _properties(gdata, goff[2 * k :], k, "retryTopic" in want)
    else:  # properties are not parsed (their text was checked above)
        tag = keys = user = uniq = retry_topic = None
    message_id = _message_ids(uniq, heads, k) if "messageId" in want else None
    ts = _micros(h)
    make: dict[str, Callable[[], pa.Array | None]] = {
        "topic": lambda: got.slice(k, k).view(pa.string()),
        "broker": lambda: _repeat_string(broker, k),
        "queueId": lambda: _int32s(h["queueId"]),
        "queueOffset": lambda: pa.Array.from_buffers(pa.int64(), k, [None, pa.py_buffer(qoff)]),
        "messageId": lambda: message_id,
        "tag": lambda: tag,
        "keys": lambda: keys,
        "body": lambda: body,
        "properties": lambda: user,
        "bornTimestamp": lambda: pa.Array.from_buffers(TIMESTAMP, k, [None, pa.py_buffer(ts[0])]),
        "storeTimestamp": lambda: pa.Array.from_buffers(TIMESTAMP, k, [None, pa.py_buffer(ts[1])]),
        "bornHost": lambda: _host_column(h["born"]),
        "storeHost": lambda: _host_column(h["store"]),
        "retryTopic": lambda: retry_topic,
        "reconsumeTimes": lambda: _int32s(h["reconsumeTimes"]),
    }
    names = ARROW_SCHEMA.names if columns is None else list(columns)
    return pa.RecordBatch.from_arrays([make[c]() for c in names],
                                      schema=ARROW_SCHEMA if columns is None else _schema_of(tuple(names)))


def _gathered(src: pa.Array, take: pa.Array | None, k: int) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """One take of the k records' bodies, then topics, then properties (:func:`_take3` when
    ``take`` is None) -> that array, its data bytes and its offsets; _Malformed when a topic
    or properties text is not UTF-8."""
    got = _take(src, take if take is not None else _take3(k))
    _, gobuf, gdbuf = got.buffers()
    goff = np.frombuffer(gobuf, np.int32, 3 * k + 1, got.offset * 4)
    text_start, text_end = int(goff[k]), int(goff[3 * k])
    gdata = np.frombuffer(gdbuf, np.uint8, text_end) if text_end else np.zeros(1, np.uint8)
    if text_end > text_start and gdata[text_start:text_end].max() >= 0x80:  # not ASCII: check the UTF-8
        try:
            got.slice(k, 2 * k).view(pa.string()).validate(full=True)
        except pa.ArrowInvalid:
            raise _Malformed() from None
    return got, gdata, goff


def _inflated(body: pa.Array, compressed: np.ndarray, k: int) -> pa.Array:
    """``body`` with the bodies ``compressed`` marks inflated; _Malformed when one does not inflate."""
    comp = np.flatnonzero(compressed)
    if not len(comp):
        return body
    try:
        inflated = pa.array([zlib.decompress(body[i].as_py()) for i in comp.tolist()], pa.binary())
    except zlib.error:
        raise _Malformed() from None
    order = _arange(k).copy()
    order[comp] = k + _arange(len(comp))
    return _take(pa.concat_arrays([body, inflated]), pa.array(order))


def _message_ids(uniq: pa.Array | None, heads: np.ndarray, k: int) -> pa.Array:
    """UNIQ_KEY per record, else (where null, or every record when ``uniq`` is None) the offset
    message id: store host + physical offset, in upper-case hex."""
    if uniq is not None and not uniq.null_count:
        return uniq
    hb = heads.view(np.uint8).reshape(k, _FIXED)
    raw = np.empty((k, 16), np.uint8)
    at = 0
    for first, size in _OFFSET_ID_PARTS:
        raw[:, at : at + size] = hb[:, first : first + size]
        at += size
    offset_ids = _strings(_steps(k + 1, 32), _HEX[raw], k)
    return offset_ids if uniq is None else pc.coalesce(uniq, offset_ids)


def _micros(h: np.ndarray) -> np.ndarray:
    """Born and store timestamps (rows 0 and 1) in microseconds; _Malformed when one overflows."""
    ts = np.empty((2, len(h)), np.int64)
    ts[0] = h["bornTs"]
    ts[1] = h["storeTs"]
    if ts.max() > _TS_LIMIT_MS or ts.min() < -_TS_LIMIT_MS:
        raise _Malformed()
    ts *= 1000
    return ts


_ALL_COLUMNS = frozenset(ARROW_SCHEMA.names)


# Memoised at module level: a pure function of the column list, called per decoded block; a
# query asks one list, so 64 entries hold every query of a process; lru_cache is thread-safe.
@functools.lru_cache(maxsize=64)
def _schema_of(columns: tuple[str, ...]) -> pa.Schema:
    """The schema of a projection of ARROW_SCHEMA and RETRY_FIELDS."""
    return pa.schema([RETRY_SCHEMA.field(c) for c in columns])


def _terminate(data: np.ndarray, offsets: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Add the final \\x02 to the non-empty properties that lack it."""
    plen = np.diff(offsets)
    nonempty = np.flatnonzero(plen)
    ends = offsets[1:][nonempty]
    lack = data[ends - 1] != 2
    if not lack.any():
        return data, offsets
    data = np.insert(data, ends[lack], np.uint8(2))
    grow = np.zeros(k, np.int64)
    grow[nonempty[lack]] = 1
    return data, _offsets_of(plen + grow)


def _no_properties(k: int, retry_topic: bool) -> tuple[pa.Array, pa.Array, pa.Array, None, pa.Array | None]:
    empty = pa.StructArray.from_arrays([_EMPTY_STRINGS, _EMPTY_STRINGS], fields=_ENTRY)
    zeros = np.zeros(k + 1, np.int32)
    return (pa.nulls(k, pa.string()), _list(zeros, _EMPTY_STRINGS, k),
            pa.Array.from_buffers(_PROPS_TYPE, k, [None, pa.py_buffer(zeros)], children=[empty]), None,
            pa.nulls(k, pa.string()) if retry_topic else None)


def _properties(
    gdata: np.ndarray, poff: np.ndarray, k: int, retry_topic: bool = False
) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array | None, pa.Array | None]:
    """Parse k records' properties ``gdata[poff[i]:poff[i + 1]]``.

    -> tag, keys and user-properties columns, UNIQ_KEY per record (null where absent; None
    when no record has one), and with ``retry_topic`` RETRY_TOPIC per record (null where
    absent; else None).
    """
    parsed = _property_items(gdata, poff, k)
    if parsed is None:
        return _no_properties(k, retry_topic)
    items, bounds, item, key_elem = parsed
    code = _index_in_fn.call([_take(items, _int32s(key_elem))], _KEY_LOOKUP)
    valid_buf, code_buf = code.buffers()
    codes = np.frombuffer(code_buf, np.int32, len(code), code.offset * 4)
    if code.null_count:
        valid = np.unpackbits(np.frombuffer(valid_buf, np.uint8), count=len(code) + code.offset,
                              bitorder="little")[code.offset :].view(np.bool_)
        codes = np.where(valid, codes, -1)
    user = np.flatnonzero(codes < 0)
    n_user = len(user)
    # one take: tag, KEYS, UNIQ_KEY per record, then the user keys, then their values
    got = _take(items, _value_elements(codes, bounds, item, user, k))
    uniq = got.slice(2 * k, k)
    entries = pa.StructArray.from_arrays([got.slice(3 * k, n_user), got.slice(3 * k + n_user, n_user)],
                                         fields=_ENTRY)
    user_off = np.searchsorted(user, bounds).astype(np.int32)  # user items before each record
    props = pa.Array.from_buffers(_PROPS_TYPE, k, [None, pa.py_buffer(user_off)], children=[entries])
    origin = _last_values(items, codes, _RETRY_TOPIC_CODE, bounds, item, k) if retry_topic else None
    return got.slice(0, k), _keys_column(got.slice(k, k), k), props, None if uniq.null_count == k else uniq, origin


def _property_items(
    gdata: np.ndarray, poff: np.ndarray, k: int
) -> tuple[pa.Array, np.ndarray, np.ndarray | None, np.ndarray] | None:
    """The items of k records' properties ``gdata[poff[i]:poff[i + 1]]`` (None when there is
    none): a string array interleaving [key, \\x01, value, \\x02] per item (the item's first
    \\x01 splits it), ``bounds`` (the items of record r: [bounds[r], bounds[r + 1])), ``item``
    (the non-empty items' indices, None when none is empty: an empty item, \\x02\\x02, is
    skipped; bounds count the non-empty ones) and the element of each non-empty item's key."""
    p0, p1 = int(poff[0]), int(poff[-1])
    if p1 == p0:
        return None
    data = gdata[p0:p1]
    offsets = poff - p0
    if not (gdata[poff[1:] - 1] == 2).all():  # some lack the final \x02 (or are empty)
        data, offsets = _terminate(data, offsets, k)
    seps = np.flatnonzero(np.less(data, 3, out=_scratch.mask(2, len(data))))  # every \x01, \x02 (\x00)
    kinds = data[seps]
    if kinds.min() == 0:  # a \x00 is data
        seps = seps[kinds != 0]
        kinds = data[seps]
    term = np.flatnonzero(kinds == 2)  # the \x02 ending each item, as indices in seps
    n_items = len(term)
    if not n_items:
        return None
    item_end = seps[term]
    first = np.empty(n_items, np.int64)  # index in seps of each item's first separator
    first[0] = 0
    np.add(term[:-1], 1, out=first[1:])
    split = seps[first]  # the item's first \x01, or its end when it has none
    # [key, \x01, value, \x02] per item, over the properties bytes
    off = np.empty((n_items + 1, 4), np.int32)
    off[0, 0] = 0
    np.add(item_end, 1, out=off[1:, 0], casting="unsafe")
    off[:-1, 1] = split
    np.add(split, first < term, out=off[:-1, 2], casting="unsafe")
    off[:-1, 3] = item_end
    items = _strings(off, data, 4 * n_items)
    bounds = np.searchsorted(item_end, offsets)
    if (off[:-1, 3] > off[:-1, 0]).all():
        return items, bounds, None, _steps(n_items, 4)
    item = np.flatnonzero(off[:-1, 3] > off[:-1, 0])
    if not len(item):
        return None
    return items, np.searchsorted(item, bounds), item, item.astype(np.int32) * 4


def _value_elements(codes: np.ndarray, bounds: np.ndarray, item: np.ndarray | None, user: np.ndarray,
                    k: int) -> pa.Array:
    """The elements of ``items`` (see :func:`_property_items`) to take: the value of the last
    TAGS, KEYS and UNIQ_KEY item of each record (codes 0, 1, 2; null where a record has none),
    in three runs of k, then the ``user`` items' keys, then their values."""
    special = np.flatnonzero(codes.view(np.uint32) <= 2)
    slot = np.repeat(_steps(k, 3), np.diff(bounds))[special]
    slot += codes[special]
    pick = np.full(3 * k, -1, np.int64)
    np.maximum.at(pick, slot, special)
    n_user = len(user)
    idx = np.empty(3 * k + 2 * n_user, np.int32)
    sel = idx[: 3 * k].reshape(3, k)
    sel[...] = (pick if item is None else item[pick]).reshape(k, 3).T
    sel *= 4
    sel += 2
    if n_user:
        user_elem = idx[3 * k : 3 * k + n_user]
        user_elem[...] = user if item is None else item[user]
        user_elem *= 4
        np.add(user_elem, 2, out=idx[3 * k + n_user :])
    missing = pick < 0
    if missing.any():
        mask = np.zeros(len(idx), np.bool_)
        mask[: 3 * k] = missing.reshape(k, 3).T.ravel()
        return pa.array(idx, mask=mask)
    return _int32s(idx)


def _last_values(items: pa.Array, codes: np.ndarray, code: int, bounds: np.ndarray, item: np.ndarray | None,
                 k: int) -> pa.Array:
    """Per record, the value of its last item whose key is the ``code``-th of ``_KEY_SET``
    (null where it has none); ``items``, ``codes``, ``bounds`` and ``item`` as in :func:`_properties`."""
    hits = np.flatnonzero(codes == code)
    if not len(hits):
        return pa.nulls(k, pa.string())
    pick = np.full(k, -1, np.int64)
    np.maximum.at(pick, np.repeat(_arange(k), np.diff(bounds))[hits], hits)
    elem = (pick if item is None else item[pick]).astype(np.int32)
    elem *= 4
    elem += 2
    missing = pick < 0
    return _take(items, pa.array(elem, mask=missing) if missing.any() else _int32s(elem))


def _keys_column(text: pa.Array, k: int) -> pa.Array:
    """KEYS values split on spaces, empty keys dropped; [] where a record has no KEYS (null)."""
    if not text.null_count:
        _, obuf, dbuf = text.buffers()
        toff = np.frombuffer(obuf, np.int32, k + 1, text.offset * 4)
        lo, hi = int(toff[0]), int(toff[-1])
        if hi > lo and not (np.frombuffer(dbuf, np.uint8, hi - lo, lo) == 0x20).any() and (
                toff[1:] > toff[:-1]).all():
            return _list(_steps(k + 1, 1), text, k)  # one key per record (the usual case)
    elif text.null_count == k:
        return _list(np.zeros(k + 1, np.int32), _EMPTY_STRINGS, k)
    parts = pc.split_pattern(text, " ")
    flat = pc.list_flatten(parts)
    parent = pc.list_parent_indices(parts).to_numpy()
    nonempty = pc.binary_length(flat).to_numpy() > 0
    if not nonempty.all():
        flat = flat.filter(pa.array(nonempty))
        parent = parent[nonempty]
    return _list(_offsets_of(np.bincount(parent, minlength=k)), flat, k)
