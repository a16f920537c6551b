"""Property-based fuzzing (hypothesis) of every decoder that meets bytes from the network, in
process: frames, stored records (pull bodies) in both the reference and the vectorised Arrow
decoder, batch send bodies, route JSON, properties and offset message ids.

Whatever the bytes, a decoder returns a value or raises :class:`ProtocolError` (a
RocketMQSparkError naming what was wrong) - never IndexError, struct.error, UnicodeError,
OverflowError, a numpy or Arrow error, a hang or a crash. The fast Arrow decoder must agree
with the reference decoder on damaged input too: both raise, or both give the same batch.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rocketmq_spark.codec import (
    BatchEntry,
    decode_batch,
    decode_properties,
    decode_records,
    encode_batch,
    encode_properties,
    encode_record,
    parse_offset_msg_id,
)
from rocketmq_spark.codec.arrow import SMALL_INPUT_BYTES, decode_to_batch, decode_to_batch_reference
from rocketmq_spark.errors import ProtocolError
from rocketmq_spark.remoting.frame import RemotingCommand, _json_header, decode_frame
from rocketmq_spark.remoting.route import TopicRouteData

pytestmark = [pytest.mark.reliability]

SOAK = os.environ.get("RMQ_SPARK_SOAK") == "1"  # set by pytest --soak (tests/conftest.py)
FUZZ = settings(max_examples=3000 if SOAK else 300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "remoting-frames.jsonl")) as _f:
    GOLDEN = [bytes.fromhex(r["raw_hex"]) for r in map(json.loads, _f) if r.get("raw_hex")]


def _damage(data: bytes, edits: list[tuple[int, int]], cut: int | None, tail: bytes) -> bytes:
    buf = bytearray(data)
    for pos, value in edits:
        if buf:
            buf[pos % len(buf)] = value
    if cut is not None and buf:
        del buf[cut % len(buf):]
    return bytes(buf) + tail


damage = st.tuples(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=8),
                   st.none() | st.integers(0, 1 << 20), st.binary(max_size=16))


# -- frames ------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_as_a_frame(raw: bytes) -> None:
    for data in (raw, struct.pack(">I", len(raw)) + raw):
        try:
            decode_frame(data)
        except ProtocolError:
            pass


@FUZZ
@given(st.sampled_from(GOLDEN), damage)
def test_damaged_golden_frames(frame: bytes, how: tuple) -> None:
    data = _damage(frame, *how)
    try:
        cmd = decode_frame(data)
    except ProtocolError:
        return
    # what decodes can be answered: the broker builds and encodes a response to it
    cmd.response_to(1, remark="x").encode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@FUZZ
@given(st.dictionaries(st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields",
                                        "serializeTypeCurrentRPC"]), json_values, max_size=8))
def test_json_headers_of_any_shape(header: dict) -> None:
    raw = json.dumps(header).encode()
    data = struct.pack(">II", 4 + len(raw), len(raw)) + raw
    try:
        cmd = decode_frame(data)
    except ProtocolError:
        return
    assert -(1 << 31) <= cmd.code < (1 << 31) and -(1 << 31) <= cmd.opaque < (1 << 31)
    cmd.response_to(1).encode()


any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["\ud800", "\x00", "\x01\x02", "\u00e9"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


@FUZZ
@given(any_json, st.booleans(), st.sampled_from([b"", b" ", b"\n"]))
def test_json_headers_decode_as_json_loads_decodes_them(value: Any, ascii_only: bool, pad: bytes) -> None:
    """The header decoder (orjson first, json for what it refuses) gives what json.loads
    gives, and refuses what it refuses: NaN, 70-bit integers, lone surrogates, padding."""
    raw = pad + json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass") + pad
    _decodes_as_json_loads(raw)


@pytest.mark.parametrize("raw", [b"1e400", b"-1e400", b"-0", b"1.0", b"18446744073709551615",
                                 b"18446744073709551616", b"-9223372036854775809", b'{"a":1,"a":2}',
                                 b"\xef\xbb\xbf{}", '{"code":1}'.encode("utf-16"), b'{"k":"\\ud800"}'])
def test_json_header_edge_numbers_and_encodings_decode_as_json_loads(raw: bytes) -> None:
    _decodes_as_json_loads(raw)


def _decodes_as_json_loads(raw: bytes) -> None:
    try:
        want = json.loads(raw)
    except ValueError:
        with pytest.raises(ProtocolError):
            _json_header(raw)
        return
    assert json.dumps(_json_header(raw)) == json.dumps(want)  # NaN != NaN: compared as written


header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
#: what a field may hold instead of what clients write: 19-digit and 33-bit integers, floats ...
odd_values = (st.sampled_from([1 << 31, -(1 << 31) - 1, 12345678901234567890123, -(10 ** 19), 1.0, 2.5, True,
                               None, "7", [], {}, [1], {"k": 2.5}]) | st.integers(-(1 << 70), 1 << 70)
              | st.floats(allow_nan=False, allow_infinity=False))
_int32 = st.integers(-(1 << 31), (1 << 31) - 1)
#: a header as clients write it (each field may be absent), then up to two fields holding anything
header_fields = st.builds(
    lambda usual, odd: {**usual, **odd},
    st.fixed_dictionaries({}, optional={
        "code": _int32, "opaque": _int32, "flag": _int32, "version": _int32, "language": st.text(max_size=8),
        "remark": st.text(max_size=8), "other": header_values,
        "extFields": st.dictionaries(st.text(max_size=4), st.text(max_size=4) | odd_values, max_size=3)}),
    st.dictionaries(st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields"]),
                    odd_values, max_size=2))


@FUZZ
@given(header_fields, st.sampled_from([b"", b" "]))
@example({"code": 2.5}, b"").via("a float in a field read")
@example({"code": 1, "remark": 12345678901234567890123}, b"").via("a 23-digit integer orjson makes a float")
@example({"code": 1, "extFields": {"k": 10 ** 19}}, b"").via("a 20-digit integer orjson makes a float")
@example({"code": 1, "other": 10 ** 19}, b"").via("a 20-digit integer in a field not read")
def test_json_headers_read_directly_decode_as_field_by_field(header: dict, pad: bytes) -> None:
    """_decode_json_header reads the usual header straight from orjson's parse: whatever the
    header (19-digit integers orjson makes floats included), it gives what the field by field
    decoder gives, or refuses with the same words."""
    raw = pad + json.dumps(header).encode() + pad
    try:
        want = RemotingCommand._decode_json_fields(raw)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as got:
            RemotingCommand._decode_json_header(memoryview(raw))
        assert str(got.value) == str(exc)
        return
    cmd = RemotingCommand._decode_json_header(memoryview(raw))
    assert cmd == want
    assert [type(v) for v in (cmd.code, cmd.opaque, cmd.flag, cmd.version, cmd.remark, cmd.language)] == \
           [type(v) for v in (want.code, want.opaque, want.flag, want.version, want.remark, want.language)]
    assert [type(v) for v in cmd.ext_fields.values()] == [type(v) for v in want.ext_fields.values()]


@FUZZ
@given(st.integers(-(1 << 15), (1 << 15) - 1), st.integers(0, 255), st.integers(-(1 << 15), (1 << 15) - 1),
       st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 31), (1 << 31) - 1), st.binary(max_size=64))
def test_binary_headers_with_any_numbers_and_tail(code: int, lang: int, version: int, opaque: int, flag: int,
                                                  rest: bytes) -> None:
    header = struct.pack(">hbhii", code, lang - 128, version, opaque, flag) + rest
    data = struct.pack(">II", 4 + len(header), (1 << 24) | len(header)) + header
    try:
        decode_frame(data)
    except ProtocolError:
        pass


# -- records (pull bodies) ----------------------------------------------------------------

record = st.builds(
    lambda body, props, tagged, v6, qid, off: encode_record(
        topic="FuzzTopic", queue_id=qid, queue_offset=off, body=body,
        properties=encode_properties({**props, **({"TAGS": "t"} if tagged else {})}),
        born_host="[::1]:9" if v6 else "127.0.0.1:9", store_host="127.0.0.1:10911"),
    st.binary(max_size=120),
    st.dictionaries(st.text("abcKEYS_", min_size=1, max_size=6), st.text(max_size=6), max_size=3),
    st.booleans(), st.booleans(), st.integers(0, 7), st.integers(0, 1 << 40))


@FUZZ
@given(st.lists(record, min_size=1, max_size=6), damage)
def test_damaged_records_reference_decoder(records: list[bytes], how: tuple) -> None:
    data = _damage(b"".join(records), *how)
    try:
        decode_records(data)
    except ProtocolError:
        pass
    try:
        decode_to_batch_reference([data], "broker-a")
    except ProtocolError:
        pass


def _outcome(fn, parts):  # type: ignore[no-untyped-def]
    try:
        return fn(parts, "broker-a")
    except ProtocolError:
        return ProtocolError


@settings(FUZZ, max_examples=600 if SOAK else 60)
@given(st.lists(record, min_size=4, max_size=8), damage, st.integers(1, 4))
def test_damaged_records_fast_decoder_agrees_with_the_reference(records: list[bytes], how: tuple,
                                                                parts: int) -> None:
    # repeat the records past SMALL_INPUT_BYTES so the vectorised path is the one taken; the
    # chunks are pull bodies (whole records), cut where the undamaged records ended
    block = b"".join(records)
    copies = SMALL_INPUT_BYTES // len(block) + 2
    data = _damage(block * copies, *how)
    cuts = [len(block) * (copies * i // parts) for i in range(1, parts)]
    cuts = [c for c in cuts if 0 < c < len(data)]
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    fast, ref = _outcome(decode_to_batch, chunks), _outcome(decode_to_batch_reference, chunks)
    if fast is ProtocolError or ref is ProtocolError:
        assert fast is ref, "one decoder refused what the other decoded"
    else:
        assert fast.equals(ref)


@FUZZ
@given(st.lists(st.builds(BatchEntry, st.binary(max_size=64), st.text(max_size=20), st.integers(0, 1 << 20)),
                min_size=1, max_size=5), damage)
def test_damaged_batch_send_bodies(entries: list[BatchEntry], how: tuple) -> None:
    data = _damage(encode_batch(entries), *how)
    try:
        out = decode_batch(data)
    except ProtocolError:
        return
    assert all(isinstance(e.body, bytes) for e in out)


# -- JSON and text -----------------------------------------------------------------------


@FUZZ
@given(json_values | st.fixed_dictionaries({"queueDatas": json_values, "brokerDatas": json_values}))
def test_route_json_of_any_shape(obj: object) -> None:
    for data in (json.dumps(obj).encode(), json.dumps(obj).encode()[:-1]):
        try:
            TopicRouteData.from_json(data)
        except ProtocolError:
            pass


@FUZZ
@given(st.binary(max_size=200))
def test_route_json_from_random_bytes(raw: bytes) -> None:
    try:
        TopicRouteData.from_json(raw)
    except ProtocolError:
        pass


@FUZZ
@given(st.text(max_size=200))
def test_properties_and_message_ids_from_any_text(text: str) -> None:
    assert isinstance(decode_properties(text), dict)
    try:
        parse_offset_msg_id(text)
    except ProtocolError:
        pass


def test_a_good_frame_still_decodes() -> None:
    # the fuzz above must not pass because everything is refused
    cmd = RemotingCommand(10, opaque=3, ext_fields={"topic": "T"})
    assert decode_frame(cmd.encode()).ext_fields == {"topic": "T"}
    assert all(isinstance(decode_frame(g), RemotingCommand) for g in GOLDEN)
