"""A read task's pull loop across a broker outage, without sockets: pulls that fail with a
connection fault are asked again from the same offset (bounded by brokerDownTimeoutMs)."""

from __future__ import annotations

import pytest

import rocketmq_spark.source.pull_loop as pull_loop
from rocketmq_spark.errors import BrokerUnavailableError, ConnectionFailedError
from rocketmq_spark.model import MessageQueue, PullResult
from rocketmq_spark.source.pull_loop import PullLoop
from rocketmq_spark.source.queue_range import QueueRange

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
    monkeypatch.setattr(pull_loop, "_OUTAGE_BACKOFF_S", (0.0, 0.0))


@pytest.mark.parametrize("refuse", [True, False])
def test_pulls_resume_at_the_same_offset_after_an_outage(refuse: bool) -> None:
    b = FlakyBroker(fail_from=3, outage=4, refuse=refuse)
    got = [nxt for _res, nxt in PullLoop(_part(60, 60_000), b.start, b.finish)]
    assert got == [10, 20, 30, 40, 50, 60]  # nothing skipped, nothing twice
    assert b.asked.count(20) == 5  # the failed pull and its retries all asked offset 20


def test_an_outage_past_the_budget_fails_naming_the_broker_address_and_operation(monkeypatch) -> None:
    clock = iter(range(0, 10_000, 1))
    monkeypatch.setattr(pull_loop.time, "monotonic", lambda: float(next(clock)))
    b = FlakyBroker(fail_from=2, outage=10_000, refuse=True)
    with pytest.raises(BrokerUnavailableError) as err:
        list(PullLoop(_part(60, 5_000), b.start, b.finish))
    msg = str(err.value)
    assert "broker-a" in msg and "127.0.0.1:10911" in msg and "pull of" in msg
    assert "brokerDownTimeoutMs=5000" in msg and "offset 10" in msg


class ReplacedStore:
    """Serves 10 offsets per pull from store 0; from pull ``swap_at`` on the broker has come back
    with store 1 (a lost disk): that pull is refused, later ones go over a new connection."""

    def __init__(self, swap_at: int | None, *, refuse: bool = True) -> None:
        self.swap_at, self.refuse = swap_at, refuse
        self.calls = 0
        self.store = 0
        self.connection = 1
        self.compared: list[int] = []  # the connection each comparison went over

    def start(self, offset: int) -> tuple[int, int]:
        self.calls += 1
        if self.swap_at is not None and self.calls == self.swap_at:
            self.store, self.connection = 1, self.connection + 1
            if self.refuse:
                raise ConnectionFailedError("127.0.0.1:10911", f"pull of {MQ}", "connection refused")
        return offset, self.store

    def finish(self, pending: tuple[int, int]) -> PullResult:
        offset, store = pending
        return PullResult("FOUND", offset + 10, 0, 100, b"old" if store == 0 else b"new")

    def other_store(self) -> str | None:
        self.compared.append(self.connection)
        return None if self.store == 0 else "offset 9 holds another message"

    def epoch(self) -> int:
        return self.connection


def _read(b: ReplacedStore, part: QueueRange) -> list[tuple[bytes, int]]:
    pulls = PullLoop(part, b.start, b.finish, other_store=b.other_store, epoch=b.epoch)
    return [(res.body, nxt) for res, nxt in pull_loop._until_gone(pulls)]  # as the task reads them


def test_a_store_replaced_during_an_outage_ends_the_range_where_the_outage_began(caplog) -> None:
    # before: the pulls after the outage handed on store 1's messages as the planned ones
    b = ReplacedStore(swap_at=3)
    got = _read(b, QueueRange(MQ, 0, 60, ("127.0.0.1:9876",), None, "g", "*", 10, False, 60_000, mark=(9, 1)))
    assert got == [(b"old", 10), (b"old", 20)]  # store 0's, then nothing of store 1
    assert b.compared == [1, 2]  # at the first answer, then over the new connection
    assert "planned offsets [20, 60) are not on the broker (offset 9 holds another message" in caplog.text


def test_a_store_replaced_before_the_task_read_fails_it_with_failOnDataLoss() -> None:
    from rocketmq_spark.errors import DataLossError

    b = ReplacedStore(swap_at=1, refuse=False)  # the task's first connection is to the new store
    with pytest.raises(DataLossError) as err:
        _read(b, QueueRange(MQ, 0, 60, ("127.0.0.1:9876",), None, "g", "*", 10, True, 60_000, mark=(9, 1)))
    assert "T/broker-a:0: planned offsets [0, 60) are not on the broker: offset 9 holds another message" \
        in str(err.value)


def test_the_same_store_is_compared_once_per_connection() -> None:
    b = ReplacedStore(swap_at=None)
    got = _read(b, QueueRange(MQ, 0, 60, ("127.0.0.1:9876",), None, "g", "*", 10, True, 60_000, mark=(9, 1)))
    assert [nxt for _b, nxt in got] == [10, 20, 30, 40, 50, 60]
    assert b.compared == [1]


def test_a_comparison_over_another_connection_than_the_answer_is_made_again() -> None:
    b = ReplacedStore(swap_at=None)
    compared = b.other_store

    def reconnecting() -> str | None:  # the first comparison's pull found the connection gone
        if not b.compared:
            b.connection += 1
        return compared()

    part = QueueRange(MQ, 0, 30, ("127.0.0.1:9876",), None, "g", "*", 10, True, 60_000, mark=(9, 1))
    got = [nxt for _r, nxt in PullLoop(part, b.start, b.finish, other_store=reconnecting, epoch=b.epoch)]
    assert got == [10, 20, 30]
    assert b.compared == [2, 2]  # the answer over connection 1 was asked again over connection 2
