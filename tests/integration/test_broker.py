"""The embedded broker over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.client.connection import RemotingConnection
from rocketmq_spark.codec import BatchEntry, TransactionType, decode_records, encode_properties
from rocketmq_spark.errors import BrokerError, ConnectionFailedError, GroupNotFoundError, TopicNotFoundError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting import (
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    decode_frame,
)

pytestmark = pytest.mark.integration


def _props(**kv: str) -> str:
    return encode_properties(kv)


def _raw_call(addr: str, frame: bytes, timeout: float = 5.0) -> RemotingCommand | None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(frame)
        head = s.recv(4, socket.MSG_WAITALL)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        body = s.recv(n, socket.MSG_WAITALL)
        # the broker closes the connection after a bad frame
        return decode_frame(head + body)


def test_route_auto_creates_topics(client: RemotingClient, topic: str) -> None:
    queues = client.message_queues(topic)
    assert [q.queue_id for q in queues] == [0, 1, 2, 3]
    assert {q.broker for q in queues} == {"broker-a"}
    assert topic in client.topic_list()


def test_auto_create_can_be_turned_off(tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path), auto_create_topics=False) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            with pytest.raises(TopicNotFoundError):
                c.route("nope")
            c.create_topic("made", queues=2)
            assert [q.queue_id for q in c.message_queues("made")] == [0, 1]
        finally:
            c.close()


def test_send_single_and_batch_then_pull(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[2]
    r = client.send(q, b"single", _props(TAGS="A", KEYS="k1 k2", u="v"))
    assert r.queue_offset == 0 and len(r.msg_id) == 32
    rs = client.send_batch(q, [BatchEntry(b"b%d" % i, _props(TAGS="B", n=str(i))) for i in range(5)])
    assert [x.queue_offset for x in rs] == [1, 2, 3, 4, 5]
    assert len({x.msg_id for x in rs}) == 5
    res = client.pull(q, 0, 32)
    recs = decode_records(res.body, check_crc=True)
    assert res.status == "FOUND" and res.next_offset == 6 and res.max_offset == 6
    assert [r.payload() for r in recs] == [b"single"] + [b"b%d" % i for i in range(5)]
    assert recs[0].keys == ["k1", "k2"] and recs[0].user_properties() == {"u": "v"}
    assert recs[0].offset_msg_id == r.msg_id
    assert recs[3].user_properties() == {"n": "2"}
    assert all(rec.store_host == client.broker_addr("broker-a") for rec in recs)


def test_send_message_v1_code_10_with_long_header_names(client: RemotingClient, broker: EmbeddedBroker,
                                                        topic: str) -> None:
    client.message_queues(topic)
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE, ext_fields={
        "producerGroup": "PG", "topic": topic, "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
        "queueId": "1", "sysFlag": "0", "bornTimestamp": "1700000000000", "flag": "0",
        "properties": _props(TAGS="X"), "reconsumeTimes": "0", "unitMode": "false", "batch": "false"},
        body=b"v1 send")
    resp = client.invoke(broker.broker_addr, cmd, "send v1")
    assert resp.ext_fields["queueId"] == "1"
    recs = decode_records(client.pull(MessageQueue(topic, "broker-a", 1), 0, 10).body)
    assert recs[0].payload() == b"v1 send" and recs[0].born_timestamp == 1700000000000


def test_oversized_message_is_refused(client: RemotingClient, broker: EmbeddedBroker, topic: str) -> None:
    q = client.message_queues(topic)[0]
    with pytest.raises(Exception, match="exceeds the maximum"):
        client.send(q, b"x" * (broker.config.max_message_size + 1))
    assert client.max_offset(q) == 0


def test_long_polling_wakes_on_new_data(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    t0 = time.monotonic()
    assert client.pull(q, 0, 32, suspend_ms=300).status == "NO_NEW_MSG"
    assert time.monotonic() - t0 >= 0.25  # held, not answered at once
    sender = RemotingClient(client.namesrv_addrs)
    timer = threading.Timer(0.3, lambda: sender.send(q, b"late"))
    timer.start()
    t0 = time.monotonic()
    res = client.pull(q, 0, 32, suspend_ms=20_000)
    waited = time.monotonic() - t0
    timer.join()
    sender.close()
    assert res.status == "FOUND"
    assert waited < 15  # woken by the send, long before the 20 s suspension ends


def test_tag_filtering_keeps_offsets_exact(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    for i in range(10):
        client.send(q, b"%d" % i, _props(TAGS="A" if i % 3 == 0 else "B"))
    res = client.pull(q, 0, 32, subscription="A")
    assert [r.payload() for r in decode_records(res.body)] == [b"0", b"3", b"6", b"9"]
    assert res.next_offset == 10
    res = client.pull(q, 0, 32, subscription="B || C")
    assert len(decode_records(res.body)) == 6
    res = client.pull(q, 0, 32, subscription="Z")
    assert res.status == "NO_MATCHED_MSG" and res.next_offset == 10


def test_pull_out_of_range_reports_the_real_offsets(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    client.send(q, b"x")
    res = client.pull(q, 50, 32)
    assert res.status == "OFFSET_ILLEGAL" and res.next_offset == 1 and res.max_offset == 1


def test_consumer_offsets(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[1]
    assert client.query_consumer_offset("g1", q) is None
    with pytest.raises(GroupNotFoundError, match="g1"):  # brokers refuse offsets of unknown groups
        client.update_consumer_offset("g1", q, 7)
    client.create_group("g1")
    client.update_consumer_offset("g1", q, 7)
    assert client.query_consumer_offset("g1", q) == 7
    client.update_consumer_offset("g1", q, 3)  # lower is accepted (offset resets)
    assert client.query_consumer_offset("g1", q) == 3
    # the whole table, as Java brokers answer it (slaves and 4.x offset checks read it)
    table = client.invoke(client.broker_addr(q.broker), RemotingCommand(RequestCode.GET_ALL_CONSUMER_OFFSET),
                          "offset table")
    assert json.loads(table.body)["offsetTable"][f"{q.topic}@g1"] == {str(q.queue_id): 3}
    assert client.query_consumer_offset("g2", q) is None


def test_min_max_and_search_by_timestamp(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[3]
    client.send_batch(q, [BatchEntry(b"a"), BatchEntry(b"b")])
    time.sleep(0.02)
    mid = int(time.time() * 1000)
    time.sleep(0.02)
    client.send(q, b"c")
    assert (client.min_offset(q), client.max_offset(q)) == (0, 3)
    assert client.search_offset(q, 0) == 0
    assert client.search_offset(q, mid) == 2
    assert client.search_offset(q, mid + 3_600_000) == 3


def test_heartbeat_consumer_list_and_drop_on_close(broker: EmbeddedBroker) -> None:
    def conn() -> RemotingConnection:
        return RemotingConnection(broker.broker_addr)

    a, b, asker = conn(), conn(), conn()
    try:
        for c, cid in ((a, "10.0.0.1@1"), (b, "10.0.0.2@2")):
            body = json.dumps({"clientID": cid, "producerDataSet": [],
                               "consumerDataSet": [{"groupName": "CG_HB", "subscriptionDataSet": []}]}).encode()
            resp = c.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=body), 5, "heartbeat")
            assert resp.code == 0

        def ids() -> list[str]:
            r = asker.invoke(RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                             ext_fields={"consumerGroup": "CG_HB"}), 5, "list")
            if r.code == ResponseCode.SYSTEM_ERROR:  # Java brokers' answer for a group with none online
                assert r.remark == "no consumer for this group, CG_HB"
                return []
            return json.loads(r.body)["consumerIdList"]

        assert ids() == ["10.0.0.1@1", "10.0.0.2@2"]
        a.invoke(RemotingCommand(RequestCode.UNREGISTER_CLIENT,
                                 ext_fields={"clientID": "10.0.0.1@1", "consumerGroup": "CG_HB"}), 5, "unregister")
        assert ids() == ["10.0.0.2@2"]
        b.close()
        deadline = time.monotonic() + 5
        while ids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ids() == []
    finally:
        for c in (a, b, asker):
            c.close()


def test_transaction_half_messages_are_invisible_until_committed(client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    props = _props(TRAN_MSG="true", PGROUP="PG_TX", UNIQ_KEY="U1")
    commit = client.send(q, b"tx-commit", props, sys_flag=TransactionType.PREPARED, producer_group="PG_TX")
    rollback = client.send(q, b"tx-rollback", props, sys_flag=TransactionType.PREPARED, producer_group="PG_TX")
    assert client.max_offset(q) == 0
    assert client.pull(q, 0, 32).status == "NO_NEW_MSG"
    addr = client.broker_addr("broker-a")
    from rocketmq_spark.codec import parse_offset_msg_id

    for sent, kind in ((commit, TransactionType.COMMIT), (rollback, TransactionType.ROLLBACK)):
        _, pos = parse_offset_msg_id(sent.msg_id)
        client.invoke(addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
            "producerGroup": "PG_TX", "tranStateTableOffset": str(sent.queue_offset),
            "commitLogOffset": str(pos), "commitOrRollback": str(kind), "fromTransactionCheck": "0",
            "msgId": "U1", "transactionId": "U1"}), "end transaction")
    recs = decode_records(client.pull(q, 0, 32).body)
    assert [r.payload() for r in recs] == [b"tx-commit"]
    assert recs[0].sys_flag & TransactionType.COMMIT
    # as Java brokers do, a second commit of the same half message stores it again: a producer
    # must end each half message once
    _, pos = parse_offset_msg_id(commit.msg_id)
    client.invoke(addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
        "producerGroup": "PG_TX", "tranStateTableOffset": str(commit.queue_offset),
        "commitLogOffset": str(pos), "commitOrRollback": "8"}), "end transaction")
    assert [r.payload() for r in decode_records(client.pull(q, 0, 32).body)] == [b"tx-commit", b"tx-commit"]
    # an END for a position that holds no half message is refused
    with pytest.raises(Exception, match="Find prepared transaction message failed"):
        client.invoke(addr, RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
            "producerGroup": "PG_TX", "tranStateTableOffset": "0",
            "commitLogOffset": str(recs[0].physical_offset), "commitOrRollback": "8"}), "end transaction")


def test_pipelined_half_messages_and_ends_over_one_connection(client: RemotingClient, topic: str) -> None:
    # what the exactly-once writer and its driver send: half messages 32 per write, then the
    # ENDs a chunk per write, the progress reported in order up to every one of them
    qs = client.message_queues(topic)
    reqs = [(qs[i % len(qs)], client.send_request(
        qs[i % len(qs)], [BatchEntry(b"p-%d" % i, _props(TRAN_MSG="true", PGROUP="PG_P", UNIQ_KEY=f"P{i:04d}"))],
        producer_group="PG_P", sys_flag=TransactionType.PREPARED)) for i in range(700)]
    txns = []
    for start in range(0, len(reqs), 32):
        part = reqs[start:start + 32]
        futs = client.send_async_many(part)
        for (mq, _), fut, i in zip(part, futs, range(start, start + 32)):
            txns.append(client.transaction(client.send_results(mq, 1, fut.result(10))[0], f"P{i:04d}"))
    assert sum(client.max_offset(q) for q in qs) == 0  # all still invisible
    marks: list[int] = []
    rollback = set(txns[::10])
    client.end_transactions([t for t in txns if t not in rollback], commit=True, producer_group="PG_P",
                            on_progress=marks.append)
    client.end_transactions(sorted(rollback), commit=False, producer_group="PG_P")
    assert marks == sorted(marks) and marks[-1] == len(txns) - len(rollback) and len(marks) >= 3, marks
    got = sorted(r.payload() for q in qs for r in decode_records(client.pull(q, 0, 1000).body))
    assert got == sorted(b"p-%d" % i for i in range(700) if i % 10), len(got)


def test_open_transaction_is_checked_back_and_survives_restart(tmp_path) -> None:
    with EmbeddedBroker(str(tmp_path), transaction_timeout_ms=0, transaction_check_interval_ms=200) as mq:
        checks: list[RemotingCommand] = []
        got = threading.Event()

        def on_request(conn: RemotingConnection, cmd: RemotingCommand) -> None:
            if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
                checks.append(cmd)
                got.set()

        c = RemotingClient(mq.namesrv_addr, on_request=on_request)
        try:
            q = c.message_queues("TX_CHECK")[1]
            sent = c.send(q, b"open", _props(TRAN_MSG="true", PGROUP="PG_CHECK", UNIQ_KEY="U9"),
                          sys_flag=TransactionType.PREPARED, producer_group="PG_CHECK")
            mq.restart()  # the open transaction must be recovered from the store
            conn = c.connection(mq.broker_addr)
            conn.invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "p@1", "producerDataSet": [{"groupName": "PG_CHECK"}]}).encode()), 5, "heartbeat")
            assert got.wait(10), "no CHECK_TRANSACTION_STATE arrived"
            check = checks[0]
            assert check.ext_fields["tranStateTableOffset"] == str(sent.queue_offset)
            assert check.ext_fields["msgId"] == "U9"
            rec = decode_records(check.body)[0]
            assert rec.topic == "TX_CHECK" and rec.queue_id == 1 and rec.payload() == b"open"
            # answer the check: commit
            conn.invoke(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields={
                "producerGroup": "PG_CHECK", "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
                "commitLogOffset": check.ext_fields["commitLogOffset"], "commitOrRollback": "8",
                "fromTransactionCheck": "1", "msgId": "U9"}), 5, "end transaction")
            assert [r.payload() for r in decode_records(c.pull(q, 0, 32).body)] == [b"open"]
            mq.restart()
            assert not mq.broker.pending_tx  # ended transactions stay ended
            assert c.max_offset(q) == 1
        finally:
            c.close()


def test_check_backs_per_round_are_bounded_oldest_first(tmp_path) -> None:
    """A long exactly-once write leaves many halves past the timeout at once: each check round
    asks about at most transaction_checks_per_round of them, the oldest first (asking about all
    in one pass held the broker's loop for seconds)."""
    with EmbeddedBroker(str(tmp_path), transaction_timeout_ms=0, transaction_check_interval_ms=3_600_000,
                        transaction_checks_per_round=3) as mq:
        c = RemotingClient(mq.namesrv_addr, on_request=lambda conn, cmd: None)
        try:
            q = c.message_queues("TX_ROUNDS")[0]
            for i in range(10):
                c.send(q, b"h%d" % i, _props(TRAN_MSG="true", PGROUP="PG_ROUNDS", UNIQ_KEY=f"R{i}"),
                       sys_flag=TransactionType.PREPARED, producer_group="PG_ROUNDS")
            c.connection(mq.broker_addr).invoke(RemotingCommand(RequestCode.HEART_BEAT, body=json.dumps(
                {"clientID": "p@rounds", "producerDataSet": [{"groupName": "PG_ROUNDS"}]}).encode()), 5, "heartbeat")
            tx = mq.broker.transactions

            def one_round() -> tuple[list[int], list[int]]:
                before = [p.checks for p in tx.pending.values()]
                tx.check()
                return before, [p.checks for p in tx.pending.values()]

            deadline = time.monotonic() + 30
            while True:
                before, after = mq.call(one_round)
                assert sum(after) - sum(before) <= 3
                assert after == sorted(after, reverse=True), "the oldest halves are asked about first"
                if all(after) or time.monotonic() > deadline:
                    break
            assert all(after), after
        finally:
            c.close()


def test_reset_offset_by_timestamp(client: RemotingClient, broker: EmbeddedBroker, topic: str) -> None:
    qs = client.message_queues(topic)
    for q in qs:
        client.send(q, b"old")
    time.sleep(0.02)
    mid = int(time.time() * 1000)
    time.sleep(0.02)
    client.create_group("g_reset")
    for q in qs:
        client.send(q, b"new")
        client.update_consumer_offset("g_reset", q, 2)
    resp = client.invoke(broker.broker_addr, RemotingCommand(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext_fields={
        "topic": topic, "group": "g_reset", "timestamp": str(mid), "isForce": "true"}), "reset offset")
    assert b'"queueId":0' in resp.body
    assert [client.query_consumer_offset("g_reset", q) for q in qs] == [1, 1, 1, 1]


def test_unknown_request_code_is_answered_not_supported(broker: EmbeddedBroker) -> None:
    c = RemotingConnection(broker.broker_addr)
    try:
        resp = c.invoke(RemotingCommand(9999), 5, "unknown")
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        resp = RemotingConnection(broker.namesrv_addr).invoke(RemotingCommand(9999), 5, "unknown")
        assert resp.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    finally:
        c.close()


def test_binary_header_requests_are_answered_in_binary(broker: EmbeddedBroker, topic: str) -> None:
    req = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=5, ext_fields={"topic": topic},
                          language="CPP", serialize_type=SERIALIZE_ROCKETMQ)
    resp = _raw_call(broker.namesrv_addr, req.encode())
    assert resp is not None and resp.serialize_type == SERIALIZE_ROCKETMQ
    assert resp.code == 0 and resp.opaque == 5 and b"brokerDatas" in resp.body


