"""The gRPC transport against the embedded broker's gRPC endpoint (no Spark)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.client.grpc_client import GrpcClient, message_columns
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties
from rocketmq_spark.errors import GroupNotFoundError, NoPermissionError, RequestNotSupportedError, TopicNotFoundError
from rocketmq_spark.proto import pb, pb_grpc
from rocketmq_spark.proto.messages import crc32_checksum, set_millis

pytestmark = pytest.mark.integration


@pytest.fixture()
def gclient(broker: EmbeddedBroker) -> Iterator[GrpcClient]:
    assert broker.grpc_endpoint
    c = GrpcClient(broker.grpc_endpoint)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture()
def stub(broker: EmbeddedBroker) -> Iterator[pb_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(broker.grpc_endpoint)
    try:
        yield pb_grpc.MessagingServiceStub(channel)
    finally:
        channel.close()


def _queue(topic: str, qid: int = 0) -> pb.MessageQueue:
    mq = pb.MessageQueue(id=qid)
    mq.topic.name = topic
    return mq


def test_route_lists_read_write_queues_of_broker_zero_with_endpoints(broker, stub) -> None:
    resp = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="G_ROUTE")))
    assert resp.status.code == pb.OK
    assert [q.id for q in resp.message_queues] == [0, 1, 2, 3]
    q = resp.message_queues[0]
    assert q.permission == pb.READ_WRITE and q.broker.id == 0 and q.broker.name == broker.broker_name
    host, port = broker.grpc_endpoint.rsplit(":", 1)
    assert (q.broker.endpoints.addresses[0].host, q.broker.endpoints.addresses[0].port) == (host, int(port))
    # as a 5.x proxy routes it: a topic takes the messages of its message.type (NORMAL when unset)
    assert list(q.accept_message_types) == [pb.NORMAL]
    RemotingClient(broker.namesrv_addr).create_topic("G_ROUTE_FIFO", message_type="FIFO")
    fifo = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="G_ROUTE_FIFO")))
    assert list(fifo.message_queues[0].accept_message_types) == [pb.FIFO]
    # and refuses the others, naming both types
    msg = pb.Message(topic=pb.Resource(name="G_ROUTE_FIFO"), body=b"x")
    msg.system_properties.message_id = "ID1"
    sent = stub.SendMessage(pb.SendMessageRequest(messages=[msg]))
    assert sent.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert "expected type is FIFO, but actual type is NORMAL" in sent.status.message


def test_routes_name_the_advertised_host_not_the_bound_one() -> None:
    """advertise_host (a proxy in front): gRPC routes send clients there, not to the bind host."""
    with EmbeddedBroker(host="127.0.0.2", advertise_host="127.0.0.1") as mq:
        port = int(str(mq.grpc_endpoint).rsplit(":", 1)[1])
        assert mq.grpc_endpoint == f"127.0.0.1:{port}"
        channel = grpc.insecure_channel(f"127.0.0.2:{port}")  # nothing listens on the advertised one
        try:
            resp = pb_grpc.MessagingServiceStub(channel).QueryRoute(
                pb.QueryRouteRequest(topic=pb.Resource(name="G_ADVERTISED")))
        finally:
            channel.close()
        a = resp.message_queues[0].broker.endpoints.addresses[0]
        assert (a.host, a.port) == ("127.0.0.1", port)


def test_telemetry_answers_settings_with_body_size_and_backoff(broker, stub) -> None:
    settings = pb.Settings(client_type=pb.PRODUCER)
    settings.publishing.topics.add(name="G_TELE")
    call = stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)]), timeout=10)
    first = next(iter(call))
    call.cancel()
    got = first.settings
    assert first.status.code == pb.OK
    assert got.publishing.max_body_size == broker.config.max_message_size
    assert got.backoff_policy.max_attempts > 0 and got.backoff_policy.HasField("exponential_backoff")


def test_sent_over_grpc_read_over_remoting_and_the_reverse(broker, client, gclient) -> None:
    topic = "G_CROSS"
    q = gclient.message_queues(topic)[2]
    props = encode_properties({"TAGS": "tg", "KEYS": "k1 k2", "UNIQ_KEY": "GRPC-1", "color": "red"})
    sent = gclient.send_batch(q, [BatchEntry(b"from-grpc", props)])
    assert sent[0].msg_id == "GRPC-1"
    recs = [r for m in client.message_queues(topic) for r in decode_records(client.pull(m, 0, 10).body)]
    assert len(recs) == 1
    rec = recs[0]
    assert (rec.body, rec.tags, rec.keys, rec.msg_id) == (b"from-grpc", "tg", ["k1", "k2"], "GRPC-1")
    assert rec.user_properties() == {"color": "red"}
    # the reverse: a remoting send (compressed body) pulled over gRPC, on a queue the gRPC send (the
    # broker picked its queue) did not use
    rq = next(m for m in client.message_queues(topic) if m.queue_id != rec.queue_id)
    import zlib

    big = b"q" * 5000
    client.send(rq, zlib.compress(big), encode_properties({"TAGS": "z", "p": "1"}), sys_flag=1)
    res = gclient.pull(gclient.message_queues(topic)[rq.queue_id], 0, 10)
    assert res.status == "FOUND" and res.next_offset == 1
    msg = res.messages[0]
    assert msg.body == big and msg.system_properties.body_encoding == pb.IDENTITY
    assert msg.system_properties.body_digest.checksum == crc32_checksum(big)
    cols = message_columns(res.messages)
    assert cols["tag"] == ["z"] and cols["properties"] == [[("p", "1")]] and cols["queueOffset"] == [0]
    assert cols["storeHost"] == [broker.broker_addr]
    # the retry columns, when asked: a gRPC row has no retry origin
    rows = gclient.rows(rq, [res], None, ("body", "retryTopic", "reconsumeTimes"))
    assert rows.schema.names == ["body", "retryTopic", "reconsumeTimes"]
    assert rows.to_pylist() == [{"body": big, "retryTopic": None, "reconsumeTimes": 0}]


def test_offsets_over_grpc_are_the_brokers(broker, client, gclient) -> None:
    topic = "G_OFFSETS"
    mq = client.message_queues(topic)[0]
    for i in range(5):
        client.send(mq, b"m%d" % i)
    assert (gclient.min_offset(mq), gclient.max_offset(mq)) == (0, 5)
    assert gclient.search_offset(mq, int(time.time() * 1000) + 60_000) == 5
    assert gclient.search_offset(mq, 0) == 0
    assert gclient.query_consumer_offset("g_none", mq) is None  # OFFSET_NOT_FOUND
    with pytest.raises(GroupNotFoundError):  # as over remoting: no offsets for an unknown group
        gclient.update_consumer_offset("g_grpc", mq, 3)
    client.create_group("g_grpc")
    gclient.update_consumer_offset("g_grpc", mq, 3)
    assert client.query_consumer_offset("g_grpc", mq) == 3
    client.update_consumer_offset("g_grpc", mq, 4)
    assert gclient.query_consumer_offset("g_grpc", mq) == 4


def test_pull_semantics_not_found_illegal_offset_and_long_polling(broker, client, gclient) -> None:
    topic = "G_PULL"
    mq = client.message_queues(topic)[0]
    for i in range(3):
        client.send(mq, b"p%d" % i, encode_properties({"TAGS": "a" if i != 1 else "b"}))
    assert gclient.pull(mq, 3, 10).status == "NO_NEW_MSG"
    moved = gclient.pull(mq, 99, 10)
    assert (moved.status, moved.next_offset) == ("OFFSET_ILLEGAL", 3)
    only_a = gclient.pull(mq, 0, 10, subscription="a")
    assert [m.body for m in only_a.messages] == [b"p0", b"p2"] and only_a.next_offset == 3
    # a long-polling pull wakes up when a message arrives (well before its timeout)
    pending = gclient.pull_async(mq, 3, 10, suspend_ms=20_000)
    pulls = broker._server.broker.pulls
    deadline = time.monotonic() + 10
    while not pulls._waiters.get((topic, mq.queue_id)) and time.monotonic() < deadline:
        time.sleep(0.01)  # until the broker holds the pull: the message below must wake it
    assert pulls._waiters.get((topic, mq.queue_id)), "the pull was never suspended on the broker"
    t0 = time.monotonic()
    client.send(mq, b"late")
    res = gclient.pull_result(mq, pending)
    assert res.status == "FOUND" and [m.body for m in res.messages] == [b"late"]
    assert time.monotonic() - t0 < 10


def test_unknown_topic_is_topic_not_found(gclient) -> None:
    with pytest.raises(TopicNotFoundError):
        gclient.max_offset(__import__("rocketmq_spark").MessageQueue("G_NOPE_%$", "broker-a", 0))


def test_pop_receive_redelivers_after_invisible_duration_and_ack_commits(broker, client, stub) -> None:
    topic, group = "G_POP", "g_pop"
    client.create_topic(topic, queues=1)
    mq = client.message_queues(topic)[0]
    for i in range(3):
        client.send(mq, b"pop%d" % i)

    def receive(invisible_ms: int, wait_ms: int = 0) -> list[pb.Message]:
        req = pb.ReceiveMessageRequest(batch_size=10)
        req.group.name = group
        req.message_queue.CopyFrom(_queue(topic))
        set_millis(req.invisible_duration, invisible_ms)
        set_millis(req.long_polling_timeout, wait_ms)
        out = list(stub.ReceiveMessage(req, timeout=30))
        return [r.message for r in out if r.WhichOneof("content") == "message"]

    first = receive(300)
    assert [m.body for m in first] == [b"pop0", b"pop1", b"pop2"]
    assert all(m.system_properties.delivery_attempt == 1 for m in first)
    assert receive(300) == []  # invisible now
    ack = pb.AckMessageRequest(entries=[pb.AckMessageEntry(message_id=m.system_properties.message_id,
                                                           receipt_handle=m.system_properties.receipt_handle)
                                        for m in first[:2]])
    ack.group.name, ack.topic.name = group, topic
    assert stub.AckMessage(ack).status.code == pb.OK
    assert client.query_consumer_offset(group, mq) == 2  # never past the un-acked pop2
    # pop2's invisibility lapses: it comes back (long polling waits for the lapse), attempt 2
    again = receive(30_000, wait_ms=5_000)
    assert [m.body for m in again] == [b"pop2"] and again[0].system_properties.delivery_attempt == 2
    change = pb.ChangeInvisibleDurationRequest(receipt_handle=again[0].system_properties.receipt_handle)
    change.group.name, change.topic.name = group, topic
    set_millis(change.invisible_duration, 60_000)
    changed = stub.ChangeInvisibleDuration(change)
    assert changed.status.code == pb.OK and changed.receipt_handle != again[0].system_properties.receipt_handle
    stale = pb.AckMessageRequest(entries=[pb.AckMessageEntry(receipt_handle=again[0].system_properties.receipt_handle)])
    stale.group.name, stale.topic.name = group, topic
    assert stub.AckMessage(stale).status.code == pb.INVALID_RECEIPT_HANDLE
    fresh = pb.AckMessageRequest(entries=[pb.AckMessageEntry(receipt_handle=changed.receipt_handle)])
    fresh.group.name, fresh.topic.name = group, topic
    assert stub.AckMessage(fresh).status.code == pb.OK
    assert client.query_consumer_offset(group, mq) == 3


def test_transaction_check_back_over_telemetry(tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path), transaction_timeout_ms=200, transaction_check_interval_ms=200) as mq:
        remoting = RemotingClient(mq.namesrv_addr)
        producer = GrpcClient(mq.grpc_endpoint or "")
        try:
            topic = "G_TX_CHECK"
            remoting.create_topic(topic, queues=1, message_type="TRANSACTION")
            asked: list[tuple[str, str]] = []

            def decide(props: dict[str, str], msg_id: str) -> bool:
                asked.append((msg_id, props.get("batch", "")))
                return props.get("batch") == "keep"

            producer.start_producer("rocketmq-spark", [topic], on_check=decide)
            q = producer.message_queues(topic, writable=True)[0]
            for name in ("keep", "drop"):
                producer.send_batch(q, [BatchEntry(name.encode(), encode_properties({"batch": name,
                                                                                    "UNIQ_KEY": f"TX-{name}"}))],
                                    sys_flag=4)
            rq = remoting.message_queues(topic)[0]
            deadline = time.monotonic() + 20
            while (mq.broker.pending_tx or remoting.max_offset(rq) < 1) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not mq.broker.pending_tx  # both ended by the check-backs
            assert sorted(asked) == [("TX-drop", "drop"), ("TX-keep", "keep")]
            assert [r.body for r in decode_records(remoting.pull(rq, 0, 10).body)] == [b"keep"]
        finally:
            producer.close()
            remoting.close()


class _ReleasedProxy(pb_grpc.MessagingServiceServicer):
    """What released Java proxies implement: routes and sends, but no pulls or offsets."""

    def __init__(self, port_holder: list[int]) -> None:
        self.port_holder = port_holder

    def QueryRoute(self, request, context):  # noqa: N802 (gRPC method name)
        mq = _queue(request.topic.name)
        mq.permission = pb.READ_WRITE
        mq.broker.name = "broker-x"
        mq.broker.endpoints.addresses.add(host="127.0.0.1", port=self.port_holder[0])
        return pb.QueryRouteResponse(status=pb.Status(code=pb.OK), message_queues=[mq])


def test_proxy_without_pull_rpcs_fails_naming_namesrv_addr() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    holder = [0]
    pb_grpc.add_MessagingServiceServicer_to_server(_ReleasedProxy(holder), server)
    holder[0] = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        c = GrpcClient(f"127.0.0.1:{holder[0]}", ClientConfig(retries=1))
        try:
            mq = c.message_queues("T")[0]
            with pytest.raises(RequestNotSupportedError, match=r"does not implement QueryOffset.*namesrvAddr"):
                c.max_offset(mq)
            with pytest.raises(RequestNotSupportedError, match=r"PullMessage.*namesrvAddr"):
                c.pull(mq, 0, 1)
        finally:
            c.close()
    finally:
        server.stop(0)


def test_a_pull_of_a_write_only_topic_is_refused_over_grpc_as_over_remoting(client, gclient) -> None:
    client.create_topic("G_WRITE_ONLY", queues=1, perm=2)
    client.create_topic("G_WRITE_ONLY", queues=1, perm=6)  # readable for a moment: route both clients
    mq = client.message_queues("G_WRITE_ONLY")[0]
    client.send(mq, b"hidden")
    gmq = gclient.message_queues("G_WRITE_ONLY")[0]
    client.create_topic("G_WRITE_ONLY", queues=1, perm=2)  # write-only from here on
    with pytest.raises(NoPermissionError, match="pulling is forbidden"):
        client.pull(mq, 0, 32)
    with pytest.raises(NoPermissionError, match="pulling is forbidden"):
        gclient.pull(gmq, 0, 32)


def test_a_stream_over_grpc_makes_its_new_group_known_even_on_an_idle_topic(broker, client) -> None:
    """Brokers refuse commits of groups they do not know; with no data no task pulls, so the planner
    makes the group known itself (over gRPC too), and its commits land."""
    from rocketmq_spark.source import Planner, ReaderOptions

    client.create_topic("G_IDLE_GROUP", queues=2)
    planner = Planner(ReaderOptions.parse({"endpoints": broker.grpc_endpoint, "topic": "G_IDLE_GROUP",
                                           "consumerGroup": "g_grpc_idle"}, stream=True))
    planner.check_group()
    start = planner.initial()
    planner.commit(start)
    assert planner.store.pending == {}  # nothing refused, nothing waiting for a retry
    assert client.query_consumer_offsets("g_grpc_idle", sorted(start)) == start


def test_a_server_side_reset_reaches_a_grpc_consumer_as_it_does_a_remoting_one(client, gclient) -> None:
    """The broker's reset rules do not depend on the transport: a commit over gRPC before the
    group's next pull of the queue is ignored, and that pull (over gRPC) is moved to the reset."""
    topic, group = "G_RESET", "g_grpc_reset"
    client.create_topic(topic, queues=1)
    mq = client.message_queues(topic)[0]
    for i in range(6):
        client.send(mq, b"r%d" % i)
    gmq = gclient.message_queues(topic)[0]
    client.create_group(group)
    gclient.update_consumer_offset(group, gmq, 5)
    assert client.reset_offset_by_timestamp(group, topic, 0) == {mq: 0}
    gclient.update_consumer_offset(group, gmq, 5)  # it has not pulled since: ignored
    assert client.query_consumer_offset(group, mq) == 0
    moved = gclient.pull(gmq, 5, 32, group=group)
    assert (moved.status, moved.next_offset) == ("OFFSET_ILLEGAL", 0)
    gclient.update_consumer_offset(group, gmq, 2)  # from then on its commits count again
    assert client.query_consumer_offset(group, mq) == 2


