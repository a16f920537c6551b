"""The client against a server that answers badly: a fake name server + broker on loopback (a
real socket, our frames or deliberately broken bytes) that routes a topic to itself and then
answers one kind of request with garbage, an over-cap frame, a missing or non-numeric field,
a damaged body, or nothing at all.

Each time the client must fail in bounded time with a RocketMQSparkError that names what was
wrong, the operation and the address - never hang, never allocate what a length prefix claims,
never return a made-up value, and never surface an IndexError/KeyError/struct.error.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import encode_record
from rocketmq_spark.errors import ConnectionFailedError, ProtocolError, RequestTimeoutError, RocketMQSparkError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting.codes import RequestCode, ResponseCode
from rocketmq_spark.remoting.frame import RemotingCommand
from rocketmq_spark.remoting.route import BrokerData, QueueData, TopicRouteData
from rocketmq_spark.source.pull_loop import read_range
from rocketmq_spark.source.queue_range import QueueRange

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

TOPIC = "FakeTopic"
Answer = Callable[[RemotingCommand], bytes | None]  # raw bytes to write back; None: stay silent


class FakeServer:
    """Name server and broker in one: routes :data:`TOPIC` (2 queues) to itself; every other
    request goes to ``answer`` (default: SUCCESS with offset 0)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.answer: Answer = lambda req: req.response_to(ResponseCode.SUCCESS, {"offset": "0"}).encode()
        self.route_body: bytes | None = None
        self.requests: list[int] = []
        self._conns: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def route(self) -> bytes:
        if self.route_body is not None:
            return self.route_body
        return TopicRouteData((QueueData("broker-a", 2, 2),),
                              (BrokerData("broker-a", {0: self.addr}, "FakeCluster"),)).to_json()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                    n = struct.unpack_from(">I", buf)[0]
                    req = RemotingCommand.decode(buf[4:4 + n])
                    buf = buf[4 + n:]
                    self.requests.append(req.code)
                    if req.code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
                        out: bytes | None = req.response_to(ResponseCode.SUCCESS, body=self.route()).encode()
                    else:
                        out = self.answer(req)
                    if out:
                        conn.sendall(out)
        except OSError:
            return

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass


@pytest.fixture()
def fake() -> Iterator[FakeServer]:
    server = FakeServer()
    try:
        yield server
    finally:
        server.close()


def _client(fake: FakeServer, timeout_s: float = 2.0) -> RemotingClient:
    return RemotingClient(fake.addr, ClientConfig(request_timeout_s=timeout_s, retries=2, retry_budget_s=5.0,
                                                  backoff_max_s=0.1))


def _mq() -> MessageQueue:
    return MessageQueue(TOPIC, "broker-a", 0)


def _fails(fn: Callable[[], object], kind: type[BaseException], *words: str, within_s: float = 15.0) -> str:
    started = time.monotonic()
    with pytest.raises(kind) as ei:
        fn()
    took = time.monotonic() - started
    text = str(ei.value)
    assert took < within_s, f"took {took:.1f}s to fail: {text}"
    for w in words:
        assert w in text, f"{w!r} not in {text!r}"
    return text


def test_garbage_answer_fails_naming_the_address_and_operation(fake: FakeServer) -> None:
    fake.answer = lambda req: struct.pack(">I", 12) + b"\x00\x00\x00\x08{not json"
    c = _client(fake)
    try:
        text = _fails(lambda: c.max_offset(_mq()), ConnectionFailedError, fake.addr, "max offset")
        assert "malformed" in text
    finally:
        c.close()


def test_an_over_cap_length_prefix_is_refused_before_reading_it(fake: FakeServer) -> None:
    # 2 GiB announced, nothing behind it: the client must refuse from the prefix, not wait for or
    # allocate the frame
    fake.answer = lambda req: struct.pack(">I", 0x7FFFFFF0)
    c = _client(fake, timeout_s=30.0)
    try:
        _fails(lambda: c.max_offset(_mq()), ConnectionFailedError, fake.addr, "exceeds the cap", within_s=10.0)
    finally:
        c.close()


@pytest.mark.parametrize("fields, problem", [
    ({}, "has no offset field"),
    ({"offset": "abc"}, "offset='abc', not a 64-bit integer"),
    ({"offset": "1" + "0" * 30}, "not a 64-bit integer"),
])
def test_missing_or_bad_numbers_are_protocol_errors(fake: FakeServer, fields: dict[str, str], problem: str) -> None:
    fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, dict(fields)).encode()
    c = _client(fake)
    try:
        mq = _mq()
        for call, op in ((lambda: c.max_offset(mq), "max offset"), (lambda: c.min_offset(mq), "min offset"),
                         (lambda: c.max_offsets([mq]), "max offset"),
                         (lambda: c.query_consumer_offset("g", mq), "query offset of group 'g'"),
                         (lambda: c.search_offset(mq, 0), "search offset by timestamp")):
            _fails(call, ProtocolError, problem, op, fake.addr)
    finally:
        c.close()


