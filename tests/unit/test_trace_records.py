"""Trace records in the Java client's format (rocketmq_spark.codec.trace) and the dispatcher that
sends them off the hot path (rocketmq_spark.client.trace): what it batches into a trace message,
and that failures and a full queue are counted and logged, never raised."""

from __future__ import annotations

import logging
import threading
import time

from rocketmq_spark.client import trace as dispatch
from rocketmq_spark.codec import decode_properties
from rocketmq_spark.codec.trace import MessageType, Pub, Sub, decode_trace, encode_pub, encode_sub, trace_keys
from rocketmq_spark.errors import TopicNotFoundError
from rocketmq_spark.model import MessageQueue

S, E = "\x01", "\x02"


def test_a_pub_record_has_the_java_encoders_fields_in_its_order() -> None:
    pub = Pub(1700000000123, "pg", "orders", "MSGID", "tagA", "k1 k2", "127.0.0.1:10911", 42, 7,
              MessageType.TRANSACTION_HALF, "OFFSETID")
    assert encode_pub(pub) == S.join(["Pub", "1700000000123", "DefaultRegion", "pg", "orders", "MSGID", "tagA",
                                      "k1 k2", "127.0.0.1:10911", "42", "7", "1", "OFFSETID", "true"]) + E


def test_sub_records_one_per_message_before_and_after() -> None:
    sub = Sub(1700000000000, "cg", "REQ", ("A", "B"), ("ka", ""), (0, 3))
    assert encode_sub(sub, after=False) == [
        S.join(["SubBefore", "1700000000000", "DefaultRegion", "cg", "REQ", "A", "0", "ka"]) + E,
        # no keys: null, as the Java client writes a missing value
        S.join(["SubBefore", "1700000000000", "DefaultRegion", "cg", "REQ", "B", "3", "null"]) + E]
    after = encode_sub(sub, after=True, cost_ms=5, done_ms=1700000000009)
    assert after[1] == S.join(["SubAfter", "REQ", "B", "5", "true", "null", "0", "1700000000009", "cg"]) + E
    decoded = decode_trace("".join(after))
    assert [(r.type, r.fields["msgId"], r.fields["group"], r.fields["costTime"]) for r in decoded] == \
        [("SubAfter", "A", "cg", "5"), ("SubAfter", "B", "cg", "5")]


def test_separators_inside_a_value_do_not_split_the_record() -> None:
    pub = Pub(1, "g", "t", "ID", f"a{S}b", f"k{E}", "h:1", 1, 0, MessageType.NORMAL, "O")
    (rec,) = decode_trace(encode_pub(pub))
    assert rec.fields["tags"] == "a b" and rec.fields["keys"] == "k " and rec.fields["success"] == "true"


def test_a_record_is_found_by_its_message_id_and_each_key() -> None:
    assert list(trace_keys("ID", "k1 k2")) == ["ID", "k1", "k2"]
    assert list(trace_keys("ID", "")) == ["ID"]


