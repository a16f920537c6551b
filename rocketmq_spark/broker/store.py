"""Durable message store: the commit log (:mod:`.commitlog`) and the consume queues
(:mod:`.consumequeue`) together, recovery, reads and flushing.

Layout under ``<data_dir>/store``::

    commitlog/<20-digit start position>      records in the wire layout, end to end
    consumequeue/<topic>/<queueId>/<20-digit first offset>
                                             fixed 28-byte entries: int64 commit-log
                                             position, int32 size, int64 tag hash,
                                             int64 store timestamp (ms)
    checkpoint                               JSON: positions known durable

Entry ``n`` of a queue's consume queue is queue offset ``n``: a read by offset is one
``pread``, a search by store time is a binary search. Records never span segments;
the unused tail of a full segment starts with a blank marker (size, BLANK magic).

Recovery (at start): the commit log's last segment is scanned from its start and cut
at the first record whose size, magic or body CRC is wrong (a torn or garbled tail).
Consume-queue entries at or past ``checkpoint.dispatched`` (or pointing past the
recovered end) are dropped and rebuilt from the commit log, so the queues always
describe exactly the records that survived.

Threading: every method is called from the broker's event-loop thread except
:meth:`MessageStore.flush_snapshot`'s returned callable, which only fsyncs file
descriptors and writes the checkpoint (run in an executor).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..codec import (
    BLANK_MAGIC,
    HEAD,
    MAGIC_V1,
    MAGIC_V2,
    MessageRecord,
    PropertyKey,
    SysFlag,
    TransactionType,
    body_crc,
    body_span,
    decode_record,
    iter_records,
    java_string_hash,
    record_parts,
    record_size,
    tag_hash,
)
from ..codec.batch_kernels import BatchLayout, pack_records
from ..files import atomic_write
from .commitlog import BLANK, CommitLog, Segment
from .consumequeue import CQ_DTYPE, CQ_ENTRY, ConsumeQueue

log = logging.getLogger(__name__)

__all__ = [
    "GetResult",
    "MessageStore",
    "NewMessage",
    "StoreConfig",
]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Tunables of the store. Sizes in bytes, times in milliseconds."""

    segment_size: int = 64 * 1024 * 1024
    cq_segment_entries: int = 300_000
    max_message_size: int = 4 * 1024 * 1024
    #: A pull scans at most this many consume-queue entries when filtering by tag.
    max_filter_scan: int = 16_000
    #: Messages within this many bytes of the commit log's end count as "in memory" (Java
    #: brokers' estimate: accessMessageInMemoryMaxRatio, 40% of physical memory).
    in_memory_bytes: int = field(default_factory=lambda: _physical_memory() * 40 // 100)


@dataclass(slots=True)
class NewMessage:
    """A message about to be stored (body as sent: compressed when the flag says so)."""

    topic: str
    queue_id: int
    body: bytes
    properties: str
    flag: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0


@dataclass(slots=True)
class Stored:
    """Where a message landed."""

    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    store_timestamp: int


@dataclass(slots=True)
class GetResult:
    """What a pull found: ``records`` are blocks of stored records (end to end, served as
    they are), ``count`` the number of messages in them."""

    status: str  # FOUND | NO_NEW | NO_MATCHED | OFFSET_TOO_SMALL | OFFSET_OVERFLOW | NO_QUEUE
    next_offset: int
    min_offset: int
    max_offset: int
    records: list[bytes]
    count: int = 0



class _Appender:
    """Records laid out back to back in the commit log and written a run at a time: a run
    ends where the next record would not fit the segment (segments never split a record)."""

    __slots__ = ("cl", "chunks", "start", "length")

    def __init__(self, cl: CommitLog) -> None:
        self.cl = cl
        self.chunks: list[bytes] = []
        self.start = -1
        self.length = 0

    def place(self, size: int) -> int:
        """The commit-log position the next record, of ``size`` bytes, gets."""
        if self.chunks and not self.cl.fits(self.start + self.length - self.cl.segments[-1].start, size):
            self.flush()
        if not self.chunks:
            self.start = self.cl.reserve(size)
        return self.start + self.length

    def add(self, parts: Iterable[bytes], size: int) -> None:
        """The record :meth:`place` placed, as its parts."""
        self.chunks += parts
        self.length += size

    def flush(self) -> None:
        if self.chunks:
            self.cl.write(self.start, b"".join(self.chunks))
            self.chunks = []
            self.length = 0

def _contiguous(entries: list[tuple[int, int, int, int]], i: int, count_left: int, bytes_left: int
                ) -> tuple[int, int, int]:
    """The run of consume-queue ``entries`` from ``i`` whose records lie end to end in the commit
    log (served as one read), at most ``count_left`` messages and ``bytes_left`` bytes (the first
    always) -> (the index past the run, the commit log position past it, its bytes)."""
    pos, size = entries[i][0], entries[i][1]
    j, run_end, run_bytes = i + 1, pos + size, size
    while (j < len(entries) and entries[j][0] == run_end and j - i < count_left
           and run_bytes + entries[j][1] <= bytes_left):
        run_end += entries[j][1]
        run_bytes += entries[j][1]
        j += 1
    return j, run_end, run_bytes


class MessageStore:
    """Commit log + consume queues with crash recovery. See the module docstring."""

    def __init__(self, root: str, store_host: bytes, config: StoreConfig | None = None) -> None:
        self.root = root
        self.config = config or StoreConfig()
        self.store_host = store_host  # packed IPv4 + port, stamped into every record
        self._store_host_v6 = len(store_host) == 20
        os.makedirs(root, exist_ok=True)
        self._cp_path = os.path.join(root, "checkpoint")
        self.commitlog = CommitLog(os.path.join(root, "commitlog"), self.config.segment_size)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._last_ts = 0
        self._last_flushed: list[ConsumeQueue] = []
        self.listeners: list[Callable[[str, int, int], None]] = []
        self._load_queues()
        self._recover()

    # -- start-up -------------------------------------------------------------------

    def _cq_dir(self, topic: str, queue_id: int) -> str:
        return os.path.join(self.root, "consumequeue", topic, str(queue_id))

    def _load_queues(self) -> None:
        base = os.path.join(self.root, "consumequeue")
        if not os.path.isdir(base):
            return
        for topic in os.listdir(base):
            tdir = os.path.join(base, topic)
            for qid in os.listdir(tdir):
                if qid.isdigit():
                    self.queues[(topic, int(qid))] = ConsumeQueue(
                        os.path.join(tdir, qid), topic, int(qid), self.config.cq_segment_entries
                    )

    def _read_checkpoint(self) -> dict[str, int]:
        try:
            with open(self._cp_path, "rb") as fh:
                obj = json.load(fh)
            return {k: int(v) for k, v in obj.items()}
        except (OSError, ValueError):
            return {}

    def _recover(self) -> None:
        t0 = time.monotonic()
        cl = self.commitlog
        seg = cl.segments[-1]
        end = self._scan_valid_end(seg)
        if end < cl.write_pos:
            log.warning(
                "commit log %s: dropping %d bytes of torn or garbled tail at position %d",
                seg.path, cl.write_pos - end, end,
            )
            cl.truncate(end)
        cp = self._read_checkpoint()
        dispatched = min(cp.get("dispatched", 0), cl.write_pos)
        dispatched = max(dispatched, cl.min_pos)
        if cl.segments[-1].start > dispatched and len(cl.segments) == 1:
            dispatched = cl.segments[-1].start
        # Drop consume-queue entries that may be stale or point past the recovered end.
        for cq in self.queues.values():
            cut = cq.first_offset_at_or_after_pos(dispatched)
            if cut < cq.max_offset:
                cq.truncate(cut)
        # Retention deletes whole commit-log segments; entries pointing below them are gone.
        for cq in self.queues.values():
            cq.advance_min(cq.first_offset_at_or_after_pos(cl.min_pos))
        redone = 0
        for pos, rec in self._iter_commitlog(dispatched):
            self._dispatch_recovered(pos, rec)
            redone += 1
        self._last_ts = max(
            (cq.last_store_ts() for cq in self.queues.values() if cq.max_offset > cq.min_offset),
            default=0,
        )
        log.info(
            "store %s recovered: commit log [%d, %d), %d queues, %d records re-dispatched in %.3fs",
            self.root, cl.min_pos, cl.write_pos, len(self.queues), redone, time.monotonic() - t0,
        )

    def _scan_valid_end(self, seg: Segment) -> int:
        """End position of the last intact record of ``seg`` (checks size, magic, body CRC)."""
        size = seg.size
        data = os.pread(seg.fd, size, 0) if size else b""
        p = 0
        while p + 8 <= len(data):
            total, magic = BLANK.unpack_from(data, p)
            if magic == BLANK_MAGIC:
                return seg.start + p  # a blank tail marks a full segment: nothing valid after
            if magic not in (MAGIC_V1, MAGIC_V2) or total < HEAD.size or p + total > len(data):
                break
            if not self._record_crc_ok(data, p, total):
                break
            p += total
        return seg.start + p

    @staticmethod
    def _record_crc_ok(data: bytes, p: int, total: int) -> bool:
        try:
            (crc,) = _I32.unpack_from(data, p + 8)
            q, blen = body_span(data, p)
        except struct.error:
            return False
        return 0 <= blen and q + blen <= p + total and body_crc(data[q : q + blen]) == crc

    def _iter_commitlog(self, start: int) -> Iterator[tuple[int, MessageRecord]]:
        cl = self.commitlog
        for seg in list(cl.segments):
            seg_end = seg.start + seg.size
            if seg_end <= start:
                continue
            data = os.pread(seg.fd, seg.size, 0)
            p = max(0, start - seg.start)
            while p + 8 <= len(data):
                total, magic = BLANK.unpack_from(data, p)
                if magic == BLANK_MAGIC or total <= 0 or p + total > len(data):
                    break
                yield seg.start + p, decode_record(data, p)
                p += total

    def _dispatch_recovered(self, pos: int, rec: MessageRecord) -> None:
        cq = self.queue(rec.topic, rec.queue_id)
        if rec.queue_offset < cq.max_offset:
            return
        if rec.queue_offset > cq.max_offset:
            log.error(
                "commit log record at %d for %s:%d has offset %d but the queue ends at %d; "
                "skipping it", pos, rec.topic, rec.queue_id, rec.queue_offset, cq.max_offset,
            )
            return
        tag = rec.properties.get(PropertyKey.TAGS)
        cq.append(rec.queue_offset, pos, rec.total_size,
                  java_string_hash(tag) if tag else 0, rec.store_timestamp)

    # -- queues -----------------------------------------------------------------------

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self._cq_dir(topic, queue_id), topic, queue_id,
                              self.config.cq_segment_entries)
            self.queues[(topic, queue_id)] = cq
        return cq

    def find_queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq else 0

    def offset_by_time(self, topic: str, queue_id: int, ts: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.offset_by_time(ts) if cq else 0

    def store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """Store time of the message at ``offset`` of the queue (0 when there is none)."""
        cq = self.queues.get((topic, queue_id))
        if not cq or not cq.min_offset <= offset < cq.max_offset:
            return 0
        return cq.entry(offset)[3]

    def in_memory(self, topic: str, queue_id: int, offset: int) -> bool:
        """Whether the message at ``offset`` exists and is among the commit log's newest
        ``config.in_memory_bytes`` (what a Java broker means by "still in memory")."""
        cq = self.queues.get((topic, queue_id))
        if not cq or not cq.min_offset <= offset < cq.max_offset:
            return False
        return self.commitlog.write_pos - cq.entry(offset)[0] <= self.config.in_memory_bytes

    @property
    def last_store_timestamp(self) -> int:
        """The store time of the newest message (ms; 0 before the first)."""
        return self._last_ts

    def earliest_store_time(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        if not cq or cq.max_offset <= cq.min_offset:
            return -1
        return cq.entry(cq.min_offset)[3]

    # -- writing ----------------------------------------------------------------------

    def _host_flags(self, sys_flag: int, born_host: bytes) -> int:
        """``sys_flag`` with the IPv6 bits saying how the born and store hosts are stored."""
        sys_flag &= ~(SysFlag.BORN_HOST_V6 | SysFlag.STORE_HOST_V6)
        if len(born_host) == 20:
            sys_flag |= SysFlag.BORN_HOST_V6
        if self._store_host_v6:
            sys_flag |= SysFlag.STORE_HOST_V6
        return sys_flag

    def put(self, messages: list[NewMessage]) -> list[Stored]:
        """Append messages (one commit-log write per call, one consume-queue write per queue)
        and index them. Returns where each landed."""
        cl = self.commitlog
        now = int(time.time() * 1000)
        now = max(now, self._last_ts)  # store times never go backwards: searches stay sound
        self._last_ts = now
        store_host = self.store_host
        now_store = _I64.pack(now) + store_host
        out: list[Stored] = []
        app = _Appender(cl)
        pending: dict[ConsumeQueue, list[tuple[int, int, int, int]]] = {}
        next_offsets: dict[ConsumeQueue, int] = {}
        last_key: tuple[str, int] | None = None
        cq: ConsumeQueue | None = None
        topic_b = b""
        for m in messages:
            key = (m.topic, m.queue_id)
            if key != last_key:  # batches share one topic and queue: look them up once
                cq = self.queue(m.topic, m.queue_id)
                topic_b = m.topic.encode()
                last_key = key
            assert cq is not None
            props_b = m.properties.encode()
            body = m.body
            qoff = next_offsets.get(cq, cq.max_offset)
            next_offsets[cq] = qoff + 1
            size = record_size(len(topic_b), len(m.born_host), len(body), len(props_b), len(store_host))
            pos = app.place(size)
            parts = record_parts(size, topic_b, m.queue_id, m.flag, qoff, pos,
                                 self._host_flags(m.sys_flag, m.born_host), m.born_timestamp, m.born_host, now_store,
                                 m.reconsume_times, m.prepared_transaction_offset, body, props_b, body_crc(body))
            app.add(parts, size)
            pending.setdefault(cq, []).append((qoff, pos, size, tag_hash(m.properties)))
            out.append(Stored(m.queue_id, qoff, pos, size, now))
        app.flush()
        for q, entries in pending.items():
            q.append_many(entries, now)
            for listener in self.listeners:
                listener(q.topic, q.queue_id, q.max_offset)
        return out

    def put_copies(self, items: list[tuple[bytes | None, str, int, int, bytes]], marker: NewMessage) -> None:
        """What a run of END_TRANSACTIONs stores, in one commit-log write and one consume-queue
        write per queue: for each ``(record, topic, queue_id, tag hash, marker body)``, the
        committed copy of ``record`` (a half message this store wrote, given whole: it is
        sliced, not checked) when it is not None, then ``marker`` with that body. Byte for byte
        what :meth:`put` writes for the same messages (the copy as
        :meth:`.Transactions.committed_copy` builds it: readdressed to ``topic``/``queue_id``,
        transaction type COMMIT, its preparedTransactionOffset the record's position, ``tag
        hash`` that of its properties), without building a message or a record per item."""
        cl = self.commitlog
        now = max(int(time.time() * 1000), self._last_ts)
        self._last_ts = now
        store_host = self.store_host
        now_store = _I64.pack(now) + store_host
        store_v6 = SysFlag.STORE_HOST_V6 if self._store_host_v6 else 0
        keep_flags = ~(SysFlag.TRANSACTION_MASK | SysFlag.STORE_HOST_V6)
        # the marker: one record layout but for its body and place
        m_topic = marker.topic.encode()
        m_props = marker.properties.encode()
        m_flags = self._host_flags(marker.sys_flag, marker.born_host)
        m_size = record_size(len(m_topic), len(marker.born_host), 0, len(m_props), len(store_host))
        m_tag = tag_hash(marker.properties)
        # per queue: (queue, its topic as a record writes it, its new entries)
        queues: dict[tuple[str, int], tuple[ConsumeQueue, bytes, list[tuple[int, int, int, int]]]] = {}
        m_key = (marker.topic, marker.queue_id)
        app = _Appender(cl)
        for raw, topic, queue_id, tag, m_body in items:
            if raw is not None:
                key = (topic, queue_id)
                cq, block, entries = queues.get(key) or self._queue_of(queues, key)
                (_, magic, _, _, flag, _, phys, sys_flag, born_ts) = HEAD.unpack_from(raw)
                host_end = HEAD.size + (20 if sys_flag & SysFlag.BORN_HOST_V6 else 8)
                p = host_end + 8 + (20 if sys_flag & SysFlag.STORE_HOST_V6 else 8)
                (body_len,) = _I32.unpack_from(raw, p + 12)
                body_end = p + 16 + body_len
                props_at = body_end + (1 + raw[body_end] if magic == MAGIC_V1
                                       else 2 + _I16.unpack_from(raw, body_end)[0])
                v2 = len(block) > 128  # a topic longer than 127 bytes: 2-byte length, V2 magic
                size = record_size(len(block) - (2 if v2 else 1), host_end - HEAD.size, body_len,
                                   len(raw) - props_at - 2, len(store_host))
                pos = app.place(size)
                qoff = cq.max_offset + len(entries)
                app.add((
                    HEAD.pack(size, MAGIC_V2 if v2 else MAGIC_V1, body_crc(raw[p + 16:body_end]), queue_id, flag,
                              qoff, pos, (sys_flag & keep_flags) | TransactionType.COMMIT | store_v6, born_ts),
                    raw[HEAD.size:host_end], now_store, raw[p:p + 4], _I64.pack(phys), raw[p + 12:body_end],
                    block, raw[props_at:],
                ), size)
                entries.append((qoff, pos, size, tag))
            size = m_size + len(m_body)
            pos = app.place(size)
            cq, _, entries = queues.get(m_key) or self._queue_of(queues, m_key)
            qoff = cq.max_offset + len(entries)
            app.add(record_parts(size, m_topic, marker.queue_id, marker.flag, qoff, pos, m_flags,
                                 marker.born_timestamp, marker.born_host, now_store, marker.reconsume_times,
                                 marker.prepared_transaction_offset, m_body, m_props, body_crc(m_body)), size)
            entries.append((qoff, pos, size, m_tag))
        app.flush()
        for cq, _, entries in queues.values():
            if entries:
                cq.append_many(entries, now)
                for listener in self.listeners:
                    listener(cq.topic, cq.queue_id, cq.max_offset)

    def _queue_of(self, queues: dict[tuple[str, int], tuple[ConsumeQueue, bytes, list[tuple[int, int, int, int]]]],
                  key: tuple[str, int]) -> tuple[ConsumeQueue, bytes, list[tuple[int, int, int, int]]]:
        """:meth:`put_copies`' entry of ``key`` in ``queues`` (added when missing)."""
        topic_b = key[0].encode()
        q = queues[key] = (self.queue(*key), (_I16.pack(len(topic_b)) if len(topic_b) > 127 else
                                              bytes((len(topic_b),))) + topic_b, [])
        return q

    def put_batch(self, topic: str, queue_id: int, layout: BatchLayout, *, sys_flag: int, born_ts: int,
                  born_host: bytes, reconsume: int, suffix: bytes) -> tuple[int, np.ndarray, int] | None:
        """Append a batch of plain messages to one queue in one pass (see :mod:`rocketmq_spark.codec.batch_kernels`):
        the same records :meth:`put` would write, properties + ``suffix``.

        -> (first queue offset, positions, store time), or None when the batch needs the
        per-message path (:meth:`put`); nothing is written then.
        """
        cl = self.commitlog
        seg = cl.segments[-1]
        used = cl.write_pos - seg.start
        now = max(int(time.time() * 1000), self._last_ts)
        cq = self.queue(topic, queue_id)
        packed = pack_records(layout, topic=topic, queue_id=queue_id, first_offset=cq.max_offset,
                              first_pos=cl.write_pos, sys_flag=self._host_flags(sys_flag, born_host), born_ts=born_ts,
                              born_host=born_host, store_ts=now, store_host=self.store_host, reconsume=reconsume,
                              suffix=suffix)
        if packed is None:
            return None
        data, sizes, pos, tags = packed
        if not cl.fits(used, len(data)):  # the batch would cross into the next segment
            return None
        self._last_ts = now
        first = cq.max_offset
        cl.write(cl.write_pos, data)
        entries = np.empty(len(pos), CQ_DTYPE)
        entries["pos"] = pos
        entries["size"] = sizes
        entries["tag"] = tags
        entries["ts"] = now
        cq.append_block(first, entries.tobytes())
        for listener in self.listeners:
            listener(topic, queue_id, cq.max_offset)
        return first, pos, now

    # -- reading ----------------------------------------------------------------------

    def read_record(self, pos: int, size: int) -> bytes:
        return self.commitlog.read(pos, size)

    def record_at(self, pos: int, size: int | None = None) -> bytes | None:
        """The whole record at commit-log position ``pos``, None when there is none there (a
        size that does not fit a record of at most the maximum message size is not one).
        ``size``: what the caller knows the record's size to be (one read; None when the
        record there has another)."""
        if size is not None:
            data = self.read_record(pos, size)
            return data if len(data) == size and int.from_bytes(data[:4], "big", signed=True) == size else None
        head = self.read_record(pos, 4)
        if len(head) < 4:
            return None
        size = int.from_bytes(head, "big", signed=True)
        if size <= 0 or size > self.config.max_message_size + 64 * 1024:
            return None
        data = self.read_record(pos, size)
        return data if len(data) == size else None

    def scan(self, topic: str, queue_id: int, start: int) -> Iterator[MessageRecord]:
        """Every record of a queue from offset ``start`` (recovery of internal queues)."""
        o = start
        while True:
            res = self.get(topic, queue_id, o, 1024, 1 << 30)
            if not res.records:
                return
            for block in res.records:
                yield from iter_records(block)
            o = res.next_offset

    def unfinished(self, work: tuple[str, int], done: tuple[str, int], start: int | None) -> Iterator[MessageRecord]:
        """The open work a restart recovers (half messages not ended, delayed messages not
        delivered): records of the internal queue ``work`` from its saved progress ``start``
        (None: from its min offset) whose offset no record of the queue ``done`` names (a
        marker's body is the offset, as text)."""
        queue = self.find_queue(*work)
        if queue is None:
            return
        first = max(start or queue.min_offset, queue.min_offset)
        if first >= queue.max_offset:
            return
        ended: set[int] = set()
        markers = self.find_queue(*done)
        if markers is not None:
            # a marker of an entry at/after ``first`` was stored after that entry
            for rec in self.scan(*done, markers.offset_by_time(queue.entry(first)[3])):
                try:
                    ended.add(int(rec.body.decode()))
                except ValueError:
                    pass
        for rec in self.scan(*work, first):
            if rec.queue_offset not in ended:
                yield rec

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        max_bytes: int,
        tag_filter: Callable[[int, bytes], bool] | None = None,
    ) -> GetResult:
        """Records of one queue from ``offset``: up to ``max_count`` messages/``max_bytes``.

        ``tag_filter(taghash, record)`` is asked only when given; messages it rejects are
        skipped and ``next_offset`` moves past them, so a filter never stalls a consumer.
        """
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            status = "NO_QUEUE" if offset == 0 else "OFFSET_OVERFLOW"
            return GetResult(status, 0, 0, 0, [])
        lo, hi = cq.min_offset, cq.max_offset
        if offset < lo:
            return GetResult("OFFSET_TOO_SMALL", lo, lo, hi, [])
        if offset > hi:
            return GetResult("OFFSET_OVERFLOW", hi, lo, hi, [])
        if offset == hi:
            return GetResult("NO_NEW", offset, lo, hi, [])
        records: list[bytes] = []
        total = 0
        cur = offset
        scanned = 0
        scan_cap = max_count if tag_filter is None else self.config.max_filter_scan
        cl = self.commitlog
        count = 0
        while cur < hi and count < max_count and scanned < scan_cap:
            raw = cq.read(cur, min(scan_cap - scanned, max(max_count - count, 32)))
            if not raw:
                break
            entries = list(CQ_ENTRY.iter_unpack(raw))
            # Coalesce runs that are contiguous in the commit log into one read.
            i = 0
            stop = False
            while i < len(entries):
                pos, size, th, _ts = entries[i]
                if pos < cl.min_pos:
                    # retention removed it underneath: treat the queue as starting later
                    cur += 1
                    i += 1
                    continue
                if tag_filter is None:
                    j, run_end, run_bytes = _contiguous(entries, i, max_count - count, max_bytes - total)
                else:  # each message on its own: the filter reads it
                    j, run_end, run_bytes = i + 1, pos + size, size
                if records and total + run_bytes > max_bytes:
                    stop = True
                    break
                blob = cl.read(pos, run_end - pos)
                if tag_filter is None:
                    # A contiguous run is served as one block: records are already end to end.
                    records.append(blob)
                    count += j - i
                    total += len(blob)
                    cur += j - i
                else:
                    if tag_filter(th, blob):
                        records.append(blob)
                        count += 1
                        total += len(blob)
                    cur += 1
                scanned += j - i
                i = j
                if count >= max_count or scanned >= scan_cap:
                    break
            if stop:
                break
        if records:
            return GetResult("FOUND", cur, lo, hi, records, count)
        return GetResult("NO_MATCHED" if cur > offset else "NO_NEW", cur, lo, hi, [])

    # -- retention and flushing -----------------------------------------------------

    def delete_before(self, pos: int) -> int:
        """Delete commit-log segments wholly before ``pos`` and advance queue minimums."""
        deleted = self.commitlog.delete_segments_before(pos)
        if deleted:
            floor = self.commitlog.min_pos
            for cq in self.queues.values():
                cq.advance_min(cq.first_offset_at_or_after_pos(floor))
        return deleted

    def delete_expired(self, max_age_ms: int, now_ms: int | None = None) -> int:
        """Delete non-active segments whose newest record is older than ``max_age_ms``."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cl = self.commitlog
        cut = cl.min_pos
        for seg in cl.segments[:-1]:
            if now_ms - os.stat(seg.path).st_mtime * 1000 < max_age_ms:
                break
            cut = seg.start + self.config.segment_size
        return self.delete_before(cut) if cut > cl.min_pos else 0

    def flush_snapshot(self) -> tuple[int, Callable[[], None]] | None:
        """Capture what to fsync now; returns (position made durable, job) or None if clean.

        The job runs off the event loop: it fsyncs the dirty consume queues and the
        commit log, then records the checkpoint.
        """
        pos = self.commitlog.write_pos
        fds = list(self.commitlog.fds())
        flushed: list[ConsumeQueue] = []
        for cq in self.queues.values():
            if cq.dirty:
                fds.extend(cq.fds())
                flushed.append(cq)
                # Cleared now, set again on failure (see mark_dirty) or by the next append.
                cq.dirty = False
        self._last_flushed = flushed
        cp_path = self._cp_path

        def job() -> None:
            for fd in fds:
                try:
                    os.fsync(fd)
                except OSError as exc:  # closed by retention/truncate meanwhile
                    log.debug("fsync of fd %d skipped: %s", fd, exc)
            atomic_write(cp_path, json.dumps({"dispatched": pos, "flushed": pos}).encode())

        return pos, job

    def mark_dirty(self) -> None:
        """A flush job failed: its queues must be fsynced again by the next one."""
        for cq in self._last_flushed:
            cq.dirty = True

    def close(self) -> None:
        self.commitlog.close()
        for cq in self.queues.values():
            cq.close()


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


