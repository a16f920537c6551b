"""Remoting codec: golden frames from real clients, round trips of every format."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocketmq_spark.codec import (
    MAGIC_V1,
    MAGIC_V2,
    BatchEntry,
    SysFlag,
    decode_batch,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch,
    encode_properties,
    encode_record,
    java_string_hash,
    offset_msg_id,
    pack_host,
    parse_offset_msg_id,
    record_size,
)
from rocketmq_spark.codec.batch import ENTRY_FIELDS, ENTRY_HEAD, ENTRY_OFFSETS
from rocketmq_spark.codec.record import (
    HEAD_OFFSETS,
    MAX_V1_TOPIC_BYTES,
    PROPERTIES_LENGTH_BYTES,
    TAIL_OFFSETS,
    TOPIC_LENGTH_V1_BYTES,
    TOPIC_LENGTH_V2_BYTES,
    fixed_fields,
    fixed_size,
)
from rocketmq_spark.errors import FrameTooLargeError, ProtocolError
from rocketmq_spark.remoting import (
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    TopicRouteData,
    decode_frame,
    loads_lenient,
)

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "remoting-frames.jsonl")


def _frames() -> list[dict]:
    with open(FIXTURE) as fh:
        return [json.loads(line) for line in fh if line.strip()]


GOLDEN = [f for f in _frames() if f.get("raw_hex")]


@pytest.mark.parametrize("frame", GOLDEN,
                         ids=lambda f: f"{f.get('language', f.get('req'))}-{f.get('name', f.get('req'))}-{f['dir']}")
def test_golden_frames_decode(frame: dict) -> None:
    raw = bytes.fromhex(frame["raw_hex"])
    cmd = decode_frame(raw)
    assert cmd.code == frame["code"]
    assert cmd.opaque == frame["opaque"]
    assert cmd.serialize_type == frame["ser"]
    if frame["dir"] == "request":
        assert cmd.language == frame["language"]
        assert cmd.version == frame["version"]
        assert not cmd.is_response
        # extFields arrive as strings, numbers or booleans: all become strings
        for key, value in (frame["extFields"] or {}).items():
            expected = ("true" if value else "false") if isinstance(value, bool) else str(value)
            assert cmd.ext_fields[key] == expected
    else:
        assert cmd.is_response
    assert len(cmd.body) == frame["body_len"]
    if frame.get("properties") and not frame.get("batch"):
        props_key = "i" if "i" in cmd.ext_fields else "properties"
        assert decode_properties(cmd.ext_fields[props_key]) == frame["properties"]
    if frame.get("batch"):
        entries = decode_batch(cmd.body)
        assert [e.body.decode() for e in entries] == [b["body"] for b in frame["batch"]]
        assert [e.properties for e in entries] == [b["propertiesRaw"] for b in frame["batch"]]


def test_golden_pull_response_records() -> None:
    frame = next(f for f in GOLDEN if f.get("req") == "PULL_MESSAGE" and f["code"] == 0)
    cmd = decode_frame(bytes.fromhex(frame["raw_hex"]))
    records = decode_records(cmd.body, check_crc=True)
    assert len(records) == int(cmd.ext_fields["nextBeginOffset"]) - 0
    assert [r.queue_offset for r in records] == list(range(len(records)))
    first = records[0]
    assert first.topic == "TopicAll"
    assert first.payload().startswith(b"Hello from")
    assert first.tags in ("TagA", "TagB")
    assert first.store_host.startswith("127.0.0.1:")
    # offset message id = store host + physical offset
    host, pos = parse_offset_msg_id(first.offset_msg_id)
    assert (host, pos) == (first.store_host, first.physical_offset)


def test_golden_route_with_bare_integer_keys() -> None:
    frame = next(f for f in GOLDEN if f.get("req") == "GET_ROUTEINFO_BY_TOPIC")
    cmd = decode_frame(bytes.fromhex(frame["raw_hex"]))
    assert b"{0:" in cmd.body  # written the Java way
    route = TopicRouteData.from_json(cmd.body)
    assert route.broker_addr("broker-a") == "127.0.0.1:20930"
    assert route.queue_datas[0].read_queue_nums == 4
    again = TopicRouteData.from_json(route.to_json())
    assert again == route


@pytest.mark.parametrize("ser", [SERIALIZE_JSON, SERIALIZE_ROCKETMQ])
def test_command_round_trip_both_header_types(ser: int) -> None:
    cmd = RemotingCommand(code=310, opaque=77, flag=0, ext_fields={"a": "PG", "b": "T", "k": "false"},
                          body=b"\x00\x01body", remark="hi", language="JAVA", version=121, serialize_type=ser)
    raw = cmd.encode()
    assert raw[4] == ser  # the serialize type is the header word's high byte
    back = decode_frame(raw)
    assert (back.code, back.opaque, back.ext_fields, back.body, back.remark, back.serialize_type) == (
        310, 77, {"a": "PG", "b": "T", "k": "false"}, b"\x00\x01body", "hi", ser)
    resp = back.response_to(0, {"x": "1"})
    assert resp.serialize_type == ser and resp.opaque == 77 and resp.is_response


def test_frame_cap_is_checked_from_the_prefix() -> None:
    raw = (100 * 1024 * 1024).to_bytes(4, "big") + b"\x00\x00\x00\x02{}"
    with pytest.raises(FrameTooLargeError, match="exceeds the cap"):
        decode_frame(raw)


@pytest.mark.parametrize("raw", [
    b"\x00\x00\x00\x06\x00\x00\x00\x10{}",  # header length beyond the frame
    b"\x00\x00\x00\x06\x00\x00\x00\x02[]",  # not an object
    b"\x00\x00\x00\x06\x07\x00\x00\x02{}",  # unknown serialize type
    b"\x00\x00\x00\x08\x00\x00\x00\x04{\"a\"",  # truncated JSON
    b"\x00\x00\x00\x0a\x01\x00\x00\x06\x00\x01\x00\x00\x00\x00",  # truncated binary header
])
def test_malformed_frames_raise_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_frame(raw)


def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("a") == 97
    assert java_string_hash("ab") == 3105
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("TagA") == 2598919
    assert java_string_hash("polygenelubricants") == -2147483648  # overflow wraps like Java's int


def _record(**over: object) -> bytes:
    base = dict(topic="orders", queue_id=3, queue_offset=42, body=b"payload",
                properties={"TAGS": "A", "KEYS": "k1 k2", "u": "v"}, flag=5, sys_flag=0, physical_offset=1234,
                born_timestamp=1700000000123, born_host="10.1.2.3:5555", store_timestamp=1700000000456,
                store_host="127.0.0.1:10911", reconsume_times=2, prepared_transaction_offset=9)
    base.update(over)
    return encode_record(**base)  # type: ignore[arg-type]


def test_record_round_trip_v1_ipv4() -> None:
    rec = decode_record(_record(), check_crc=True)
    assert rec.magic == MAGIC_V1
    assert (rec.topic, rec.queue_id, rec.queue_offset, rec.flag) == ("orders", 3, 42, 5)
    assert (rec.born_host, rec.store_host) == ("10.1.2.3:5555", "127.0.0.1:10911")
    assert (rec.born_timestamp, rec.store_timestamp) == (1700000000123, 1700000000456)
    assert rec.tags == "A" and rec.keys == ["k1", "k2"] and rec.user_properties() == {"u": "v"}
    assert (rec.reconsume_times, rec.prepared_transaction_offset, rec.physical_offset) == (2, 9, 1234)
    assert rec.msg_id == offset_msg_id("127.0.0.1:10911", 1234)
    assert len(rec.msg_id) == 32


def test_record_v2_long_topic_and_ipv6_hosts() -> None:
    topic = "t" * 200
    rec = decode_record(_record(topic=topic, born_host="[::1]:7000", store_host="[fe80::2]:10911"), check_crc=True)
    assert rec.magic == MAGIC_V2 and rec.topic == topic
    assert rec.sys_flag & SysFlag.BORN_HOST_V6 and rec.sys_flag & SysFlag.STORE_HOST_V6
    assert rec.born_host == "[::1]:7000" and rec.store_host == "[fe80::2]:10911"
    assert len(rec.offset_msg_id) == 56
    assert parse_offset_msg_id(rec.offset_msg_id) == ("[fe80::2]:10911", 1234)


def test_compressed_body_inflates() -> None:
    body = (b"x" * 5000) + os.urandom(100)
    rec = decode_record(_record(body=zlib.compress(body), sys_flag=SysFlag.COMPRESSED))
    assert rec.payload() == body
    bad = decode_record(_record(body=b"not zlib", sys_flag=SysFlag.COMPRESSED))
    with pytest.raises(ProtocolError, match="does not inflate"):
        bad.payload()


def test_record_crc_and_bounds_are_checked() -> None:
    raw = bytearray(_record())
    raw[-2] = ord("w")  # a property value: the CRC only covers the body
    decode_record(bytes(raw))
    body_at = raw.index(b"payload")
    raw[body_at] ^= 0xFF
    with pytest.raises(ProtocolError, match="CRC"):
        decode_record(bytes(raw), check_crc=True)
    with pytest.raises(ProtocolError):
        decode_record(_record()[:-3])
    with pytest.raises(ProtocolError, match="magic"):
        decode_record(b"\x00\x00\x00\x60" + b"\x00" * 92)


@given(st.sampled_from(["10.1.2.3:5555", "[::1]:7000"]), st.sampled_from(["127.0.0.1:10911", "[fe80::2]:10911"]),
       st.sampled_from(["t", "t" * 127, "t" * 128]), st.binary(max_size=40), st.sampled_from(["", "TAGS\x01A\x02"]))
def test_the_layout_table_says_where_encode_record_puts_each_field(born: str, store: str, topic: str, body: bytes,
                                                                  props: str) -> None:
    # RECORD_FIELDS is the one definition every walk reads (record, arrow, batch_kernels): it must
    # describe the bytes the encoder writes, for either host width and either topic length
    raw = _record(born_host=born, store_host=store, topic=topic, body=body, properties=props)
    rec = decode_record(raw)
    born_b, store_b = pack_host(born)[0], pack_host(store)[0]
    want = {"totalSize": len(raw), "magic": rec.magic, "bodyCRC": rec.body_crc, "queueId": 3, "flag": 5,
            "queueOffset": 42, "physicalOffset": 1234, "sysFlag": rec.sys_flag, "bornTimestamp": 1700000000123,
            "bornHost": born_b, "storeTimestamp": 1700000000456, "storeHost": store_b, "reconsumeTimes": 2,
            "preparedTransactionOffset": 9, "bodyLength": len(body)}
    fields = fixed_fields(len(born_b), len(store_b))
    assert [name for name, _, _ in fields] == list(want)
    for name, typ, at in fields:
        if typ.startswith("V"):
            assert raw[at : at + int(typ[1:])] == want[name], name
        else:
            assert struct.unpack_from(typ.replace("i4", "i").replace("i8", "q"), raw, at)[0] == want[name], name
    offsets = {name: at for name, _, at in fields}
    assert HEAD_OFFSETS == {name: offsets[name] for name in HEAD_OFFSETS}
    store_end = offsets["storeHost"] + len(store_b)
    assert {name: offsets[name] - store_end for name in TAIL_OFFSETS} == TAIL_OFFSETS
    at = fixed_size(len(born_b), len(store_b))
    assert raw[at : at + len(body)] == body
    at += len(body)
    topic_len = TOPIC_LENGTH_V2_BYTES if len(topic) > MAX_V1_TOPIC_BYTES else TOPIC_LENGTH_V1_BYTES
    assert int.from_bytes(raw[at : at + topic_len], "big") == len(topic)
    at += topic_len + len(topic)
    assert int.from_bytes(raw[at : at + PROPERTIES_LENGTH_BYTES], "big") == len(props)
    assert at + PROPERTIES_LENGTH_BYTES + len(props) == len(raw) == record_size(
        len(topic), len(born_b), len(body), len(props), len(store_b))


def test_the_batch_entry_table_says_where_encode_batch_puts_each_field() -> None:
    raw = encode_batch([BatchEntry(b"body!", "k\x01v\x02", flag=7)])
    want = {"totalSize": len(raw), "magic": 0, "bodyCRC": 0, "flag": 7, "bodyLength": 5}
    assert list(ENTRY_OFFSETS) == [name for name, _ in ENTRY_FIELDS] == list(want)
    for name, at in ENTRY_OFFSETS.items():
        assert struct.unpack_from(">i", raw, at)[0] == want[name], name
    assert raw[ENTRY_HEAD.size :] == b"body!" + (4).to_bytes(PROPERTIES_LENGTH_BYTES, "big") + b"k\x01v\x02"


def test_batch_round_trip_and_overrun() -> None:
    entries = [BatchEntry(b"one", "TAGS\x01A\x02"), BatchEntry(b"", ""),
               BatchEntry(b"three" * 100, "k\x01v\x02", flag=3)]
    assert decode_batch(encode_batch(entries)) == entries
    with pytest.raises(ProtocolError):
        decode_batch(encode_batch(entries)[:-2])


@given(st.dictionaries(
    st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), min_size=1),
    st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)))))
def test_properties_round_trip(props: dict[str, str]) -> None:
    assert decode_properties(encode_properties(props)) == props


@given(st.binary(max_size=2000), st.integers(0, 2**31 - 1), st.integers(0, 2**62))
def test_record_round_trip_property(body: bytes, qid: int, offset: int) -> None:
    rec = decode_record(_record(body=body, queue_id=qid, queue_offset=offset), check_crc=True)
    assert (rec.body, rec.queue_id, rec.queue_offset) == (body, qid, offset)


@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoders(data: bytes) -> None:
    for fn in (decode_frame, decode_batch, decode_records):
        try:
            fn(data)
        except ProtocolError:
            pass


def test_lenient_json_quotes_only_bare_keys() -> None:
    assert loads_lenient('{0:"a:1",12 : {"x":"{3:4}"}}') == {"0": "a:1", "12": {"x": "{3:4}"}}
    with pytest.raises(ProtocolError):
        loads_lenient("{oops")


_texts = st.one_of(st.text(max_size=12), st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126),
                                                 max_size=12))


@given(code=st.integers(-(2**15), 2**15 - 1), opaque=st.integers(-(2**31), 2**31 - 1), flag=st.integers(0, 3),
       remark=st.none() | _texts, language=st.sampled_from(["JAVA", "PYTHON", 'OD"D', "é"]),
       ext=st.dictionaries(_texts, _texts, max_size=6))
def test_json_headers_written_directly_equal_json_dumps(code: int, opaque: int, flag: int, remark: str | None,
                                                        language: str, ext: dict[str, str]) -> None:
    cmd = RemotingCommand(code=code, opaque=opaque, flag=flag, remark=remark, language=language, ext_fields=ext)
    assert cmd.encode_header() == cmd._dump_json_header()
    assert RemotingCommand.decode(cmd.encode()[4:]).ext_fields == ext


def test_a_batch_response_header_takes_the_direct_path() -> None:
    ids = ",".join(f"7F00000100002A9F{i * 250:016X}" for i in range(512))
    cmd = RemotingCommand(code=0, opaque=7, flag=1, language="JAVA",
                          ext_fields={"msgId": ids, "queueId": "3", "queueOffset": "1024"})
    assert cmd._encode_plain_json_header() == cmd._dump_json_header()
    assert RemotingCommand(code=0, ext_fields={"k": 'a"b'})._encode_plain_json_header() is None
    assert RemotingCommand(code=0, ext_fields={"k": "a\nb"})._encode_plain_json_header() is None


_props = st.text(alphabet=st.sampled_from(['a', 'Z', '0', ' ', '\x01', '\x02', '"', '\\', 'é', '\x7f', '\n']),
                 max_size=16)


@given(group=_texts, topic=_texts, broker=_texts, queue_id=st.integers(0, 64), sys_flag=st.sampled_from([0, 4, 8]),
       props=_props, msg_id=_props, commit=st.booleans())
def test_requests_with_their_fields_written_by_the_client_encode_as_the_encoder_writes_them(
        group: str, topic: str, broker: str, queue_id: int, sys_flag: int, props: str, msg_id: str,
        commit: bool) -> None:
    # send_request / end_transaction_request write the extFields themselves (a template per queue):
    # the frame must be the encoder's, byte for byte, or left to it
    from rocketmq_spark.client.remoting import RemotingClient
    from rocketmq_spark.codec import BatchEntry
    from rocketmq_spark.model import MessageQueue

    mq = MessageQueue(topic, broker, queue_id)
    client = RemotingClient("127.0.0.1:9876")  # connects on first use only
    reqs = [client.send_request(mq, [BatchEntry(b"b", props)], producer_group=group, sys_flag=sys_flag,
                                born_ts=1700000000000),
            RemotingClient.end_transaction_request(broker, producer_group=group, commit_log_offset=123456789,
                                                   queue_offset=queue_id, msg_id=msg_id, commit=commit)]
    # a pull's fields come from a template per queue and subscription: all but the offset
    for at in (queue_id * 1000, 7):
        pull = client.pull_request(mq, at, 32, group=group, subscription=props)
        assert list(pull.ext_fields.items()) == [
            ("consumerGroup", group or "rocketmq-spark"), ("topic", topic), ("queueId", str(queue_id)),
            ("queueOffset", str(at)), ("maxMsgNums", "32"), ("sysFlag", "4"), ("commitOffset", "0"),
            ("suspendTimeoutMillis", "0"), ("subscription", props), ("subVersion", "0"), ("expressionType", "TAG"),
            ("bname", broker)]
        reqs.append(pull)
    # a single send's fields come from a template per queue and flags: those of the header, in order
    for _ in range(2):
        again = client.send_request(mq, [BatchEntry(b"b", props)], producer_group=group, sys_flag=sys_flag,
                                    born_ts=1700000000000)
        assert list(again.ext_fields.items()) == [
            ("a", group), ("b", topic), ("c", "TBW102"), ("d", "4"), ("e", str(queue_id)), ("f", str(sys_flag)),
            ("g", "1700000000000"), ("h", "0"), ("i", props), ("j", "0"), ("k", "false"), ("m", "false"),
            ("n", broker)]
        again.ext_fields["i"] = "changed"  # in place, by a caller: the next request's are its own
    for req in reqs:
        req.opaque = 77
        plain = RemotingCommand(req.code, opaque=77, ext_fields=dict(req.ext_fields), body=req.body)
        assert req.encode() == plain.encode()
        req.ext_fields = {**req.ext_fields, "x": "1"}  # a new dict: the written fields are not used
        assert RemotingCommand.decode(req.encode()[4:]).ext_fields == req.ext_fields
