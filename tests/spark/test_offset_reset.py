"""A running streaming query is a member of its consumer group (issue 20): the brokers list it
as an online consumer, and a reset of the group's offsets (rocketmq-spark reset-offset, or
mqadmin resetOffsetByTime on the real broker) is followed by its next batch (onOffsetReset),
on the embedded broker and on Apache RocketMQ."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager

import pytest

from brokers import Target, Transport, queued, settles_at, wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _send(client: RemotingClient, topic: str, prefix: str, n: int) -> None:
    """Sends <prefix>0..<prefix>n-1 and returns once the topic's consume queues hold them."""
    qs = client.message_queues(topic)
    before = queued(client, topic)
    for i in range(n):
        client.send_batch(qs[i % len(qs)], [BatchEntry(f"{prefix}{i}".encode())])
    assert settles_at(client, topic, before + n) == before + n


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


def _wait_for(q, pred, what, timeout_s: float = 90) -> None:  # type: ignore[no-untyped-def]
    def ok() -> bool:
        assert q.isActive, f"the query stopped: {q.exception()}"
        return bool(pred())

    assert wait_until(ok, timeout_s, 0.2), what() if callable(what) else what


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
        # the first batch (a*, b*) is committed when Spark plans the next one (c*), then c*
        qs = client.message_queues(topic)
        _send(client, topic, "c", 2)
        # c* read before the reset: the reset must re-read them, not read one the first time (the
        # full suite caught c1 planned only after the reset, read once where the test wanted twice)
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 22, "c0 and c1")

        def committed_past_b() -> bool:  # 10 after the first batch, 11 once c* is committed too
            return all((client.query_consumer_offset(group, m) or 0) >= 10 for m in qs)

        _wait_for(q, committed_past_b, lambda: f"the group's commits: it holds "
                  f"{[client.query_consumer_offset(group, m) for m in qs]}; last progress {q.lastProgress}",
                  timeout_s=150)
        _reset(broker, client, group, topic, cut, how)
        want = Counter({f"a{i}": 1 for i in range(10)} | {f"b{i}": 2 for i in range(10)} | {"c0": 2, "c1": 2})
        _wait_for(q, lambda: _bodies(spark, group) == want, lambda: f"b* and c* read once more after the reset: "
                  f"read {_bodies(spark, group) - want} more, {want - _bodies(spark, group)} missing; the group "
                  f"holds {[client.query_consumer_offset(group, m) for m in qs]}; last progress {q.lastProgress}",
                  timeout_s=60)
        # reset to now: nothing is read again, what comes later is read once (a re-read would come
        # at the first trigger after the reset, before or with d*: the exact counts below see it)
        _reset(broker, client, group, topic, int(time.time() * 1000), how)
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
        _wait_for(q, lambda: (client.query_consumer_offset(group, qs[0]) or 0) >= 5, "the group's first commit")
        client.reset_offset_by_timestamp(group, topic, 0)
        assert wait_until(lambda: not q.isActive, 60, 0.2), "the query kept running after the reset"
        err = str(q.exception())
        assert "onOffsetReset=fail" in err and group in err and "-> 0" in err, err
    finally:
        q.stop()


@contextmanager
def _member_query(spark, broker, client, transport, tmp_path, name: str):  # type: ignore[no-untyped-def]
    """A running query of a new group on a 2-queue topic, past its first commit: (query, topic,
    group, the client ids the broker lists for the group); stopped on exit, then no longer listed."""
    topic, group = broker.create_topic(transport(f"MEMBER_{name.upper()}"), queues=2), transport(f"g_member_{name}")
    _send(client, topic, "a", 4)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"))
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 4, "the messages")
        qs = client.message_queues(topic)
        _send(client, topic, "b", 2)  # a second batch: Spark commits the first
        _wait_for(q, lambda: all((client.query_consumer_offset(group, m) or 0) >= 2 for m in qs),
                  "the first commit")
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 6, "the second batch")
        yield q, topic, group, client.consumer_ids(group, broker.broker_addr, broker.broker_name)
    finally:
        q.stop()
    assert wait_until(lambda: client.consumer_ids(group, broker.broker_addr, broker.broker_name) == [], 30), \
        "the stopped query is still listed"


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_running_query_is_an_online_consumer_of_its_group(spark, broker, client, transport, tmp_path) -> None:
    with _member_query(spark, broker, client, transport, tmp_path, "online") as (q, topic, group, ids):
        assert len(ids) == 1 and ids[0].startswith("rocketmq-spark@"), ids
        # our progress shows what the running query planned and processed, per queue
        got = json.loads(subprocess.run([sys.executable, "-m", "rocketmq_spark", "progress", "-g", group, "-t",
                                         topic, "--json", "-n", broker.namesrv_addr], capture_output=True,
                                        text=True, check=True).stdout)
        assert got["onlineConsumers"] == 1
        seen = {r["queueId"]: r["consumers"] for r in got["queues"]}
        assert all(v[0]["clientId"] == ids[0] and v[0]["planned"] == 3 and v[0]["processed"] >= 2
                   for v in seen.values()) and len(seen) == 2, seen
        # a second query in the same group is refused while this one runs
        q2 = _start(spark, transport, topic, group, str(tmp_path / "ck2"), name="q_member_second")
        assert wait_until(lambda: not q2.isActive, 60, 0.2)
        assert "online consumers" in str(q2.exception()) and ids[0] in str(q2.exception())


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_rocketmqs_own_tools_list_a_running_query_and_its_queues(spark, broker, client, transport, tmp_path,
                                                                 real_rocketmq) -> None:
    # mqadmin from the real-broker fixture, pointed at either broker's name server
    with _member_query(spark, broker, client, transport, tmp_path, "tools") as (_q, topic, group, ids):
        out = real_rocketmq.mqadmin("consumerConnection", "-g", group, namesrv=broker.namesrv_addr)
        assert ids[0] in out and "CONSUME_ACTIVELY" in out and topic in out, out
        status = real_rocketmq.mqadmin("consumerStatus", "-g", group, "-i", ids[0], namesrv=broker.namesrv_addr)
        details = [line for line in status.splitlines() if line.startswith(topic) and "ProcessQueueInfo" in line]
        assert len(details) == 2 and all("cachedMsgMaxOffset=3" in d for d in details), status


