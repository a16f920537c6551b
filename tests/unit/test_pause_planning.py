"""A broker that stops answering (a paused process: every request times out) under the
planner, a read task and the remoting client's route cache, on a fake clock: the query fails
within about brokerDownTimeoutMs plus one request timeout, counted from when the broker was
last heard of, and a name server that does not answer does not stop a query whose routes are
known. The Spark-level runs against both brokers are in tests/spark/test_pause.py."""

from __future__ import annotations

import json
import logging
import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable
from test_reader_planning import FakeClient, Q, _planner
from test_retry_budget import Clock, fake_clock

import rocketmq_spark.client.retry as retry
import rocketmq_spark.source.availability as availability
import rocketmq_spark.source.reader as reader
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.errors import BrokerUnavailableError, RequestTimeoutError
from rocketmq_spark.model import MessageQueue, PullResult
from rocketmq_spark.remoting.frame import RemotingCommand
from rocketmq_spark.source.pull_loop import PullLoop
from rocketmq_spark.source.queue_range import QueueRange

TIMEOUT_S = 10.0
B_ADDR = "127.0.0.1:10921"


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = fake_clock(monkeypatch)
    monkeypatch.setattr(time, "monotonic", c.now)  # the time module: every user of it
    monkeypatch.setattr(time, "sleep", c.sleep)
    return c


class PausedBrokerClient(FakeClient):
    """broker-b's process is paused while ``paused``: every request to it times out after
    ``TIMEOUT_S``, and each call retries as the real clients do (client/retry.py, with the
    reader's config)."""

    def __init__(self, queues: dict[MessageQueue, tuple[int, int]], clock: Clock, down_ms: int) -> None:
        super().__init__(queues)
        self.clock = clock
        self.config = ClientConfig(retry_budget_s=min(30.0, down_ms / 1000))  # the reader's clients
        self.paused = False
        self.calls: list[int] = []  # attempts per call to broker-b

    def _check(self, mq: MessageQueue, what: str) -> None:
        if not (self.paused and mq.broker == "broker-b"):
            return
        self.calls.append(0)

        def attempt() -> None:
            self.calls[-1] += 1
            self.clock.t += TIMEOUT_S
            raise RequestTimeoutError(B_ADDR, f"{what} of {mq}", f"no response within {TIMEOUT_S:g}s")

        retry.retrying(attempt, self.config)

    def max_offset(self, mq: MessageQueue) -> int:
        self._check(mq, "max offset")
        return super().max_offset(mq)

    def min_offset(self, mq: MessageQueue) -> int:
        self._check(mq, "min offset")
        return super().min_offset(mq)

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        self._check(mq, f"query offset of group {group!r}")
        return super().query_consumer_offset(group, mq)


def _trigger(p: reader.Planner, end: dict[MessageQueue, int]) -> dict[MessageQueue, int]:
    """What latestOffset asks of the planner each trigger."""
    p.find_resets(end)
    return p.next_end(p.check_data_loss(end), ReadAllAvailable())


@pytest.mark.parametrize("down_ms", [30_000, 5_000])
def test_a_paused_broker_fails_the_query_within_the_bound_plus_one_request_timeout(clock: Clock, down_ms: int,
                                                                                     caplog) -> None:
    a0, b0, b1 = Q(0), Q(0, "broker-b"), Q(1, "broker-b")
    client = PausedBrokerClient({a0: (0, 10), b0: (0, 10), b1: (0, 10)}, clock, down_ms)
    client.committed = {a0: 10, b0: 10, b1: 10}
    p = _planner(client, brokerDownTimeoutMs=str(down_ms))
    end = {a0: 10, b0: 10, b1: 10}
    p.find_resets(end)  # the run's first look at the group's offsets
    end = _trigger(p, end)
    client.paused = True
    paused_at = clock.t
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.source"):
        with pytest.raises(BrokerUnavailableError) as failed:
            for _ in range(10_000):
                assert _trigger(p, end) == end  # broker-b's queues wait at their offsets
                assert "broker broker-b unavailable" in caplog.text  # said as soon as it is found
                clock.t += 0.2  # the trigger interval
    took = clock.t - paused_at
    # was: 80 s of find_resets per trigger (a 10 s wait per queue after the retries), and the
    # wait counted from after them: 181 s with a 30 s bound
    assert took <= down_ms / 1000 + TIMEOUT_S + availability.REPROBE_S + 1, took
    msg = str(failed.value)
    assert "broker broker-b" in msg and B_ADDR in msg and "query offset of group" in msg, msg
    # a broker known to be down is asked again once, not through a chain of request timeouts
    assert all(n == 1 for n in client.calls[1:]), client.calls
    assert len(client.calls) == (1 if down_ms <= TIMEOUT_S * 1000 else 2), client.calls


