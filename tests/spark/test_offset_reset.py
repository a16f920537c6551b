"""A running streaming query is a member of its consumer group (issue 20): the brokers list it
as an online consumer, and a reset of the group's offsets (rocketmq-spark reset-offset, or
mqadmin resetOffsetByTime on the real broker) is followed by its next batch (onOffsetReset),
on the embedded broker and on Apache RocketMQ."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from brokers import wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _send(client: RemotingClient, topic: str, prefix: str, n: int) -> None:
    qs = client.message_queues(topic)
    for i in range(n):
        client.send_batch(qs[i % len(qs)], [BatchEntry(f"{prefix}{i}".encode())])


def _start(spark, transport, topic: str, group: str, ck: str, name: str = "", **opts: str):  # type: ignore[no-untyped-def]
    reader = (spark.readStream.format("rocketmq").options(**transport.options).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", "earliest"))
    for k, v in opts.items():
        reader = reader.option(k, v)
    return (reader.load().selectExpr("CAST(body AS STRING) AS body")
            .writeStream.format("memory").queryName(name or f"q_{group}").option("checkpointLocation", ck)
            .trigger(processingTime="300 milliseconds").start())


def _bodies(spark, group: str) -> Counter[str]:  # type: ignore[no-untyped-def]
    return Counter(r.body for r in spark.sql(f"select body from q_{group}").collect())


def _reset(broker, client: RemotingClient, group: str, topic: str, ts: int, how: str) -> None:  # type: ignore[no-untyped-def]
    if how == "mqadmin":
        broker.real.mqadmin("resetOffsetByTime", "-g", group, "-t", topic, "-s", str(ts))
    else:  # what `rocketmq-spark reset-offset` sends
        client.reset_offset_by_timestamp(group, topic, ts)


def _wait_for(q, pred, what: str, timeout_s: float = 90) -> None:  # type: ignore[no-untyped-def]
    def ok() -> bool:
        assert q.isActive, f"the query stopped: {q.exception()}"
        return bool(pred())

    assert wait_until(ok, timeout_s, 0.2), what


def _follow_resets(spark, broker, client, transport, tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    topic, group = broker.create_topic(transport(f"RESET_FOLLOW_{how.upper()}"), queues=2), transport(f"g_rf_{how}")
    _send(client, topic, "a", 10)
    time.sleep(0.05)  # store times in ms: the cut lies strictly between a* and b*
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    _send(client, topic, "b", 10)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"))
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 20, "the first 20 messages")
        # the first batch (a*, b*) is committed when Spark plans the next one (c*)
        qs = client.message_queues(topic)
        _send(client, topic, "c", 2)
        _wait_for(q, lambda: [client.query_consumer_offset(group, m) for m in qs] == [10, 10],
                  "the group's commits")
        _reset(broker, client, group, topic, cut, how)
        want = Counter({f"a{i}": 1 for i in range(10)} | {f"b{i}": 2 for i in range(10)} | {"c0": 2, "c1": 2})
        _wait_for(q, lambda: _bodies(spark, group) == want, "b* and c* read once more after the reset",
                  timeout_s=60)
        # reset to now: nothing is read again, what comes later is read once
        _reset(broker, client, group, topic, int(time.time() * 1000), how)
        time.sleep(1.5)  # several triggers: a reset to now must not bring anything again
        assert _bodies(spark, group) == want
        _send(client, topic, "d", 4)
        want.update({f"d{i}": 1 for i in range(4)})
        _wait_for(q, lambda: _bodies(spark, group) == want, "the messages after the reset, once")
    finally:
        q.stop()


@pytest.mark.transports(embedded=("remoting", "grpc"), real=("remoting",))
def test_a_running_query_follows_a_reset_to_an_earlier_time_then_to_now(spark, broker, client, transport,
                                                                        tmp_path) -> None:
    _follow_resets(spark, broker, client, transport, tmp_path, "client")


@pytest.mark.brokers("real")
@pytest.mark.transports(real=("remoting",))
def test_a_running_query_follows_mqadmin_reset_offset_by_time(spark, broker, client, transport, tmp_path) -> None:
    _follow_resets(spark, broker, client, transport, tmp_path, "mqadmin")


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_on_offset_reset_fail_stops_the_query_naming_the_group_and_offsets(spark, broker, client, transport,
                                                                           tmp_path) -> None:
    topic, group = broker.create_topic(transport("RESET_FAIL"), queues=1), transport("g_reset_fail")
    _send(client, topic, "a", 5)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"), onOffsetReset="fail")
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 5, "the first messages")
        qs = client.message_queues(topic)
        _send(client, topic, "b", 1)
        _wait_for(q, lambda: client.query_consumer_offset(group, qs[0]) == 5, "the group's first commit")
        client.reset_offset_by_timestamp(group, topic, 0)
        assert wait_until(lambda: not q.isActive, 60, 0.2), "the query kept running after the reset"
        err = str(q.exception())
        assert "onOffsetReset=fail" in err and group in err and "-> 0" in err, err
    finally:
        q.stop()


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_running_query_is_an_online_consumer_of_its_group(spark, broker, client, transport, tmp_path) -> None:
    topic, group = broker.create_topic(transport("RESET_MEMBER"), queues=2), transport("g_member")
    _send(client, topic, "a", 4)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"))
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 4, "the messages")
        ids = client.consumer_ids(group, broker.broker_addr, broker.broker_name)
        assert len(ids) == 1 and ids[0].startswith("rocketmq-spark@"), ids
        if broker.is_real:
            out = broker.real.mqadmin("consumerConnection", "-g", group)
            assert ids[0] in out and "CONSUME_ACTIVELY" in out and topic in out, out
        # a second query in the same group is refused while this one runs
        q2 = _start(spark, transport, topic, group, str(tmp_path / "ck2"), name="q_member_second")
        assert wait_until(lambda: not q2.isActive, 60, 0.2)
        assert "online consumers" in str(q2.exception()) and ids[0] in str(q2.exception())
    finally:
        q.stop()
    assert wait_until(lambda: client.consumer_ids(group, broker.broker_addr, broker.broker_name) == [], 30), \
        "the stopped query is still listed"
