"""The planner's many-queue calls against the embedded broker: GET_TOPIC_STATS_INFO (one
answer per topic and broker), pipelined per-queue offset requests, and the per-queue fallback
for brokers that do not serve topic stats."""

from __future__ import annotations

import pytest

from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.client.tables import parse_topic_stats
from rocketmq_spark.codec import BatchEntry, encode_properties
from rocketmq_spark.errors import ConnectionFailedError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting import RequestCode

pytestmark = pytest.mark.integration


def _load(client: RemotingClient, topic: str, queues: int) -> list[MessageQueue]:
    client.create_topic(topic, queues)
    qs = client.message_queues(topic, refresh=True)
    for i, mq in enumerate(qs):
        if i % 3:  # every third queue stays empty
            client.send_batch(mq, [BatchEntry(b"m%d" % k, encode_properties({"TAGS": "t"})) for k in range(i)])
    return qs


def test_offset_ranges_match_the_per_queue_answers(client: RemotingClient, topic: str) -> None:
    qs = _load(client, topic, 40)
    ranges = client.offset_ranges(qs)
    assert ranges == {mq: (client.min_offset(mq), client.max_offset(mq)) for mq in qs}
    assert ranges[qs[5]] == (0, 5) and ranges[qs[3]] == (0, 0)
    assert client.max_offsets(qs) == {mq: hi for mq, (_lo, hi) in ranges.items()}
    assert client.min_offsets(qs) == {mq: lo for mq, (lo, _hi) in ranges.items()}


def test_group_offsets_written_and_read_many_at_once(client: RemotingClient, topic: str) -> None:
    qs = _load(client, topic, 300)  # more than one pipelined chunk
    group = f"g_{topic}"
    assert set(client.query_consumer_offsets(group, qs).values()) == {None}
    wanted = {mq: mq.queue_id * 2 for mq in qs}
    client.create_group(group)
    assert client.update_consumer_offsets(group, wanted) == {}
    assert client.query_consumer_offsets(group, qs) == wanted
    assert client.query_consumer_offset(group, qs[77]) == 154


def test_offset_ranges_fall_back_to_per_queue_requests(topic: str) -> None:
    with EmbeddedBroker() as mq_broker:
        server = mq_broker._server.remoting
        assert server is not None
        del server.handlers[RequestCode.GET_TOPIC_STATS_INFO]  # like a broker without the admin request
        c = RemotingClient(mq_broker.namesrv_addr)
        try:
            qs = _load(c, topic, 6)
            assert c.offset_ranges(qs) == {mq: (0, i if i % 3 else 0) for i, mq in enumerate(qs)}
        finally:
            c.close()


def test_a_stopped_broker_fails_the_many_queue_calls_with_its_address(topic: str) -> None:
    mq_broker = EmbeddedBroker().start()
    c = RemotingClient(mq_broker.namesrv_addr)
    try:
        qs = _load(c, topic, 4)
        addr = c.broker_addr(qs[0].broker, topic)
        mq_broker.stop()
        with pytest.raises(ConnectionFailedError) as err:
            c.max_offsets(qs)
        assert addr in str(err.value) and "max offset" in str(err.value)
        failed = c.update_consumer_offsets("g", {mq: 1 for mq in qs})
        assert set(failed) == set(qs)  # reported per queue, not raised
    finally:
        c.close()


def test_parse_topic_stats_reads_fastjson_object_keys() -> None:
    body = (b'{"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"lastUpdateTimestamp":17,'
            b'"maxOffset":9,"minOffset":2},{"brokerName":"broker-a","queueId":1,"topic":"T"}:'
            b'{"lastUpdateTimestamp":0,"maxOffset":0,"minOffset":0}}}')
    assert parse_topic_stats(body) == {MessageQueue("T", "broker-a", 0): (2, 9),
                                       MessageQueue("T", "broker-a", 1): (0, 0)}
    assert parse_topic_stats(b"") == {}
    assert parse_topic_stats(b'{"offsetTable":{{"queueId":"x"}:{"maxOffset":1}}}') == {}
