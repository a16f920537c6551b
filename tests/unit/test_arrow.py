"""The vectorised decode_to_batch against the per-record reference decoder (the oracle)."""

from __future__ import annotations

import datetime as dt
import zlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocketmq_spark.codec import (
    MAGIC_V1,
    SYSTEM_PROPERTY_KEYS,
    MessageRecord,
    SysFlag,
    arrow,
    decode_records,
    encode_record,
    property_of,
    split_record,
)
from rocketmq_spark.codec.arrow import ARROW_SCHEMA, RETRY_COLUMNS, decode_to_batch, decode_to_batch_reference
from rocketmq_spark.errors import ProtocolError

BROKER = "broker-a"


@pytest.fixture(autouse=True)
def always_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small inputs would go to the reference decoder: make every input take the fast path."""
    monkeypatch.setattr(arrow, "SMALL_INPUT_BYTES", 0)


def assert_same(chunks: list[bytes], end: int | None = None) -> pa.RecordBatch:
    ref = decode_to_batch_reference(chunks, BROKER, end)
    fast = decode_to_batch(chunks, BROKER, end)
    assert fast.schema == ARROW_SCHEMA
    if not fast.equals(ref):  # name the differing columns
        diff = [n for n in ARROW_SCHEMA.names if not fast.column(n).equals(ref.column(n))]
        raise AssertionError(f"columns differ: {diff}\nfast: {fast.to_pylist()[:3]}\nref:  {ref.to_pylist()[:3]}")
    return fast


def no_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the reference decoder is used (the fast path must handle the input itself)."""
    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("the reference decoder was used")

    monkeypatch.setattr(arrow, "decode_to_batch_reference", boom)


def record(i: int = 0, **kw: object) -> bytes:
    args: dict[str, object] = {
        "topic": "T", "queue_id": 1, "queue_offset": i, "body": b"body-%d" % i,
        "properties": {"TAGS": "a", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:031d}", "p": "v"},
        "physical_offset": 1000 + 300 * i, "born_timestamp": 1_700_000_000_000 + i,
        "store_timestamp": 1_700_000_000_001 + i, "born_host": "10.0.0.1:5000",
        "store_host": "10.0.0.2:10911",
    }
    args.update(kw)
    return encode_record(**args)  # type: ignore[arg-type]


# -- property-based -----------------------------------------------------------------------

# keys and values: any text but the two separators (surrogates cannot be encoded)
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
_key = st.one_of(
    _text,
    st.sampled_from(sorted(SYSTEM_PROPERTY_KEYS)),
    st.sampled_from(["region", "traceId", "TAGSX", "KEY", "uniq_key", "x-request-id-longer-than-24", "RETRY_TOPIC"]),
)
_keys_value = st.lists(st.sampled_from(["", "k1", "k2", "order-7", "ключ", "x y"]), max_size=4).map(" ".join)


@st.composite
def properties(draw: st.DrawFn) -> str:
    items: list[tuple[str, str]] = []
    if draw(st.booleans()):
        items.append(("TAGS", draw(_text)))
    if draw(st.booleans()):
        items.append(("KEYS", draw(_keys_value)))
    if draw(st.booleans()):
        items.append(("UNIQ_KEY", draw(st.text("0123456789ABCDEF", min_size=0, max_size=32))))
    items += draw(st.lists(st.tuples(_key, _text), max_size=4))
    items = draw(st.permutations(items))
    text = "".join(f"{k}\x01{v}\x02" for k, v in items)
    quirk = draw(st.sampled_from(["", "", "", "no-final-sep", "empty-item", "no-value-sep", "dup-tag"]))
    if quirk == "no-final-sep" and text:
        text = text[:-1]
    elif quirk == "empty-item":
        text = "\x02" + text.replace("\x02", "\x02\x02", 1)
    elif quirk == "no-value-sep":
        text += draw(_key) + "\x02"
    elif quirk == "dup-tag":
        text += f"TAGS\x01{draw(_text)}\x02KEYS\x01{draw(_keys_value)}\x02"
    return text


_ipv4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
                  st.integers(0, 65535)).map(lambda t: "{}.{}.{}.{}:{}".format(*t))