def test_oversized_and_malformed_frames_close_only_that_connection(broker: EmbeddedBroker,
                                                                   client: RemotingClient, topic: str) -> None:
    q = client.message_queues(topic)[0]
    hdr = json.dumps({"code": 10, "opaque": 42, "flag": 0}).encode()
    huge = struct.pack(">II", 64 * 1024 * 1024, len(hdr)) + hdr
    resp = _raw_call(broker.broker_addr, huge)
    assert resp is not None and resp.code == ResponseCode.SYSTEM_ERROR and resp.opaque == 42
    assert "exceeds the cap" in (resp.remark or "")
    garbage = b"{not json"
    resp = _raw_call(broker.broker_addr, struct.pack(">II", 4 + len(garbage), len(garbage)) + garbage)
    assert resp is not None and resp.code == ResponseCode.SYSTEM_ERROR and "malformed" in (resp.remark or "")
    # a send with a bad integer field is answered, and the connection keeps working
    conn = RemotingConnection(broker.broker_addr)
    try:
        r = conn.invoke(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": topic, "queueId": "x"}),
                        5, "bad field")
        assert r.code == ResponseCode.SYSTEM_ERROR and "queueId" in (r.remark or "")
        r = conn.invoke(RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": topic, "queueId": "0"}),
                        5, "good")
        assert r.code == 0
    finally:
        conn.close()
    client.send(q, b"still serving")
    assert client.max_offset(q) == 1


