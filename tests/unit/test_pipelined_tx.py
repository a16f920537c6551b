"""The embedded broker stores the half messages and END_TRANSACTIONs that arrive together (a
pipelining writer and driver) in one write and answers them in one: it must store and answer
exactly what it does for the same requests one by one, and the codec shortcuts it takes must
agree with the general decoders and encoders."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from rocketmq_spark.broker import connection as connection_mod
from rocketmq_spark.broker import send as send_mod
from rocketmq_spark.broker.broker import Broker
from rocketmq_spark.broker.config import BrokerConfig
from rocketmq_spark.broker.connection import Connection
from rocketmq_spark.broker.remoting_service import RemotingService
from rocketmq_spark.broker.state import HALF_TOPIC
from rocketmq_spark.codec import (
    PropertyKey,
    TransactionType,
    decode_properties,
    decode_record,
    encode_record,
    offset_msg_id,
    offset_of_msg_id,
    parse_offset_msg_id,
    property_of,
    split_record,
)
from rocketmq_spark.errors import ProtocolError
from rocketmq_spark.model import Txn
from rocketmq_spark.remoting.codes import RequestCode, ResponseCode
from rocketmq_spark.remoting.frame import FLAG_ONEWAY, RemotingCommand, send_success_frame, success_frame
from rocketmq_spark.sink.txlog import TxLog

NOW = 1_750_000_000.123


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50123) if name == "peername" else default

    def close(self) -> None:
        pass


def _connected(b: Broker, *, together: bool) -> tuple[Connection, _Transport]:
    service = RemotingService(b)
    conn = Connection(service.dispatch, lambda c: None, dispatch_many=service.dispatch_many if together else None)
    t = _Transport()
    conn.connection_made(t)
    return conn, t


def _feed(b: Broker, reqs: list[RemotingCommand], *, together: bool) -> list[RemotingCommand]:
    """``reqs`` to a new connection of ``b``, in one read (``together``) or a read each; the answers."""
    conn, t = _connected(b, together=together)
    if together:
        conn.data_received(b"".join(r.encode() for r in reqs))
    else:
        for r in reqs:
            conn.data_received(r.encode())
    return _answers(t)


def _answers(t: _Transport) -> list[RemotingCommand]:
    data = b"".join(t.writes)
    t.writes.clear()
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big")
        out.append(RemotingCommand.decode(memoryview(data)[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out


def _half(opaque: int, topic: str, queue_id: int, i: int, *, pgroup: bool = True, oneway: bool = False,
          own: str = "") -> RemotingCommand:
    props = f"UNIQ_KEY\x01{i:032X}\x02TRAN_MSG\x01true\x02TAGS\x01t{i % 3}\x02{own}"
    if pgroup:
        props += "PGROUP\x01pg-own\x02"
    ext = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id),
           "f": str(int(TransactionType.PREPARED)), "g": "1700000000000", "h": "0", "i": props, "j": "0",
           "k": "false", "m": "false", "n": "broker-a"}
    return RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=opaque, flag=FLAG_ONEWAY if oneway else 0,
                           ext_fields=ext, body=b"body-%d" % i)


def _end(opaque: int, pos: int, half_offset: int, kind: int) -> RemotingCommand:
    return RemotingCommand(RequestCode.END_TRANSACTION, opaque=opaque, ext_fields={
        "producerGroup": "pg", "tranStateTableOffset": str(half_offset), "commitLogOffset": str(pos),
        "commitOrRollback": str(kind), "fromTransactionCheck": "0", "msgId": "m", "transactionId": "m"})


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for sub in ("store/commitlog", "store/consumequeue")
            for p in sorted((root / sub).rglob("*")) if p.is_file()}


def test_requests_that_arrive_together_are_stored_and_answered_as_one_by_one(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)
    brokers = {name: Broker(BrokerConfig(data_dir=str(tmp_path / name)), "127.0.0.1:10911")
               for name in ("alone", "together")}
    writes = {name: 0 for name in brokers}
    for name, b in brokers.items():
        b.create_topic("TX_A", 4)
        b.create_topic("TX_B", 2)

        def counted(messages: Any, put: Any = b.store.put, name: str = name) -> Any:
            writes[name] += 1
            return put(messages)

        b.store.put = counted  # type: ignore[method-assign]
        if name == "alone":
            # the one-by-one broker stores what an END run stores as the messages put() takes
            # (each copy as committed_copy builds it), the other through put_copies
            def as_messages(items: Any, marker: Any, b: Broker = b) -> None:
                messages = []
                for raw, _, _, _, body in items:
                    if raw is not None:
                        messages.append(b.transactions.committed_copy(split_record(raw)))
                    messages.append(dataclasses.replace(marker, body=body))
                b.store.put(messages)

            b.store.put_copies = as_messages  # type: ignore[method-assign]
        else:
            def counted_copies(items: Any, marker: Any, put: Any = b.store.put_copies, name: str = name) -> Any:
                writes[name] += 1
                return put(items, marker)

            b.store.put_copies = counted_copies  # type: ignore[method-assign]
    sends = [_half(i + 1, "TX_A" if i % 3 else "TX_B", i % 4 if i % 3 else i % 2, i, pgroup=i % 5 != 0)
             for i in range(40)]
    # a half that carries a property the broker sets (merged as a map) in the second run: the
    # run is stored in one write all the same
    sends[30] = _half(31, "TX_A", 2, 30, own=f"{PropertyKey.REAL_QID}\x017\x02")
    sends.insert(20, RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=999,
                                     ext_fields={"topic": "TX_A", "queueId": "1"}))  # splits the run
    sends.append(_half(500, "TX_A", 0, 500, oneway=True))  # stored, not answered
    sends.append(_half(501, "NO SUCH TOPIC", 0, 501))  # refused, the others stored

    answers: dict[str, list[RemotingCommand]] = {}
    appending = send_mod.needs_parsing
    for name, b in brokers.items():
        # the one-by-one broker builds half properties as a map, the other appends them
        monkeypatch.setattr(send_mod, "needs_parsing", (lambda p: True) if name == "alone" else appending)
        answers[name] = _feed(b, sends, together=name == "together")
    monkeypatch.setattr(send_mod, "needs_parsing", appending)

    halves = [(int(a.ext_fields["queueOffset"]), offset_of_msg_id(a.ext_fields["msgId"]))
              for a in answers["alone"] if a.code == ResponseCode.SUCCESS and "msgId" in a.ext_fields]
    assert len(halves) == 40
    ends = [_end(2000 + k, pos, off, TransactionType.ROLLBACK if k % 7 == 0 else TransactionType.COMMIT)
            for k, (off, pos) in enumerate(halves)]
    ends.append(_end(3000, halves[1][1], halves[1][0], TransactionType.COMMIT))  # again: a second copy
    ends.append(_end(3001, 123456789, -1, TransactionType.COMMIT))  # no half there: refused
    ends.append(_end(3002, halves[2][1], halves[2][0], TransactionType.NOT_TYPE))  # unknown yet: no answer
    ends.append(_end(3003, halves[3][1], halves[3][0], TransactionType.ROLLBACK))  # ended before: a marker again
    # splits the ENDs in two runs; the second holds the END of a checked-back half (its copy says
    # so: the general path takes that run)
    ends.insert(20, RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=998,
                                    ext_fields={"topic": "TX_A", "queueId": "1"}))
    for b in brokers.values():
        b.transactions.pending[halves[25][0]].checks = 1
    for name, b in brokers.items():
        answers[name] += _feed(b, ends, together=name == "together")
        b.store.commitlog.close()

    def seen(cmds: list[RemotingCommand]) -> list[tuple[int, int, str | None, dict[str, str]]]:
        return [(c.opaque, c.code, c.remark, c.ext_fields) for c in cmds]

    assert seen(answers["together"]) == seen(answers["alone"])
    # one store write per run, a run ending at GET_MAX_OFFSET (and where the connection's slice of
    # 64 requests ends: not here): sends before and after GET_MAX_OFFSET, ENDs before and after it
    # (the refused topic's send is checked before the store)
    assert connection_mod._SLICE == 64
    assert writes["together"] == 4 and writes["alone"] == 41 + 42, writes  # 41 halves stored, 42 ends applied
    codes = [a.code for a in answers["alone"]]
    assert len(answers["alone"]) == 41 + 1 + 44 and codes.count(ResponseCode.SUCCESS) == 40 + 1 + 43
    assert 500 not in [a.opaque for a in answers["alone"]] and 3002 not in [a.opaque for a in answers["alone"]]
    got, want = _files(tmp_path / "together"), _files(tmp_path / "alone")
    assert {k.replace("together", "x") for k in got} == {k.replace("alone", "x") for k in want}
    for (k1, v1), (k2, v2) in zip(sorted(got.items()), sorted(want.items())):
        assert v1 == v2, f"{k1} differs from {k2}"


def test_half_header_fields_missing_empty_or_malformed_in_a_run(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The run path reads a half's short header fields itself: missing or empty ones take the
    defaults, malformed ones the general path's answer (only theirs: the rest of the run is
    stored), queue ids past the topic's queues refused, byte for byte as the halves one by one."""
    monkeypatch.setattr(time, "time", lambda: NOW)
    changes: list[dict[str, str | None]] = [
        {}, {"h": None, "j": None, "g": None, "e": None}, {"h": "", "j": "", "g": "", "e": ""}, {"e": "-1"},
        {"e": "9"}, {"h": "x"}, {"j": "2", "h": "3"}, {"g": "abc"}, {"e": "1.5"}, {"f": "5"}, {"a": None},
        {"h": "12", "g": "1700000000123"}, {"i": "TAGS\x01t\x02UNIQ_KEY\x01v"}, {"b": "%RETRY%pg"},
        {"i": "UNIQ_KEY\x01u\x02"}, {"f": "\u00b2"},  # a digit to str.isdigit, not to int()
    ]
    sends = []
    for i, change in enumerate(changes * 2):
        req = _half(i + 1, "TX_A", i % 4, i, pgroup=i % 2 == 0)
        for key, value in change.items():
            if value is None:
                req.ext_fields.pop(key, None)
            else:
                req.ext_fields[key] = value
        sends.append(req)
    answers = {}
    appending = send_mod.needs_parsing
    for name in ("alone", "together"):
        b = Broker(BrokerConfig(data_dir=str(tmp_path / name)), "127.0.0.1:10911")
        b.create_topic("TX_A", 4)
        # the one-by-one broker builds half properties as a map, the other appends them
        monkeypatch.setattr(send_mod, "needs_parsing", (lambda p: True) if name == "alone" else appending)
        answers[name] = [(a.opaque, a.code, a.remark, a.ext_fields)
                         for a in _feed(b, sends, together=name == "together")]
        b.store.commitlog.close()
    assert answers["together"] == answers["alone"]
    assert sum(a[1] == ResponseCode.SUCCESS for a in answers["alone"]) >= 20
    got, want = _files(tmp_path / "together"), _files(tmp_path / "alone")
    assert [k.replace("together", "x") for k in got] == [k.replace("alone", "x") for k in want]
    assert list(got.values()) == list(want.values())


