"""A writer task under a broker or name server that cannot be reached for a while (a restart),
on a fake clock: route lookups and sends are asked again for up to the writer's bound
(``_BROKER_DOWN_S``, the reader's brokerDownTimeoutMs default), then fail naming the
address and the operation. The fault suite found both: a name server restart failed every
task that started meanwhile (no route known to a task's new client), and a message group's
sends to a restarting Apache RocketMQ broker failed after about a second."""

from __future__ import annotations

from typing import Any

import pytest
from test_retry_budget import Clock
from test_writer_encode import _FakeClient, _opts, _sender

import rocketmq_spark.sink.writer as writer
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.errors import ConnectionFailedError, RocketMQSparkError
from rocketmq_spark.model import MessageQueue

DOWN_S = writer.BROKER_DOWN_S


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(writer.time, "monotonic", c.now)  # the time module: every user of it
    monkeypatch.setattr(writer.time, "sleep", c.sleep)
    return c


class _Down(_FakeClient):
    """Refuses route lookups until ``routes_at`` and sends to broker-a until ``sends_at``
    (fake-clock times), as a restarting name server and broker do."""

    def __init__(self, clock: Clock, *, routes_at: float = 0.0, sends_at: float = 0.0) -> None:
        super().__init__()
        self.clock, self.routes_at, self.sends_at = clock, routes_at, sends_at
        self.lookups = 0
        self.sends: list[tuple[float, MessageQueue]] = []

    def message_queues(self, topic: str, writable: bool = True, refresh: bool = False) -> list[MessageQueue]:
        self.lookups += 1
        if self.clock.t < self.routes_at:
            raise ConnectionFailedError("127.0.0.1:9876", f"route lookup of topic {topic!r}", "connection refused")
        return super().message_queues(topic, writable)

    def send_batch(self, mq: MessageQueue, entries: Any, **kw: Any) -> list[str]:
        self.sends.append((self.clock.t, mq))
        if self.clock.t < self.sends_at:
            raise ConnectionFailedError("127.0.0.1:10911", f"send to {mq}", "connection refused")
        return ["ok"]


def _ordered_send(mq: MessageQueue) -> writer._Send:
    return writer._Send(None, mq, [BatchEntry(b"row", "")], 0, "", True, "")


def test_a_task_starting_while_the_name_server_restarts_finds_its_route_once_it_is_back(clock: Clock) -> None:
    s = _sender(_opts())
    s.client = client = _Down(clock, routes_at=clock.t + 8.0)
    qs = s.queues("t")  # before: ConnectionFailedError at once, the task failed
    assert qs and clock.t >= client.routes_at and client.lookups > 1


def test_a_name_server_down_past_the_bound_fails_the_task_naming_it(clock: Clock) -> None:
    s = _sender(_opts())
    s.client = _Down(clock, routes_at=clock.t + DOWN_S + 60)
    start = clock.t
    with pytest.raises(ConnectionFailedError, match=r"route lookup of topic 't' to 127\.0\.0\.1:9876 failed"):
        s.queues("t")
    assert DOWN_S <= clock.t - start <= DOWN_S + 2.5


def test_a_message_groups_send_waits_on_its_queue_for_a_restarting_broker(clock: Clock) -> None:
    s = _sender(_opts())
    s.client = client = _Down(clock, sends_at=clock.t + 12.0)
    mq = MessageQueue("t", "broker-a", 2)
    first = ConnectionFailedError("127.0.0.1:10911", f"send to {mq}", "connection refused")
    assert s._retry(_ordered_send(mq), first) == ["ok"]  # before: failed after 3 attempts (< 1 s)
    assert {q for _, q in client.sends} == {mq}, "a message group's sends left its queue"
    assert client.sends[-1][0] >= client.sends_at


def test_a_broker_down_past_the_bound_fails_the_send_naming_it(clock: Clock) -> None:
    s = _sender(_opts())
    s.client = _Down(clock, sends_at=clock.t + DOWN_S + 60)
    mq = MessageQueue("t", "broker-a", 2)
    start = clock.t
    first = ConnectionFailedError("127.0.0.1:10911", f"send to {mq}", "connection refused")
    with pytest.raises(RocketMQSparkError, match=r"sending 1 messages to .*broker-a.*127\.0\.0\.1:10911"):
        s._retry(_ordered_send(mq), first)
    assert DOWN_S <= clock.t - start <= DOWN_S + 2.5


def test_other_send_errors_are_tried_three_times_as_before(clock: Clock) -> None:
    s = _sender(_opts())
    calls: list[float] = []

    def refused(mq: MessageQueue, entries: Any, **kw: Any) -> list[str]:
        calls.append(clock.t)
        raise RocketMQSparkError("broker busy")

    s.client.send_batch = refused  # type: ignore[method-assign]
    with pytest.raises(RocketMQSparkError, match="failed after 4 attempts"):
        s._retry(_ordered_send(MessageQueue("t", "broker-a", 0)), RocketMQSparkError("broker busy"))
    assert len(calls) == 3 and clock.t - 1000.0 < 2.0


def test_an_acl_refusal_fails_the_task_at_once_not_retried(clock: Clock) -> None:
    from concurrent.futures import Future

    from rocketmq_spark.errors import AuthorizationError

    s = _sender(_opts())
    s.client = client = _Down(clock)
    mq = MessageQueue("t", "broker-a", 0)
    refused: Future[Any] = Future()
    refused.set_exception(AuthorizationError(16, "user 'alice' may not Pub on Topic:t", user="alice",
                                             resource="Topic:t", action="Pub"))
    s._inflight.append(writer._Send(refused, mq, [BatchEntry(b"row", "")], 0, "", False, ""))
    start = clock.t
    with pytest.raises(AuthorizationError, match="may not Pub on Topic:t"):
        s._drain(0)
    assert client.sends == [] and clock.t == start  # no second attempt, no backoff
