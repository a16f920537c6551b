"""The search of a queue's offset by time: brokers before 5.1.1 answer the message stored nearest
to the time (4.9.7's ConsumeQueue.getOffsetInQueueByTime), and the client corrects that answer
to the first message stored at or after it, as 5.1.1 and later answer (BoundaryType.LOWER)."""

from __future__ import annotations

import bisect

import pytest

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting import RemotingCommand, RequestCode, ResponseCode

MQ = MessageQueue("T", "broker-a", 0)


def _nearest(times: list[int], ts: int, lo: int) -> int:
    """What a 4.9 broker answers: an exact match (any of equals), else the closer neighbour,
    the last message when every one is older, the first when every one is newer."""
    if lo == len(times):
        return 0  # an empty queue
    after = bisect.bisect_left(times, ts, lo)
    if after < len(times) and times[after] == ts:
        return bisect.bisect_right(times, ts, lo) - 1  # the last of equals: not the first
    if after == lo:
        return lo
    if after == len(times):
        return len(times) - 1
    return after if ts - times[after - 1] > times[after] - ts else after - 1


class FakeQueue:
    """One queue's store times on a broker of ``version`` (407: 4.9.7, 513: 5.5.0)."""

    def __init__(self, times: list[int], version: int, lo: int = 0) -> None:
        self.times, self.version, self.lo = times, version, lo
        self.pulls = 0

    def install(self, client: RemotingClient) -> None:
        def mq_call(mq, code, ext, operation, ok=(ResponseCode.SUCCESS,), started=None):  # type: ignore[no-untyped-def]
            assert code == RequestCode.SEARCH_OFFSET_BY_TIMESTAMP
            ts = int(ext["timestamp"])
            offset = (_nearest(self.times, ts, self.lo) if self.version < 435
                      else bisect.bisect_left(self.times, ts, self.lo))
            return RemotingCommand(ResponseCode.SUCCESS, ext_fields={"offset": str(offset)}, version=self.version)

        def store_time_at(mq: MessageQueue, offset: int) -> int | None:
            self.pulls += 1
            return self.times[offset] if self.lo <= offset < len(self.times) else None

        client._mq_call = mq_call  # type: ignore[method-assign]
        client.store_time_at = store_time_at  # type: ignore[method-assign]
        client.min_offset = lambda mq: self.lo  # type: ignore[method-assign]
        client.max_offset = lambda mq: len(self.times)  # type: ignore[method-assign]


def _search(queue: FakeQueue, ts: int) -> int:
    client = RemotingClient("127.0.0.1:9876")  # connects on first use only: never here
    queue.install(client)
    return client.search_offset(MQ, ts)


TIMES = [100, 110, 110, 110, 120, 150, 150, 200, 260, 261]


@pytest.mark.parametrize("ts", [0, 100, 101, 105, 109, 110, 111, 119, 120, 121, 149, 150, 151, 199, 200, 201,
                                259, 260, 261, 262, 10_000])
@pytest.mark.parametrize("version", [407, 513])
def test_the_first_message_stored_at_or_after_the_time_on_every_broker(ts: int, version: int) -> None:
    want = bisect.bisect_left(TIMES, ts)
    assert _search(FakeQueue(TIMES, version), ts) == want


def test_a_4_9_answer_before_the_time_is_corrected_and_a_5_5_answer_is_taken_as_it_is() -> None:
    assert _nearest(TIMES, 110, 0) == 3  # the fake answers the last of the 110s: not the first
    assert _nearest(TIMES, 140, 0) == 5 and _nearest(TIMES, 130, 0) == 4  # after it, or before it
    old = FakeQueue(TIMES, 407)
    assert _search(old, 130) == 5 and old.pulls > 0
    new = FakeQueue(TIMES, 513)
    assert _search(new, 130) == 5 and new.pulls == 0  # 5.1.1 and later: no pulls


def test_a_queue_whose_head_was_deleted_and_one_empty_queue() -> None:
    head_gone = [0, 0, 0] + TIMES[3:]  # offsets below 3 deleted by retention
    assert _search(FakeQueue(head_gone, 407, lo=3), 50) == 3
    assert _search(FakeQueue(head_gone, 407, lo=3), 121) == 5
    assert _search(FakeQueue([], 407), 50) == 0


def test_a_burst_in_one_millisecond_is_searched_in_few_pulls() -> None:
    times = [10] * 5 + [20] * 5000 + [30] * 5
    queue = FakeQueue(times, 407)
    assert _search(queue, 20) == 5  # 4.9 answers one of the 5000 20s
    assert queue.pulls <= 2 * 13 + 2  # galloping and halving: logarithmic in the burst
