"""Durable message store: commit log segments, consume queues, recovery, flushing.

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
from bisect import bisect_right
from collections.abc import Callable, Iterator
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
    body_crc,
    body_span,
    decode_properties,
    decode_record,
    java_string_hash,
    properties_text,
    record_parts,
    record_size,
    subscribed_tags,
    tag_hash,
    tag_of,
)
from ..codec.batch_kernels import BatchLayout, pack_records
from ..files import atomic_write

log = logging.getLogger(__name__)

__all__ = [
    "CQ_ENTRY",
    "ConsumeQueue",
    "GetResult",
    "MessageStore",
    "NewMessage",
    "StoreConfig",
    "tag_filter",
]

CQ_ENTRY = struct.Struct(">qiqq")
_CQ_SIZE = CQ_ENTRY.size
_CQ_DTYPE = np.dtype([("pos", ">i8"), ("size", ">i4"), ("tag", ">i8"), ("ts", ">i8")])
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BLANK = struct.Struct(">ii")


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


class _Segment:
    __slots__ = ("fd", "path", "size", "start")

    def __init__(self, start: int, path: str, fd: int, size: int) -> None:
        self.start = start
        self.path = path
        self.fd = fd
        self.size = size


class CommitLog:
    """Append-only segments of records; positions are global byte offsets."""

    def __init__(self, directory: str, segment_size: int) -> None:
        self.dir = directory
        self.segment_size = segment_size
        os.makedirs(directory, exist_ok=True)
        self.segments: list[_Segment] = []
        self._starts: list[int] = []
        for name in sorted(os.listdir(directory)):
            if not name.isdigit():
                continue
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR)
            self.segments.append(_Segment(int(name), path, fd, os.fstat(fd).st_size))
        self._starts = [s.start for s in self.segments]
        if not self.segments:
            self._new_segment(0)
        self.write_pos = self.segments[-1].start + self.segments[-1].size

    def _new_segment(self, start: int) -> _Segment:
        path = os.path.join(self.dir, f"{start:020d}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        seg = _Segment(start, path, fd, 0)
        self.segments.append(seg)
        self._starts.append(start)
        return seg

    @property
    def min_pos(self) -> int:
        return self.segments[0].start

    def fits(self, used: int, size: int) -> bool:
        """Whether ``size`` more bytes fit a segment holding ``used``: as in Java's commit log,
        a segment always keeps room for the blank marker that ends it, so no record ends
        exactly at a segment's end and records of two segments are never contiguous."""
        return used + size + _BLANK.size <= self.segment_size

    def reserve(self, size: int) -> int:
        """Position where a record of ``size`` bytes will go, rolling the segment if needed."""
        seg = self.segments[-1]
        used = self.write_pos - seg.start
        if not self.fits(used, size) and used > 0:
            remaining = self.segment_size - used
            if remaining >= _BLANK.size:
                os.pwrite(seg.fd, _BLANK.pack(remaining, BLANK_MAGIC), used)
                seg.size = used + _BLANK.size
            seg = self._new_segment(seg.start + self.segment_size)
            self.write_pos = seg.start
        return self.write_pos

    def write(self, pos: int, data: bytes) -> None:
        seg = self.segments[-1]
        off = pos - seg.start
        os.pwrite(seg.fd, data, off)
        seg.size = max(seg.size, off + len(data))
        self.write_pos = pos + len(data)

    def _segment_for(self, pos: int) -> _Segment | None:
        i = bisect_right(self._starts, pos) - 1
        if i < 0:
            return None
        return self.segments[i]

    def read(self, pos: int, size: int) -> bytes:
        """``size`` bytes from ``pos``, across segments if they run on (a store written before
        segments kept room for their blank marker can hold records contiguous across two)."""
        i = bisect_right(self._starts, pos) - 1
        if i < 0:
            return b""
        seg = self.segments[i]
        data = os.pread(seg.fd, size, pos - seg.start)
        while len(data) < size and i + 1 < len(self.segments) and self._starts[i + 1] == pos + len(data):
            i += 1
            data += os.pread(self.segments[i].fd, size - len(data), 0)
        return data

    def truncate(self, pos: int) -> None:
        """Drop everything at and after ``pos`` (recovery)."""
        while len(self.segments) > 1 and self.segments[-1].start > pos:
            seg = self.segments.pop()
            self._starts.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
        seg = self.segments[-1]
        keep = max(0, pos - seg.start)
        os.ftruncate(seg.fd, keep)
        seg.size = keep
        self.write_pos = seg.start + keep

    def delete_segments_before(self, pos: int) -> int:
        """Delete whole segments that end at or before ``pos``; keeps the active one."""
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].start <= pos:
            seg = self.segments.pop(0)
            self._starts.pop(0)
            os.close(seg.fd)
            os.unlink(seg.path)
            deleted += 1
        return deleted

    def fds(self) -> list[int]:
        return [s.fd for s in self.segments[-2:]]

    def close(self) -> None:
        for s in self.segments:
            os.close(s.fd)
        self.segments.clear()