@st.composite
def records(draw: st.DrawFn, offset: int) -> bytes:
    return encode_record(
        topic=draw(st.sampled_from(["T", "TopicA", "主题", "t" * 127])),
        queue_id=draw(st.integers(-(2**31), 2**31 - 1)),
        queue_offset=offset,
        body=draw(st.binary(max_size=200)),
        properties=draw(properties()),
        flag=draw(st.integers(0, 7)),
        sys_flag=draw(st.sampled_from([0, 0, 4, 8, 12])),
        physical_offset=draw(st.integers(0, 2**62)),
        born_timestamp=draw(st.integers(0, 2**42)),
        born_host=draw(st.one_of(st.just("10.0.0.1:5000"), _ipv4)),
        store_timestamp=draw(st.integers(0, 2**42)),
        store_host=draw(st.one_of(st.just("10.0.0.2:10911"), _ipv4)),
        reconsume_times=draw(st.integers(0, 16)),
    )


@st.composite
def pull_bodies(draw: st.DrawFn) -> tuple[list[bytes], int | None]:
    n = draw(st.integers(1, 40))
    recs = [draw(records(offset=100 + i)) for i in range(n)]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=4))) if n > 1 else []
    chunks = [b"".join(recs[a:b]) for a, b in zip([0, *cuts], [*cuts, n])]
    end = draw(st.one_of(st.none(), st.integers(90, 100 + n + 5)))
    return chunks, end


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pull_bodies())
def test_matches_reference(case: tuple[list[bytes], int | None]) -> None:
    chunks, end = case
    assert_same(chunks, end)


WITH_RETRY = (*ARROW_SCHEMA.names, *RETRY_COLUMNS)


def assert_retry_same(chunks: list[bytes], end: int | None = None) -> pa.RecordBatch:
    """The retry columns as the reference decodes them, and the other columns as without them."""
    ref = decode_to_batch_reference(chunks, BROKER, end, retry=True)
    fast = decode_to_batch(chunks, BROKER, end, WITH_RETRY)
    assert fast.schema.names == list(WITH_RETRY)
    assert fast.equals(ref), [n for n in WITH_RETRY if not fast.column(n).equals(ref.column(n))]
    assert fast.select(ARROW_SCHEMA.names).equals(decode_to_batch(chunks, BROKER, end))
    return fast


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(pull_bodies())
def test_retry_columns_match_reference(case: tuple[list[bytes], int | None]) -> None:
    chunks, end = case
    assert_retry_same(chunks, end)


# -- the reference decoder against the record codec ------------------------------------------
#
# Two scalar walks of one layout (codec.record's decode_records, the reference decoder): on the
# records the fast path leaves to the reference (IPv6 hosts, V2 topics, compressed bodies)
# they must read the same fields, so neither can drift from RECORD_FIELDS alone.

_any_host = st.one_of(_ipv4, st.sampled_from(["[::1]:7000", "[2001:db8::7]:10911", "[fe80::2]:1"]))
_user_key = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), min_size=1,
                    max_size=8).filter(lambda k: k not in SYSTEM_PROPERTY_KEYS)


@st.composite
def any_record(draw: st.DrawFn, offset: int) -> bytes:
    props: dict[str, str] = draw(st.dictionaries(_user_key, _text, max_size=3))
    for key, value in (("TAGS", _text), ("KEYS", _keys_value), ("RETRY_TOPIC", _text),
                       ("UNIQ_KEY", st.text("0123456789ABCDEF", min_size=1, max_size=32))):
        if draw(st.booleans()):
            props[key] = draw(value)
    body = draw(st.binary(max_size=120))
    compressed = draw(st.booleans())
    return encode_record(
        topic=draw(st.sampled_from(["T", "主题", "t" * 127, "L" * 128, "L" * 300])), queue_id=draw(st.integers(0, 7)),
        queue_offset=offset, body=zlib.compress(body) if compressed else body, properties=props,
        sys_flag=SysFlag.COMPRESSED if compressed else 0, physical_offset=draw(st.integers(0, 2**62)),
        born_timestamp=draw(st.integers(0, 2**42)), born_host=draw(_any_host),
        store_timestamp=draw(st.integers(0, 2**42)), store_host=draw(_any_host),
        reconsume_times=draw(st.integers(0, 16)))


