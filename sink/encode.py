"""What the writer sends for a row: its message properties, defined once, and the vectorised
encoder of plain rows that is held to that definition.

A row's message properties are, in this order (:func:`row_properties`): ``TAGS`` (a non-empty
tag), ``KEYS`` (non-empty keys, a list joined with spaces: :func:`keys_text`), ``UNIQ_KEY`` (the
writer's message id), then the rest (:func:`rest_properties`): ``__SHARDINGKEY`` (the message
group, when the message names it itself rather than its batch send), ``TIMER_DELIVER_MS`` (the
delivery time) and the properties column's items. A half message (exactly-once) ends with
:func:`half_properties`. The per-row path and the half-message path build every message with
these functions.

The vectorised encoder (:func:`encode_plain_rows`): ``at-least-once`` rows that carry only a
body (BINARY or STRING, at most the compression threshold), a tag and STRING keys, for the
option topic, need no per-row decision: their properties (``TAGS``, ``KEYS``, ``UNIQ_KEY``) and
batch entries are built with a handful of Arrow / numpy kernels over the whole batch, then cut
into sends bounded by count and bytes exactly as the per-row path bounds them. Anything else (a
null or large body, a topic / messageGroup / deliveryTimestamp / properties value, list keys,
exactly-once) returns None and the rows take the per-row path, which also owns every error
message. Both give the same bytes: tests/unit/test_writer_encode.py holds the encoder's
properties to :func:`row_properties` and its sends to the per-row path's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..codec import MAX_PROPERTIES_BYTES, EncodedBatch, PropertyKey
from ..codec.batch import ENTRY_FIELDS, ENTRY_HEAD
from ..codec.record import PROPERTIES_LENGTH_BYTES

__all__ = ["COLUMN_KEYS", "TX_TAG", "SetByColumnError", "deliver_millis", "encode_plain_rows", "half_properties",
           "keys_text", "property_item", "rest_properties", "row_properties", "uniq_ids"]

# -- a row's properties ------------------------------------------------------------------------

_TAGS, _KEYS, _UNIQ_KEY = PropertyKey.TAGS, PropertyKey.KEYS, PropertyKey.UNIQ_KEY
_GROUP, _DELIVER = PropertyKey.SHARDING_KEY, PropertyKey.TIMER_DELIVER_MS
#: the properties a row's columns (or the writer) set, never also taken from its properties
#: column: who sets each, for the error
COLUMN_KEYS = {_TAGS: "the tag column", _KEYS: "the keys column", _UNIQ_KEY: "the writer (the message id)",
               _GROUP: "the messageGroup column", _DELIVER: "the deliveryTimestamp column"}
#: the property tagging a half message with ``<batchId>:<partition>:<attempt>:<sinkId>:<nonce>``,
#: by which check-backs are answered
TX_TAG = "RMQSPARK_TX"


class SetByColumnError(ValueError):
    """The properties column names a key that a column of the row (or the writer) sets."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} is set by {COLUMN_KEYS[key]}")
        self.key = key


def property_item(key: str, value: object) -> str:
    """One ``key\\x01value\\x02`` property."""
    return f"{key}\x01{value}\x02"


def keys_text(keys: str | list[str | None] | None) -> str:
    """The KEYS value of a keys column's value: a list joined with spaces (empty and null keys
    dropped), a string as it is; "" for none."""
    return (" ".join(x for x in keys if x) if isinstance(keys, list) else keys) if keys else ""


def row_properties(uniq: str, tag: str | None = None, keys: str = "", rest: str = "") -> str:
    """A row's message properties: ``TAGS`` when ``tag`` is non-empty, ``KEYS`` when ``keys``
    (:func:`keys_text`) is, ``UNIQ_KEY``, then ``rest`` (:func:`rest_properties`)."""
    # one f-string per case: a third cheaper than building the text up (called per row)
    if tag:
        if keys:
            return f"{_TAGS}\x01{tag}\x02{_KEYS}\x01{keys}\x02{_UNIQ_KEY}\x01{uniq}\x02{rest}"
        return f"{_TAGS}\x01{tag}\x02{_UNIQ_KEY}\x01{uniq}\x02{rest}"
    if keys:
        return f"{_KEYS}\x01{keys}\x02{_UNIQ_KEY}\x01{uniq}\x02{rest}"
    return f"{_UNIQ_KEY}\x01{uniq}\x02{rest}"


