"""The writer's vectorised encoder: an Arrow batch of plain rows -> batch-send bodies.

``at-least-once`` rows that carry only a body (BINARY or STRING, at most the compression
threshold), a tag and STRING keys, for the option topic, need no per-row decision: their
properties (``TAGS``, ``KEYS``, ``UNIQ_KEY``) and batch entries are built with a handful
of Arrow / numpy kernels over the whole batch, then cut into sends bounded by count and
bytes exactly as the per-row path bounds them. Anything else (a null or large body, a
topic / messageGroup / deliveryTimestamp / properties value, list keys, exactly-once)
returns None and the rows take the per-row path, which also owns every error message.
Both paths produce the same bytes (tests/unit/test_writer_encode.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..codec import MAX_PROPERTIES_BYTES, EncodedBatch

__all__ = ["encode_plain_rows"]

_join = pc.get_function("binary_join_element_wise")
# from buffers: pa.scalar() would import pandas in processes that only plan or commit
_EMPTY = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, np.int32)), pa.py_buffer(b"")])[0]
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SHIFTS = np.arange(36, -1, -4, dtype=np.uint64)  # ten hex digits, most significant first
_PLAIN_TYPES = (pa.binary(), pa.string())
#: columns that, when they hold a value, need the per-row path
_PER_ROW_COLUMNS = ("topic", "messageGroup", "deliveryTimestamp", "properties")
_ENTRY_HEAD = np.dtype([("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("flag", ">i4"), ("body_len", ">i4")])


def _column(batch: pa.RecordBatch, name: str) -> Any:
    i = batch.schema.get_field_index(name)
    return batch.column(i) if i >= 0 else None


def _lengths(arr: Any) -> np.ndarray:
    """Byte lengths of a binary/string array's values (0 for nulls)."""
    _, obuf, _ = arr.buffers()
    off = np.frombuffer(obuf, np.int32, len(arr) + 1, arr.offset * 4)
    return np.diff(off).astype(np.int64)


def _binary(offsets: np.ndarray, data: Any, n: int) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _property(name: str, values: Any) -> pa.Array | None:
    """``NAME\\x01value\\x02`` where the value is non-empty, else empty; None if all are."""
    if values is None or values.null_count == len(values):
        return None
    values = values.cast(pa.binary())
    part = _join.call([pa.scalar(name.encode() + b"\x01"), values, pa.scalar(b"\x02"), _EMPTY])
    keep = pc.greater(pc.binary_length(values), 0)
    return pc.fill_null(pc.if_else(keep, part, _EMPTY), _EMPTY)


def _uniq_keys(prefix: str, first_seq: int, n: int) -> pa.Array:
    """``UNIQ_KEY\\x01<prefix><seq as 10 hex digits>\\x02`` for seq = first_seq, first_seq + 1, ..."""
    head = b"UNIQ_KEY\x01" + prefix.encode()
    width = len(head) + 11
    out = np.empty((n, width), np.uint8)
    out[:, : len(head)] = np.frombuffer(head, np.uint8)
    seq = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    out[:, len(head) : width - 1] = _HEX[(seq[:, None] >> _SHIFTS) & np.uint64(15)]
    out[:, -1] = 2
    return _binary(np.arange(0, (n + 1) * width, width, dtype=np.int32), out, n)


def encode_plain_rows(batch: pa.RecordBatch, *, uniq_prefix: str, first_seq: int, compress_threshold: int,
                      max_message_size: int, max_batch_messages: int,
                      max_batch_bytes: int) -> list[EncodedBatch] | None:
    """Batch-send bodies for ``batch``'s rows (UNIQ_KEY sequence from ``first_seq``), or
    None when a row needs the per-row path (see the module docstring).

    Sizes are in bytes. A body over ``min(compress_threshold, max_message_size)`` or
    properties over 32767 bytes send the batch to the per-row path. Each body holds at most
    ``max_batch_messages`` rows and ends with the row that brings its estimated size (body +
    properties + 24 per row) to ``max_batch_bytes`` or more, as the per-row path's buffer does."""
    n = batch.num_rows
    body = _column(batch, "body")
    if not n or body is None or body.type not in _PLAIN_TYPES or body.null_count:
        return None
    for name in _PER_ROW_COLUMNS:
        col = _column(batch, name)
        if col is not None and col.null_count != n:
            return None
    tag, keys = _column(batch, "tag"), _column(batch, "keys")
    if (tag is not None and tag.type != pa.string()) or (keys is not None and keys.type != pa.string()):
        return None
    body_len = _lengths(body)
    if body_len.max() > min(compress_threshold, max_message_size):
        return None
    parts = [p for p in (_property("TAGS", tag), _property("KEYS", keys)) if p is not None]
    props = _join.call([*parts, _uniq_keys(uniq_prefix, first_seq, n), _EMPTY])
    props_len = _lengths(props)
    if props_len.max() > MAX_PROPERTIES_BYTES:
        return None
    head = np.zeros(n, _ENTRY_HEAD)
    head["total"] = 20 + body_len + 2 + props_len
    head["body_len"] = body_len
    steps = np.arange(n + 1, dtype=np.int32)
    try:
        entries = _join.call([_binary(steps * 20, head, n), body.cast(pa.binary()),
                              _binary(steps * 2, props_len.astype(">i2"), n), props, _EMPTY])
    except pa.ArrowInvalid:  # over 2 GiB in one Arrow batch: the per-row path copes
        return None
    _, obuf, dbuf = entries.buffers()
    off = np.frombuffer(obuf, np.int32, n + 1, entries.offset * 4).astype(np.int64)
    data = memoryview(dbuf)
    # sends of at most max_batch_messages rows, closed (like the per-row path's buffer) once
    # their estimated size reaches max_batch_bytes
    estimate = np.zeros(n + 1, np.int64)
    np.cumsum(body_len + props_len + 24, out=estimate[1:])
    out: list[EncodedBatch] = []
    i = 0
    while i < n:
        j = min(n, i + max_batch_messages)
        full = int(np.searchsorted(estimate, estimate[i] + max_batch_bytes, "left"))  # first row reaching it
        j = min(j, max(full, i + 1))
        out.append(EncodedBatch(bytes(data[off[i] : off[j]]), j - i))
        i = j
    return out