def _row_of(rec: MessageRecord) -> dict[str, object]:
    """A record's row as codec.record reads it (timestamps as the schema's UTC datetimes)."""
    def at(ms: int) -> dt.datetime:
        return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)

    return {"topic": rec.topic, "broker": BROKER, "queueId": rec.queue_id, "queueOffset": rec.queue_offset,
            "messageId": rec.msg_id, "tag": rec.tags, "keys": rec.keys, "body": rec.payload(),
            "properties": list(rec.user_properties().items()), "bornTimestamp": at(rec.born_timestamp),
            "storeTimestamp": at(rec.store_timestamp), "bornHost": rec.born_host, "storeHost": rec.store_host,
            "retryTopic": rec.properties.get("RETRY_TOPIC"), "reconsumeTimes": rec.reconsume_times}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(*(any_record(offset=i) for i in range(n)))))
def test_the_reference_decoder_reads_records_as_the_record_codec_does(recs: tuple[bytes, ...]) -> None:
    chunk = b"".join(recs)
    batch = decode_to_batch_reference([chunk], BROKER, retry=True)
    assert batch.to_pylist() == [_row_of(rec) for rec in decode_records(chunk, check_crc=True)]


# -- explicit cases -----------------------------------------------------------------------


def test_schema_and_typical_batch_without_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    chunks = [b"".join(record(i) for i in range(j, j + 32)) for j in range(0, 96, 32)]
    ref = decode_to_batch_reference(chunks, BROKER)
    no_reference(monkeypatch)
    fast = decode_to_batch(chunks, BROKER)
    assert fast.schema == ARROW_SCHEMA
    assert fast.equals(ref)
    row = fast.slice(5, 1).to_pylist()[0]
    assert row["topic"] == "T" and row["broker"] == BROKER and row["queueOffset"] == 5
    assert row["tag"] == "a" and row["keys"] == ["k5"] and row["properties"] == [("p", "v")]
    assert row["messageId"] == "U" + "5".zfill(31) and row["bornHost"] == "10.0.0.1:5000"


def test_empty_input() -> None:
    for chunks in ([], [b""]):
        batch = decode_to_batch(chunks, BROKER)
        assert batch.num_rows == 0 and batch.schema == ARROW_SCHEMA


def test_end_drops_records_at_and_after_it() -> None:
    chunks = [b"".join(record(i) for i in range(10))]
    assert assert_same(chunks, 4).column("queueOffset").to_pylist() == [0, 1, 2, 3]
    assert assert_same(chunks, 0).num_rows == 0
    assert assert_same(chunks, 100).num_rows == 10


def test_ipv6_hosts_fall_back_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    v4 = [b"".join(record(i) for i in range(j, j + 5)) for j in (0, 10)]
    v6 = b"".join([record(5, born_host="[::1]:5000"), record(6, store_host="[2001:db8::7]:10911"), record(7)])
    chunks = [v4[0], v6, v4[1]]
    batch = assert_same(chunks)
    assert batch.column("bornHost")[5].as_py() == "[::1]:5000"
    assert batch.column("storeHost")[6].as_py() == "[2001:db8::7]:10911"
    # only the chunk with IPv6 hosts goes through the reference decoder
    used: list[int] = []
    real = decode_to_batch_reference

    def spy(chunks: list[bytes], broker: str, end: int | None = None, retry: bool = False) -> pa.RecordBatch:
        used.append(len(chunks))
        assert chunks == [v6]
        return real(chunks, broker, end, retry)

    monkeypatch.setattr(arrow, "decode_to_batch_reference", spy)
    assert decode_to_batch(chunks, BROKER).equals(real(chunks, BROKER))
    assert used == [1]


def test_v2_long_topics() -> None:
    long_topic = "L" * 200  # > 127 bytes: magic V2, 2-byte topic length
    chunks = [b"".join(record(i) for i in range(4)),
              b"".join(record(i, topic=long_topic) for i in range(4, 8)),
              b"".join([record(8), record(9, topic=long_topic), record(10)])]
    batch = assert_same(chunks)
    assert batch.column("topic").to_pylist()[4:6] == [long_topic, long_topic]


def test_compressed_bodies_mixed_with_plain_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = bytes(range(256)) * 40
    recs = [record(i) if i % 3 else record(i, body=zlib.compress(payload + bytes([i])), sys_flag=1)
            for i in range(12)]
    chunks = [b"".join(recs)]
    ref = decode_to_batch_reference(chunks, BROKER)
    no_reference(monkeypatch)
    batch = decode_to_batch(chunks, BROKER)
    assert batch.equals(ref)
    assert batch.column("body")[3].as_py() == payload + bytes([3])
    assert batch.column("body")[4].as_py() == b"body-4"