def test_restart_keeps_acknowledged_messages_and_offsets(tmp_path) -> None:
    mq = EmbeddedBroker(str(tmp_path)).start()
    try:
        c = RemotingClient(mq.namesrv_addr)
        qs = c.message_queues("DURABLE")
        for i in range(200):
            c.send_batch(qs[i % 4], [BatchEntry(b"m%d" % i)])
        c.create_group("g")
        c.update_consumer_offset("g", qs[0], 17)
        mq.restart()
        c.close()
        c = RemotingClient(mq.namesrv_addr)
        assert [c.max_offset(q) for q in qs] == [50, 50, 50, 50]
        assert c.query_consumer_offset("g", qs[0]) == 17
        bodies = sorted(r.payload() for q in qs for r in decode_records(c.pull(q, 0, 100).body))
        assert bodies == sorted(b"m%d" % i for i in range(200))
        c.close()
    finally:
        mq.close()


def test_connection_refused_is_reported_with_address_and_operation() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from rocketmq_spark.client import ClientConfig

    c = RemotingClient(f"127.0.0.1:{port}", ClientConfig(retries=2, retry_budget_s=2))
    with pytest.raises(ConnectionFailedError) as info:
        c.route("x")
    assert f"127.0.0.1:{port}" in str(info.value) and "route lookup" in str(info.value)


def test_concurrent_flush_rounds_never_fail_sync_sends(tmp_path) -> None:
    # Regression: overlapping flush rounds raced on the checkpoint's temp file, failing
    # sync-flushed sends that had in fact been stored.
    with EmbeddedBroker(str(tmp_path), flush="sync", flush_interval_ms=1) as mq:
        c = RemotingClient(mq.namesrv_addr)
        q = c.message_queues("FLUSH_RACE")[0]
        stop = threading.Event()

        def flush_forever() -> None:
            while not stop.is_set():
                mq.flush()

        t = threading.Thread(target=flush_forever)
        t.start()
        try:
            for _ in range(300):
                c.send(q, b"x" * 100)
        finally:
            stop.set()
            t.join()
            c.close()
        assert mq.broker.store.max_offset("FLUSH_RACE", 0) == 300


def test_group_names_follow_the_group_rule_not_the_topic_one(client: RemotingClient) -> None:
    long_group = "g" * 200  # too long for a topic (127), fine for a group (255)
    client.create_group(long_group)
    with pytest.raises(BrokerError, match="at most 255"):
        client.create_group("g" * 256)
    with pytest.raises(BrokerError, match="only letters"):
        client.create_group("bad group")
