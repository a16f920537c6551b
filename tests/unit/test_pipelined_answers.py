"""The remoting client's pipelined calls match answers to requests by position: a request left
without an answer fails the call, naming the operation and the address, rather than shifting
the answers after it onto other queues. No sockets: the connection is a fake."""

from __future__ import annotations

import pytest

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.client.connection import Reply
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.errors import RocketMQSparkError
from rocketmq_spark.model import MessageQueue, Txn
from rocketmq_spark.remoting.codes import ResponseCode
from rocketmq_spark.remoting.frame import RemotingCommand

BROKER_ADDR = "127.0.0.1:10911"
QUEUES = [MessageQueue("T", "broker-a", i) for i in range(3)]


class ShortConnection:
    """Answers every request it is given (a max offset of 100 + its place, a send stored on the
    queue it named), but hands back ``lose`` replies fewer than requests (the last ones): what a
    connection that lost track of some requests would look like."""

    closed = False

    def __init__(self, lose: int) -> None:
        self.lose = lose

    def send_many(self, cmds: list[RemotingCommand]) -> list[Reply]:
        replies = []
        for n, cmd in enumerate(cmds):
            reply = Reply()
            reply.set_result(RemotingCommand(ResponseCode.SUCCESS, ext_fields={
                "offset": str(100 + n), "msgId": "", "queueOffset": str(n), "queueId": cmd.ext_fields.get("e", "0")}))
            replies.append(reply)
        return replies[:len(replies) - self.lose]


def _client(lose: int) -> RemotingClient:
    client = RemotingClient("127.0.0.1:9876")
    client.remember_broker_addr("broker-a", BROKER_ADDR)
    conn = ShortConnection(lose)
    client.connection = lambda address: conn  # type: ignore[method-assign,assignment,return-value]
    return client


def test_pipelined_offsets_with_every_answer_are_matched_by_position() -> None:
    assert _client(lose=0).max_offsets(QUEUES) == {QUEUES[0]: 100, QUEUES[1]: 101, QUEUES[2]: 102}


def test_a_pipelined_request_without_an_answer_fails_naming_the_operation_and_address() -> None:
    with pytest.raises(RocketMQSparkError) as err:
        _client(lose=1).max_offsets(QUEUES)
    msg = str(err.value)
    assert f"max offset of {QUEUES[2]} at {BROKER_ADDR}" in msg and "request 3 of 3" in msg


def test_a_send_without_an_answer_fails_naming_the_queue_and_address() -> None:
    client = _client(lose=1)
    sends = [(mq, client.send_request(mq, [BatchEntry(b"x")])) for mq in QUEUES]
    with pytest.raises(RocketMQSparkError) as err:
        client.send_async_many(sends)
    assert f"send to {QUEUES[2]} at {BROKER_ADDR}" in str(err.value)


def test_every_send_with_an_answer_keeps_its_order() -> None:
    client = _client(lose=0)
    sends = [(mq, client.send_request(mq, [BatchEntry(b"x")])) for mq in QUEUES]
    answers = client.send_async_many(sends)
    assert [client.send_results(mq, 1, a.result(1))[0].queue for mq, a in zip(QUEUES, answers)] == QUEUES


def test_an_end_of_a_transaction_without_an_answer_fails_naming_it_and_the_address() -> None:
    txns = [Txn("broker-a", "T", i, 1000 + i, f"id-{i}") for i in range(3)]
    progress: list[int] = []
    assert _client(lose=0).end_transactions(txns, commit=True, on_progress=progress.append) == []
    assert progress == [3]
    with pytest.raises(RocketMQSparkError) as err:
        _client(lose=1).end_transactions(txns, commit=True, on_progress=progress.append)
    assert f"commit of transactions (id-2) at {BROKER_ADDR}" in str(err.value) and progress == [3]
