"""The broker's vectorised path for batch sends (SEND_BATCH_MESSAGE of plain messages).

A batch body is a run of entries ``int32 total | int32 magic | int32 bodyCRC | int32 flag |
int32 bodyLen | body | int16 propsLen | props``. Stored records have the layout of
:func:`.record.encode_record`; per record they are

    prefix (size .. preparedTransactionOffset)  | bodyLen | body | topic length | topic |
    propsLen | props | [\\x02] | the broker's properties (MSG_REGION, CLUSTER, TRACE_ON)

so a record is the entry with its 16-byte head replaced by a prefix and its props length by
the topic and a new props length, plus a suffix. :func:`parse_batch` reads the entries'
layout with numpy (no per-entry Python beyond the walk over their sizes when they differ);
:func:`pack_records` builds every record of the batch with a few numpy / Arrow kernels and
one ``zlib.crc32`` call per body (the only per-message Python left).

Anything unusual (a layout the per-message path would reject or treat specially: malformed
entries, bodies over the size limit, properties that are not ASCII, that name the cluster,
a delay or a timer, or that would overflow int16) returns ``None`` and the caller takes the
per-message path, which stores or rejects exactly as before. Both paths write the same
bytes (tests/unit/test_batchput.py).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .batch import ENTRY_HEAD, ENTRY_OFFSETS
from .properties import PER_MESSAGE_MARKERS
from .record import (
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_BYTES,
    MAX_V1_TOPIC_BYTES,
    PROPERTIES_LENGTH_BYTES,
    fixed_fields,
)
from .tags import tag_hash

__all__ = ["BatchLayout", "offset_msg_ids", "pack_records", "parse_batch"]

_MIN_ENTRY = ENTRY_HEAD.size + PROPERTIES_LENGTH_BYTES  # an empty body and properties
_BODY_LENGTH_AT = ENTRY_OFFSETS["bodyLength"]
_FLAG_AT = ENTRY_OFFSETS["flag"]
_I32 = struct.Struct(">i")
#: properties that send a batch down the per-message path (they need parsing per message)
_SPECIAL = tuple(m.encode() for m in PER_MESSAGE_MARKERS)
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)[np.arange(256).reshape(256, 1) >> np.array([4, 0]) & 15]

# Module state: the caches below hold values that depend only on their arguments and never
# change once built, shared by every store of the process (brokers in one process run on
# their own loop threads, so a kernel may run in two threads at once).
#
#: pyarrow, pyarrow.compute and the two compute functions the kernels call, imported on the
#: first batch (the broker starts without pyarrow). Set once; threads racing the first batch
#: import the same modules, so either assignment is right.
_pa: Any = None


def special_free(props: bytes) -> bool:
    """Whether no property in ``props`` needs the per-message path (delays, timers, the
    broker's own properties)."""
    return not any(p in props for p in _SPECIAL)


def _arrow() -> tuple[Any, Any, Any, Any]:
    global _pa
    if _pa is None:
        import pyarrow
        import pyarrow.compute as pc

        _pa = (pyarrow, pc.get_function("binary_join_element_wise"), pc.get_function("array_take"), pc)
    return _pa


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """Where each entry's parts lie in the batch body (int64 arrays, one item per entry):
    ``starts`` byte positions of the entries, ``body_len`` and ``props_len`` in bytes,
    ``flags`` the producers' message flags."""

    body: bytes
    starts: np.ndarray
    body_len: np.ndarray
    props_len: np.ndarray
    flags: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


def _walk(body: bytes, n: int) -> np.ndarray | None:
    first = _I32.unpack_from(body, 0)[0]
    if first >= _MIN_ENTRY and n % first == 0:  # equal sizes (common): check them all at once
        starts = np.arange(0, n, first, dtype=np.int64)
        if (np.ndarray((n // first,), ">i4", body, 0, (first,)) == first).all():
            return starts
    out: list[int] = []
    add = out.append
    unpack = _I32.unpack_from
    p = 0
    while p < n:
        if n - p < _MIN_ENTRY:
            return None
        (total,) = unpack(body, p)
        if total < _MIN_ENTRY:
            return None
        add(p)
        p += total
    return np.array(out, np.int64) if p == n else None


def parse_batch(body: bytes, max_body: int) -> BatchLayout | None:
    """The layout of a well-formed batch of plain messages (no body over ``max_body``
    bytes); None sends it down the per-message path (see the module docstring)."""
    n = len(body)
    if n < _MIN_ENTRY:
        return None
    starts = _walk(body, n)
    if starts is None:
        return None
    i32 = np.ndarray((n - 3,), ">i4", body, 0, (1,))
    totals = i32[starts].astype(np.int64)
    body_len = i32[starts + _BODY_LENGTH_AT].astype(np.int64)
    if body_len.min() < 0 or body_len.max() > max_body:
        return None
    plen_at = starts + ENTRY_HEAD.size + body_len
    ends = starts + totals
    if (plen_at + PROPERTIES_LENGTH_BYTES > ends).any():
        return None
    props_len = np.ndarray((n - 1,), ">i2", body, 0, (1,))[plen_at].astype(np.int64)
    if props_len.min() < 0 or not np.array_equal(plen_at + PROPERTIES_LENGTH_BYTES + props_len, ends):
        return None
    return BatchLayout(body, starts, body_len, props_len, i32[starts + _FLAG_AT].astype(np.int64))


# the record's fixed part as a dtype (:data:`.record.RECORD_FIELDS`), per packed host length
# (8 or 20 bytes each: four in use at most); lru_cache is thread-safe and dtypes immutable
@lru_cache(maxsize=16)
def _prefix_dtype(born_len: int, store_len: int) -> np.dtype:
    return np.dtype([(name, typ) for name, typ, _ in fixed_fields(born_len, store_len)])


# per topic, for the 64 topics most recently appended to in batches; immutable values
@lru_cache(maxsize=64)
def _topic_part(topic: str) -> tuple[np.dtype, bytes, int]:
    """dtype of ``topic length | topic | propsLen`` for ``topic``, its length bytes, the magic."""
    raw = topic.encode()
    v2 = len(raw) > MAX_V1_TOPIC_BYTES
    head = struct.pack(">h", len(raw)) if v2 else bytes((len(raw),))
    return (np.dtype([("topic", f"V{len(head) + len(raw)}"), ("props_len", ">i2")]), head + raw,
            MAGIC_V2 if v2 else MAGIC_V1)


# Arrow scalars of the broker's property suffixes (one per broker configuration) and b""
@lru_cache(maxsize=16)
def _scalar(value: bytes) -> Any:
    return _arrow()[0].scalar(value, _arrow()[0].binary())


def _binary(pa: Any, offsets: np.ndarray, data: Any, n: int) -> Any:
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


#: the last TAGS item (the one a property map keeps): at the start of the properties or right
#: after a separator, with as much as possible before it
_TAGS_RE = "(?s)^(?:.*\x02)?TAGS\x01(?P<tag>[^\x02]*)"
#: 31**d mod 2**32 for d < len(_pow31): grown (at least doubling) to the longest tag hashed so
#: far and kept, 8 bytes per character. Never written once built; a call uses the table it read
#: or built, so threads racing a growth only build it twice.
_pow31 = np.ones(1, np.uint64)


def _powers_of_31(n: int) -> np.ndarray:
    global _pow31
    table = _pow31
    if len(table) < n:
        grown = np.full(max(n, 2 * len(table)), 31, np.uint64)
        grown[0] = 1
        np.multiply.accumulate(grown, out=grown)  # wraps mod 2**64, which keeps it mod 2**32
        table = _pow31 = grown & np.uint64(0xFFFFFFFF)
    return table


def tag_hashes(props: Any) -> np.ndarray:
    """The consume queue's tag hash per message: Java's ``String.hashCode`` of the value of
    its TAGS item, the last when repeated (0 without one or when it is empty), as
    :func:`.tags.tag_hash` computes it. ``props``: an Arrow array of
    ASCII properties, so a byte is a UTF-16 code unit. No per-message Python."""
    pa, pc = _arrow()[0], _arrow()[3]
    k = len(props)
    out = np.zeros(k, np.int64)
    tags = pc.struct_field(pc.extract_regex(props.view(pa.string()), _TAGS_RE), [0])
    valid_buf, off_buf, data_buf = tags.buffers()
    off = np.frombuffer(off_buf, np.int32, k + 1, tags.offset * 4).astype(np.int64)
    lens = np.diff(off)
    if valid_buf is not None:
        valid = np.unpackbits(np.frombuffer(valid_buf, np.uint8), count=k + tags.offset, bitorder="little")
        lens[valid[tags.offset :] == 0] = 0
    rows = np.flatnonzero(lens)
    if not len(rows):
        return out
    lens, first = lens[rows], off[:-1][rows]
    ends = np.cumsum(lens)
    begin = ends - lens
    at = np.arange(int(ends[-1]), dtype=np.int64)
    dist = np.repeat(ends - 1, lens) - at  # how far each byte is from its tag's end
    at += np.repeat(first - begin, lens)
    data = np.frombuffer(data_buf, np.uint8, int(off[-1]))
    h = np.add.reduceat(data[at] * _powers_of_31(int(lens.max()))[dist], begin) & np.uint64(0xFFFFFFFF)
    h = h.astype(np.int64)
    h[h >= 1 << 31] -= 1 << 32  # a signed int32, as Java has it
    out[rows] = h
    return out


def pack_records(layout: BatchLayout, *, topic: str, queue_id: int, first_offset: int, first_pos: int,
                 sys_flag: int, born_ts: int, born_host: bytes, store_ts: int, store_host: bytes,
                 reconsume: int, suffix: bytes) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray] | None:
    """The stored records of ``layout``'s messages, laid end to end from ``first_pos``.

    ``first_offset`` is the first message's queue offset, ``first_pos`` its byte position in
    the commit log; times are epoch milliseconds; hosts are packed as
    :func:`.record.pack_host` packs them (``sys_flag`` carries their IPv6 bits); ``suffix``
    (the broker's own properties) is appended to each message's properties.

    -> (records buffer, sizes in bytes, commit-log positions, tag hashes), or None when a
    message's properties are not ASCII, name a special property, or would overflow int16
    with the suffix (per-message path).
    """
    bodies, props = _entry_parts(layout)
    checked = _checked_properties(layout, props, len(suffix))
    if checked is None:
        return None
    text, sep, new_props_len = checked
    tdtype, topic_bytes, magic = _topic_part(topic)
    pdtype = _prefix_dtype(len(born_host), len(store_host))
    sizes = pdtype.itemsize + layout.body_len + tdtype.itemsize + new_props_len
    pos = _positions(sizes, first_pos)
    k = len(layout)
    prefix = np.zeros(k, pdtype)  # the fixed part of each record
    prefix["totalSize"] = sizes
    prefix["magic"] = magic
    prefix["bodyCRC"] = _body_crcs(bodies)
    prefix["queueId"] = queue_id
    prefix["flag"] = layout.flags
    prefix["queueOffset"] = np.arange(first_offset, first_offset + k, dtype=np.int64)
    prefix["physicalOffset"] = pos
    prefix["sysFlag"] = sys_flag
    prefix["bornTimestamp"] = born_ts
    prefix["bornHost"] = np.void(born_host)
    prefix["storeTimestamp"] = store_ts
    prefix["storeHost"] = np.void(store_host)
    prefix["reconsumeTimes"] = reconsume
    prefix["bodyLength"] = layout.body_len
    tpart = np.empty(k, tdtype)  # then the topic and the properties' new length
    tpart["topic"] = np.void(topic_bytes)
    tpart["props_len"] = new_props_len
    data = _joined(prefix, bodies, tpart, props, sep, suffix)
    return data, sizes, pos, _tags_of(props, text, suffix)


def _entry_parts(layout: BatchLayout) -> tuple[Any, Any]:
    """The entries' bodies and properties, as two Arrow binary arrays (of k each) sliced from one."""
    pa, _, take, _ = _arrow()
    k = len(layout)
    # the entry's parts, as one binary array: [body, propsLen, props, next entry head + bodyLen] * k
    cuts = np.empty((k, 4), np.int64)
    np.add(layout.starts, ENTRY_HEAD.size, out=cuts[:, 0])
    np.add(cuts[:, 0], layout.body_len, out=cuts[:, 1])
    np.add(cuts[:, 1], PROPERTIES_LENGTH_BYTES, out=cuts[:, 2])
    np.add(cuts[:, 2], layout.props_len, out=cuts[:, 3])
    parts = _binary(pa, cuts.ravel().astype(np.int32), layout.body, 4 * k - 1)
    picked = take.call([parts, pa.array(np.concatenate([np.arange(0, 4 * k, 4, dtype=np.int32),
                                                        np.arange(2, 4 * k, 4, dtype=np.int32)]))])
    return picked.slice(0, k), picked.slice(k, k)


def _checked_properties(layout: BatchLayout, props: Any,
                        suffix_len: int) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """The messages' properties, all in one text; per message whether they need a \\x02
    before the suffix (non-empty, not ending with one), and their length with it and the
    suffix. None when they are not ASCII (the per-message path decodes and checks them), name
    a special property, or would grow past an int16 (see :func:`pack_records`)."""
    _, poff_buf, pdata_buf = props.buffers()
    k = len(layout)
    poff = np.frombuffer(poff_buf, np.int32, 2 * k + 1)[k:]
    pdata = np.frombuffer(pdata_buf, np.uint8, int(poff[-1]))[int(poff[0]):]
    text = pdata.tobytes()
    if not text.isascii() or not special_free(text):
        return None
    last = pdata[np.maximum(poff[1:] - poff[0] - 1, 0)] if len(pdata) else np.zeros(k, np.uint8)
    sep = (layout.props_len > 0) & (last != 2)
    new_props_len = layout.props_len + sep + suffix_len
    if new_props_len.max() > MAX_PROPERTIES_BYTES:
        return None
    return text, sep, new_props_len


def _positions(sizes: np.ndarray, first_pos: int) -> np.ndarray:
    """The commit-log position of each record of these sizes, laid end to end from ``first_pos``."""
    pos = np.empty(len(sizes), np.int64)
    pos[0] = first_pos
    np.cumsum(sizes[:-1], out=pos[1:])
    pos[1:] += first_pos
    return pos


def _body_crcs(bodies: Any) -> np.ndarray:
    """Each body's CRC as a record stores it (:func:`.record.body_crc`)."""
    # one zlib call per body; Arrow hands the bodies over as bytes more cheaply than slicing
    crcs = np.fromiter(map(zlib.crc32, bodies.to_pylist()), np.uint32, len(bodies))
    crcs &= 0x7FFFFFFF
    return crcs


def _joined(prefix: np.ndarray, bodies: Any, tpart: np.ndarray, props: Any, sep: np.ndarray,
            suffix: bytes) -> Any:
    """The records' bytes: per message its fixed part, body, topic part, properties, separator
    and the suffix, joined (one Arrow kernel)."""
    pa, join, _, _ = _arrow()
    k = len(prefix)
    steps = np.arange(k + 1, dtype=np.int32)
    sep_off = np.zeros(k + 1, np.int32)
    np.cumsum(sep, out=sep_off[1:])
    records = join.call([
        _binary(pa, steps * prefix.dtype.itemsize, prefix, k),
        bodies,
        _binary(pa, steps * tpart.dtype.itemsize, tpart, k),
        props,
        _binary(pa, sep_off, b"\x02" * int(sep_off[-1]), k),
        _scalar(suffix),
        _scalar(b""),
    ])
    _, roff_buf, rdata_buf = records.buffers()
    roff = np.frombuffer(roff_buf, np.int32, k + 1, records.offset * 4)
    return rdata_buf[int(roff[0]) : int(roff[-1])]


def _tags_of(props: Any, text: bytes, suffix: bytes) -> np.ndarray:
    """Each message's tag hash: its last TAGS item's, or the suffix's when it has one (it
    comes after every message's own); ``text`` all their properties."""
    k = len(props)
    if b"TAGS\x01" in suffix:
        return np.full(k, tag_hash(suffix.decode()), np.int64)
    return tag_hashes(props) if b"TAGS\x01" in text else np.zeros(k, np.int64)


def offset_msg_ids(prefix_hex: str, positions: np.ndarray) -> str:
    """Comma-joined offset message ids (store host hex + 16 hex digits of the position):
    ``prefix_hex`` the packed store host in upper-case hex, ``positions`` commit-log byte
    positions."""
    k = len(positions)
    width = len(prefix_hex) + 17
    out = np.empty((k, width), np.uint8)
    out[:, : len(prefix_hex)] = np.frombuffer(prefix_hex.encode(), np.uint8)
    out[:, len(prefix_hex) : width - 1] = _HEX[positions.astype(">u8").view(np.uint8).reshape(k, 8)].reshape(k, 16)
    out[:, -1] = 0x2C
    return out.tobytes()[:-1].decode("ascii")
