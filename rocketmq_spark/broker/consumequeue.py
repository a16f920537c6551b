"""Consume queues: per (topic, queueId) fixed 28-byte entries (int64 commit-log position,
int32 size, int64 tag hash, int64 store timestamp ms); entry n is queue offset n, so a read by
offset is one ``pread`` and a search by store time a binary search."""

from __future__ import annotations

import os
import struct

import numpy as np

from .commitlog import Segment, SegmentFiles

__all__ = ["CQ_DTYPE", "CQ_ENTRY", "CQ_SIZE", "ConsumeQueue"]

CQ_ENTRY = struct.Struct(">qiqq")
CQ_SIZE = CQ_ENTRY.size
CQ_DTYPE = np.dtype([("pos", ">i8"), ("size", ">i4"), ("tag", ">i8"), ("ts", ">i8")])


class ConsumeQueue(SegmentFiles):
    """Fixed-size entries of one (topic, queueId); entry n is queue offset n."""

    def __init__(self, directory: str, topic: str, queue_id: int, seg_entries: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        self.seg_entries = seg_entries
        os.makedirs(directory, exist_ok=True)
        self.segments: list[Segment] = []
        for name in sorted(os.listdir(directory)):
            if not name.isdigit():
                continue
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR)
            size = os.fstat(fd).st_size
            if size % CQ_SIZE:
                size -= size % CQ_SIZE
                os.ftruncate(fd, size)
            self.segments.append(Segment(int(name), path, fd, size))
        self._starts = [s.start for s in self.segments]
        self.min_offset = self.segments[0].start if self.segments else 0
        if self.segments:
            last = self.segments[-1]
            self.max_offset = last.start + last.size // CQ_SIZE
        else:
            self.max_offset = 0
        self.dirty = False

    def _segment_for(self, offset: int) -> Segment | None:
        i = self._index_of(offset)
        return self.segments[i] if i >= 0 else None

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
        count = len(view) // CQ_SIZE
        done = 0
        while done < count:
            at = first + done
            if not self.segments or at >= self.segments[-1].start + self.seg_entries:
                path = os.path.join(self.dir, f"{at:020d}")
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                self.segments.append(Segment(at, path, fd, 0))
                self._starts.append(at)
            seg = self.segments[-1]
            part = min(count - done, seg.start + self.seg_entries - at)
            off = (at - seg.start) * CQ_SIZE
            os.pwrite(seg.fd, view[done * CQ_SIZE : (done + part) * CQ_SIZE], off)
            seg.size = off + part * CQ_SIZE
            self.max_offset = at + part
            done += part
        self.dirty = True

    def read(self, offset: int, count: int) -> bytes:
        """Up to ``count`` raw entries from ``offset`` (stops at a segment boundary)."""
        seg = self._segment_for(offset)
        if seg is None or offset >= self.max_offset:
            return b""
        first = offset - seg.start
        n = min(count, seg.size // CQ_SIZE - first)
        if n <= 0:
            return b""
        return os.pread(seg.fd, n * CQ_SIZE, first * CQ_SIZE)

    def entry(self, offset: int) -> tuple[int, int, int, int]:
        raw = self.read(offset, 1)
        if len(raw) < CQ_SIZE:
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
            self._drop(-1)
        if self.segments:
            seg = self.segments[-1]
            keep = max(0, (offset - seg.start) * CQ_SIZE)
            if keep < seg.size:
                os.ftruncate(seg.fd, keep)
                seg.size = keep
            self.max_offset = seg.start + seg.size // CQ_SIZE
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
            self._drop(0)

