"""Crash safety: SIGKILL during sync-flushed sends, torn segment tails, restarts."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import pytest

from broker_support import start_broker_process  # tests/ is on sys.path through conftest
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import RocketMQSparkError

pytestmark = pytest.mark.integration


def _read_all(client: RemotingClient, topic: str) -> list[bytes]:
    out: list[bytes] = []
    for q in client.message_queues(topic, refresh=True):
        off, end = 0, client.max_offset(q)
        while off < end:
            res = client.pull(q, off, 1024)
            out.extend(r.payload() for r in decode_records(res.body, check_crc=True))
            off = res.next_offset
    return out


def test_sigkill_during_sync_flushed_sends_loses_no_acknowledged_message(tmp_path) -> None:
    data = str(tmp_path / "data")
    proc, addrs = start_broker_process(data, "--flush", "sync")
    acked: list[bytes] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(worker: int) -> None:
        c = RemotingClient(addrs["namesrv"], ClientConfig(retries=1, request_timeout_s=5))
        try:
            qs = c.message_queues("KILL_TOPIC")
            i = 0
            while not stop.is_set():
                batch = [BatchEntry(b"w%d-%d" % (worker, i + k)) for k in range(4)]
                try:
                    c.send_batch(qs[i % len(qs)], batch)
                except RocketMQSparkError:
                    return  # the broker died under us: this batch was never acknowledged
                acked.extend(e.body for e in batch)
                i += 4
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 600 and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: sends are in flight
    proc.wait(10)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(acked) >= 600
    snapshot = set(acked)

    proc, addrs = start_broker_process(data)
    try:
        c = RemotingClient(addrs["namesrv"])
        stored = _read_all(c, "KILL_TOPIC")
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0  # clean stop on SIGTERM
    missing = snapshot - set(stored)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
    assert len(stored) == len(set(stored))  # nothing stored twice


@pytest.mark.parametrize("damage", ["truncate", "garble body", "garble header", "junk after"])
def test_hand_damaged_segment_tail_is_recovered(tmp_path, damage: str) -> None:
    mq = EmbeddedBroker(str(tmp_path)).start()
    try:
        c = RemotingClient(mq.namesrv_addr)
        q = c.message_queues("TORN")[0]
        for i in range(20):
            c.send(q, b"msg-%02d" % i)
        c.create_group("g")
        c.update_consumer_offset("g", q, 20)
        mq.stop()
        seg_dir = os.path.join(str(tmp_path), "store", "commitlog")
        last = os.path.join(seg_dir, sorted(os.listdir(seg_dir))[-1])
        with open(last, "rb") as f:
            data = f.read()
        end = len(data.rstrip(b"\x00"))  # preallocated segments are zero-filled past the tail
        tail = data.rindex(b"msg-19")  # the last record's body
        with open(last, "r+b") as f:
            if damage == "truncate":
                f.truncate(end - 7)  # tear the last record
            elif damage == "garble body":
                f.seek(tail)
                f.write(b"XXX")  # the body CRC no longer matches
            elif damage == "garble header":
                start = 0  # walk the records by their sizes to the last one
                while start + 4 < end:
                    (size,) = struct.unpack_from(">i", data, start)
                    if start + size >= end:
                        break
                    start += size
                f.seek(start + 4)
                f.write(b"\x12\x34\x56\x78")  # its magic: what recovery checks besides size and body CRC
            else:
                f.seek(end)
                f.write(os.urandom(100) + b"\xff" * 20)  # garbage after the last good record
        intact = 20 if damage == "junk after" else None
        mq.start()
        c.close()
        c = RemotingClient(mq.namesrv_addr)
        kept = c.max_offset(q)
        if intact is not None:
            assert kept == intact
        else:
            assert 0 < kept < 20  # the damaged record and anything after it are dropped, nothing else
        assert [r.payload() for r in decode_records(c.pull(q, 0, 100).body, check_crc=True)] == [
            b"msg-%02d" % i for i in range(kept)]
        assert c.query_consumer_offset("g", q) == 20
        sent = c.send(q, b"after")
        assert sent.queue_offset == kept  # the queue continues right after the last intact record
        c.close()
    finally:
        mq.close()
