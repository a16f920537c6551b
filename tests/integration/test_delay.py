"""Delayed delivery by the embedded broker: DELAY levels and the 5.x TIMER_* properties.

A delayed message must stay out of its destination queue (pulls, min/max offsets) until
its due time, then be delivered once, in due-time order, across broker restarts.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import Future

import pytest

from broker_support import start_broker_process  # tests/ is on sys.path through conftest
from brokers import wait_for
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.broker.delayed import SCHEDULE_TOPIC
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, MessageRecord, decode_records, encode_properties
from rocketmq_spark.errors import MessageIllegalError
from rocketmq_spark.model import MessageQueue

pytestmark = pytest.mark.integration

#: Store timestamps and the test's clock are the same host clock; allow rounding only.
TOLERANCE_MS = 5


def _now_ms() -> int:
    return int(time.time() * 1000)


def _props(**kv: object) -> str:
    return encode_properties({k: str(v) for k, v in kv.items()})


def _wait_max(client: RemotingClient, q: MessageQueue, n: int, timeout_s: float = 10.0) -> int:
    """Wait until the queue's max offset reaches ``n``; returns the clock (ms) when seen."""
    wait_for(lambda: client.max_offset(q) >= n, f"{n} messages in {q}", timeout_s, 0.05)
    return _now_ms()


def _records(client: RemotingClient, q: MessageQueue) -> list[MessageRecord]:
    return decode_records(client.pull(q, 0, 1024).body)


