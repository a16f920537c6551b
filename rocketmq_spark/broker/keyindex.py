"""The message key index: what QUERY_MESSAGE looks up (mqadmin queryMsgByKey and
queryMsgTraceById, the Java client's queryMessage). As a Java broker's IndexService indexes
``topic#key``, each stored message is found under its topic and each key of its KEYS property
(split on spaces, empty keys left out) and under its UNIQ_KEY (the client's message id); and, as
5.5's index does for a query of index type ``T``, under its TAGS value (whole, not split).

Built lazily, in memory only, so that storing a message costs nothing more: a query of topic T
first indexes T's consume-queue entries not indexed yet (each queue remembers how far it got),
reading each record's properties from the commit log. After a restart the index starts empty
and the first query of each topic rebuilds it. Records that retention deleted (below the commit
log's first position) are forgotten at the next query of their topic.

Differences from a Java broker's index, none of which a client sees (Java clients drop hash
collisions themselves): keys match exactly (not by hash), store times are compared to the
millisecond (not the second), and a message whose keys repeat (or repeat its UNIQ_KEY) is
listed once.

Runs on the broker's event-loop thread, as the store does.
"""

from __future__ import annotations

import heapq
import logging
import struct
import time
from array import array

import numpy as np

from ..codec import PropertyKey, SysFlag, TransactionType, properties_text, property_of
from ..codec.record import HEAD_OFFSETS
from .consumequeue import CQ_DTYPE
from .store import MessageStore

log = logging.getLogger(__name__)

__all__ = ["KeyIndex"]

_I32 = struct.Struct(">i")
_SYS_FLAG_AT = HEAD_OFFSETS["sysFlag"]
#: consume-queue entries read at once while indexing
_CHUNK = 4096
#: records of one queue are read from the commit log in runs: the next record joins the run
#: when it starts at most this many bytes after the run's end (what lies between is read and
#: skipped; other topics' records) and the run stays within _RUN bytes
_GAP = 4096
_RUN = 1 << 20


_Rows = dict[str, int | list[int]]


def _add(table: _Rows, key: str, row: int) -> None:
    have = table.get(key)
    if have is None:
        table[key] = row
    elif isinstance(have, int):
        table[key] = [have, row]
    else:
        have.append(row)


def _renumbered(table: _Rows, renumber: dict[int, int]) -> _Rows:
    out: _Rows = {}
    for key, have in table.items():
        if isinstance(have, int):
            if have in renumber:
                out[key] = renumber[have]
        else:
            live = [renumber[r] for r in have if r in renumber]
            if live:
                out[key] = live[0] if len(live) == 1 else live
    return out


class _TopicKeys:
    """One topic's index: rows (commit-log position, stored size, store time) in three columns,
    and the rows under each key and each tag (an int for one row, the common case of a UNIQ_KEY)."""

    __slots__ = ("done", "floor", "keys", "pos", "size", "tags", "ts")

    def __init__(self, floor: int) -> None:
        #: queue id -> the next queue offset to index
        self.done: dict[int, int] = {}
        self.keys: _Rows = {}
        self.tags: _Rows = {}
        self.pos = array("q")
        self.size = array("q")
        self.ts = array("q")
        #: the commit log's first position when rows were last swept (rows below it are gone)
        self.floor = floor

    def rows(self, key: str, by_tag: bool) -> list[int]:
        have = (self.tags if by_tag else self.keys).get(key)
        return [] if have is None else [have] if isinstance(have, int) else have

    def sweep(self, floor: int) -> None:
        """Forget the rows of records below commit-log position ``floor`` (deleted by retention),
        renumbering the rest."""
        renumber: dict[int, int] = {}
        pos, size, ts = array("q"), array("q"), array("q")
        for row, p in enumerate(self.pos):
            if p >= floor:
                renumber[row] = len(pos)
                pos.append(p)
                size.append(self.size[row])
                ts.append(self.ts[row])
        self.keys, self.tags = _renumbered(self.keys, renumber), _renumbered(self.tags, renumber)
        self.pos, self.size, self.ts, self.floor = pos, size, ts, floor