def test_a_grpc_member_of_a_group_is_listed_with_remoting_ones(broker: EmbeddedBroker, gclient: GrpcClient) -> None:
    # GET_CONSUMER_CONNECTION_LIST read a remoting connection's peer of every consumer, and a gRPC
    # session had none: the whole listing failed once a gRPC consumer was in the group
    import json

    from rocketmq_spark.remoting import RemotingCommand, RequestCode

    rc = RemotingClient(broker.namesrv_addr)
    try:
        rc.create_topic("T_GRPC_MEMBER", 1)
        member = gclient.join_group("g_grpc_member", {"T_GRPC_MEMBER": "*"}, dict)
        remote = rc.join_group("g_grpc_member", {"T_GRPC_MEMBER": "*"}, dict)
        assert member is not None and remote is not None
        try:
            resp = rc.invoke(broker.broker_addr, RemotingCommand(RequestCode.GET_CONSUMER_CONNECTION_LIST,
                                                                 ext_fields={"consumerGroup": "g_grpc_member"}), "list")
            conns = json.loads(resp.body)["connectionSet"]
            assert {c["clientId"] for c in conns} == {gclient.client_id, remote.client_id}  # type: ignore[attr-defined]
            assert all(c["clientAddr"].startswith("127.0.0.1:") or c["clientAddr"].startswith("ipv4:") for c in conns)
        finally:
            remote.close()
            member.close()
    finally:
        rc.close()