def test_timer_deliver_ms_is_invisible_until_due_then_delivered(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[1]
    born = _now_ms()
    due = born + 1500
    sent = client.send(q, b"later", _props(TIMER_DELIVER_MS=due, UNIQ_KEY="UK-LATER", TAGS="tg", KEYS="k1"),
                       born_ts=born)
    assert sent.queue.queue_id == 1
    assert client.max_offset(q) == 0
    assert client.min_offset(q) == 0
    res = client.pull(q, 0, 32)
    assert res.status == "NO_NEW_MSG" and res.max_offset == 0
    assert SCHEDULE_TOPIC not in client.topic_list()

    seen = _wait_max(client, q, 1)
    assert seen >= due - TOLERANCE_MS
    recs = _records(client, q)
    assert len(recs) == 1
    rec = recs[0]
    assert rec.payload() == b"later"
    assert (rec.topic, rec.queue_id, rec.queue_offset) == (topic, 1, 0)
    assert rec.store_timestamp >= due - TOLERANCE_MS
    assert rec.born_timestamp == born
    assert rec.msg_id == "UK-LATER"  # the client message id is kept
    assert rec.tags == "tg" and rec.keys == ["k1"]
    assert rec.properties["TIMER_DELIVER_MS"] == str(due)
    # as a 5.x broker's timer delivers it: where it was bound, when due, in and out of the timer
    assert (rec.properties["REAL_TOPIC"], rec.properties["REAL_QID"]) == (topic, "1")
    assert rec.properties["TIMER_OUT_MS"] == str(due)
    assert int(rec.properties["TIMER_ENQUEUE_MS"]) <= int(rec.properties["TIMER_DEQUEUE_MS"])
    assert client.max_offset(q) == 1  # delivered once


def test_long_polling_consumer_is_woken_by_the_delivery(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    due = _now_ms() + 1000
    client.send(q, b"wake", _props(TIMER_DELIVER_MS=due))
    t0 = time.monotonic()
    fut: Future = client.pull_async(q, 0, 32, suspend_ms=20_000)
    res = client.pull_result(q, fut)
    elapsed = time.monotonic() - t0
    assert res.status == "FOUND"
    assert [r.payload() for r in decode_records(res.body)] == [b"wake"]
    assert elapsed < 10, "the suspended pull was not woken by the delivery"
    assert decode_records(res.body)[0].store_timestamp >= due - TOLERANCE_MS


def test_timer_delay_sec_ms_and_delay_level(client: RemotingClient, topic: str) -> None:
    qs = client.message_queues(topic)
    t0 = _now_ms()
    client.send(qs[0], b"sec", _props(TIMER_DELAY_SEC=1))
    client.send(qs[1], b"lvl", _props(DELAY=1))
    client.send(qs[2], b"ms", _props(TIMER_DELAY_MS=700))
    for q in qs[:3]:
        assert client.max_offset(q) == 0
        assert client.pull(q, 0, 32).status == "NO_NEW_MSG"
    for q in qs[:3]:
        _wait_max(client, q, 1)
    sec, lvl, ms = (_records(client, q)[0] for q in qs[:3])
    assert sec.payload() == b"sec" and sec.store_timestamp >= t0 + 1000 - TOLERANCE_MS
    assert sec.properties["TIMER_DELAY_SEC"] == "1"
    assert lvl.payload() == b"lvl" and lvl.store_timestamp >= t0 + 1000 - TOLERANCE_MS
    # like Java's ScheduleMessageService: the level is cleared so a re-send is not delayed again
    assert lvl.properties["DELAY"] == "1"  # a 5.x broker keeps the level on the delivered copy
    assert ms.payload() == b"ms" and ms.store_timestamp >= t0 + 700 - TOLERANCE_MS
    assert ms.properties["TIMER_DELAY_MS"] == "700"


def test_past_or_zero_delays_are_delivered_at_once(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    client.send(q, b"past", _props(TIMER_DELIVER_MS=_now_ms() - 10_000))
    assert client.max_offset(q) == 1
    client.send(q, b"level0", _props(DELAY=0))
    client.send(q, b"level-3", _props(DELAY=-3))
    client.send(q, b"sec0", _props(TIMER_DELAY_SEC=0))
    assert client.max_offset(q) == 4
    recs = _records(client, q)
    assert [r.payload() for r in recs] == [b"past", b"level0", b"level-3", b"sec0"]
    assert "TIMER_DELIVER_MS" in recs[0].properties


def test_delivery_follows_due_time_order(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[2]
    now = _now_ms()
    # due times far enough ahead that the sends (slow on a loaded machine) end before the first
    dues = {b"c": now + 3000, b"a": now + 2000, b"d": now + 3400, b"b": now + 2500}
    for body in (b"c", b"a", b"d"):
        client.send(q, body, _props(TIMER_DELIVER_MS=dues[body]))
    # a batch mixing an immediate message with a delayed one
    client.send_batch(q, [BatchEntry(b"now", ""), BatchEntry(b"b", _props(TIMER_DELIVER_MS=dues[b"b"]))])
    visible = client.max_offset(q)
    assert _now_ms() < dues[b"a"], "the sends took longer than the first due time: the check below means nothing"
    assert visible == 1  # only the immediate one
    _wait_max(client, q, 5)
    recs = _records(client, q)
    assert [r.payload() for r in recs] == [b"now", b"a", b"b", b"c", b"d"]
    stamps = [r.store_timestamp for r in recs[1:]]
    assert stamps == sorted(stamps)
    for r in recs[1:]:
        assert r.store_timestamp >= dues[r.payload()] - TOLERANCE_MS


def test_delay_levels_above_18_count_as_18_and_bad_values_are_refused(broker: EmbeddedBroker,
                                                                      client: RemotingClient,
                                                                      topic: str) -> None:
    q = client.message_queues(topic)[0]
    t0 = _now_ms()
    client.send(q, b"two-hours", _props(DELAY=99, TIMER_DELIVER_MS=t0 + 1000))
    assert client.max_offset(q) == 0
    waiting = broker.call(lambda: [(d.due_ms, d.schedule_offset) for d in broker.broker.pending_delay.values()])
    assert any(t0 + 7_200_000 - TOLERANCE_MS <= due <= _now_ms() + 7_200_000 for due, _ in waiting)
    with pytest.raises(MessageIllegalError, match="TIMER_DELIVER_MS"):
        client.send(q, b"bad", _props(TIMER_DELIVER_MS="soon"))
    with pytest.raises(MessageIllegalError, match="DELAY"):
        client.send(q, b"bad", _props(DELAY="x"))
    with pytest.raises(MessageIllegalError, match="at most"):
        client.send(q, b"too-far", _props(TIMER_DELAY_SEC=30 * 24 * 3600))
    assert client.max_offset(q) == 0


def test_restart_with_pending_messages_delivers_each_exactly_once(tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path)) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            q = c.message_queues("DELAY_RESTART")[3]
            now = _now_ms()
            dues = {b"first": now + 400, b"second": now + 2500, b"third": now + 3200}
            for body, due in dues.items():
                c.send(q, body, _props(TIMER_DELIVER_MS=due, UNIQ_KEY=body.decode()))
            _wait_max(c, q, 1)  # "first" is out; two still wait
            mq.restart()
            assert c.max_offset(q) == 1
            assert mq.call(lambda: sorted(mq.broker.pending_delay)) == [1, 2]
            mq.restart()  # twice while pending: nothing lost, nothing delivered early
            assert c.max_offset(q) <= 3
            _wait_max(c, q, 3)
            recs = _records(c, q)
            assert [r.payload() for r in recs] == [b"first", b"second", b"third"]
            assert [r.msg_id for r in recs] == ["first", "second", "third"]
            for r in recs:
                assert r.store_timestamp >= dues[r.payload()] - TOLERANCE_MS
            # after delivery a restart must not deliver again
            mq.restart()
            assert mq.call(lambda: len(mq.broker.pending_delay)) == 0
            c.send(q, b"marker", "")  # anything the scheduler did would precede this
            assert c.max_offset(q) == 4
            assert [r.payload() for r in _records(c, q)] == [b"first", b"second", b"third", b"marker"]
        finally:
            c.close()


def test_messages_due_while_the_broker_was_down_are_delivered_at_start(tmp_path) -> None:
    mq = EmbeddedBroker(str(tmp_path)).start()
    c = RemotingClient(mq.namesrv_addr)
    try:
        q = c.message_queues("DELAY_DOWN")[0]
        c.send(q, b"overdue", _props(DELAY=1, UNIQ_KEY="OD"))  # due in 1 s
        due = _now_ms() + 1400
        c.send(q, b"later", _props(TIMER_DELIVER_MS=due))
        assert c.max_offset(q) == 0
        mq.stop()
        wait_for(lambda: _now_ms() > due + 200, "both due times to pass while the broker is down", 10, 0.05)
        mq.restart()  # (stop is a no-op now) a fresh broker on the same data dir
        _wait_max(c, q, 2, timeout_s=5)
        recs = _records(c, q)
        assert [r.payload() for r in recs] == [b"overdue", b"later"]
        mq.restart()
        assert c.max_offset(q) == 2
        assert mq.call(lambda: len(mq.broker.pending_delay)) == 0
    finally:
        c.close()
        mq.close()


def test_sync_flush_delayed_send(tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path), flush="sync") as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            q = c.message_queues("DELAY_SYNC")[0]
            c.send(q, b"x", _props(TIMER_DELAY_MS=300))
            assert c.max_offset(q) == 0
            _wait_max(c, q, 1)
            assert [r.payload() for r in _records(c, q)] == [b"x"]
        finally:
            c.close()


def test_sigkilled_broker_loses_no_delayed_message_and_delivers_none_twice(tmp_path) -> None:
    data = str(tmp_path / "data")
    proc, addrs = start_broker_process(data)
    c = RemotingClient(addrs["namesrv"])
    try:
        q = c.message_queues("DELAY_KILL")[0]
        now = _now_ms()
        dues = {b"k1": now + 300, b"k2": now + 2500, b"k3": now + 3000}
        for body, due in dues.items():
            c.send(q, body, _props(TIMER_DELIVER_MS=due))
        _wait_max(c, q, 1)
        proc.kill()  # SIGKILL: no clean flush of offsets or checkpoint
        proc.wait(10)
        c.close()
        proc, addrs = start_broker_process(data)
        c = RemotingClient(addrs["namesrv"])
        _wait_max(c, q, 3)
        assert [r.payload() for r in _records(c, q)] == [b"k1", b"k2", b"k3"]
        proc.kill()
        proc.wait(10)
        c.close()
        proc, addrs = start_broker_process(data)
        c = RemotingClient(addrs["namesrv"])
        c.send(q, b"marker", "")  # a redelivery would be scheduled at start, before this
        assert [r.payload() for r in _records(c, q)] == [b"k1", b"k2", b"k3", b"marker"]
    finally:
        c.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