def test_body_holding_a_magic_and_a_fake_record() -> None:
    # a body that is itself a record: the magic scan finds it, the size chain must win
    inner = record(99)
    chunks = [b"".join([record(0), record(1, body=inner), record(2, body=b"\xda\xa3\x20\xa7" * 8), record(3)])]
    assert assert_same(chunks).column("body")[1].as_py() == inner


def test_message_id_without_uniq_key_is_the_offset_id() -> None:
    recs = [record(0, properties={"TAGS": "a"}), record(1), record(2, properties="")]
    batch = assert_same([b"".join(recs)])
    assert batch.column("messageId")[0].as_py() == "0A00000200002A9F" + f"{1000:016X}"  # 10.0.0.2:10911, offset 1000
    none = assert_same([b"".join(record(i, properties={"KEYS": "a b"}) for i in range(3))])
    assert none.column("keys").to_pylist() == [["a", "b"]] * 3


def test_properties_quirks() -> None:
    props = [
        "",  # none
        "TAGS\x01t\x02KEYS\x01 a  b \x02UNIQ_KEY\x01U\x02",  # spaces in KEYS, empty entries dropped
        "TAGS\x01t1\x02TAGS\x01t2\x02x\x01\x02",  # the last TAGS wins, empty value
        "\x02\x02a\x01b\x02\x02",  # empty items
        "flag\x02k\x01v\x01w",  # an item without \x01 and no final separator; \x01 inside a value
        "WAIT\x01true\x02DELAY\x013\x02user\x01u\x02",  # system keys are not user properties
        "KEYS\x01\x02UNIQ_KEY\x01\x02",  # empty KEYS -> [], empty UNIQ_KEY -> ""
        "n\x00ul\x01v\x00\x02",  # NUL bytes are data
        "ключ\x01значение\x02TAGS\x01тег\x02",  # non-ASCII
    ]
    batch = assert_same([b"".join(record(i, properties=p) for i, p in enumerate(props))])
    assert batch.column("keys").to_pylist()[1] == ["a", "b"]
    assert batch.column("tag").to_pylist()[:3] == [None, "t", "t2"]
    assert batch.column("properties").to_pylist()[5] == [("user", "u")]
    assert batch.column("messageId")[6].as_py() == ""


def test_the_system_keys_5_5_added_are_not_user_properties() -> None:
    # Java's MessageConst.STRING_HASH_SET of 5.5.0: ORIGIN_GROUP (a revived POP retry),
    # _SYS_MSG_PRIORITY_ (a priority message), __LITE_TOPIC (a Lite Topic message)
    props = "ORIGIN_GROUP\x01g\x02_SYS_MSG_PRIORITY_\x013\x02__LITE_TOPIC\x01lt\x02user\x01u\x02"
    batch = assert_same([record(0, properties=props)])
    assert batch.column("properties").to_pylist() == [[("user", "u")]]
    assert decode_records(record(0, properties=props))[0].user_properties() == {"user": "u"}


def test_many_hosts_and_topics() -> None:
    recs = [record(i, born_host=f"10.1.{i % 7}.{i % 5}:{i}", store_host=f"10.2.0.{i % 3}:10911",
                   topic=f"T{i % 4}") for i in range(50)]
    assert_same([b"".join(recs[:20]), b"".join(recs[20:])])


def test_invalid_utf8_raises_like_the_reference() -> None:
    bad = [b"".join([record(0), record(1, properties="TAGS\x01x\x02")]).replace(b"TAGS\x01x", b"TAGS\x01\xff")]
    # a ProtocolError naming the record's position and the UTF-8 fault, from both decoders
    with pytest.raises(ProtocolError, match=r"record at byte \d+: 'utf-8' codec can't decode"):
        decode_to_batch_reference(bad, BROKER)
    with pytest.raises(ProtocolError, match=r"record at byte \d+: 'utf-8' codec can't decode"):
        decode_to_batch(bad, BROKER)


def test_large_input_without_the_small_input_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrow, "SMALL_INPUT_BYTES", 16 * 1024)
    chunks = [b"".join(record(i) for i in range(j, j + 256)) for j in range(0, 2048, 256)]
    ref = decode_to_batch_reference(chunks, BROKER)
    no_reference(monkeypatch)
    assert decode_to_batch(chunks, BROKER).equals(ref)