def test_answers_leave_a_slice_at_a_time(tmp_path: Path) -> None:
    """150 half messages in one read: stored and answered 64, 64, then 22, each slice's answers
    written before the next slice is stored (the client reads them meanwhile)."""
    b = Broker(BrokerConfig(data_dir=str(tmp_path)), "127.0.0.1:10911")
    b.create_topic("TX_A", 4)
    conn, t = _connected(b, together=True)
    stored_before_write: list[int] = []
    write = t.write

    def spying(data: bytes) -> None:  # how many halves were stored when each write went out
        stored_before_write.append(b.store.max_offset(HALF_TOPIC, 0))
        write(data)

    t.write = spying  # type: ignore[method-assign]
    conn.data_received(b"".join(_half(i + 1, "TX_A", i % 4, i).encode() for i in range(150)))
    assert stored_before_write == [64, 128, 150]
    answers = _answers(t)
    assert [a.opaque for a in answers] == list(range(1, 151))
    assert all(a.code == ResponseCode.SUCCESS for a in answers)
    b.store.commitlog.close()


@pytest.mark.parametrize("header", [b'{"code":2.5}', b'{"code":310,"extFields":5}', b'{"code":310,"flag":"x"}',
                                    b'{"code":12345678901234567890123}', b'{bad'])
