"""The fault suite's producer against an embedded broker behind the fault proxy: what its send
log says of each send is what the broker holds (the checker's fairness rests on it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from brokers import wait_until
from rocketmq_spark.broker import EmbeddedBroker

from .checker import read_topic
from .proxy import FaultProxy
from .workload import Producer, SendLog

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def test_the_send_log_says_acked_for_stored_failed_for_refused_and_unknown_for_unanswered(tmp_path: Path) -> None:
    with FaultProxy(target=("127.0.0.2", 0)) as proxy, \
            EmbeddedBroker(host="127.0.0.2", advertise_host="127.0.0.1", broker_port=proxy.port,
                           grpc_port=None) as mq:
        from rocketmq_spark.client import RemotingClient

        admin = RemotingClient(mq.namesrv_addr)
        admin.create_topic("WorkloadT", 2)
        admin.close()
        log_path = tmp_path / "sends.jsonl"
        producer = Producer(mq.namesrv_addr, "WorkloadT", str(log_path), rate=400, batch=5, request_timeout_s=1.0)
        producer.start()
        try:
            assert wait_until(lambda: producer.counts["acked"] >= 100, 20)
            proxy.blackhole()  # sends are written and never answered
            assert wait_until(lambda: producer.counts["unknown"] >= 10, 20)
            proxy.heal()
            proxy.refuse()  # the port closed: sends are never written
            proxy.reset_all()
            assert wait_until(lambda: producer.counts["failed"] >= 10, 20)
            proxy.heal()
            acked = producer.counts["acked"]
            assert wait_until(lambda: producer.counts["acked"] >= acked + 100, 20)
            producer.pause()
            paused, active = dict(producer.counts), producer.active_s
            time.sleep(0.5)
            assert producer.counts == paused  # nothing starts while paused
            assert producer.active_s == active  # and the pause is not counted as time of sending
            producer.resume()
        finally:
            producer.stop()
        stopped = producer.active_s
        time.sleep(0.2)
        assert 0 < producer.active_s == stopped  # stopped: no longer grows
        log = SendLog.load(log_path)
        assert sum(producer.counts.values()) == len(log.acked) + len(log.unknown) + len(log.failed)
        assert log.bad_lines == 0
        copies = read_topic(mq.namesrv_addr, "WorkloadT")
        found = {c.id for c in copies}
        assert len(copies) == len(found)  # each send attempt has ids of its own: nothing twice
        assert set(log.acked) <= found
        assert not log.failed & found
        assert found <= set(log.acked) | log.unknown
        # each acked id sits at the offset its send's answer gave
        assert {c.id: c.offset for c in copies if c.id in log.acked} == log.acked_offsets
        by_queue: dict[str, list[int]] = {}
        for c in sorted(copies, key=lambda c: (c.queue, c.offset)):
            by_queue.setdefault(c.queue, []).append(c.id)  # type: ignore[arg-type]
        assert all(ids == sorted(ids) for ids in by_queue.values())  # a queue's ids grow with its offsets