class ConsumeQueue:
    """Fixed-size entries of one (topic, queueId); entry n is queue offset n."""

    def __init__(self, directory: str, topic: str, queue_id: int, seg_entries: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        self.seg_entries = seg_entries
        os.makedirs(directory, exist_ok=True)
        self.segments: list[_Segment] = []
        for name in sorted(os.listdir(directory)):
            if not name.isdigit():
                continue
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR)
            size = os.fstat(fd).st_size
            if size % _CQ_SIZE:
                size -= size % _CQ_SIZE
                os.ftruncate(fd, size)
            self.segments.append(_Segment(int(name), path, fd, size))
        self._starts = [s.start for s in self.segments]
        self.min_offset = self.segments[0].start if self.segments else 0
        if self.segments:
            last = self.segments[-1]
            self.max_offset = last.start + last.size // _CQ_SIZE
        else:
            self.max_offset = 0
        self.dirty = False

    def _segment_for(self, offset: int) -> _Segment | None:
        i = bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        return self.segments[i]

    def append(self, offset: int, pos: int, size: int, taghash: int, store_ts: int) -> None:
        self.append_many([(offset, pos, size, taghash)], store_ts)

    def append_many(self, entries: list[tuple[int, int, int, int]], store_ts: int) -> None:
        """Append consecutive ``(offset, pos, size, taghash)`` entries, one write per segment."""
        if entries:
            self.append_block(entries[0][0], b"".join(CQ_ENTRY.pack(pos, size, th, store_ts)
                                                      for _, pos, size, th in entries))

    def append_block(self, first: int, data: bytes | memoryview) -> None:
        """Append raw consecutive entries (``len(data) // 28`` of them) from offset ``first``,
        one write per segment."""
        if first != self.max_offset:
            raise ValueError(f"consume queue {self.topic}:{self.queue_id} expected offset "
                             f"{self.max_offset}, got {first}")
        view = memoryview(data)
        count = len(view) // _CQ_SIZE
        done = 0
        while done < count:
            at = first + done
            if not self.segments or at >= self.segments[-1].start + self.seg_entries:
                path = os.path.join(self.dir, f"{at:020d}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                self.segments.append(_Segment(at, path, fd, 0))
                self._starts.append(at)
            seg = self.segments[-1]
            part = min(count - done, seg.start + self.seg_entries - at)
            off = (at - seg.start) * _CQ_SIZE
            os.pwrite(seg.fd, view[done * _CQ_SIZE : (done + part) * _CQ_SIZE], off)
            seg.size = off + part * _CQ_SIZE
            self.max_offset = at + part
            done += part
        self.dirty = True

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` raw entries from ``offset`` (stops at a segment boundary)."""
        seg = self._segment_for(offset)
        if seg is None or offset >= self.max_offset:
            return b""
        first = offset - seg.start
        n = min(count, seg.size // _CQ_SIZE - first)
        if n <= 0:
            return b""
        return os.pread(seg.fd, n * _CQ_SIZE, first * _CQ_SIZE)

    def entry(self, offset: int) -> tuple[int, int, int, int]:
        raw = self.read(offset, 1)
        if len(raw) < _CQ_SIZE:
            raise IndexError(offset)
        return CQ_ENTRY.unpack(raw)

    def last_store_ts(self) -> int:
        return self.entry(self.max_offset - 1)[3] if self.max_offset > self.min_offset else 0

    def offset_by_time(self, ts: int) -> int:
        """First offset whose store timestamp >= ``ts``; ``max_offset`` when none."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[3] < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def first_offset_at_or_after_pos(self, pos: int) -> int:
        """First offset whose commit-log position >= ``pos`` (positions grow with offsets)."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < pos:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def truncate(self, offset: int) -> None:
        """Drop entries at and after ``offset``."""
        offset = max(offset, self.min_offset)
        while self.segments and self.segments[-1].start >= offset and len(self.segments) > 1:
            seg = self.segments.pop()
            self._starts.pop()
            os.close(seg.fd)
            os.unlink(seg.path)
        if self.segments:
            seg = self.segments[-1]
            keep = max(0, (offset - seg.start) * _CQ_SIZE)
            if keep < seg.size:
                os.ftruncate(seg.fd, keep)
                seg.size = keep
            self.max_offset = seg.start + seg.size // _CQ_SIZE
        else:
            self.max_offset = offset
        self.min_offset = min(self.min_offset, self.max_offset)

    def advance_min(self, offset: int) -> None:
        """Forget entries before ``offset`` (retention); deletes whole segments."""
        offset = min(offset, self.max_offset)
        if offset <= self.min_offset:
            return
        self.min_offset = offset
        while len(self.segments) > 1 and self.segments[1].start <= offset:
            seg = self.segments.pop(0)
            self._starts.pop(0)
            os.close(seg.fd)
            os.unlink(seg.path)

    def fds(self) -> list[int]:
        return [s.fd for s in self.segments[-2:]]

    def close(self) -> None:
        for s in self.segments:
            os.close(s.fd)
        self.segments.clear()


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

    def _scan_valid_end(self, seg: _Segment) -> int:
        """End position of the last intact record of ``seg`` (checks size, magic, body CRC)."""
        size = seg.size
        data = os.pread(seg.fd, size, 0) if size else b""
        p = 0
        while p + 8 <= len(data):
            total, magic = _BLANK.unpack_from(data, p)
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
                total, magic = _BLANK.unpack_from(data, p)
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
        chunks: list[bytes] = []
        chunk_start = -1
        chunk_len = 0
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
            # Roll the segment between records if this one does not fit.
            if chunks and not cl.fits(chunk_start + chunk_len - cl.segments[-1].start, size):
                cl.write(chunk_start, b"".join(chunks))
                chunks = []
                chunk_len = 0
            if not chunks:
                chunk_start = cl.reserve(size)
            pos = chunk_start + chunk_len
            _, parts = record_parts(topic_b, m.queue_id, m.flag, qoff, pos, self._host_flags(m.sys_flag, m.born_host),
                                    m.born_timestamp, m.born_host, now_store, m.reconsume_times,
                                    m.prepared_transaction_offset, body, props_b, body_crc(body))
            chunks += parts
            chunk_len += size
            pending.setdefault(cq, []).append((qoff, pos, size, tag_hash(m.properties)))
            out.append(Stored(m.queue_id, qoff, pos, size, now))
        if chunks:
            cl.write(chunk_start, b"".join(chunks))
        for q, entries in pending.items():
            q.append_many(entries, now)
            for listener in self.listeners:
                listener(q.topic, q.queue_id, q.max_offset)
        return out

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
        entries = np.empty(len(pos), _CQ_DTYPE)
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
                j = i + 1
                run_end = pos + size
                run_bytes = size
                while (j < len(entries) and entries[j][0] == run_end
                       and tag_filter is None
                       and count + (j - i) < max_count
                       and total + run_bytes + entries[j][1] <= max_bytes):
                    run_end += entries[j][1]
                    run_bytes += entries[j][1]
                    j += 1
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


def tag_filter(subscription: str, *, exact: bool = False) -> Callable[[int, bytes], bool] | None:
    """The filter of a TAG subscription (None for ``*``) for :meth:`MessageStore.get`. Pulls
    compare only the tag's hash code kept in the consume queue, as Java brokers do
    (ExpressionMessageFilter): a tag whose hash collides with a subscribed one ("Aa"/"BB") is
    delivered and the consumer drops it by its tag string. ``exact`` adds that string check,
    for POP, where the 5.x proxy does it before the client sees the message."""
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


def record_properties(record: bytes) -> dict[str, str]:
    return decode_properties(properties_text(record))
