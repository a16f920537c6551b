"""The message store on real files (no sockets): appends, reads, recovery, retention."""

from __future__ import annotations

import os
import time

import pytest

from rocketmq_spark.broker.store import MessageStore, NewMessage, StoreConfig
from rocketmq_spark.codec import decode_records, java_string_hash
from rocketmq_spark.codec.tags import tag_matches

HOST = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"  # 127.0.0.1:10911


def _open(path: str, **cfg: int) -> MessageStore:
    return MessageStore(path, HOST, StoreConfig(**cfg))


def _msgs(n: int, queues: int = 2, tag: str = "A", size: int = 100) -> list[NewMessage]:
    return [NewMessage("t", i % queues, (b"%06d" % i) + b"x" * (size - 6), f"TAGS\x01{tag}\x02") for i in range(n)]


def test_append_and_read_by_offset(tmp_path) -> None:
    s = _open(str(tmp_path))
    stored = s.put(_msgs(100))
    assert [x.queue_offset for x in stored[:4]] == [0, 0, 1, 1]
    assert s.max_offset("t", 0) == 50 and s.min_offset("t", 0) == 0
    res = s.get("t", 1, 10, 5, 1 << 20)
    recs = decode_records(b"".join(res.records), check_crc=True)
    assert res.status == "FOUND" and res.next_offset == 15
    assert [r.queue_offset for r in recs] == list(range(10, 15))
    assert [int(r.body[:6]) for r in recs] == [21, 23, 25, 27, 29]
    assert recs[0].physical_offset == stored[21].physical_offset
    assert s.get("t", 1, 50, 5, 1 << 20).status == "NO_NEW"
    assert s.get("t", 1, 51, 5, 1 << 20).status == "OFFSET_OVERFLOW"
    s.close()


