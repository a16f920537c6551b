"""Reader options and planning without Spark or sockets (a fake client)."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from rocketmq_spark.errors import DataLossError, OptionError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.sink import WriterOptions
from rocketmq_spark.source import Planner, ReaderOptions
from rocketmq_spark.source.reader import offsets_from_json, offsets_to_json


class FakeClient:
    def __init__(self, queues: dict[MessageQueue, tuple[int, int]]) -> None:
        self.ranges = dict(queues)  # mq -> (min, max)
        self.committed: dict[MessageQueue, int] = {}

    def message_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return sorted(q for q in self.ranges if q.topic == topic)

    def max_offset(self, mq: MessageQueue) -> int:
        return self.ranges[mq][1]

    def min_offset(self, mq: MessageQueue) -> int:
        return self.ranges[mq][0]

    def search_offset(self, mq: MessageQueue, ts: int) -> int:
        return min(self.ranges[mq][1], ts)  # "store time" == offset in this fake

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        return self.committed.get(mq)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        self.committed[mq] = offset

    def close(self) -> None:
        pass


def Q(i: int, broker: str = "broker-a", topic: str = "t") -> MessageQueue:
    return MessageQueue(topic, broker, i)


def _planner(client: FakeClient, **opts: str) -> Planner:
    base = {"namesrvAddr": "127.0.0.1:9876", "topic": "t", "consumerGroup": "g"}
    base.update(opts)
    return Planner(ReaderOptions.parse(base, stream=True), client)  # type: ignore[arg-type]


def test_offsets_json_is_canonical_and_round_trips() -> None:
    offs = {Q(1, "broker-b"): 5, Q(0): 7, Q(10): 1, Q(2, topic="a"): 3}
    js = offsets_to_json(offs)
    assert list(js) == ["a", "t"]
    assert list(js["t"]) == ["broker-a:0", "broker-a:10", "broker-b:1"]
    assert offsets_from_json(js) == offs


@pytest.mark.parametrize("opts, match", [
    ({"topic": ""}, "topic"),
    ({"startingOffsets": "sometime"}, "startingOffsets"),
    ({"startingOffsets": '{"other":{"broker-a:0":1}}'}, "is not read"),
    ({"startingOffsets": '{"t":{"a0":1}}'}, "broker"),
    ({"maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger"),
    ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"consumeFromWhere": "middle"}, "consumeFromWhere"),
    ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
    ({"namesrvAddr": "nohostport"}, "namesrvAddr"),
    ({"endingOffsets": "latest"}, "only by batch reads"),
    ({"pullbatchsize": "-3"}, "pullBatchSize"),
    ({"colour": "red"}, "unknown option"),
])
def test_invalid_reader_options_name_option_value_and_accepted(opts: dict[str, str], match: str) -> None:
    base = {"namesrvAddr": "127.0.0.1:9876", "topic": "t", "consumerGroup": "g"}
    base.update(opts)
    with pytest.raises(OptionError, match=match) as info:
        ReaderOptions.parse(base, stream=True)
    assert "accepted" in str(info.value) or "required" in str(info.value)


def test_stream_needs_a_group_and_keys_are_case_insensitive() -> None:
    with pytest.raises(OptionError, match="consumerGroup"):
        ReaderOptions.parse({"namesrvAddr": "h:1", "topic": "t"}, stream=True)
    o = ReaderOptions.parse({"NAMESRVADDR": "h:1;h2:2", "Topic": "a, b", "CONSUMERGROUP": "g",
                             "startingtimestamp": "2024-01-01T00:00:00Z"}, stream=True)
    assert o.namesrv_addr == ("h:1", "h2:2") and o.topics == ("a", "b") and o.starting_timestamp == 1704067200000


def test_invalid_writer_options() -> None:
    with pytest.raises(OptionError, match="delivery"):
        WriterOptions.parse({"namesrvAddr": "h:1", "delivery": "maybe"})
    with pytest.raises(OptionError, match="unknown option"):
        WriterOptions.parse({"namesrvAddr": "h:1", "tpoic": "x"})


def test_initial_offsets_from_group_with_consume_from_where_fallback() -> None:
    c = FakeClient({Q(0): (0, 10), Q(1): (2, 8)})
    c.committed[Q(0)] = 4
    assert _planner(c).initial() == {Q(0): 4, Q(1): 8}  # stream default: latest
    assert _planner(c, consumeFromWhere="earliest").initial() == {Q(0): 4, Q(1): 2}
    assert _planner(c, startingOffsets="earliest").initial() == {Q(0): 0, Q(1): 2}
    assert _planner(c, startingOffsets='{"t":{"broker-a:0":-1,"broker-a:1":5}}').initial() == {Q(0): 10, Q(1): 5}
    assert _planner(c, startingTimestamp="6").initial() == {Q(0): 6, Q(1): 6}


def test_admission_splits_the_budget_by_backlog() -> None:
    c = FakeClient({Q(0): (0, 100), Q(1): (0, 10), Q(2): (0, 0)})
    p = _planner(c)
    end = p.next_end({Q(0): 0, Q(1): 0, Q(2): 0}, ReadMaxRows(22))
    assert sum(end.values()) == 22 and end[Q(0)] == 20 and end[Q(1)] == 2 and end[Q(2)] == 0
    assert p.next_end({Q(0): 0, Q(1): 0, Q(2): 0}, ReadAllAvailable()) == {Q(0): 100, Q(1): 10, Q(2): 0}


def test_available_now_caps_at_the_target_and_new_queues_start_at_earliest() -> None:
    c = FakeClient({Q(0): (0, 10)})
    p = _planner(c)
    p.target = p.latest()
    c.ranges[Q(0)] = (0, 50)  # data arriving after the AvailableNow target
    c.ranges[Q(1)] = (3, 9)  # a queue added meanwhile
    end = p.next_end({Q(0): 0}, ReadAllAvailable())
    assert end[Q(0)] == 10
    parts = p.partitions({Q(0): 0}, end)
    assert [(x.mq, x.start, x.end) for x in parts] == [(Q(0), 0, 10), (Q(1), 3, 9)]


def test_data_loss_fails_or_skips() -> None:
    c = FakeClient({Q(0): (5, 10)})
    with pytest.raises(DataLossError, match=r"t/broker-a:0: offsets \[2, 5\)"):
        _planner(c).check_data_loss({Q(0): 2})
    assert _planner(c, failOnDataLoss="false").check_data_loss({Q(0): 2}) == {Q(0): 5}


def test_min_partitions_split_is_exact() -> None:
    c = FakeClient({Q(0): (0, 10), Q(1): (0, 3)})
    parts = _planner(c, minPartitions="5").partitions({Q(0): 0, Q(1): 0}, {Q(0): 10, Q(1): 3})
    covered: dict[MessageQueue, list[int]] = {}
    for x in parts:
        covered.setdefault(x.mq, []).extend(range(x.start, x.end))
    assert covered == {Q(0): list(range(10)), Q(1): list(range(3))}
    assert len(parts) >= 5


def test_commit_writes_min_unconsumed_offsets_and_never_goes_back() -> None:
    c = FakeClient({Q(0): (0, 100)})
    p = _planner(c)
    e1 = p.next_end({Q(0): 0}, ReadMaxRows(10))
    e2 = p.next_end(e1, ReadMaxRows(10))
    p.commit(e1)
    assert c.committed == {Q(0): 10}
    p.commit(e2)
    assert c.committed == {Q(0): 20}
    p.commit(e1)  # a stale commit never moves the broker offset back
    assert c.committed == {Q(0): 20}
