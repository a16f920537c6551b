"""A read task's pull loop against a broker that serves fewer messages per pull than asked
(Apache RocketMQ caps a pull at 32): pulls ahead at computed offsets, and every offset read
once, in order, when an answer breaks the computed offsets (a byte cap, a short queue)."""

from __future__ import annotations

import pytest

from rocketmq_spark.model import MessageQueue, PullResult
from rocketmq_spark.source.pull_loop import PullLoop
from rocketmq_spark.source.queue_range import QueueRange

MQ = MessageQueue("T", "broker-a", 0)


def _part(start: int, end: int, batch: int = 1024) -> QueueRange:
    return QueueRange(MQ, start, end, ("127.0.0.1:9876",), None, "g", "*", batch, True, 60_000)


class CappedBroker:
    """Serves at most ``cap`` messages a pull (``short`` maps an offset to a smaller answer)."""

    def __init__(self, cap: int, max_offset: int, short: dict[int, int] | None = None) -> None:
        self.cap, self.max_offset, self.short = cap, max_offset, short or {}
        self.asked: list[int] = []
        self.groups: list[int] = []  # sizes of the groups of pulls sent at once
        self.in_flight = self.most_in_flight = 0

    def start(self, offset: int) -> int:
        self.asked.append(offset)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        return offset

    def finish(self, offset: int) -> PullResult:
        self.in_flight -= 1
        n = min(self.short.get(offset, self.cap), self.max_offset - offset)
        return PullResult("FOUND", offset + n, 0, self.max_offset, b"m" * n)


def _read(part: QueueRange, b: CappedBroker, ahead: int, many: bool = False) -> list[int]:
    """The planned offsets each yielded answer covers, in yield order (the last pull may go past
    the range's end: the decoder drops those rows); ``many``: pulls ahead go out in groups."""
    got: list[int] = []

    def start_many(offsets: list[int]) -> list[int]:
        b.groups.append(len(offsets))
        return [b.start(off) for off in offsets]

    for res, nxt in PullLoop(part, b.start, b.finish, ahead, start_many if many else None):
        got.extend(range(nxt - len(res.body), min(nxt, part.end)))
    return got


@pytest.mark.parametrize("many", [False, True])
def test_a_capped_broker_gets_pulls_ahead_and_every_offset_once(many: bool) -> None:
    b = CappedBroker(cap=32, max_offset=10_000)
    assert _read(_part(100, 5_000), b, ahead=8, many=many) == list(range(100, 5_000))
    assert b.most_in_flight == 8
    assert all(100 <= off < 5_000 for off in b.asked)  # nothing asked outside the planned range
    assert len(b.asked) == len(set(b.asked)) == -(-4_900 // 32)  # each pull once
    if many:  # half a window (or more) at a time, never one by one once the cap is known
        assert b.groups and min(b.groups[:-1]) >= 4


@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("short_at", [132, 164, 4_964])
def test_an_answer_shorter_than_the_cap_drops_the_pulls_ahead_and_goes_on_from_its_end(short_at: int,
                                                                                      many: bool) -> None:
    b = CappedBroker(cap=32, max_offset=10_000, short={short_at: 5})
    assert _read(_part(100, 5_000), b, ahead=8, many=many) == list(range(100, 5_000))
    assert short_at + 5 in b.asked  # pulled again from where the short answer ended


def test_a_broker_serving_all_that_is_asked_gets_one_pull_ahead() -> None:
    b = CappedBroker(cap=1024, max_offset=100_000)
    assert _read(_part(0, 50_000), b, ahead=8) == list(range(50_000))
    assert b.most_in_flight == 1


def test_without_pulls_ahead_one_pull_is_in_flight() -> None:
    b = CappedBroker(cap=32, max_offset=10_000)
    assert _read(_part(0, 1_000), b, ahead=1) == list(range(1_000))
    assert b.most_in_flight == 1
