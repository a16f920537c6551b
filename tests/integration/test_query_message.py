"""QUERY_MESSAGE (messages by key or message id: mqadmin queryMsgByKey and queryMsgTraceById, the
Java client's queryMessage) on the embedded broker over real sockets, and mqadmin's
queryMsgByKey finding the same messages on the embedded broker and Apache RocketMQ."""

from __future__ import annotations

import time

import pytest

from brokers import wait_until
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties
from rocketmq_spark.remoting import RemotingCommand, RequestCode, ResponseCode

pytestmark = pytest.mark.integration

BROKERS = ("embedded", "real")


def _props(keys: str | None = None, uniq: str | None = None, tags: str = "t") -> str:
    props = {"TAGS": tags}
    if keys is not None:
        props["KEYS"] = keys
    if uniq is not None:
        props["UNIQ_KEY"] = uniq
    return encode_properties(props)


def _raw_query(client: RemotingClient, topic: str, key: str, max_num: int, *, unique: bool = False,
               index_type: str | None = None, addr: str | None = None) -> RemotingCommand:
    """QUERY_MESSAGE as the Java client sends it (``index_type``: 5.5's indexType), its answer
    whatever its code."""
    ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": "0",
           "endTimestamp": str(2**63 - 1), "_UNIQUE_KEY_QUERY": "true" if unique else "false"}
    if index_type is not None:
        ext["indexType"] = index_type
    return client.invoke(addr or client.broker_addr("broker-a"),
                         RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext), "query", ok=tuple(ResponseCode))


def _bodies(resp: RemotingCommand) -> list[bytes]:
    return [r.body for r in decode_records(resp.body)] if resp.code == ResponseCode.SUCCESS else []


@pytest.mark.brokers("embedded")
def test_keys_and_message_ids_find_their_messages_single_and_batch_sent(client: RemotingClient, topic: str) -> None:
    q0, q1 = client.message_queues(topic)[:2]
    client.send(q0, b"one", _props("order-1 customer-7", "U-one"))
    client.send_batch(q1, [BatchEntry(b"b%d" % i, _props(f"order-{i} batch", f"U-b{i}")) for i in range(3)])
    client.send(q0, b"ten", _props("order-10"))
    client.send(client.message_queues("OTHER_" + topic)[0], b"elsewhere", _props("order-1"))
    assert sorted(r.body for r in client.query_messages(topic, "order-1")) == [b"b1", b"one"]
    assert [r.body for r in client.query_messages(topic, "batch")] == [b"b0", b"b1", b"b2"]
    assert [r.body for r in client.query_messages(topic, "customer-7")] == [b"one"]
    # by message id: Java's MessageClientIDSetter id (UNIQ_KEY), as mqadmin queryMsgByUniqueKey asks
    (rec,) = client.query_messages(topic, "U-b2", unique=True)
    assert rec.body == b"b2" and rec.msg_id == "U-b2" and rec.queue_id == q1.queue_id and rec.queue_offset == 2
    # the broker finds a message id as a key too (as Java's index holds it), and the client then
    # drops it as Java's MQAdminImpl does: not among its KEYS
    assert [r.body for r in decode_records(_raw_query(client, topic, "U-one", 32).body)] == [b"one"]
    assert client.query_messages(topic, "U-one") == []
    assert client.query_messages(topic, "order-") == [] and client.query_messages(topic, "U-b2 ") == []
    # 5.5's index type T: by the whole TAGS value
    assert _bodies(_raw_query(client, topic, "t", 32, index_type="T")) == [b"one", b"b0", b"b1", b"b2", b"ten"]
    assert _bodies(_raw_query(client, topic, "order-1", 32, index_type="T")) == []


@pytest.mark.brokers("embedded")
def test_none_found_is_query_not_found_as_java_brokers_answer(client: RemotingClient, topic: str) -> None:
    client.send(client.message_queues(topic)[0], b"x", _props("k"))
    resp = _raw_query(client, topic, "missing", 32)
    assert resp.code == ResponseCode.QUERY_NOT_FOUND == 22
    assert resp.remark == "can not find message, maybe time range not correct" and not resp.body
    assert _raw_query(client, "NO_SUCH_TOPIC_" + topic, "k", 32).code == ResponseCode.QUERY_NOT_FOUND
    found = _raw_query(client, topic, "k", 32)
    assert found.code == ResponseCode.SUCCESS and [r.body for r in decode_records(found.body, check_crc=True)] == [b"x"]
    assert int(found.ext_fields["indexLastUpdateTimestamp"]) >= decode_records(found.body)[0].store_timestamp
    assert int(found.ext_fields["indexLastUpdatePhyoffset"]) > 0
    # a malformed request is answered, naming the field (Java: its header's @CFNotNull fields)
    for ext, field in (({"topic": topic, "maxNum": "1", "beginTimestamp": "0", "endTimestamp": "1"}, "key"),
                       ({"topic": topic, "key": "k", "maxNum": "x", "beginTimestamp": "0", "endTimestamp": "1"},
                        "maxNum")):
        bad = client.invoke(client.broker_addr("broker-a"), RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext),
                            "query", ok=tuple(ResponseCode))
        assert bad.code == ResponseCode.SYSTEM_ERROR and field in (bad.remark or ""), bad


