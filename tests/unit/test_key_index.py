"""The broker's key index (QUERY_MESSAGE) over a store on real files (no sockets): built lazily
per topic and caught up by each query, rebuilt after a restart, and forgetting what retention
deleted."""

from __future__ import annotations

from rocketmq_spark.broker.keyindex import KeyIndex
from rocketmq_spark.broker.store import MessageStore, NewMessage, StoreConfig
from rocketmq_spark.codec import TransactionType, decode_record, encode_properties

HOST = b"\x7f\x00\x00\x01\x00\x00\x2a\x9f"  # 127.0.0.1:10911
EVER = (0, 2**63 - 1)


def _open(path: str, **cfg: int) -> MessageStore:
    return MessageStore(path, HOST, StoreConfig(**cfg))


def _msg(topic: str, i: int, keys: str | None = None, uniq: str | None = None, queue: int | None = None,
         sys_flag: int = 0) -> NewMessage:
    props = {"TAGS": "t"}
    if keys is not None:
        props["KEYS"] = keys
    if uniq is not None:
        props["UNIQ_KEY"] = uniq
    return NewMessage(topic, i % 2 if queue is None else queue, b"m%04d" % i + b"x" * 200, encode_properties(props),
                      sys_flag=sys_flag)


def _bodies(store: MessageStore, found: list[tuple[int, int]]) -> list[bytes]:
    return [decode_record(store.record_at(pos, size) or b"").body[:5] for pos, size in found]


def test_keys_split_on_spaces_and_uniq_keys_are_found_per_topic(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put([_msg("t", 0, "a b", "U0"), _msg("t", 1, "b  c ", "U1"), _msg("t", 2, None, "U2"), _msg("t", 3, "a a"),
           _msg("other", 4, "a", "U4"), _msg("t", 5, "ab", None),
           _msg("t", 6, "a", "U6", sys_flag=TransactionType.ROLLBACK)])
    idx = KeyIndex(s)
    assert _bodies(s, idx.query("t", "a", 64, *EVER)) == [b"m0000", b"m0003"]  # listed once, not by "ab"
    assert _bodies(s, idx.query("t", "b", 64, *EVER)) == [b"m0000", b"m0001"]
    assert _bodies(s, idx.query("t", "c", 64, *EVER)) == [b"m0001"]
    assert _bodies(s, idx.query("t", "U2", 64, *EVER)) == [b"m0002"]
    assert _bodies(s, idx.query("other", "a", 64, *EVER)) == [b"m0004"]
    assert idx.query("t", "U4", 64, *EVER) == [] and idx.query("t", "", 64, *EVER) == []
    assert idx.query("nope", "a", 64, *EVER) == []
    s.close()


def test_tags_are_found_whole_by_tag_queries_only(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put([NewMessage("t", 0, b"m0000", encode_properties({"TAGS": "red"})),
           NewMessage("t", 1, b"m0001", encode_properties({"TAGS": "red || blue", "KEYS": "blue"})),
           NewMessage("t", 0, b"m0002", encode_properties({"TAGS": "blue", "KEYS": "red"}))])
    idx = KeyIndex(s)
    assert _bodies(s, idx.query("t", "red", 64, *EVER, by_tag=True)) == [b"m0000"]
    assert _bodies(s, idx.query("t", "blue", 64, *EVER, by_tag=True)) == [b"m0002"]
    assert _bodies(s, idx.query("t", "red || blue", 64, *EVER, by_tag=True)) == [b"m0001"]
    assert _bodies(s, idx.query("t", "red", 64, *EVER)) == [b"m0002"]
    s.close()


def test_the_newest_are_answered_in_commit_log_order_within_the_time_range(tmp_path) -> None:
    s = _open(str(tmp_path))
    stored = [s.put([_msg("t", i, "k")])[0] for i in range(10)]
    idx = KeyIndex(s)
    found = idx.query("t", "k", 3, *EVER)
    assert found == sorted(found) and _bodies(s, found) == [b"m0007", b"m0008", b"m0009"]
    ts = [st.store_timestamp for st in stored]
    got = _bodies(s, idx.query("t", "k", 64, ts[4], ts[6]))
    assert got == [b"m%04d" % i for i in range(10) if ts[4] <= ts[i] <= ts[6]]
    assert idx.query("t", "k", 0, *EVER) == [] and idx.query("t", "k", 64, ts[9] + 1, 2**63 - 1) == []
    s.close()


def test_a_query_catches_up_with_what_was_stored_since_the_last_one(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put([_msg("t", i, "k") for i in range(5)])
    idx = KeyIndex(s)
    assert len(idx.query("t", "k", 64, *EVER)) == 5
    s.put([_msg("t", i, "k") for i in range(5, 8)] + [_msg("t", 8, "k", queue=7)])  # and a new queue
    assert _bodies(s, idx.query("t", "k", 64, *EVER)) == [b"m%04d" % i for i in range(9)]
    s.close()


def test_a_reopened_store_is_indexed_again(tmp_path) -> None:
    s = _open(str(tmp_path))
    s.put([_msg("t", i, f"k{i % 3}", f"U{i}") for i in range(30)])
    s.close()
    s = _open(str(tmp_path))
    idx = KeyIndex(s)
    assert _bodies(s, idx.query("t", "k1", 64, *EVER)) == [b"m%04d" % i for i in range(1, 30, 3)]
    assert _bodies(s, idx.query("t", "U29", 64, *EVER)) == [b"m0029"]
    s.close()


def test_records_deleted_by_retention_are_forgotten(tmp_path) -> None:
    s = _open(str(tmp_path), segment_size=4096)
    stored = s.put([_msg("t", i, "k", f"U{i}") for i in range(60)])  # ~16 records a segment
    idx = KeyIndex(s)
    assert len(idx.query("t", "k", 64, *EVER)) == 60
    s.delete_before(stored[30].physical_offset)
    floor = s.commitlog.min_pos
    kept = [i for i, st in enumerate(stored) if st.physical_offset >= floor]
    assert 0 < len(kept) < 60
    assert _bodies(s, idx.query("t", "k", 64, *EVER)) == [b"m%04d" % i for i in kept]
    assert idx.query("t", "U0", 64, *EVER) == []
    # indexed for the first time after retention: the same
    assert _bodies(s, KeyIndex(s).query("t", "k", 64, *EVER)) == [b"m%04d" % i for i in kept]
    s.put([_msg("t", 60, "k", "U60")])
    assert _bodies(s, idx.query("t", "U60", 64, *EVER)) == [b"m0060"]
    s.close()
