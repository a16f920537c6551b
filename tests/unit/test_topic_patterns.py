"""subscribePattern (rocketmq_spark.source.patterns and the planner's topics): which topics of the
name servers' list a pattern reads, and when the list changes."""

from __future__ import annotations

import pytest

from rocketmq_spark.errors import OptionError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.source import Planner, ReaderOptions
from rocketmq_spark.source.patterns import is_system_topic, matching_topics

LISTED = ["orders-eu", "orders-us", "orders", "xorders-eu", "%RETRY%orders-g", "%DLQ%orders-g", "TBW102",
          "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_REVIVE_LOG_DefaultCluster",
          "DefaultCluster", "DefaultCluster_REPLY_TOPIC", "broker-a", "OFFSET_MOVED_EVENT", "BenchmarkTest",
          "ns1%orders-eu", "ns1%payments"]


def test_a_pattern_matches_whole_names_and_never_a_system_topic() -> None:
    names = {"DefaultCluster", "broker-a"}
    assert matching_topics("orders-.*", LISTED, "", names) == ["orders-eu", "orders-us"]  # whole names: not xorders
    assert matching_topics(".*", LISTED, "", names) == ["ns1%orders-eu", "ns1%payments", "orders", "orders-eu",
                                                         "orders-us", "xorders-eu"]
    assert matching_topics(".*orders.*", LISTED, "", names) == ["ns1%orders-eu", "orders", "orders-eu", "orders-us",
                                                                "xorders-eu"]
    for t in ("%RETRY%g", "%DLQ%g", "TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "rmq_sys_wheel_timer",
              "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC"):
        assert is_system_topic(t), t
    assert is_system_topic("DefaultCluster_REPLY_TOPIC", names) and not is_system_topic("orders_REPLY_TOPIC", names)


def test_in_a_namespace_only_its_topics_match_by_the_names_its_users_know() -> None:
    assert matching_topics("orders-.*", LISTED, "ns1") == ["ns1%orders-eu"]
    assert matching_topics(".*", LISTED, "ns1") == ["ns1%orders-eu", "ns1%payments"]


@pytest.mark.parametrize(("opts", "stream", "match"), [
    ({"subscribePattern": "orders-(", "consumerGroup": "g"}, True, r"not a regular expression .*orders-\.\*"),
    ({"subscribePattern": "  ", "consumerGroup": "g"}, True, "regular expression matched against whole topic names"),
    ({"subscribePattern": "o.*", "topic": "t"}, False, "either topic .* or subscribePattern"),
    ({"subscribePattern": "o.*", "namesrvAddr": None, "endpoints": "127.0.0.1:8081"}, False, "use namesrvAddr"),
    ({"subscribePattern": "o.*", "startingOffsets": '{"payments":{"broker-a:0":1}}'}, False,
     "topics the option subscribePattern 'o.*' matches"),
])
def test_pattern_option_errors_name_the_option_value_and_what_is_accepted(opts: dict, stream: bool, match: str) -> None:
    base = {"namesrvAddr": "127.0.0.1:9876"}
    base.update({k: v for k, v in opts.items() if v is not None})
    if opts.get("namesrvAddr", "") is None:
        del base["namesrvAddr"]
    with pytest.raises(OptionError, match=match) as info:
        ReaderOptions.parse(base, stream=stream)
    assert info.value.option in ("subscribePattern", "topic", "startingOffsets")


class _Listing:
    """A client whose name servers list ``listed`` topics, each with one queue on ``broker-a``."""

    def __init__(self, listed: list[str]) -> None:
        self.listed = list(listed)
        self.routed = set(listed)
        self.alive = {"broker-a"}
        self.asked = 0  # topic lists asked

    def topic_list(self) -> list[str]:
        self.asked += 1
        return sorted(self.listed)

    def cluster_names(self) -> set[str]:
        return {"DefaultCluster", "broker-a"}

    def cluster_brokers(self) -> dict[str, str]:
        return {b: "127.0.0.1:10911" for b in self.alive}

    def message_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        from rocketmq_spark.errors import TopicNotFoundError
        if topic not in self.routed:
            raise TopicNotFoundError(17, f"no route of {topic}")
        return [MessageQueue(topic, "broker-a", 0)]


