"""One check for every send path: each way a send can reach the broker (SEND_MESSAGE,
SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, and a pipelined run of prepared sends, which has a short
path of its own) refuses the same sends with the same code, and takes the same ones.

The copies of these rules once drifted apart path by path (a batch to an existing retry topic
was stored by the vectorised path and refused by the per-message one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocketmq_spark.broker.broker import Broker
from rocketmq_spark.broker.config import BrokerConfig
from rocketmq_spark.broker.remoting_service import RemotingService
from rocketmq_spark.codec import BatchEntry, TransactionType, encode_batch
from rocketmq_spark.remoting.codes import RequestCode, ResponseCode
from rocketmq_spark.remoting.frame import RemotingCommand

MAX_BODY = 1024


class _Conn:
    peer = "127.0.0.1:50123"


def _broker(root: Path) -> Broker:
    b = Broker(BrokerConfig(data_dir=str(root), max_message_size=MAX_BODY, auto_create_groups=False),
               "127.0.0.1:10911")
    b.create_topic("T", 4)
    b.create_topic("READ_ONLY", 4, perm=4)
    b.groups.table.put("G")
    b.groups.retry_topic_of("G")  # the retry topic exists: the vectorised batch path once took it
    return b


#: (name, topic, queue id, body, extra properties, a header field made malformed)
CASES = [
    ("a plain send", "T", 1, b"x", "", None),
    ("any queue", "T", -1, b"x", "", None),
    ("a queue past the topic's", "T", 4, b"x", "", None),
    ("a topic name with a space", "BAD NAME", 0, b"x", "", None),
    ("a topic that cannot be created", "RMQ_SYS_TRANS_HALF_TOPIC", 0, b"x", "", None),
    ("a topic without write permission", "READ_ONLY", 0, b"x", "", None),
    ("a body over the maximum", "T", 0, b"x" * (MAX_BODY + 1), "", None),
    ("properties over the maximum", "T", 0, b"x", "K\x01" + "v" * 40_000 + "\x02", None),
    ("a retry topic of a group", "%RETRY%G", 0, b"x", "", None),
    ("a retry topic of no group", "%RETRY%NOBODY", 0, b"x", "", None),
    ("a malformed queue id", "T", 0, b"x", "", "queueId"),
    ("a malformed born timestamp", "T", 0, b"x", "", "bornTimestamp"),
]

_SHORT = {"topic": "b", "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
          "reconsumeTimes": "j", "producerGroup": "a", "batch": "m"}


def _fields(topic: str, queue_id: int, props: str, sys_flag: int, batch: bool, bad: str | None) -> dict[str, str]:
    ext = {"topic": topic, "queueId": str(queue_id), "sysFlag": str(sys_flag), "bornTimestamp": "1700000000000",
           "flag": "0", "properties": props, "reconsumeTimes": "0", "producerGroup": "pg",
           "batch": str(batch).lower()}
    if bad is not None:
        ext[bad] = "twelve"
    return ext


def _request(path: str, opaque: int, topic: str, queue_id: int, body: bytes, props: str, bad: str | None
             ) -> RemotingCommand:
    uniq = f"UNIQ_KEY\x01{opaque:032X}\x02"
    if path == "batch":
        ext = _fields(topic, queue_id, props, 0, True, bad)  # the batch's own, appended to each message's
        payload = encode_batch([BatchEntry(body, uniq), BatchEntry(b"y", uniq)])
        return RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, opaque=opaque, body=payload,
                               ext_fields={_SHORT[k]: v for k, v in ext.items()})
    prepared = path == "prepared run"
    ext = _fields(topic, queue_id, f"{uniq}{props}" + ("TRAN_MSG\x01true\x02" if prepared else ""),
                  int(TransactionType.PREPARED) if prepared else 0, False, bad)
    if path == "SEND_MESSAGE":
        return RemotingCommand(RequestCode.SEND_MESSAGE, opaque=opaque, body=body, ext_fields=ext)
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, body=body,
                           ext_fields={_SHORT[k]: v for k, v in ext.items()})


def _answer(b: Broker, path: str, case: tuple[str, str, int, bytes, str, str | None]) -> tuple[int, str]:
    _, topic, queue_id, body, props, bad = case
    conn = _Conn()
    if path == "prepared run":  # with a good send beside it: the run takes the pipelined path
        reqs = [_request(path, 1, "T", 0, b"ok", "", None), _request(path, 2, topic, queue_id, body, props, bad)]
        out = RemotingService(b).dispatch_many(conn, reqs)  # type: ignore[arg-type]
        first = out[0]
        assert isinstance(first, bytes) or first.code == ResponseCode.SUCCESS  # type: ignore[union-attr]
        got = out[1]
    else:
        got = RemotingService(b).dispatch(conn, _request(path, 2, topic, queue_id, body, props, bad))  # type: ignore[arg-type]
    if isinstance(got, (bytes, bytearray, memoryview)):  # a success frame written as it is
        return ResponseCode.SUCCESS, ""
    assert isinstance(got, RemotingCommand)
    return got.code, got.remark or ""


PATHS = ["SEND_MESSAGE", "SEND_MESSAGE_V2", "batch", "prepared run"]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_send_path_refuses_and_takes_the_same_sends(tmp_path: Path,
                                                         case: tuple[str, str, int, bytes, str, str | None]) -> None:
    answers = {path: _answer(_broker(tmp_path / path.replace(" ", "_")), path, case) for path in PATHS}
    codes = {path: code for path, (code, _) in answers.items()}
    single = {p: c for p, c in codes.items() if p != "batch"}
    assert len(set(single.values())) == 1, answers
    if case[1].startswith("%RETRY%"):  # Java brokers refuse a batch to a retry topic, whichever path
        assert codes["batch"] == ResponseCode.MESSAGE_ILLEGAL, answers
        assert "batch request does not support retry group" in answers["batch"][1]
    else:
        assert codes["batch"] == codes["SEND_MESSAGE"], answers


def test_the_codes_are_java_brokers(tmp_path: Path) -> None:
    """What each case is answered (the rules themselves, read from Java's msgCheck and
    SendMessageProcessor), on the single-send path."""
    expected = {
        "a plain send": ResponseCode.SUCCESS, "any queue": ResponseCode.SUCCESS,
        "a queue past the topic's": ResponseCode.INVALID_PARAMETER,
        "a topic name with a space": ResponseCode.MESSAGE_ILLEGAL,
        "a topic that cannot be created": ResponseCode.TOPIC_NOT_EXIST,
        "a topic without write permission": ResponseCode.NO_PERMISSION,
        "a body over the maximum": ResponseCode.MESSAGE_ILLEGAL,
        "properties over the maximum": ResponseCode.MESSAGE_ILLEGAL,
        "a retry topic of a group": ResponseCode.SUCCESS,
        "a retry topic of no group": ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
        "a malformed queue id": ResponseCode.SYSTEM_ERROR, "a malformed born timestamp": ResponseCode.SYSTEM_ERROR,
    }
    got = {}
    for case in CASES:
        b = _broker(tmp_path / str(len(got)))
        got[case[0]] = _answer(b, "SEND_MESSAGE_V2", case)[0]
    assert got == expected
