"""A read task's pull loop across a broker outage, without sockets: pulls that fail with a
connection fault are asked again from the same offset (bounded by brokerDownTimeoutMs)."""

from __future__ import annotations

import pytest

import rocketmq_spark.source.reader as reader
from rocketmq_spark.errors import BrokerUnavailableError, ConnectionFailedError
from rocketmq_spark.model import MessageQueue, PullResult
from rocketmq_spark.source.reader import QueueRange, _pulls

MQ = MessageQueue("T", "broker-a", 0)


def _part(end: int, down_ms: int) -> QueueRange:
    return QueueRange(MQ, 0, end, ("127.0.0.1:9876",), None, "g", "*", 10, True, down_ms)


class FlakyBroker:
    """Serves 10 offsets per pull; down (refusing or dropping pulls) for ``outage`` calls."""

    def __init__(self, fail_from: int, outage: int, *, refuse: bool) -> None:
        self.fail_from, self.outage, self.refuse = fail_from, outage, refuse
        self.calls = 0
        self.asked: list[int] = []

    def start(self, offset: int) -> int:
        self.calls += 1
        self.asked.append(offset)
        down = self.fail_from <= self.calls < self.fail_from + self.outage
        if down and self.refuse:
            raise ConnectionFailedError("127.0.0.1:10911", f"pull of {MQ}", "connection refused")
        return -1 if down else offset

    def finish(self, pending: int) -> PullResult:
        if pending < 0:
            raise ConnectionFailedError("127.0.0.1:10911", f"pull of {MQ}", "connection reset")
        return PullResult("FOUND", pending + 10, 0, 100, b"x")


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "_OUTAGE_BACKOFF_S", (0.0, 0.0))


@pytest.mark.parametrize("refuse", [True, False])
def test_pulls_resume_at_the_same_offset_after_an_outage(refuse: bool) -> None:
    b = FlakyBroker(fail_from=3, outage=4, refuse=refuse)
    got = [nxt for _res, nxt in _pulls(_part(60, 60_000), b.start, b.finish)]
    assert got == [10, 20, 30, 40, 50, 60]  # nothing skipped, nothing twice
    assert b.asked.count(20) == 5  # the failed pull and its retries all asked offset 20


def test_an_outage_past_the_budget_fails_naming_the_broker_address_and_operation(monkeypatch) -> None:
    clock = iter(range(0, 10_000, 1))
    monkeypatch.setattr(reader.time, "monotonic", lambda: float(next(clock)))
    b = FlakyBroker(fail_from=2, outage=10_000, refuse=True)
    with pytest.raises(BrokerUnavailableError) as err:
        list(_pulls(_part(60, 5_000), b.start, b.finish))
    msg = str(err.value)
    assert "broker-a" in msg and "127.0.0.1:10911" in msg and "pull of" in msg
    assert "brokerDownTimeoutMs=5000" in msg and "offset 10" in msg