def test_a_pull_that_times_out_counts_from_when_it_went_out(clock: Clock) -> None:
    mq = MessageQueue("T", "broker-b", 0)
    part = QueueRange(mq, 0, 100, ("127.0.0.1:9876",), None, "g", "*", 10, True, 5_000)
    sent: list[float] = []

    def start(offset: int) -> int:
        sent.append(clock.t)
        return offset

    def finish(offset: int) -> PullResult:
        if offset < 20:
            return PullResult("FOUND", offset + 10, 0, 100, b"x")
        clock.t += TIMEOUT_S  # paused: no answer
        raise RequestTimeoutError(B_ADDR, f"pull of {mq}", f"no response within {TIMEOUT_S:g}s")

    with pytest.raises(BrokerUnavailableError) as failed:
        for _res, _nxt in PullLoop(part, start, finish):
            pass
    # the pull at 20 went out before the pause was seen: the 5 s bound was over when its timeout
    # came (was: counted from then, so one more 10 s pull before failing)
    assert len(sent) == 3 and clock.t - sent[-1] == TIMEOUT_S
    assert "offset 20" in str(failed.value) and B_ADDR in str(failed.value)


def _route_body(topic: str) -> bytes:
    return json.dumps({"queueDatas": [{"brokerName": "broker-a", "readQueueNums": 2, "writeQueueNums": 2,
                                       "perm": 6}],
                       "brokerDatas": [{"brokerName": "broker-a", "cluster": "c",
                                        "brokerAddrs": {"0": "127.0.0.1:10911"}}]}).encode()


def test_a_name_server_that_does_not_answer_leaves_the_known_route_in_use(clock: Clock, monkeypatch,
                                                                          caplog) -> None:
    c = RemotingClient("127.0.0.1:9876")
    asked: list[str] = []
    silent = [False]

    def invoke_namesrv(cmd: RemotingCommand, operation: str, ok: tuple[int, ...] = (0,)) -> RemotingCommand:
        asked.append(operation)
        if silent[0]:
            clock.t += TIMEOUT_S
            raise RequestTimeoutError("127.0.0.1:9876", operation, f"no response within {TIMEOUT_S:g}s")
        return RemotingCommand(0, body=_route_body(cmd.ext_fields["topic"]))

    monkeypatch.setattr(c.names, "invoke", invoke_namesrv)
    first = c.message_queues("T", refresh=True)
    silent[0] = True
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.client"):
        t0 = clock.t
        assert c.message_queues("T", refresh=True) == first  # one round of the name servers, no retries
        assert clock.t - t0 == TIMEOUT_S
        assert "using the route of topic T" in caplog.text
        for _ in range(20):  # the planner asks every trigger: the name servers are not waited for again
            assert c.message_queues("T", refresh=True) == first
            clock.t += 0.2
        assert len(asked) == 2
        assert c.broker_addr("broker-a", "T") == "127.0.0.1:10911"
        # asked again once route_refresh_s has passed; answering again is said
        clock.t += c.config.route_refresh_s
        silent[0] = False
        assert c.message_queues("T", refresh=True) == first
        assert len(asked) == 3 and "answer again" in caplog.text
    # a topic never looked up has no route to fall back on: the lookup fails (bounded retries)
    silent[0] = True
    with pytest.raises(RequestTimeoutError):
        c.message_queues("OTHER", refresh=True)


