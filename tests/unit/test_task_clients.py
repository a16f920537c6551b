"""Clients a Python worker keeps between read tasks (rocketmq_spark.source.task_clients)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rocketmq_spark.model import MessageQueue
from rocketmq_spark.source import task_clients
from rocketmq_spark.source.queue_range import QueueRange
from rocketmq_spark.source.task_clients import close_idle, kept_client


class _Client:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.fixture(autouse=True)
def _empty() -> Iterator[None]:
    close_idle()
    yield
    close_idle()


def _part(ns: str = "127.0.0.1:9876", namespace: str = "") -> QueueRange:
    return QueueRange(MessageQueue("T", "broker-a", 0), 0, 10, (ns,), None, "g", "*", 32, True, namespace=namespace)


def _run(part: QueueRange, made: list[_Client], fail: bool = False, take: int | None = None) -> _Client:
    used: list[Any] = []

    def read(c: Any) -> Iterator[int]:
        used.append(c)
        for i in range(3):
            if fail and i == 1:
                raise RuntimeError("pull failed")
            yield i

    def connect(_p: QueueRange) -> Any:
        made.append(_Client())
        return made[-1]

    it = kept_client(part, connect, read)
    if take is None:
        if fail:
            with pytest.raises(RuntimeError):
                list(it)
        else:
            assert list(it) == [0, 1, 2]
    else:
        for _ in range(take):
            next(it)
        it.close()  # type: ignore[attr-defined]
    return used[0]


def test_the_next_task_with_the_same_settings_reuses_the_client() -> None:
    made: list[_Client] = []
    first = _run(_part(), made)
    assert _run(_part(), made) is first and len(made) == 1 and first.closed == 0
    other = _run(_part(namespace="team"), made)  # other settings: a client of their own
    assert other is not first and len(made) == 2


def test_a_failed_or_unfinished_read_closes_its_client() -> None:
    made: list[_Client] = []
    failed = _run(_part(), made, fail=True)
    assert failed.closed == 1
    left = _run(_part(), made, take=1)
    assert left is not failed and left.closed == 1
    assert _run(_part(), made) not in (failed, left) and len(made) == 3


def test_idle_clients_are_closed_after_idle_s_and_at_most_keep_are_kept(monkeypatch) -> None:
    made: list[_Client] = []
    clients = [_run(_part(f"127.0.0.1:{9000 + i}"), made) for i in range(task_clients.KEEP + 2)]
    assert [c.closed for c in clients] == [1, 1] + [0] * task_clients.KEEP  # the oldest went
    now = task_clients.time.monotonic()
    monkeypatch.setattr(task_clients.time, "monotonic", lambda: now + task_clients.IDLE_S + 1)
    fresh = _run(_part("127.0.0.1:9999"), made)
    assert fresh is made[-1] and all(c.closed == 1 for c in clients)