def test_a_reset_pushed_by_a_4x_style_broker_is_followed(spark, tmp_path) -> None:
    # server-side resets off (4.x, or a 5.x broker with useServerSideResetOffset=false): the
    # broker writes the offsets and pushes RESET_CONSUMER_CLIENT_OFFSET to the online consumers
    from rocketmq_spark.broker import EmbeddedBroker

    with EmbeddedBroker(server_side_reset=False) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            c.create_topic("RESET_PUSHED", 1)
            _send(c, "RESET_PUSHED", "a", 3)
            where = Transport.over("remoting", Target.of_embedded(mq))
            # commitOffsets=false: the group's offsets are not compared, only the push can tell
            q = _start(spark, where, "RESET_PUSHED", "g_pushed", str(tmp_path / "ck"), commitOffsets="false")
            try:
                _wait_for(q, lambda: sum(_bodies(spark, "g_pushed").values()) == 3, "the messages")
                _send(c, "RESET_PUSHED", "b", 1)
                _wait_for(q, lambda: sum(_bodies(spark, "g_pushed").values()) == 4, "the next message")
                written = c.reset_offset_by_timestamp("g_pushed", "RESET_PUSHED", 0)  # to the start
                assert list(written.values()) == [0]
                want = Counter({"a0": 2, "a1": 2, "a2": 2, "b0": 2})
                _wait_for(q, lambda: _bodies(spark, "g_pushed") == want, "everything read once more", 60)
            finally:
                q.stop()
        finally:
            c.close()


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_reset_made_while_the_query_was_stopped_is_followed_at_restart(spark, broker, client, transport,
                                                                         tmp_path) -> None:
    topic, group = broker.create_topic(transport("RESET_STOPPED"), queues=1), transport("g_reset_stopped")
    _send(client, topic, "a", 4)
    ck, out = str(tmp_path / "ck"), str(tmp_path / "out")

    def run() -> Counter[str]:  # the sink's rows so far (the memory sink cannot restart)
        q = (spark.readStream.format("rocketmq").options(**transport.options).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest").load()
             .selectExpr("CAST(body AS STRING) AS body")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None, q.exception()
        return Counter(r.body for r in spark.read.parquet(out).collect())

    first = Counter({f"a{i}": 1 for i in range(4)})
    assert run() == first
    _send(client, topic, "c", 5)
    client.reset_offset_by_timestamp(group, topic, int(time.time() * 1000) + 1)  # to the end, past the checkpoint
    assert run() == first, "the restarted query read what the reset skipped"
    _send(client, topic, "d", 2)
    assert run() == first + Counter({"d0": 1, "d1": 1})


@pytest.mark.brokers("embedded")
@pytest.mark.transports(embedded=("grpc",))
def test_over_grpc_a_running_query_is_a_simple_consumer_of_its_group(spark, broker, client, transport,
                                                                    tmp_path) -> None:
    with _member_query(spark, broker, client, transport, tmp_path, "grpc") as (_q, _topic, _group, ids):
        assert len(ids) == 1


def test_a_restarted_query_with_nothing_new_brings_the_group_offsets_up_to_its_checkpoint(
        spark, broker, client, tmp_path) -> None:
    # Spark commits a batch to the source only when the next batch starts, and the reader writes
    # a finished batch's offsets at the next trigger: a driver killed right after its last batch
    # leaves the group's offsets one batch behind the checkpoint. A restart with nothing new to
    # read runs no batch, so they stayed behind for good (test_driver_kills: 3,250 of 3,750 on
    # every queue)
    topic, group = "OR_CATCH_UP", "or-catch-up"
    broker.create_topic(topic, 2)
    _send(client, topic, "c", 40)
    qs = client.message_queues(topic)

    def run(out: str):  # type: ignore[no-untyped-def]
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "10").load().selectExpr("CAST(body AS STRING) AS body")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(180)
        assert q.exception() is None

    run(str(tmp_path / "out"))
    assert spark.read.parquet(str(tmp_path / "out")).count() == 40
    # the run's last trigger wrote its last batch's end (Spark never commits that batch)
    assert client.query_consumer_offsets(group, qs) == client.max_offsets(qs) == {qs[0]: 20, qs[1]: 20}
    for mq in qs:  # as a driver killed before that trigger leaves them: the last batch's start
        client.update_consumer_offset(group, mq, 15)
    run(str(tmp_path / "out"))  # nothing new
    assert client.query_consumer_offsets(group, qs) == client.max_offsets(qs)
    assert spark.read.parquet(str(tmp_path / "out")).count() == 40
