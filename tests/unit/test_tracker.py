"""InFlightTracker: the min-unconsumed-offset rule under any completion order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rocketmq_spark.checkpoints import BrokerOffsetStore, InFlightTracker
from rocketmq_spark.client.many import SequentialManyQueueCalls
from rocketmq_spark.errors import ConnectionFailedError
from rocketmq_spark.model import MessageQueue


def test_out_of_order_completion_holds_at_the_earliest_open_range() -> None:
    t = InFlightTracker()
    for s, e in ((0, 10), (10, 20), (20, 30)):
        t.register("q", s, e)
    assert t.committable("q") == 0  # nothing processed: the start itself
    t.complete("q", 20, 30)
    assert t.committable("q") == 0
    t.complete("q", 0, 10)
    assert t.committable("q") == 10
    t.complete("q", 10, 20)
    assert t.committable("q") == 30


@given(st.lists(st.integers(1, 50), min_size=1, max_size=30), st.randoms())
def test_never_commits_past_an_unprocessed_message_and_never_goes_back(sizes: list[int], rnd) -> None:
    t = InFlightTracker()
    ranges, start = [], 0
    for n in sizes:
        ranges.append((start, start + n))
        t.register("q", start, start + n)
        start += n
    order = ranges[:]
    rnd.shuffle(order)
    done: set[tuple[int, int]] = set()
    last = -1
    for r in order:
        t.complete("q", *r)
        done.add(r)
        c = t.committable("q")
        assert c is not None
        # every message below c was processed
        assert all(r2 in done for r2 in ranges if r2[0] < c)
        assert c >= last
        last = c
    assert last == start


class _Flaky(SequentialManyQueueCalls):
    def __init__(self) -> None:
        self.fail = True
        self.stored: dict[MessageQueue, int] = {}

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        return self.stored.get(mq)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        if self.fail:
            raise ConnectionFailedError("127.0.0.1:1", "update offset")
        self.stored[mq] = offset


def test_failed_commit_is_retried_at_the_next_commit() -> None:
    client = _Flaky()
    store = BrokerOffsetStore(client, "g")
    mq = MessageQueue("t", "b", 0)
    failed = store.commit({mq: 5})
    assert mq in failed and store.pending == {mq: 5}
    client.fail = False
    assert store.commit({}) == {}
    assert client.stored == {mq: 5} and store.pending == {}
