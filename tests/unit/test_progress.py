"""checkpoints/progress.py: a group's progress and lag per queue, against a client fake."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from rocketmq_spark.checkpoints import QueueLag, group_progress, queue_lag, queue_lags
from rocketmq_spark.client.many import SequentialManyQueueCalls
from rocketmq_spark.model import MessageQueue

T0 = 1_700_000_000_000  # the message at offset k was stored at T0 + k seconds


class _Cluster(SequentialManyQueueCalls):
    """Topics whose queues hold messages [min, max), and a group's committed offsets; counts
    the many-queue calls so a test can tell one pipelined call from one call per queue."""

    def __init__(self, queues: dict[MessageQueue, tuple[int, int]], committed: dict[MessageQueue, int]) -> None:
        self.queues = queues
        self.committed = committed
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        return [mq for mq in self.queues if mq.topic == topic]

    def min_offset(self, mq: MessageQueue) -> int:
        return self.queues[mq][0]

    def max_offset(self, mq: MessageQueue) -> int:
        return self.queues[mq][1]

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        return self.committed.get(mq) if group == "g" else None

    def offset_ranges(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        self._count("offset_ranges")
        return super().offset_ranges(mqs)

    def query_consumer_offsets(self, group: str, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        self._count("query_consumer_offsets")
        return super().query_consumer_offsets(group, mqs)

    def store_time_at(self, mq: MessageQueue, offset: int) -> int | None:
        self._count("store_time_at")
        lo, hi = self.queues[mq]
        return T0 + offset * 1000 if lo <= offset < hi else None


def _q(topic: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, "broker-a", queue_id)


def test_queue_lags_count_messages_and_the_wait_of_the_oldest_unread_one() -> None:
    behind, caught_up, trimmed = _q("T", 0), _q("T", 1), _q("T", 2)
    client = _Cluster({behind: (0, 10), caught_up: (0, 5), trimmed: (6, 9)}, {})
    now = T0 + 60_000
    lags = queue_lags(client, {behind: 4, caught_up: 5, trimmed: 2}, now)
    assert lags[behind] == QueueLag(behind, 4, 10, 6, now - (T0 + 4_000))
    assert lags[caught_up] == QueueLag(caught_up, 5, 5, 0, 0)
    # offsets 2-5 are gone: behind counts from the offset, the wait from the first message still there
    assert lags[trimmed] == QueueLag(trimmed, 2, 9, 7, now - (T0 + 6_000))
    assert client.calls == {"offset_ranges": 1, "store_time_at": 2}  # one range call; no pull when caught up
    assert queue_lag(client, behind, 4, now) == lags[behind]
    assert queue_lags(client, {}) == {}


def test_group_progress_shows_the_topics_the_group_committed_on() -> None:
    a0, a1, a2, b0 = _q("A", 0), _q("A", 1), _q("A", 2), _q("B", 0)
    client = _Cluster({a0: (0, 10), a1: (3, 8), a2: (0, 4), b0: (0, 7)}, {a0: 6, a2: 0})
    rows = group_progress(client, "g", ["A", "B"])
    assert [r.queue for r in rows] == [a0, a1, a2]  # B: the group never committed there
    assert [(r.min_offset, r.max_offset, r.consumer_offset, r.lag) for r in rows] == [
        (0, 10, 6, 4), (3, 8, None, 5), (0, 4, 0, 4)]  # never committed: the lag counts from the min
    # the last consumed message's store time; none before the first message or without a commit
    assert [r.last_store_time for r in rows] == [T0 + 5_000, None, None]
    assert client.calls == {"query_consumer_offsets": 1, "offset_ranges": 1, "store_time_at": 1}
    assert group_progress(client, "other", ["A", "B"]) == []
    assert group_progress(client, "g", []) == []


def test_the_progress_command_loads_no_spark() -> None:
    # what `rocketmq-spark progress` imports: the command line, then the library module
    code = ("import sys\nimport rocketmq_spark.cli, rocketmq_spark.checkpoints.progress\n"
            "print('\\n'.join(sys.modules))\n")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert "rocketmq_spark.checkpoints.progress" in loaded
    assert not [m for m in loaded if m.startswith(("pyspark", "rocketmq_spark.checkpoints.committer"))]
