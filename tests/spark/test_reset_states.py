"""Resets are followed in every state of a running query (issue 30), and the broker holds the
query's exact offsets at every trigger, idle ones included.

Each test resets the group as an operator would (``rocketmq-spark reset-offset``'s request, or
``mqadmin resetOffsetByTime`` on Apache RocketMQ) and counts every row the query wrote."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from test_offset_reset import _bodies, _reset, _send, _start, _wait_for

from brokers import wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _halves(client: RemotingClient, topic: str, n: int) -> int:
    """``n`` messages a* on the topic's first queue, then ``n`` b* spread over all its queues,
    stored strictly later; returns a time between them (ms). A reset to that time lands on a
    batch's start for every queue but the first (offset 0 there), as in the issue."""
    first = client.message_queues(topic)[0]
    for i in range(n):
        client.send_batch(first, [BatchEntry(f"a{i}".encode())])
    time.sleep(1.0)
    cut = int(time.time() * 1000)
    time.sleep(1.0)
    _send(client, topic, "b", n)
    return cut


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_query_idle_after_one_batch_follows_a_reset_to_a_time_inside_it(spark, broker, client, transport,
                                                                          tmp_path) -> None:
    _idle_after_one_batch(spark, broker, client, transport, tmp_path, "client")


@pytest.mark.brokers("real")
@pytest.mark.transports(real=("remoting",))
def test_a_query_idle_after_one_batch_follows_mqadmin_reset_offset_by_time(spark, broker, client, transport,
                                                                           tmp_path) -> None:
    _idle_after_one_batch(spark, broker, client, transport, tmp_path, "mqadmin")


def _idle_after_one_batch(spark, broker, client, transport, tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    """The issue's scenario: everything was read by the first batch, the query idles, and the
    reset lands on that batch's start for one queue at least. The broker must hold the batch's
    end while the query idles, and the reset must re-read exactly the second half, once."""
    topic = broker.create_topic(transport(f"RESET_IDLE_{how.upper()}"), queues=2)
    group = transport(f"g_reset_idle_{how}")
    cut = _halves(client, topic, 50)
    qs = client.message_queues(topic)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"))
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 100, "the 100 messages")
        # idle now: the batch's end must be on the broker without another batch
        ends = [75, 25]  # 50 a* and 25 b* on the first queue, 25 b* on the second
        _wait_for(q, lambda: [client.query_consumer_offset(group, m) for m in qs] == ends,
                  lambda: f"the group's offsets while the query idles: "
                          f"{[client.query_consumer_offset(group, m) for m in qs]} (want {ends})",
                  timeout_s=30)
        _reset(broker, client, group, topic, cut, how)
        want = Counter({f"a{i}": 1 for i in range(50)} | {f"b{i}": 2 for i in range(50)})
        _wait_for(q, lambda: _bodies(spark, group) == want,
                  lambda: f"b* read once more after the reset: read {_bodies(spark, group) - want} more, "
                          f"{want - _bodies(spark, group)} missing; the group holds "
                          f"{[client.query_consumer_offset(group, m) for m in qs]}; last progress {q.lastProgress}",
                  timeout_s=60)
        # and the query goes on: what comes next is read once
        _send(client, topic, "c", 4)
        want.update({f"c{i}": 1 for i in range(4)})
        _wait_for(q, lambda: _bodies(spark, group) == want, "the messages after the reset, once")
        assert wait_until(lambda: [client.query_consumer_offset(group, m) for m in qs] == [77, 27], 30, 0.2), \
            [client.query_consumer_offset(group, m) for m in qs]
    finally:
        q.stop()