def test_planned_ranges_carry_the_brokers_address_and_how_long_it_has_been_silent(clock: Clock) -> None:
    a0, b0 = Q(0), Q(0, "broker-b")
    client = PausedBrokerClient({a0: (0, 10), b0: (0, 10)}, clock, 60_000)
    p = _planner(client, brokerDownTimeoutMs="60000")
    start = {a0: 0, b0: 0}
    end = p.next_end(start, ReadAllAvailable())
    ranges = p.partitions(start, end)
    # a read task goes straight to the broker: a name server that does not answer cannot stop it
    assert [(r.mq, r.broker_addr, r.broker_silent_s) for r in ranges] == [
        (a0, "addr-of-broker-a", 0.0), (b0, "addr-of-broker-b", 0.0)]
    client.paused = True
    p.check_data_loss(start)  # broker-b found not answering
    clock.t += 3
    silent = {r.mq: r.broker_silent_s for r in p.partitions(start, end)}
    assert silent[a0] == 0.0 and silent[b0] >= 3 + TIMEOUT_S


def test_a_task_of_a_broker_the_planner_found_silent_counts_from_then(clock: Clock) -> None:
    mq = MessageQueue("T", "broker-b", 0)
    part = QueueRange(mq, 0, 100, ("127.0.0.1:9876",), None, "g", "*", 10, True, 30_000,
                      broker_addr=B_ADDR, broker_silent_s=25.0)
    attempts: list[float] = []

    def finish(offset: int) -> PullResult:
        attempts.append(clock.t)
        clock.t += TIMEOUT_S
        raise RequestTimeoutError(B_ADDR, f"pull of {mq}", f"no response within {TIMEOUT_S:g}s")

    with pytest.raises(BrokerUnavailableError, match=r"unreachable for 35s"):
        list(PullLoop(part, lambda off: off, finish))
    assert len(attempts) == 1  # 25 s silent before the task, 10 s more: past the 30 s bound


def test_commits_leave_an_unreachable_broker_alone_until_retry_after_or_until_it_answers(clock: Clock) -> None:
    from rocketmq_spark.checkpoints import BrokerOffsetStore
    from rocketmq_spark.client.many import SequentialManyQueueCalls

    asked: list[MessageQueue] = []
    stored: dict[MessageQueue, int] = {}
    paused = [True]

    class Client(SequentialManyQueueCalls):
        def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
            asked.append(mq)
            if paused[0] and mq.broker == "broker-b":
                clock.t += TIMEOUT_S
                raise RequestTimeoutError(B_ADDR, f"update offset of {mq}", "no response within 10s")
            stored[mq] = offset

    a0, b0 = Q(0), Q(0, "broker-b")
    store = BrokerOffsetStore(Client(), "g", retry_after_s=5.0)
    assert set(store.commit({a0: 1, b0: 1})) == {b0}
    assert set(store.commit({a0: 2, b0: 2})) == {b0}  # every batch: broker-b is not waited for again
    assert asked.count(b0) == 1 and stored == {a0: 2} and store.pending == {b0: 2}
    clock.t += 5.0
    assert set(store.commit({a0: 3})) == {b0}  # asked again once retry_after_s passed
    assert asked.count(b0) == 2
    paused[0] = False
    store.answered("broker-b")  # the planner heard from it: the next commit goes at once
    assert store.commit({a0: 4}) == {}
    assert stored == {a0: 4, b0: 2} and store.pending == {}


def test_a_broker_back_in_the_routes_just_past_the_bound_is_asked_before_failing(clock: Clock) -> None:
    from test_reader_planning import FlakyBrokerClient

    a0, b0 = Q(0), Q(0, "broker-b")
    client = FlakyBrokerClient({a0: (0, 10), b0: (0, 10)})
    p = _planner(client, brokerDownTimeoutMs="5000")
    end = p.next_end({a0: 0, b0: 0}, ReadAllAvailable())
    client.routed = False  # restarting: gone from the routes
    assert p.next_end(end, ReadAllAvailable()) == end
    clock.t += 5.1
    client.routed = True  # registered again: it answers
    assert p.next_end(end, ReadAllAvailable()) == end
