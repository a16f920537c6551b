"""The time bounds of the clients' retries (client/retry.py), on a fake clock: a peer that
stopped answering (every attempt a request timeout) costs a call its retry budget at most,
counted from the first attempt; quick faults are retried within it."""

from __future__ import annotations

import pytest

import rocketmq_spark.client.retry as retry
from rocketmq_spark.client.retry import ClientConfig, bounded, may_retry, retrying
from rocketmq_spark.errors import ConnectionFailedError, RequestTimeoutError

TIMEOUT_S = 10.0


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fake clock the retry module waits on (tests/unit/test_pause_planning.py adds the reader)."""
    c = Clock()
    monkeypatch.setattr(retry, "_now", c.now)
    monkeypatch.setattr(retry, "_sleep", c.sleep)
    return c


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return fake_clock(monkeypatch)


class Peer:
    """Each call is one attempt: a timeout (``TIMEOUT_S`` on the clock) or a refusal (instant)."""

    def __init__(self, clock: Clock, *, timeout: bool) -> None:
        self.clock, self.timeout = clock, timeout
        self.started: list[float] = []

    def __call__(self) -> str:
        self.started.append(self.clock.t)
        if self.timeout:
            self.clock.t += TIMEOUT_S
            raise RequestTimeoutError("127.0.0.1:10911", "pull", f"no response within {TIMEOUT_S:g}s")
        raise ConnectionFailedError("127.0.0.1:10911", "pull", "connection refused")


def _cfg(budget_s: float, retries: int = 5) -> ClientConfig:
    return ClientConfig(request_timeout_s=TIMEOUT_S, retries=retries, retry_budget_s=budget_s)


def test_a_peer_that_stopped_answering_costs_the_budget_counted_from_the_first_attempt(clock: Clock) -> None:
    peer = Peer(clock, timeout=True)
    t0 = clock.t
    with pytest.raises(RequestTimeoutError):
        retrying(peer, _cfg(30.0))
    assert clock.t - t0 <= 30.0  # was 10 s + 30 s + a last 10 s attempt: the budget began at the second
    assert len(peer.started) == 2  # a third timeout would have ended past the budget


def test_a_budget_shorter_than_a_request_timeout_makes_one_attempt(clock: Clock) -> None:
    peer = Peer(clock, timeout=True)
    with pytest.raises(RequestTimeoutError):
        retrying(peer, _cfg(5.0))
    assert len(peer.started) == 1


def test_quick_faults_are_retried_up_to_the_attempt_count_within_the_budget(clock: Clock) -> None:
    peer = Peer(clock, timeout=False)
    t0 = clock.t
    with pytest.raises(ConnectionFailedError):
        retrying(peer, _cfg(30.0, retries=5))
    assert len(peer.started) == 5
    assert clock.t - t0 < 30.0


def test_no_attempt_starts_past_the_budget_backoff_included(clock: Clock) -> None:
    peer = Peer(clock, timeout=False)
    t0 = clock.t
    with pytest.raises(ConnectionFailedError):
        retrying(peer, ClientConfig(retries=1000, retry_budget_s=3.0, backoff_max_s=2.0))
    assert len(peer.started) > 3
    assert all(s - t0 < 3.0 for s in peer.started), peer.started


def test_the_budget_counts_from_a_first_attempt_made_elsewhere(clock: Clock) -> None:
    # a pipelined request timed out 10 s after it went out: one more attempt fits a 30 s budget,
    # then no other
    sent = clock.t
    clock.t += TIMEOUT_S
    first = RequestTimeoutError("127.0.0.1:10911", "max offset", "no response within 10s")
    assert may_retry(first, _cfg(30.0), sent)
    peer = Peer(clock, timeout=True)
    with pytest.raises(RequestTimeoutError):
        retrying(peer, _cfg(30.0), started=sent)
    assert len(peer.started) == 1
    assert clock.t - sent <= 30.0
    # with 15 s, not even that one
    assert not may_retry(first, _cfg(15.0), sent)


def test_bounded_makes_a_timed_out_call_a_single_attempt_and_keeps_quick_retries(clock: Clock) -> None:
    slow, quick = Peer(clock, timeout=True), Peer(clock, timeout=False)
    with bounded(1.0):
        with pytest.raises(RequestTimeoutError):
            retrying(slow, _cfg(30.0))
        with pytest.raises(ConnectionFailedError):
            retrying(quick, _cfg(30.0))
        assert retry.retry_budget(_cfg(30.0)) == 1.0
        with bounded(5.0):  # nested: the smaller cap holds
            assert retry.retry_budget(_cfg(30.0)) == 1.0
    assert retry.retry_budget(_cfg(30.0)) == 30.0
    assert len(slow.started) == 1
    assert len(quick.started) > 1


def test_non_retriable_faults_and_single_attempt_configs_are_not_retried(clock: Clock) -> None:
    peer = Peer(clock, timeout=False)
    with pytest.raises(ConnectionFailedError):
        retrying(peer, _cfg(30.0, retries=1))
    assert len(peer.started) == 1
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise ValueError("not ours")

    with pytest.raises(ValueError):
        retrying(refused, _cfg(30.0))
    assert calls == [1]