def test_a_malformed_header_after_good_requests_is_refused_and_closes(tmp_path: Path, header: bytes) -> None:
    """Requests before a frame whose header is refused are answered, then the refusal, then
    the connection closes (the decoder must not keep a view of the connection's buffer)."""
    b = Broker(BrokerConfig(data_dir=str(tmp_path)), "127.0.0.1:10911")
    b.create_topic("TX_A", 4)
    conn, t = _connected(b, together=True)
    bad = len(header).to_bytes(4, "big") + header
    conn.data_received(b"".join(_half(i + 1, "TX_A", 0, i).encode() for i in range(3))
                       + len(bad).to_bytes(4, "big") + bad)
    answers = _answers(t)
    assert [a.opaque for a in answers] == [1, 2, 3, 0] and conn.closed
    assert answers[-1].code == ResponseCode.SYSTEM_ERROR and answers[-1].remark.startswith("malformed frame: ")
    b.store.commitlog.close()


def test_codec_shortcuts_agree_with_the_general_forms() -> None:
    props = {"UNIQ_KEY": "AB", "TAGS": "x", PropertyKey.REAL_TOPIC: "T", "KEYS": "k1 k2"}
    for host in ("127.0.0.1:10911", "[::1]:10911"):
        raw = encode_record(topic="RMQ_SYS_TRANS_HALF_TOPIC", queue_id=0, queue_offset=7, body=b"b\x00dy",
                            properties=props, flag=3, sys_flag=int(TransactionType.PREPARED), physical_offset=4096,
                            born_timestamp=11, born_host=host, store_timestamp=12, store_host=host,
                            reconsume_times=2)
        full, parts = decode_record(raw), split_record(raw)
        assert (parts.topic, parts.queue_id, parts.queue_offset, parts.physical_offset, parts.flag, parts.sys_flag,
                parts.born_timestamp, parts.reconsume_times, parts.body) == (
            full.topic, full.queue_id, full.queue_offset, full.physical_offset, full.flag, full.sys_flag,
            full.born_timestamp, full.reconsume_times, full.body)
        assert decode_properties(parts.properties) == full.properties
        with pytest.raises(ProtocolError):
            split_record(raw[:-3])
        m = offset_msg_id(host, 1 << 40)
        assert offset_of_msg_id(m) == parse_offset_msg_id(m)[1] == 1 << 40
    with pytest.raises(ProtocolError):
        offset_of_msg_id("XYZ")
    text = "TAGS\x01a\x02XTAGS\x01no\x02TAGS\x01b\x02K\x01v"
    assert property_of(text, "TAGS") == decode_properties(text)["TAGS"] == "b"
    assert property_of(text, "K") == "v" and property_of(text, "AGS") is None and property_of("", "K") is None