@pytest.mark.brokers("embedded")
def test_the_time_range_is_of_store_times_both_ends_included(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    client.send_batch(q, [BatchEntry(b"early%d" % i, _props("k")) for i in range(2)])
    (early,) = {r.store_timestamp for r in client.query_messages(topic, "k")}
    assert wait_until(lambda: time.time() * 1000 > early + 1, 5, 0.001)
    client.send_batch(q, [BatchEntry(b"late%d" % i, _props("k")) for i in range(2)])
    late = max(r.store_timestamp for r in client.query_messages(topic, "k"))
    assert late > early

    def bodies(begin: int, end: int) -> list[bytes]:
        return [r.body for r in client.query_messages(topic, "k", begin_ms=begin, end_ms=end)]

    assert bodies(early, early) == [b"early0", b"early1"]
    assert bodies(early + 1, late) == [b"late0", b"late1"]
    assert bodies(0, late - 1) == [b"early0", b"early1"]
    assert bodies(late + 1, 2**63 - 1) == []


@pytest.mark.brokers("embedded")
def test_the_newest_max_num_capped_at_64_and_32_by_message_id(client: RemotingClient, topic: str) -> None:
    q0, q1 = client.message_queues(topic)[:2]
    client.send_batch(q0, [BatchEntry(b"a%02d" % i, _props("many")) for i in range(40)])
    client.send_batch(q1, [BatchEntry(b"b%02d" % i, _props("many")) for i in range(40)])
    got = client.query_messages(topic, "many", max_num=5)
    assert [r.body for r in got] == [b"b%02d" % i for i in range(35, 40)]  # the newest, in store order
    got = client.query_messages(topic, "many", max_num=1000)
    assert len(got) == 64 and [r.body for r in got] == [b"a%02d" % i for i in range(16, 40)] + [
        b"b%02d" % i for i in range(40)]
    # a query by message id answers at most 32 (defaultQueryMaxNum) whatever maxNum says
    resp = _raw_query(client, topic, "many", 1000, unique=True)
    assert len(decode_records(resp.body)) == 32


@pytest.mark.brokers("embedded")
def test_keys_are_found_after_a_restart_of_the_broker(tmp_path) -> None:
    data = str(tmp_path / "mq")
    with EmbeddedBroker(data, grpc_port=None) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            q = c.message_queues("RESTARTED")[0]
            c.send_batch(q, [BatchEntry(b"before%d" % i, _props("k", f"U{i}")) for i in range(3)])
            assert len(c.query_messages("RESTARTED", "k")) == 3
        finally:
            c.close()
    with EmbeddedBroker(data, grpc_port=None) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            c.send(c.message_queues("RESTARTED")[0], b"after", _props("k"))
            assert [r.body for r in c.query_messages("RESTARTED", "k")] == [b"before0", b"before1", b"before2",
                                                                           b"after"]
            assert [r.body for r in c.query_messages("RESTARTED", "U1", unique=True)] == [b"before1"]
        finally:
            c.close()


def _mqadmin_rows(out: str) -> set[tuple[str, int, int]]:
    """(message id, queue id, queue offset) of each message mqadmin queryMsgByKey lists (5.5's
    lists each one's index key too)."""
    rows = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) in (3, 4) and parts[1].isdigit() and parts[2].isdigit():
            rows.add((parts[0], int(parts[1]), int(parts[2])))
    return rows


def test_mqadmin_query_by_key_finds_the_same_messages_on_both_brokers(broker, client, real_rocketmq) -> None:
    topic = broker.create_topic("QUERY_BY_KEY" + ("_REAL" if broker.is_real else ""), queues=2)
    q0, q1 = client.message_queues(topic)[:2]
    tag = "real" if broker.is_real else "embedded"  # message ids unique to the broker (the real one is shared)
    sent = [client.send(q0, b"one", _props("order-1 customer-7", f"{tag}-one"))]
    sent += client.send_batch(q1, [BatchEntry(b"b%d" % i, _props(f"order-{i}", f"{tag}-b{i}")) for i in range(3)])
    client.send(q0, b"ten", _props("order-10", f"{tag}-ten", tags="tenth"))
    want = {(f"{tag}-one", q0.queue_id, sent[0].queue_offset), (f"{tag}-b1", q1.queue_id, sent[2].queue_offset)}
    # Apache RocketMQ indexes keys asynchronously, after the store
    assert wait_until(lambda: {r.msg_id for r in client.query_messages(topic, "order-1")} == {m for m, _, _ in want},
                      30)
    # 5.5's query by tag (indexType T), the last message's: once it is indexed, all are
    assert wait_until(lambda: _bodies(_raw_query(client, topic, "tenth", 32, index_type="T", addr=broker.broker_addr))
                      == [b"ten"], 30)
    by_id = _raw_query(client, topic, f"{tag}-b2", 1000, unique=True, addr=broker.broker_addr)
    assert _bodies(by_id) == [b"b2"]
    miss = _raw_query(client, topic, "order-", 32, addr=broker.broker_addr)
    assert (miss.code, miss.remark) == (ResponseCode.QUERY_NOT_FOUND,
                                        "can not find message, maybe time range not correct")
    out = real_rocketmq.mqadmin("queryMsgByKey", "-t", topic, "-k", "order-1", namesrv=broker.namesrv_addr)
    assert _mqadmin_rows(out) == want, out
