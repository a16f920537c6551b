"""The writer's vectorised encoder sends exactly the bytes of the per-row path, cut into the
same sends; rows it cannot encode are left to the per-row path."""

from __future__ import annotations

import collections
import datetime as dt
import random
from concurrent.futures import Future
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rocketmq_spark.sink.writer as writer
from rocketmq_spark.codec import EncodedBatch, decode_batch, encode_batch
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting.frame import RemotingCommand
from rocketmq_spark.sink.encode import encode_plain_rows, half_properties, keys_text, row_properties
from rocketmq_spark.sink.options import WriterOptions
from rocketmq_spark.sink.txlog import Txn


class _FakeClient:
    """Records every send; answers SUCCESS at once."""

    class config:
        request_timeout_s = 5

    compresses_bodies = True

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes, int]] = []  # (queue id, batch body, messages)

    def message_queues(self, topic: str, writable: bool = True) -> list[MessageQueue]:
        return [MessageQueue(topic, "broker-a", i) for i in range(4)]

    def send_request(self, mq: MessageQueue, entries: Any, **kw: Any) -> tuple[MessageQueue, Any]:
        return mq, entries

    def send_async(self, mq: MessageQueue, req: tuple[MessageQueue, Any]) -> Future[RemotingCommand]:
        _, entries = req
        body = entries.body if isinstance(entries, EncodedBatch) else encode_batch(entries)
        self.sent.append((mq.queue_id, body, len(entries)))
        fut: Future[RemotingCommand] = Future()
        fut.set_result(RemotingCommand(0))
        return fut

    def check_sent(self, mq: MessageQueue, count: int, answer: RemotingCommand) -> None:
        assert answer.code == 0

    def close(self) -> None:
        pass


def _sender(opts: WriterOptions) -> Any:
    s = writer._Sender.__new__(writer._Sender)
    s.opts, s.batch_id, s.partition, s.attempt, s.txlog = opts, None, 0, 0, None
    s.client = _FakeClient()
    s._queues, s._rr, s._uniq_prefix, s._seq, s.rows = {}, 0, "0123456789ABCDEF012345", 41, 0
    s.txns, s._inflight, s._queued, s._buffers, s._paused = [], collections.deque(), [], {}, {}
    s._wire_topics, s.sums, s.nonce, s.trace = {}, {}, "n0", None
    return s


def _send(batches: list[pa.RecordBatch], opts: WriterOptions, *, fast: bool, monkeypatch: pytest.MonkeyPatch,
          encoded: list[bool] | None = None) -> tuple[list[tuple[int, bytes, int]], int]:
    def spy(*a: Any, **k: Any) -> Any:
        out = encode_plain_rows(*a, **k) if fast else None
        if encoded is not None:
            encoded.append(out is not None)
        return out

    with monkeypatch.context() as m:
        m.setattr(writer, "encode_plain_rows", spy)
        s = _sender(opts)
        for b in batches:
            s.add_batch(b)
        s.finish()
    return s.client.sent, s.rows


# a tag or keys value: any text but the separators (surrogates cannot be encoded), empty included
_prop_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=8)


def _opts(**extra: str) -> WriterOptions:
    return WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", **extra})


def _rows(rng: random.Random, n: int, *, strings: bool = False) -> pa.RecordBatch:
    bodies = [rng.randbytes(rng.choice([0, 1, 50, 100, 4096])) for _ in range(n)]
    tags = [rng.choice([None, "", "a", "tag-1", "caf\u00e9"]) for _ in range(n)]
    keys = [rng.choice([None, "", "k1", "k1 k2", "\u00fcber"]) for _ in range(n)]
    body = pa.array([b.hex()[: len(b)] for b in bodies], pa.string()) if strings else pa.array(bodies, pa.binary())
    return pa.RecordBatch.from_arrays(
        [body, pa.array(tags, pa.string()), pa.array(keys, pa.string()), pa.nulls(n, pa.string()),
         pa.nulls(n, pa.string())],
        names=["body", "tag", "keys", "topic", "messageGroup"])