def test_the_planner_reads_new_matching_topics_keeps_restarting_ones_and_drops_deleted_ones() -> None:
    c = _Listing(["orders-eu", "payments", "%RETRY%g", "DefaultCluster"])
    opts = ReaderOptions.parse({"namesrvAddr": "127.0.0.1:9876", "subscribePattern": "orders-.*|Default.*",
                                "consumerGroup": "g", "commitOffsets": "false"}, stream=True)
    p = Planner(opts, c)  # type: ignore[arg-type]

    def trigger() -> Planner:  # the next trigger: the topic list is asked again
        p._listed_at = None  # type: ignore[attr-defined]
        return p

    assert [q.topic for q in trigger().queues()] == ["orders-eu"]
    c.listed.append("orders-us")  # created while the query runs; listed before it has a route
    assert [q.topic for q in trigger().queues()] == ["orders-eu"]
    c.routed.add("orders-us")
    assert [q.topic for q in trigger().queues()] == ["orders-eu", "orders-us"]
    # its broker restarting: the name servers drop its topics for a while; they are kept
    c.listed.remove("orders-eu")
    c.alive = set()
    assert trigger().topics() == ("orders-eu", "orders-us")
    # deleted: gone from the list while its broker is listed
    c.alive = {"broker-a"}
    asked = c.asked
    eu, us = MessageQueue("orders-eu", "broker-a", 0), MessageQueue("orders-us", "broker-a", 0)
    assert trigger().reading({eu: 5, us: 7}) == {us: 7}
    assert p.topics() == ("orders-us",) and [q.topic for q in p.queues()] == ["orders-us"]
    assert c.asked == asked + 1  # one topic list per trigger
    c.listed.append("orders-eu")  # created again: read again, as a new topic
    assert trigger().topics() == ("orders-eu", "orders-us")


def test_name_servers_out_of_reach_keep_the_matched_topics_read(caplog) -> None:
    import logging

    from rocketmq_spark.errors import AccessDeniedError, ConnectionFailedError

    c = _Listing(["orders-eu"])
    opts = ReaderOptions.parse({"namesrvAddr": "127.0.0.1:9876", "subscribePattern": "orders-.*",
                                "consumerGroup": "g", "commitOffsets": "false"}, stream=True)
    p = Planner(opts, c)  # type: ignore[arg-type]
    assert p.topics() == ("orders-eu",)
    down = ConnectionFailedError("127.0.0.1:9876", "topic list", "connection refused")

    def refused() -> list[str]:
        raise down

    c.topic_list = refused  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.source.planning"):
        for _ in range(3):  # a name server restarting: three triggers without a topic list
            p._listed_at = None  # type: ignore[attr-defined]
            assert p.topics() == ("orders-eu",)
            assert [q.topic for q in p.queues()] == ["orders-eu"]
    (warned,) = [r.getMessage() for r in caplog.records]  # once, not at every trigger
    assert "topic list cannot be had now" in warned and "orders-eu" in warned and "connection refused" in warned
    c.topic_list = lambda: ["orders-eu", "orders-us"]  # type: ignore[method-assign]
    c.routed.add("orders-us")
    p._listed_at = None  # type: ignore[attr-defined]
    assert p.topics() == ("orders-eu", "orders-us")  # back: new topics are found again

    def denied() -> list[str]:
        raise AccessDeniedError("refused", address="127.0.0.1:9876", operation="topic list")

    c.topic_list = denied  # type: ignore[method-assign]
    p._listed_at = None  # type: ignore[attr-defined]
    with pytest.raises(AccessDeniedError):  # not a fault to ride out
        p.topics()