class _Client:
    """What the dispatcher uses of a client: the trace topic's queues and a send."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail, self.sends, self.closed = fail, [], False
        self.gate = threading.Event()
        self.gate.set()

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        return [MessageQueue(topic, "b", 0), MessageQueue(topic, "b", 1)]

    def send_batch(self, mq, entries, **kw):  # type: ignore[no-untyped-def]
        self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        self.sends.append((mq, entries, kw))
        return []

    def close(self) -> None:
        self.closed = True


def test_records_go_out_in_trace_messages_bounded_by_body_and_keys(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "MAX_BODY", 1000)
    monkeypatch.setattr(dispatch, "MAX_KEYS_TEXT", 300)
    client = _Client()
    client.gate.clear()  # the first send waits: the rest pile up and are batched
    d = dispatch.TraceDispatcher(lambda: client, "TRACE_T")  # type: ignore[arg-type, return-value]
    d.add([("ID0" + S + "x" * 100 + E, ["ID0"])])
    d.add((f"ID{i}" + S + "y" * 90 + E, [f"ID{i}", f"K{i}"]) for i in range(1, 40))
    client.gate.set()
    assert d.flush(10)
    d.close()
    assert d.counts.sent == 40 and d.counts.failed == d.counts.dropped == 0 and client.closed
    bodies = [entries[0].body for _mq, entries, _kw in client.sends]
    assert b"".join(bodies).count(E.encode()) == 40
    for _mq, (entry,), kw in client.sends:
        props = decode_properties(entry.properties)
        records = decode_trace(entry.body.decode())
        assert len(entry.body) <= 1000 and len(props["KEYS"]) <= 300
        assert kw["producer_group"] == dispatch.TRACE_PRODUCER_GROUP and props["UNIQ_KEY"]
        # each trace message is found by exactly the keys of the records it holds
        ids = [r.type for r in records]  # (the test's records start with their id)
        assert props["KEYS"].split(" ") == [k for i in ids for k in ([i] if i == "ID0" else [i, f"K{i[2:]}"])]
    assert {mq.queue_id for mq, _e, _k in client.sends} == {0, 1}  # the trace topic's queues in turn


def test_a_failing_send_is_counted_and_logged_with_what_to_do_never_raised(caplog) -> None:
    client = _Client(TopicNotFoundError("topic 'NOPE' does not exist"))
    d = dispatch.TraceDispatcher(lambda: client, "NOPE")  # type: ignore[arg-type, return-value]
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.client.trace"):
        d.add([("r" + E, ["ID"])] * 3)
        assert d.flush(10)
    d.close()
    assert (d.counts.sent, d.counts.failed) == (0, 3)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "3 trace records to 'NOPE' failed" in msg and "traceTopicEnable=true" in msg and "0 records sent" in msg


def test_a_full_queue_drops_new_records_and_counts_them(monkeypatch, caplog) -> None:
    monkeypatch.setattr(dispatch, "MAX_PENDING", 5 * 4)  # 5 records of 2 bytes with 2 of keys
    client = _Client()
    client.gate.clear()
    d = dispatch.TraceDispatcher(lambda: client, "T")  # type: ignore[arg-type, return-value]
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.client.trace"):
        d.add([("a" + E, ["I"])])
        # wait until the sending thread holds the first record (its send blocked on the gate)
        deadline = time.monotonic() + 10
        while not d._busy and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert d._busy == 1
        d.add([("b" + E, ["I"])] * 8)
    assert d.counts.dropped == 3
    assert any("3 trace records dropped" in r.getMessage() for r in caplog.records)
    client.gate.set()
    assert d.flush(10)
    d.close()
    assert d.counts.sent == 6


def test_a_read_tasks_vectorised_records_are_the_scalar_encoders() -> None:
    import pyarrow as pa

    from rocketmq_spark.source.tracing import ReadTrace

    sent: list[tuple[list[str], list[str]]] = []

    class _Dispatcher:
        def add_arrays(self, records: pa.Array, keys: pa.Array) -> None:
            sent.append((records.to_pylist(), keys.to_pylist()))

    from types import SimpleNamespace

    trace = ReadTrace.__new__(ReadTrace)
    trace.dispatcher, trace.group = _Dispatcher(), "cg"  # type: ignore[assignment]
    trace.part = SimpleNamespace(trace_topic="T", mq="T:0")  # type: ignore[assignment]
    batch = pa.record_batch({
        "messageId": pa.array(["A", "B", "C"]),
        "keys": pa.array([["k1", "k2"], [], None], pa.list_(pa.string())),
        "reconsumeTimes": pa.array([0, 2, None], pa.int32())})
    handed = trace.before(batch)
    assert handed is not None
    trace.after(handed)
    (before, found_by), (after, found_by2) = sent
    sub = Sub(int(before[0].split(S)[1]), "cg", handed.request_id, ("A", "B", "C"), ("k1 k2", "", ""), (0, 2, 0))
    assert before == encode_sub(sub, after=False)
    fields = after[0].split(S)
    assert after == encode_sub(sub, after=True, cost_ms=int(fields[3]), done_ms=int(fields[7].rstrip(E)))
    assert found_by == found_by2 == ["A k1 k2 ", "B ", "C "]


def test_a_write_tasks_column_wise_pub_records_are_the_per_row_ones() -> None:
    import pyarrow as pa

    from rocketmq_spark.codec import BatchEntry
    from rocketmq_spark.model import SendResult
    from rocketmq_spark.sink.encode import row_properties
    from rocketmq_spark.sink.tracing import PlainRows, WriteTrace

    sent: list[list[str]] = []

    class _Dispatcher:
        def add_arrays(self, records: pa.Array, keys: pa.Array) -> None:
            sent.append(records.to_pylist())

        def add(self, records) -> None:  # type: ignore[no-untyped-def]
            sent.append([text for text, _keys in records])

    class _Client:
        def broker_addr(self, broker: str, topic: str | None = None) -> str:
            return "127.0.0.1:10911"

    trace = WriteTrace.__new__(WriteTrace)
    trace.dispatcher, trace.group, trace.namespace = _Dispatcher(), "pg", ""  # type: ignore[assignment]
    batch = pa.record_batch({"body": pa.array([b"a", b"bbb"]), "tag": pa.array(["t", None]),
                             "keys": pa.array(["k1 k2", None])})
    rows = PlainRows.of(batch, "PFX", 41)
    mq = MessageQueue("T", "broker-a", 0)
    results = [SendResult("OFF1", mq, 7), SendResult("OFF2", mq, 8)]
    trace.sent_rows(_Client(), rows, results, 1700000000000, 3)  # type: ignore[arg-type]
    entries = [BatchEntry(b"a", row_properties("PFX0000000029", "t", "k1 k2")),
               BatchEntry(b"bbb", row_properties("PFX000000002A"))]
    trace.sent(_Client(), entries, results, 0, 1700000000000, 3)  # type: ignore[arg-type]
    column_wise, per_row = sent
    assert column_wise == per_row
    assert decode_trace("".join(column_wise))[1].fields["msgId"] == "PFX000000002A"


def test_an_exactly_once_commits_end_transaction_records_have_the_java_fields() -> None:
    import pyarrow as pa

    from rocketmq_spark.model import Txn
    from rocketmq_spark.sink.tracing import WriteTrace

    sent: list[tuple[list[str], list[str]]] = []

    class _Dispatcher:
        def add_arrays(self, records: pa.Array, keys: pa.Array) -> None:
            sent.append((records.to_pylist(), keys.to_pylist()))

    class _Client:
        def broker_addr(self, broker: str, topic: str | None = None) -> str:
            return {"broker-a": "127.0.0.1:10911", "broker-b": "127.0.0.1:10921"}[broker]

    trace = WriteTrace.__new__(WriteTrace)
    trace.dispatcher, trace.group, trace.namespace = _Dispatcher(), "pg", "ns1"  # type: ignore[assignment]
    txns = [Txn("broker-a", "ns1%T", 3, 1000, "ID1"), Txn("broker-b", "ns1%T", 4, 2000, "ID2", "PROXYTX")]
    trace.ended(_Client(), txns, commit=True)  # type: ignore[arg-type]
    (records, keys), = sent
    fields = [r.fields for r in decode_trace("".join(records))]
    assert [(f["topic"], f["msgId"], f["storeHost"], f["msgType"], f["transactionId"], f["transactionState"],
             f["fromTransactionCheck"], f["group"]) for f in fields] == [
        ("T", "ID1", "127.0.0.1:10911", "2", "ID1", "COMMIT_MESSAGE", "false", "pg"),
        ("T", "ID2", "127.0.0.1:10921", "2", "PROXYTX", "COMMIT_MESSAGE", "false", "pg")]
    assert all(len(r.split(S)) == 13 for r in records)  # what Java's decoder reads by position
    assert keys == ["ID1 ", "ID2 "]


def test_a_read_tasks_trace_error_is_logged_once_and_never_raised(caplog) -> None:
    from dataclasses import replace as dc_replace

    import pyarrow as pa

    from rocketmq_spark.source.queue_range import QueueRange
    from rocketmq_spark.source.tracing import ReadTrace

    calls = []

    class _Broken:
        def add_arrays(self, records: pa.Array, keys: pa.Array) -> None:
            calls.append(len(records))
            raise pa.ArrowInvalid("no room")

    part = QueueRange(MessageQueue("T", "b", 0), 0, 10, ("127.0.0.1:9876",), None, "g", "*", 32, True,
                      trace_topic="TRACE")
    trace = ReadTrace.__new__(ReadTrace)
    trace.part, trace.group, trace.dispatcher = part, "g", _Broken()  # type: ignore[assignment]
    batch = pa.record_batch({"messageId": pa.array(["A"]), "keys": pa.array([None], pa.list_(pa.string()))})
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.source.tracing"):
        assert trace.before(batch) is None  # the error is the trace's, not the read's
        assert trace.before(batch) is None
        trace.after(None)
    assert calls == [1]  # off after the first error
    assert trace.part == dc_replace(part, trace_topic=None)
    (msg,) = [r.getMessage() for r in caplog.records]
    assert "no room" in msg and "traces no more" in msg