@pytest.mark.parametrize("seed,extra", [
    (0, {}),
    (1, {"maxBatchMessages": "7"}),
    (2, {"maxBatchBytes": "2000"}),
    (3, {"maxBatchBytes": "1"}),  # one row per send
])
def test_same_sends_as_the_per_row_path(monkeypatch: pytest.MonkeyPatch, seed: int, extra: dict[str, str]) -> None:
    rng = random.Random(seed)
    n = 1500
    batch = _rows(rng, n, strings=seed == 1)
    taken: list[bool] = []
    fast, fast_rows = _send([batch], _opts(**extra), fast=True, monkeypatch=monkeypatch, encoded=taken)
    assert taken == [True]
    slow, slow_rows = _send([batch], _opts(**extra), fast=False, monkeypatch=monkeypatch)
    assert fast_rows == slow_rows == n
    assert [(q, c) for q, _, c in fast] == [(q, c) for q, _, c in slow]
    for (_, a, _), (_, b, _) in zip(fast, slow):
        assert a == b
    assert sum(c for _, _, c in fast) == n
    # and the entries decode to the rows
    entries = [e for _, body, _ in fast for e in decode_batch(body)]
    assert [e.body for e in entries] == [v.encode() if isinstance(v, str) else v for v in batch.column(0).to_pylist()]
    assert [e.property_map()["UNIQ_KEY"] for e in entries] == [f"0123456789ABCDEF012345{i:010X}"
                                                               for i in range(42, 42 + n)]


def _plain(n: int = 10, **cols: pa.Array) -> pa.RecordBatch:
    arrays = {"body": pa.array([b"x" * 10] * n, pa.binary()), **cols}
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


@pytest.mark.parametrize("batch", [
    _plain(body=pa.array([b"x", None] * 5, pa.binary())),  # a null body: the per-row path names it
    _plain(body=pa.array([b"x" * 5000] + [b"y"] * 9, pa.binary())),  # over the compression threshold
    _plain(topic=pa.array(["other"] + [None] * 9, pa.string())),
    _plain(messageGroup=pa.array(["g"] * 10, pa.string())),
    _plain(keys=pa.array([["a", "b"]] * 10, pa.list_(pa.string()))),
    _plain(properties=pa.array([[("a", "b")]] * 10, pa.map_(pa.string(), pa.string()))),
    _plain(deliveryTimestamp=pa.array([dt.datetime(2030, 1, 1)] * 10, pa.timestamp("us"))),
    _plain(body=pa.array([b"x" * 10] * 10, pa.large_binary())),
], ids=["null-body", "large-body", "topic", "group", "list-keys", "properties", "delivery", "large-binary"])
def test_rows_needing_a_decision_each_are_left_to_the_per_row_path(batch: pa.RecordBatch) -> None:
    assert encode_plain_rows(batch, uniq_prefix="P", first_seq=1, compress_threshold=4096,
                             max_message_size=1 << 22, max_batch_messages=512, max_batch_bytes=1 << 20) is None


def test_mixed_batches_keep_the_sequence_and_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    batches = [_rows(rng, 100), _plain(messageGroup=pa.array(["g"] * 10, pa.string())), _rows(rng, 50)]
    taken: list[bool] = []
    sent, rows = _send(batches, _opts(), fast=True, monkeypatch=monkeypatch, encoded=taken)
    assert taken == [True, False, True]
    assert rows == 160
    uniq = sorted(e.property_map()["UNIQ_KEY"] for _, body, _ in sent for e in decode_batch(body))
    assert uniq == [f"0123456789ABCDEF012345{i:010X}" for i in range(42, 202)]


@pytest.mark.parametrize("columns, key, setter", [
    ({"tag": ["A"]}, "TAGS", "tag column"),
    ({"keys": [["k1"]]}, "KEYS", "keys column"),
    ({}, "UNIQ_KEY", "the writer"),
])
def test_a_property_a_column_sets_is_refused_in_the_properties_column(columns: dict, key: str, setter: str) -> None:
    # two TAGS in one message: the broker hashes the first, readers keep the last, so a tag
    # filter and the rows read disagreed silently
    from rocketmq_spark.errors import OptionError

    s = _sender(_opts())
    props = pa.array([[(key, "x"), ("u", "1")]], pa.map_(pa.string(), pa.string()))
    batch = pa.RecordBatch.from_pydict({"body": [b"b"], **columns, "properties": props})
    with pytest.raises(OptionError, match=rf"row 0: key '{key}' is set by .*{setter}"):
        s.add_batch(batch)
    ok = pa.RecordBatch.from_pydict({"body": [b"b"], "properties": pa.array([[("TAGS", "x")]],
                                                                           pa.map_(pa.string(), pa.string()))})
    s.add_batch(ok)  # no tag column value: the property is the message's one tag


def test_a_message_group_is_named_by_its_column_only() -> None:
    # the writer routes a group to one queue and never moves it on a retry; a __SHARDINGKEY in
    # properties would make a group it does not know of
    from rocketmq_spark.errors import OptionError

    s = _sender(_opts())
    props = pa.array([[("__SHARDINGKEY", "g1")]], pa.map_(pa.string(), pa.string()))
    with pytest.raises(OptionError, match=r"'__SHARDINGKEY' is set by the messageGroup column"):
        s.add_batch(pa.RecordBatch.from_pydict({"body": [b"b"], "properties": props}))
    keys_blank = pa.RecordBatch.from_pydict({"body": [b"b"], "keys": [[""]], "properties": pa.array(
        [[("KEYS", "k")]], pa.map_(pa.string(), pa.string()))})
    s.add_batch(keys_blank)  # a blank keys value sets no KEYS: the property is the message's