def test_bad_send_and_pull_answers(fake: FakeServer) -> None:
    fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, {"msgId": "X", "queueOffset": "x"}).encode()
    c = _client(fake)
    try:
        _fails(lambda: c.send(_mq(), b"m"), ProtocolError, "queueOffset='x'", "send to", fake.addr)
        fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, {"nextBeginOffset": "soon"}).encode()
        _fails(lambda: c.pull(_mq(), 0, 8), ProtocolError, "nextBeginOffset='soon'", "pull of", fake.addr)
        # every field there and a number, but one past a Java long
        fake.answer = lambda req: req.response_to(ResponseCode.PULL_NOT_FOUND, {
            "nextBeginOffset": "4", "minOffset": "0", "maxOffset": str(1 << 63)}).encode()
        _fails(lambda: c.pull(_mq(), 0, 8), ProtocolError, "maxOffset=", "not a 64-bit integer", "pull of", fake.addr)
        # a field left out reads as -1 (unknown), as before
        fake.answer = lambda req: req.response_to(ResponseCode.PULL_NOT_FOUND, {"nextBeginOffset": "4"}).encode()
        res = c.pull(_mq(), 0, 8)
        assert (res.status, res.next_offset, res.min_offset, res.max_offset) == ("NO_NEW_MSG", 4, -1, -1)
    finally:
        c.close()


@pytest.mark.parametrize("body, words", [
    (b"<html>", ("malformed JSON",)),
    (b"[1, 2]", ("not an object",)),
    (b"\xff\xfe", ("not UTF-8",)),
    (json.dumps({"queueDatas": [{"brokerName": "broker-a", "readQueueNums": 10 ** 9, "writeQueueNums": 1}],
                 "brokerDatas": []}).encode(), ("queue numbers", "1000000000")),
    (json.dumps({"queueDatas": [{"readQueueNums": 2}], "brokerDatas": []}).encode(), ("malformed TopicRouteData",)),
])
def test_malformed_routes(fake: FakeServer, body: bytes, words: tuple[str, ...]) -> None:
    fake.route_body = body
    c = _client(fake)
    try:
        _fails(lambda: c.message_queues(TOPIC), ProtocolError, *words)
    finally:
        c.close()


def test_bad_json_bodies_of_admin_answers(fake: FakeServer) -> None:
    c = _client(fake)
    try:
        fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, body=b"[1,2]").encode()
        _fails(lambda: c.consumer_ids("g", fake.addr), ProtocolError, "consumer list of group 'g'", "not an object")
        _fails(lambda: c.topic_configs(fake.addr), ProtocolError, "topic config list", "not an object")
        fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, body=b'{"consumerIdList": 7}').encode()
        _fails(lambda: c.consumer_ids("g", fake.addr), ProtocolError, "consumerIdList is not a list")
        fake.answer = lambda req: req.response_to(ResponseCode.SUCCESS, body=b'{"topicList": "x"}').encode()
        _fails(c.topic_list, ProtocolError, "malformed topic list")
    finally:
        c.close()


def test_silence_is_a_timeout_naming_the_address_and_operation(fake: FakeServer) -> None:
    fake.answer = lambda req: None
    c = _client(fake, timeout_s=0.5)
    try:
        _fails(lambda: c.max_offset(_mq()), RequestTimeoutError, fake.addr, "max offset", "no response within")
    finally:
        c.close()


def test_a_damaged_pull_body_fails_the_read_task_clearly(fake: FakeServer) -> None:
    good = b"".join(encode_record(topic=TOPIC, queue_id=0, queue_offset=i, body=b"x" * 10) for i in range(4))
    damaged = bytearray(good)
    damaged[4:8] = b"\x00\x00\x00\x00"  # the first record's magic

    def answer(req: RemotingCommand) -> bytes:
        if req.code == RequestCode.PULL_MESSAGE:
            return req.response_to(ResponseCode.SUCCESS, {"nextBeginOffset": "4", "minOffset": "0",
                                                          "maxOffset": "4"}, body=bytes(damaged)).encode()
        return req.response_to(ResponseCode.SUCCESS, {"offset": "4"}).encode()

    fake.answer = answer
    c = _client(fake)
    try:
        part = QueueRange(_mq(), 0, 4, (fake.addr,), None, "g", "*", 32, True, 3_000)
        text = _fails(lambda: list(read_range(part, c)), RocketMQSparkError, "bad message magic")
        assert "record at byte 0" in text and f"{TOPIC}/broker-a:0" in text and fake.addr in text
        assert "offsets [0, 4)" in text
        # the same body undamaged reads fine: the failure above is the damage, not the fake
        damaged[:] = good
        assert sum(b.num_rows for b in read_range(part, c)) == 4
    finally:
        c.close()
