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


def test_a_groups_first_commit_of_a_topic_goes_alone_on_each_broker() -> None:
    # a 5.x broker builds a group's offset table of a topic on its first commit without a lock:
    # two first commits handled together keep only one of them (each broker has its own table)
    rounds: list[list[MessageQueue]] = []

    class Recorder(_Flaky):
        def update_consumer_offsets(self, group, offsets):  # type: ignore[no-untyped-def]
            rounds.append(sorted(offsets))
            return super().update_consumer_offsets(group, offsets)

    client = Recorder()
    client.fail = False
    store = BrokerOffsetStore(client, "g")
    a0, a1, b0, b1 = (MessageQueue("t", b, q) for b in ("a", "b") for q in (0, 1))
    assert store.commit({a0: 1, a1: 1, b0: 1, b1: 1}) == {}
    assert rounds == [[a0, b0], [a1, b1]]  # one per broker first, then the rest together
    rounds.clear()
    store.commit({a0: 2, a1: 2, b0: 2, b1: 2})
    assert rounds == [[a0, a1, b0, b1]]
    assert client.stored == {a0: 2, a1: 2, b0: 2, b1: 2}