# -- one definition of a row's properties ----------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), _prop_text), st.one_of(st.none(), _prop_text)), min_size=1,
                max_size=40), st.integers(0, 1 << 30))
def test_the_encoders_properties_are_row_properties(rows: list[tuple[str | None, str | None]], first: int) -> None:
    # encode_plain_rows builds TAGS, KEYS and UNIQ_KEY with Arrow kernels: each message's
    # properties must be what row_properties, the definition the other paths call, gives
    tags, keys = [t for t, _ in rows], [k for _, k in rows]
    batch = pa.RecordBatch.from_arrays([pa.array([b"b"] * len(rows), pa.binary()), pa.array(tags, pa.string()),
                                        pa.array(keys, pa.string())], names=["body", "tag", "keys"])
    sends = encode_plain_rows(batch, uniq_prefix="P" * 22, first_seq=first, compress_threshold=4096,
                              max_message_size=1 << 22, max_batch_messages=512, max_batch_bytes=1 << 20)
    assert sends is not None
    got = [e.properties for s in sends for e in decode_batch(s.body)]
    assert got == [row_properties(f"{'P' * 22}{first + i:010X}", t, keys_text(k)) for i, (t, k) in enumerate(rows)]


class _FakeHalfClient(_FakeClient):
    """Records every half message sent (queue id, batch body, sysFlag, properties); answers SUCCESS."""

    def __init__(self) -> None:
        super().__init__()
        self.halves: list[tuple[int, bytes, int, str]] = []

    def send_request(self, mq: MessageQueue, entries: Any, **kw: Any) -> tuple[Any, int]:  # type: ignore[override]
        return entries, kw["sys_flag"]

    def send_async_many(self, reqs: list[tuple[MessageQueue, Any]]) -> list[Future[RemotingCommand]]:
        out = []
        for mq, (entries, sys_flag) in reqs:
            self.halves.append((mq.queue_id, encode_batch(entries), sys_flag, entries[0].properties))
            fut: Future[RemotingCommand] = Future()
            fut.set_result(RemotingCommand(0))
            out.append(fut)
        return out

    def half_transaction(self, mq: MessageQueue, answer: RemotingCommand, uniq: str) -> Txn:
        return Txn(mq.broker, mq.topic, 0, 0, uniq)


def _half_sender() -> Any:
    opts = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "delivery": "exactly-once",
                                "checkpointLocation": "/nonexistent-unused", "compressThreshold": "64"})
    s = _sender(opts)
    s.client = _FakeHalfClient()
    s._queues["t"] = s.client.message_queues("t")  # known: no producer to start, no proxy check
    s._half_suffix = half_properties("pg", "7:0:0:sink:n0")
    return s


@pytest.mark.parametrize("strings", [False, True])
def test_half_messages_of_body_only_rows_are_the_per_row_paths(monkeypatch: pytest.MonkeyPatch,
                                                                strings: bool) -> None:
    # _add_halves skips the per-row look at the other columns: its messages (properties, bodies,
    # compressed or not, sysFlags, queues) and row checksums must be the per-row path's
    rng = random.Random(3)
    raw = [rng.randbytes(rng.choice([0, 10, 200])) for _ in range(60)]
    body = pa.array([b.hex() for b in raw], pa.string()) if strings else pa.array(raw, pa.binary())
    batch = pa.RecordBatch.from_arrays([body, pa.nulls(60, pa.string())], names=["body", "tag"])
    fast = _half_sender()
    fast.add_batch(batch)
    fast.finish()
    slow = _half_sender()
    with monkeypatch.context() as m:  # every row down the per-row path
        m.setattr(writer._Sender, "_bodies_only", staticmethod(lambda batch: False))
        slow.add_batch(batch)
        slow.finish()
    fast_sent, slow_sent = fast.client.halves, slow.client.halves
    assert fast_sent == slow_sent and len(fast_sent) == 60
    assert fast.sums == slow.sums and fast.rows == slow.rows == 60
    assert [t.msg_id for t in fast.txns] == [t.msg_id for t in slow.txns]
    assert {flag for _, _, flag, _ in fast_sent} == {4, 5}  # prepared, and prepared + compressed
    uniq = f"0123456789ABCDEF012345{42:010X}"
    assert fast_sent[0][3] == row_properties(uniq) + half_properties("pg", "7:0:0:sink:n0")