def test_pull_respects_byte_cap_but_returns_at_least_one(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put(_msgs(10, queues=1, size=1000))
    res = s.get("t", 0, 0, 100, 2500)
    assert res.count == 2  # each record is ~1.1 KB
    res = s.get("t", 0, 0, 100, 10)
    assert res.count == 1
    s.close()


def test_segments_roll_and_records_never_span(tmp_path) -> None:
    s = _open(str(tmp_path), segment_size=4096)
    stored = s.put(_msgs(200))
    assert len(s.commitlog.segments) > 5
    for st in stored:
        assert st.physical_offset // 4096 == (st.physical_offset + st.size - 1) // 4096
    res = s.get("t", 0, 0, 1000, 1 << 30)
    assert res.count == 100
    assert [r.queue_offset for r in decode_records(b"".join(res.records), check_crc=True)] == list(range(100))
    s.close()


def test_a_segment_exactly_filled_by_records_still_reads_whole(tmp_path) -> None:
    # Records whose sizes add up to the segment size exactly: Java rolls one record earlier (a
    # segment keeps room for its blank marker); a pull over the boundary returned the first
    # segment's records only while counting all of them, so its next offset skipped the rest
    s = _open(str(tmp_path / "probe"), segment_size=4096)
    one = s.put(_msgs(1, queues=1))[0].size
    s.close()
    seg = one * 4
    s = _open(str(tmp_path / "exact"), segment_size=seg)
    stored = s.put(_msgs(12, queues=1))
    for st in stored:
        assert st.physical_offset // seg == (st.physical_offset + st.size - 1) // seg
        assert (st.physical_offset + st.size) % seg != 0, "a record ends exactly at a segment's end"
    res = s.get("t", 0, 0, 1000, 1 << 30)
    recs = decode_records(b"".join(res.records), check_crc=True)
    assert res.count == len(recs) == 12 and res.next_offset == 12
    s.close()


def test_a_read_over_two_contiguous_segments_returns_both(tmp_path) -> None:
    # a store written before segments kept room for their blank can hold records contiguous
    # across two segments: the commit log reads on into the next one
    s = _open(str(tmp_path), segment_size=4096)
    s.put(_msgs(3, queues=1))
    cl = s.commitlog
    first = cl.segments[0]
    data = os.pread(first.fd, first.size, 0)
    first_len = len(data)
    cl._new_segment(first_len)  # pretend the segment ended right after these records
    cl.write(first_len, b"next-segment")
    assert cl.read(0, first_len + 12) == data + b"next-segment"
    s.close()


def test_restart_keeps_everything(tmp_path) -> None:
    s = _open(str(tmp_path), segment_size=8192)
    s.put(_msgs(300))
    s.close()  # no flush: the OS page cache has it, as after a process kill
    s = _open(str(tmp_path), segment_size=8192)
    assert s.max_offset("t", 0) == 150 and s.max_offset("t", 1) == 150
    stored = s.put(_msgs(2))
    assert stored[0].queue_offset == 150
    s.close()


def test_torn_tail_is_truncated_and_queues_rebuilt(tmp_path) -> None:
    s = _open(str(tmp_path))
    stored = s.put(_msgs(10))
    snap = s.flush_snapshot()
    assert snap is not None
    snap[1]()  # checkpoint covers all 10
    seg = s.commitlog.segments[-1].path
    size = os.path.getsize(seg)
    s.close()
    os.truncate(seg, size - 25)  # the last record (queue 1, offset 4) is torn
    s = _open(str(tmp_path))
    assert (s.max_offset("t", 0), s.max_offset("t", 1)) == (5, 4)
    assert s.commitlog.write_pos == stored[-1].physical_offset
    res = s.get("t", 1, 0, 100, 1 << 20)
    assert res.count == 4
    stored = s.put(_msgs(2))
    assert (stored[0].queue_offset, stored[1].queue_offset) == (5, 4)
    s.close()


def test_garbled_tail_is_cut_at_the_first_bad_record(tmp_path) -> None:
    s = _open(str(tmp_path))
    stored = s.put(_msgs(10))
    seg = s.commitlog.segments[-1].path
    s.close()
    with open(seg, "r+b") as fh:  # flip a body byte of record 7: its CRC no longer matches
        fh.seek(stored[7].physical_offset + stored[7].size - 40)
        fh.write(b"\xff\xff")
    s = _open(str(tmp_path))
    assert s.commitlog.write_pos == stored[7].physical_offset
    assert s.max_offset("t", 0) + s.max_offset("t", 1) == 7
    s.close()


def test_consume_queue_entries_past_the_checkpoint_are_rebuilt(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put(_msgs(4))
    snap = s.flush_snapshot()
    assert snap is not None
    snap[1]()
    s.put(_msgs(6))
    cq = s.queue("t", 0)
    seg = cq.segments[-1].path
    s.close()
    os.truncate(seg, 2 * 28)  # lose queue 0's entries 2..4, written after the checkpoint
    s = _open(str(tmp_path))
    assert s.max_offset("t", 0) == 5
    res = s.get("t", 0, 0, 100, 1 << 20)
    assert [r.queue_offset for r in decode_records(b"".join(res.records))] == [0, 1, 2, 3, 4]
    s.close()


def test_offset_by_store_time(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put(_msgs(3, queues=1))
    time.sleep(0.01)
    mid = int(time.time() * 1000)
    time.sleep(0.01)
    s.put(_msgs(3, queues=1))
    assert s.offset_by_time("t", 0, 0) == 0
    assert s.offset_by_time("t", 0, mid) == 3
    assert s.offset_by_time("t", 0, mid + 10**9) == 6
    assert s.earliest_store_time("t", 0) <= mid
    s.close()


def test_tag_filter_skips_and_moves_on(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put([NewMessage("t", 0, b"%d" % i, "TAGS\x01%s\x02" % ("A" if i % 4 == 0 else "B")) for i in range(20)])
    ha = java_string_hash("A")
    res = s.get("t", 0, 0, 3, 1 << 20, lambda th, rec: th == ha and tag_matches(rec, frozenset({"A"})))
    assert [r.body for r in decode_records(b"".join(res.records))] == [b"0", b"4", b"8"]
    assert res.next_offset == 9
    res = s.get("t", 0, 17, 3, 1 << 20, lambda th, rec: th == ha)
    assert res.status == "NO_MATCHED" and res.next_offset == 20
    s.close()


def test_retention_moves_min_offset(tmp_path) -> None:
    s = _open(str(tmp_path), segment_size=4096)
    s.put(_msgs(200))
    deleted = s.delete_before(3 * 4096)
    assert deleted == 3
    lo = s.min_offset("t", 0)
    assert lo > 0
    assert s.get("t", 0, 0, 5, 1 << 20).status == "OFFSET_TOO_SMALL"
    assert s.get("t", 0, lo, 5, 1 << 20).status == "FOUND"
    s.close()
    s = _open(str(tmp_path), segment_size=4096)
    assert s.min_offset("t", 0) >= lo - 1
    assert s.get("t", 0, s.min_offset("t", 0), 5, 1 << 20).status == "FOUND"
    s.close()


def test_oversized_queue_offset_gap_is_refused(tmp_path) -> None:
    s = _open(str(tmp_path))
    with pytest.raises(ValueError, match="expected offset"):
        s.queue("t", 0).append(5, 0, 10, 0, 0)
    s.close()


def test_a_cancelled_flush_round_finishes_before_the_next_one_starts(tmp_path) -> None:
    """Stopping the flusher cancels its periodic round mid-fsync; the final round must wait
    for that job (they share the checkpoint's temp file)."""
    import asyncio
    import threading

    from rocketmq_spark.broker.flusher import Flusher
    from rocketmq_spark.broker.state import ConsumerOffsets

    running = 0
    overlaps = 0
    rounds = 0
    lock = threading.Lock()
    inside = threading.Event()

    def slow_job() -> None:
        nonlocal running, overlaps, rounds
        with lock:
            running += 1
            rounds += 1
            overlaps += running > 1
        inside.set()
        time.sleep(0.3)
        with lock:
            running -= 1

    async def scenario() -> None:
        store = MessageStore(str(tmp_path / "store"), b"\x7f\x00\x00\x01\x00\x00\x27\x0f")
        store.put([NewMessage("T", 0, b"x", "")])
        flusher = Flusher(store, ConsumerOffsets(str(tmp_path / "config")), sync=False, interval_s=0.01,
                          extra=[slow_job])
        flusher.start()
        # until a periodic round is inside slow_job: stop() must cancel it mid-job
        assert await asyncio.to_thread(inside.wait, 10), "no flush round ran"
        await flusher.stop()  # cancels it, then runs the final round
        store.close()

    asyncio.run(scenario())
    assert rounds >= 2  # the cancelled round and the final one
    assert overlaps == 0
