"""The commit log: append-only segment files holding every record end to end, addressed by a
global byte position (a segment's file name is its start position, 20 digits)."""

from __future__ import annotations

import os
import struct
from bisect import bisect_right

from ..codec import BLANK_MAGIC

__all__ = ["BLANK", "CommitLog", "Segment", "SegmentFiles"]

#: the marker that starts the unused tail of a full segment: int32 size, int32 BLANK_MAGIC
BLANK = struct.Struct(">ii")


class Segment:
    """One open segment file (commit log or consume queue): its start, path, descriptor, size."""

    __slots__ = ("fd", "path", "size", "start")

    def __init__(self, start: int, path: str, fd: int, size: int) -> None:
        self.start = start
        self.path = path
        self.fd = fd
        self.size = size


class SegmentFiles:
    """What the commit log and a consume queue share: their open segment files, in order."""

    segments: list[Segment]
    _starts: list[int]  # the segments' starts, for bisect

    def _index_of(self, key: int) -> int:
        """Index of the segment holding ``key`` (a position or offset), -1 before the first."""
        return bisect_right(self._starts, key) - 1

    def _drop(self, index: int) -> None:
        """Close and delete the segment at ``index`` (the first: retention; the last: truncation)."""
        seg = self.segments.pop(index)
        self._starts.pop(index)
        os.close(seg.fd)
        os.unlink(seg.path)

    def fds(self) -> list[int]:
        """The descriptors a flush syncs: the last two segments (the rest are full and synced)."""
        return [s.fd for s in self.segments[-2:]]

    def close(self) -> None:
        for s in self.segments:
            os.close(s.fd)
        self.segments.clear()


class CommitLog(SegmentFiles):
    """Append-only segments of records; positions are global byte offsets."""

    def __init__(self, directory: str, segment_size: int) -> None:
        self.dir = directory
        self.segment_size = segment_size
        os.makedirs(directory, exist_ok=True)
        self.segments: list[Segment] = []
        self._starts: list[int] = []
        for name in sorted(os.listdir(directory)):
            if not name.isdigit():
                continue
            path = os.path.join(directory, name)
            fd = os.open(path, os.O_RDWR)
            self.segments.append(Segment(int(name), path, fd, os.fstat(fd).st_size))
        self._starts = [s.start for s in self.segments]
        if not self.segments:
            self._new_segment(0)
        self.write_pos = self.segments[-1].start + self.segments[-1].size

    def _new_segment(self, start: int) -> Segment:
        path = os.path.join(self.dir, f"{start:020d}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        seg = Segment(start, path, fd, 0)
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
        return used + size + BLANK.size <= self.segment_size

    def reserve(self, size: int) -> int:
        """Position where a record of ``size`` bytes will go, rolling the segment if needed."""
        seg = self.segments[-1]
        used = self.write_pos - seg.start
        if not self.fits(used, size) and used > 0:
            remaining = self.segment_size - used
            if remaining >= BLANK.size:
                os.pwrite(seg.fd, BLANK.pack(remaining, BLANK_MAGIC), used)
                seg.size = used + BLANK.size
            seg = self._new_segment(seg.start + self.segment_size)
            self.write_pos = seg.start
        return self.write_pos

    def write(self, pos: int, data: bytes) -> None:
        seg = self.segments[-1]
        off = pos - seg.start
        os.pwrite(seg.fd, data, off)
        seg.size = max(seg.size, off + len(data))
        self.write_pos = pos + len(data)

    def read(self, pos: int, size: int) -> bytes:
        """``size`` bytes from ``pos``, across segments if they run on (a store written before
        segments kept room for their blank marker can hold records contiguous across two)."""
        i = self._index_of(pos)
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
            self._drop(-1)
        seg = self.segments[-1]
        keep = max(0, pos - seg.start)
        os.ftruncate(seg.fd, keep)
        seg.size = keep
        self.write_pos = seg.start + keep

    def delete_segments_before(self, pos: int) -> int:
        """Delete whole segments that end at or before ``pos``; keeps the active one."""
        deleted = 0
        while len(self.segments) > 1 and self.segments[1].start <= pos:
            self._drop(0)
            deleted += 1
        return deleted