def rest_properties(group: str | None, deliver_ms: int | None,
                    user: Mapping[str, str | None] | Iterable[tuple[str, str | None]] | None, *,
                    tag: bool, keys: bool) -> str:
    """A row's properties after its ``UNIQ_KEY``: ``__SHARDINGKEY`` when ``group`` is non-empty
    (pass None when its batch send names it), ``TIMER_DELIVER_MS`` when ``deliver_ms`` (epoch
    milliseconds) is not None, then the properties column's items (``user``; one with an empty
    key or a null value is left out). SetByColumnError when an item's key is one this row's
    columns set: the tag's and the keys' when the row has them (``tag``, ``keys``), the delivery
    time's with ``deliver_ms``, the message group's and the message id's always (the writer
    routes and retries by the messageGroup column alone)."""
    out = f"{_GROUP}\x01{group}\x02" if group else ""
    if deliver_ms is not None:
        out += f"{_DELIVER}\x01{deliver_ms}\x02"
    if user:
        taken = {_UNIQ_KEY, _GROUP} | ({_TAGS} if tag else set()) | ({_KEYS} if keys else set()) \
            | ({_DELIVER} if deliver_ms is not None else set())
        for key, value in (user.items() if isinstance(user, Mapping) else user):
            if key and value is not None:
                if key in taken:
                    raise SetByColumnError(key)
                out += f"{key}\x01{value}\x02"
    return out


def deliver_millis(value: Any) -> int | None:
    """A deliveryTimestamp value as epoch milliseconds (a datetime, or a number of
    milliseconds); None for none."""
    if value is None:
        return None
    return int(value.timestamp() * 1000) if hasattr(value, "timestamp") else int(value)


def half_properties(producer_group: str, tx_tag: str) -> str:
    """What a half message's properties end with: ``TRAN_MSG``, its producer group and the
    :data:`TX_TAG` check-backs are answered by."""
    return f"{PropertyKey.TRAN_MSG}\x01true\x02{PropertyKey.PGROUP}\x01{producer_group}\x02{TX_TAG}\x01{tx_tag}\x02"


# -- the vectorised encoder of plain rows ------------------------------------------------------

_join = pc.get_function("binary_join_element_wise")
# from buffers: pa.scalar() would import pandas in processes that only plan or commit
_EMPTY = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.zeros(2, np.int32)), pa.py_buffer(b"")])[0]
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_SHIFTS = np.arange(36, -1, -4, dtype=np.uint64)  # ten hex digits, most significant first
_PLAIN_TYPES = (pa.binary(), pa.string())
#: columns that, when they hold a value, need the per-row path
_PER_ROW_COLUMNS = ("topic", "messageGroup", "deliveryTimestamp", "properties")
_ENTRY_HEAD = np.dtype([(name, ">" + code) for name, code in ENTRY_FIELDS])  # codec.batch's layout


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
    """``NAME\\x01value\\x02`` where the value is non-empty, else empty (as :func:`row_properties`
    writes TAGS and KEYS); None if all are."""
    if values is None or values.null_count == len(values):
        return None
    values = values.cast(pa.binary())
    part = _join.call([pa.scalar(name.encode() + b"\x01"), values, pa.scalar(b"\x02"), _EMPTY])
    keep = pc.greater(pc.binary_length(values), 0)
    return pc.fill_null(pc.if_else(keep, part, _EMPTY), _EMPTY)


def _sequence_ids(head: bytes, first_seq: int, n: int, tail: bytes) -> pa.Array:
    """``<head><seq as 10 hex digits><tail>`` for seq = first_seq, first_seq + 1, ... (binary)."""
    width = len(head) + 10 + len(tail)
    out = np.empty((n, width), np.uint8)
    out[:, : len(head)] = np.frombuffer(head, np.uint8)
    seq = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    out[:, len(head) : len(head) + 10] = _HEX[(seq[:, None] >> _SHIFTS) & np.uint64(15)]
    out[:, len(head) + 10 :] = np.frombuffer(tail, np.uint8)
    return _binary(np.arange(0, (n + 1) * width, width, dtype=np.int32), out, n)


def _uniq_keys(prefix: str, first_seq: int, n: int) -> pa.Array:
    """``UNIQ_KEY\\x01<prefix><seq as 10 hex digits>\\x02`` for seq = first_seq, first_seq + 1, ..."""
    return _sequence_ids(f"{_UNIQ_KEY}\x01{prefix}".encode(), first_seq, n, b"\x02")


def uniq_ids(prefix: str, first_seq: int, n: int) -> pa.Array:
    """The message ids (UNIQ_KEY values) :func:`encode_plain_rows` gives rows from ``first_seq``, as strings."""
    return _sequence_ids(prefix.encode(), first_seq, n, b"").cast(pa.string())


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
    parts = [p for p in (_property(_TAGS, tag), _property(_KEYS, keys)) if p is not None]
    props = _join.call([*parts, _uniq_keys(uniq_prefix, first_seq, n), _EMPTY])
    props_len = _lengths(props)
    if props_len.max() > MAX_PROPERTIES_BYTES:
        return None
    head = np.zeros(n, _ENTRY_HEAD)
    head["totalSize"] = ENTRY_HEAD.size + body_len + PROPERTIES_LENGTH_BYTES + props_len
    head["bodyLength"] = body_len
    steps = np.arange(n + 1, dtype=np.int32)
    try:
        entries = _join.call([_binary(steps * ENTRY_HEAD.size, head, n), body.cast(pa.binary()),
                              _binary(steps * PROPERTIES_LENGTH_BYTES, props_len.astype(">i2"), n), props, _EMPTY])
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