def test_magic_constant() -> None:
    assert MAGIC_V1 & 0xFFFFFFFF == 0xDAA320A7


# -- the retry columns (includeRetryTopic) ------------------------------------------------


def _origin(chunks: list[bytes], end: int | None = None) -> list[tuple[str | None, int]]:
    """(RETRY_TOPIC property, reconsume times) of each record below ``end``, read record by record."""
    out = []
    for body in chunks:
        at = 0
        while at < len(body):
            rec = split_record(body, at)
            if end is None or rec.queue_offset < end:
                out.append((property_of(rec.properties, "RETRY_TOPIC"), rec.reconsume_times))
            at += int.from_bytes(body[at:at + 4], "big")
    return out


def given_back(i: int, **kw: object) -> bytes:
    """A message of a retry topic: the topic it was first read from, given back ``i % 5`` times
    (every third one has no RETRY_TOPIC: a message sent to the retry topic by hand)."""
    props: dict[str, str] = {"TAGS": "a", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:031d}", "ORIGIN_MESSAGE_ID": f"O{i}"}
    if i % 3:
        props["RETRY_TOPIC"] = ("Orders", "заказы")[i % 3 - 1]
    return record(i, **{"topic": "%RETRY%group", "properties": props, "reconsume_times": i % 5, **kw})


@pytest.mark.parametrize("end", [None, 70])
def test_retry_columns_are_read_with_the_rest_without_reference(monkeypatch: pytest.MonkeyPatch,
                                                                end: int | None) -> None:
    chunks = [b"".join(given_back(i) for i in range(j, j + 32)) for j in range(0, 96, 32)]
    want = _origin(chunks, end)
    assert {t for t, _ in want} == {None, "Orders", "заказы"} and {n for _, n in want} == set(range(5))
    plain = decode_to_batch(chunks, BROKER, end)
    no_reference(monkeypatch)
    batch = decode_to_batch(chunks, BROKER, end, WITH_RETRY)
    assert list(zip(batch.column("retryTopic").to_pylist(), batch.column("reconsumeTimes").to_pylist())) == want
    assert batch.select(ARROW_SCHEMA.names).equals(plain)  # the other columns as without them
    assert batch.schema.field("reconsumeTimes").type == pa.int32()


@pytest.mark.parametrize("columns", [("retryTopic",), ("reconsumeTimes",), ("body", "reconsumeTimes", "retryTopic"),
                                     ("tag", "retryTopic")])
def test_retry_columns_in_a_projection(columns: tuple[str, ...]) -> None:
    chunks = [b"".join(given_back(i) for i in range(j, j + 32)) for j in range(0, 96, 32)]
    batch = decode_to_batch(chunks, BROKER, None, columns)
    full = assert_retry_same(chunks)
    assert batch.schema.names == list(columns) and batch.equals(full.select(list(columns)))


def test_retry_columns_of_small_mixed_and_odd_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    # IPv6 hosts (a chunk through the reference), a RETRY_TOPIC given twice (the last counts),
    # records without properties, and an input small enough for the reference alone
    v6 = b"".join([given_back(40, born_host="[::1]:5000"), given_back(41)])
    twice = given_back(50, properties="RETRY_TOPIC\x01first\x02TAGS\x01a\x02RETRY_TOPIC\x01last\x02")
    chunks = [b"".join(given_back(i) for i in range(30)), v6, twice + given_back(51, properties="")]
    batch = assert_retry_same(chunks)
    assert list(zip(batch.column("retryTopic").to_pylist(), batch.column("reconsumeTimes").to_pylist())) == \
        _origin(chunks)
    assert batch.column("retryTopic").to_pylist()[-2:] == ["last", None]
    monkeypatch.setattr(arrow, "SMALL_INPUT_BYTES", 1 << 20)
    assert decode_to_batch(chunks, BROKER, None, WITH_RETRY).equals(batch)


def test_retry_columns_of_no_rows() -> None:
    chunks = [b"".join(given_back(i) for i in range(10, 60))]
    for columns in (WITH_RETRY, ("retryTopic",)):
        batch = decode_to_batch(chunks, BROKER, 5, columns)
        assert batch.num_rows == 0 and batch.schema.names == list(columns)