@pytest.mark.parametrize("txid", ["AB01", 'quote"d', "tab\there", ""])
def test_send_success_frames_are_the_encoded_answer(txid: str) -> None:
    ext = {"msgId": "7F00000100002A9F0000000000001234", "queueId": "3", "queueOffset": "12",
           "MSG_REGION": "DefaultRegion", "TRACE_ON": "true", "transactionId": txid}
    frame = send_success_frame(4242, ext["msgId"], 3, 12, "DefaultRegion", txid)
    assert frame == success_frame(4242, ext)
    if frame is not None:
        assert frame == RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=4242).response_to(
            ResponseCode.SUCCESS, ext_fields=ext).encode()


@pytest.mark.parametrize("ext", [None, {"msgId": "7F0000010000", "queueId": "3", "transactionId": "AB"},
                                 {"a": 'quote"d'}, {"a": "tab\there"}])
def test_success_frames_are_the_encoded_answer(ext: dict[str, str] | None) -> None:
    req = RemotingCommand(RequestCode.END_TRANSACTION, opaque=4242, ext_fields={"x": "y"})
    frame = success_frame(req.opaque, ext)
    if ext is not None and any(c in v for v in ext.values() for c in '"\t'):
        assert frame is None  # escaping needed: the command is built instead
    else:
        assert frame == req.response_to(ResponseCode.SUCCESS, ext_fields=ext).encode()


@pytest.mark.parametrize("value", ["UNIQ_KEY\x01AB\x02TAGS\x01x y\x02", "plain", "", "\x01\x02", "é\x01", "a\x03b"])
def test_json_headers_written_directly_are_what_json_writes(value: str) -> None:
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=9, ext_fields={"i": value, "b": "T"})
    fast = cmd._encode_plain_json_header()
    assert fast is None or fast == cmd._dump_json_header()
    assert (fast is not None) == (value.isascii() and value.replace("\x01", "").replace("\x02", "").isprintable())
    assert RemotingCommand.decode(memoryview(cmd.encode())[4:]).ext_fields == {"i": value, "b": "T"}


def test_commit_progress_is_kept_with_the_record_and_pruned_with_it(tmp_path: Path) -> None:
    log = TxLog(str(tmp_path), keep=2)
    txns = [Txn("b", "T", i, 100 * i, f"M{i}") for i in range(5)]
    log.record(1, txns)
    assert log.progress(1) == 0
    log.mark_progress(1, 3)
    assert log.progress(1) == 3 and log.txns(1)[3:] == sorted(txns)[3:]
    log.record(4, txns)
    assert not (tmp_path / "rocketmq-sink" / "commits" / "1.progress").exists()
