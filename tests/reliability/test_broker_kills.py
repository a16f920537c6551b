"""Broker kills: the broker process is SIGKILLed while consumers pull and commit offsets, then
restarted on the same data directory: every acknowledged message is still readable byte for
byte (CRC-checked), the committed group offsets are intact, and the queues continue where they
stopped. 3 kills in the CI run, 10 under ``pytest --soak``."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from broker_support import start_broker_process
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import RocketMQSparkError

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

TOPIC = "PULL_KILL"


def _read_all(c: RemotingClient) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for q in c.message_queues(TOPIC, refresh=True):
        off, end, got = 0, c.max_offset(q), []
        while off < end:
            res = c.pull(q, off, 1024)
            got.extend(r.payload() for r in decode_records(res.body, check_crc=True))
            off = res.next_offset
        out[q.queue_id] = got
    return out


def test_sigkill_during_pulls_and_offset_commits_keeps_messages_and_offsets(tmp_path, soak: bool) -> None:
    data = str(tmp_path / "data")
    kills = 10 if soak else 3
    acked: dict[int, list[bytes]] = {}
    committed: dict[int, int] = {}
    checked = 0
    for round_ in range(kills):
        proc, addrs = start_broker_process(data, "--flush", "sync")
        try:
            c = RemotingClient(addrs["namesrv"], ClientConfig(retries=1, request_timeout_s=5))
            if round_ == 0:
                c.create_topic(TOPIC, 4)
                c.create_group("g_kill")
            qs = c.message_queues(TOPIC, refresh=True)
            # the state so far survived the last kill
            stored = _read_all(c)
            for qid, bodies in acked.items():
                assert stored[qid] == bodies, f"round {round_}: queue {qid} differs after the kill"
                checked += len(bodies)
            for qid, off in committed.items():
                assert c.query_consumer_offset("g_kill", qs[qid]) == off, f"round {round_}: offset of queue {qid}"
            # more acknowledged messages, then consumers pulling and committing while the broker dies
            for q in qs:
                batch = [BatchEntry(b"r%d-q%d-%d" % (round_, q.queue_id, i)) for i in range(200)]
                c.send_batch(q, batch)
                acked.setdefault(q.queue_id, []).extend(e.body for e in batch)
            stop = threading.Event()
            pulled = [0]
            lock = threading.Lock()

            # this round's broker, stop flag and counters, bound now (not looked up when a thread runs)
            def consume(q, *, addrs=addrs, stop=stop, lock=lock, pulled=pulled) -> None:  # type: ignore[no-untyped-def]
                cc = RemotingClient(addrs["namesrv"], ClientConfig(retries=1, request_timeout_s=5))
                off = best = committed.get(q.queue_id, 0)
                try:
                    while not stop.is_set():
                        res = cc.pull(q, off, 32)
                        if res.status != "FOUND":
                            off = 0  # at the end: read the queue again (pull load), commit only progress
                            continue
                        with lock:
                            pulled[0] += len(decode_records(res.body, check_crc=True))
                        off = res.next_offset
                        if off > best:
                            cc.update_consumer_offset("g_kill", q, off)
                            best = off
                            with lock:
                                committed[q.queue_id] = off
                except RocketMQSparkError:
                    return  # the broker died under us
                finally:
                    cc.close()

            threads = [threading.Thread(target=consume, args=(q,)) for q in qs]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while pulled[0] < 2000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pulled[0] >= 2000, "the consumers did not get going"
            os.kill(proc.pid, signal.SIGKILL)  # mid-pull, mid-commit
            proc.wait(10)
            stop.set()
            for t in threads:
                t.join(30)
            c.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    # the last kill's state, once more
    proc, addrs = start_broker_process(data)
    try:
        c = RemotingClient(addrs["namesrv"])
        qs = c.message_queues(TOPIC, refresh=True)
        assert _read_all(c) == acked
        assert {q.queue_id: c.query_consumer_offset("g_kill", q) for q in qs} == committed
        res = c.send_batch(qs[0], [BatchEntry(b"after")])
        assert res[0].queue_offset == len(acked[0])  # the queue continues right after the last record
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert checked > 0