class KeyIndex:
    """The key index of one :class:`~.store.MessageStore` (see the module docstring)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._topics: dict[str, _TopicKeys] = {}

    def query(self, topic: str, key: str, max_num: int, begin_ms: int, end_ms: int, *, by_tag: bool = False
              ) -> list[tuple[int, int]]:
        """The messages of ``topic`` stored from ``begin_ms`` to ``end_ms`` (both included) with
        ``key`` among their keys or as their UNIQ_KEY (``by_tag``: as their TAGS): the newest
        ``max_num`` of them, as (commit-log position, stored size) in commit-log order (as a Java
        broker answers)."""
        t = self._catch_up(topic)
        if t is None or max_num <= 0:
            return []
        pos, ts = t.pos, t.ts
        hits = [r for r in t.rows(key, by_tag) if begin_ms <= ts[r] <= end_ms]
        newest = heapq.nlargest(max_num, hits, key=pos.__getitem__)
        return sorted((pos[r], t.size[r]) for r in newest)

    def _catch_up(self, topic: str) -> _TopicKeys | None:
        """``topic``'s index with every entry of its consume queues indexed (None: the topic
        has no queue in the store)."""
        store = self.store
        queues = [cq for (name, _), cq in store.queues.items() if name == topic]
        t = self._topics.get(topic)
        floor = store.commitlog.min_pos
        if t is None:
            if not queues:
                return None
            t = self._topics[topic] = _TopicKeys(floor)
        elif floor > t.floor:
            t.sweep(floor)
        started, rows = time.monotonic(), len(t.pos)
        for cq in queues:
            at = max(t.done.get(cq.queue_id, 0), cq.min_offset)  # retention may have passed it
            while at < cq.max_offset:
                raw = cq.read(at, _CHUNK)
                if not raw:
                    break
                entries = np.frombuffer(raw, CQ_DTYPE)
                self._index(t, entries["pos"].tolist(), entries["size"].tolist(), entries["ts"].tolist(), floor)
                at += len(entries)
            t.done[cq.queue_id] = at
        if len(t.pos) - rows > 10_000:
            log.info("key index of topic %s: %d messages indexed in %.3fs", topic, len(t.pos) - rows,
                     time.monotonic() - started)
        return t

    def _index(self, t: _TopicKeys, pos: list[int], size: list[int], ts: list[int], floor: int) -> None:
        """Index the records at ``pos`` (ascending, one queue's), read in runs."""
        cl = self.store.commitlog
        i, n = 0, len(pos)
        while i < n:
            if pos[i] < floor:  # deleted by retention
                i += 1
                continue
            start, end, j = pos[i], pos[i] + size[i], i + 1
            while j < n and 0 <= pos[j] - end <= _GAP and pos[j] + size[j] - start <= _RUN:
                end = pos[j] + size[j]
                j += 1
            blob = cl.read(start, end - start)
            for k in range(i, j):
                at = pos[k] - start
                if at + size[k] <= len(blob):
                    self._index_record(t, blob, at, pos[k], size[k], ts[k])
                else:  # the run crossed into another segment: this record alone
                    self._index_record(t, cl.read(pos[k], size[k]), 0, pos[k], size[k], ts[k])
            i = j

    @staticmethod
    def _index_record(t: _TopicKeys, buf: bytes, at: int, pos: int, size: int, ts: int) -> None:
        try:
            if len(buf) < at + size or _I32.unpack_from(buf, at)[0] != size:
                raise ValueError(f"no record of {size} bytes there")
            (sys_flag,) = _I32.unpack_from(buf, at + _SYS_FLAG_AT)
            if sys_flag & SysFlag.TRANSACTION_MASK == TransactionType.ROLLBACK:
                return  # as Java's IndexService: a rolled-back message is not indexed
            props = properties_text(buf, at)
        except (ValueError, struct.error, IndexError) as exc:  # UnicodeDecodeError is a ValueError
            log.warning("key index: commit-log record at %d (%d bytes) skipped: %s", pos, size, exc)
            return
        uniq = property_of(props, PropertyKey.UNIQ_KEY)
        keys = property_of(props, PropertyKey.KEYS)
        tags = property_of(props, PropertyKey.TAGS)
        names = set(keys.split(" ")) if keys else set()
        if uniq:
            names.add(uniq)
        names.discard("")
        if not names and not tags:
            return
        row = len(t.pos)
        t.pos.append(pos)
        t.size.append(size)
        t.ts.append(ts)
        for name in names:
            _add(t.keys, name, row)
        if tags:
            _add(t.tags, tags, row)
