"""The tag filter, both halves. A TAG subscription names tags (``"A || B"``, :func:`subscribed_tags`).
Brokers filter a pull by the tag's hash code only, the one each consume-queue entry keeps
(:func:`tag_hash`, :func:`tag_filter`), as Java brokers do (ExpressionMessageFilter); a tag
whose hash collides with a subscribed one ("Aa" and "BB") arrives too, and the reader drops it
by its tag string (:func:`only_subscribed`), as the Java client's PullAPIWrapper does.

pyarrow is imported only by the reader's half: the broker uses this module without loading it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from .properties import java_string_hash, property_of
from .record import properties_text

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["only_subscribed", "subscribed_tags", "tag_filter", "tag_hash", "tag_matches", "tag_of", "tag_set"]


def subscribed_tags(expression: str) -> frozenset[str] | None:
    """The tags a TAG subscription expression names (``"A || B"``); None for every tag (``*``,
    empty, or ``*`` among the names), as brokers and the Java client read it."""
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    return None if not tags or "*" in tags else tags


def tag_of(props: str) -> str | None:
    """The value of the TAGS item of a properties text (:func:`property_of`); None when absent."""
    return property_of(props, "TAGS")


def tag_hash(props: str) -> int:
    """The consume queue's tag code of a properties text: Java's hash of its TAGS (:func:`tag_of`),
    0 without."""
    tag = tag_of(props)
    return java_string_hash(tag) if tag else 0


# -- the broker's half: by hash ---------------------------------------------------------------

def tag_filter(subscription: str, *, exact: bool = False) -> Callable[[int, bytes], bool] | None:
    """The filter of a TAG subscription (None for ``*``) for the broker's store reads: the tag's
    hash code kept in the consume queue against the subscribed tags'. ``exact`` adds the tag
    string check (:func:`tag_matches`), for POP, where the 5.x proxy does it before the client
    sees the message."""
    tags = subscribed_tags(subscription)
    if tags is None:
        return None
    hashes = frozenset(java_string_hash(t) for t in tags)
    if exact:
        return lambda th, rec: th in hashes and tag_matches(rec, tags)
    return lambda th, rec: th in hashes


def tag_matches(record: bytes, tags: frozenset[str]) -> bool:
    """Exact tag check on a stored record (after the hash pre-filter)."""
    try:
        rec_props = properties_text(record)
    except (struct.error, IndexError, UnicodeDecodeError):
        return False
    tag = tag_of(rec_props)
    return tag is not None and tag in tags


# -- the reader's half: by string -------------------------------------------------------------

def tag_set(tags: frozenset[str] | None) -> pa.Array | None:
    """The subscribed tags as the value set :func:`only_subscribed` takes (None: every tag)."""
    from .arrow import string_constant  # the reader's half: pyarrow (see the module's docstring)

    return None if tags is None else string_constant(sorted(tags))


def only_subscribed(batch: pa.RecordBatch, tags: pa.Array | None) -> pa.RecordBatch:
    """The rows whose tag string is in ``tags`` (from :func:`tag_set`; all rows when None): a
    tag whose hash collides with a subscribed one is dropped here; the queue's offsets still
    pass it."""
    if tags is None or not batch.num_rows:
        return batch
    import pyarrow.compute as pc  # the reader's half (see the module's docstring)

    keep = pc.fill_null(pc.is_in(batch.column("tag"), value_set=tags), False)
    if keep.true_count == batch.num_rows:  # the usual case: nothing collided
        return batch
    return batch.filter(keep)
