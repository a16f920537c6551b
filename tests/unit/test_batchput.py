"""The broker's vectorised batch-send path writes exactly what the per-message path writes.

Two brokers get the same SEND_BATCH_MESSAGE requests, one with the vectorised path turned
off; their commit logs, consume queues and answers must be byte for byte the same, and the
vectorised path must have been taken wherever it applies (or declined where it must not).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from rocketmq_spark.broker.broker import Broker
from rocketmq_spark.broker.config import BrokerConfig
from rocketmq_spark.broker.remoting_service import RemotingService
from rocketmq_spark.codec import BatchEntry, SysFlag, decode_records, encode_batch
from rocketmq_spark.codec.batch_kernels import offset_msg_ids, parse_batch
from rocketmq_spark.remoting.codes import RequestCode, ResponseCode
from rocketmq_spark.remoting.frame import RemotingCommand

NOW = 1_750_000_000.123


class _Peer:
    peer = "127.0.0.1:50123"


def _broker(root: Path, name: str, *, fast: bool, segment_size: int = 64 << 20) -> tuple[Broker, list[int]]:
    b = Broker(BrokerConfig(data_dir=str(root / name), segment_size=segment_size), "127.0.0.1:10911")
    taken: list[int] = []
    real = b.sends.put_batch

    def spy(send: Any, body: bytes, born_host: bytes) -> Any:
        if not fast:
            return None
        out = real(send, body, born_host)
        taken.append(out is not None)
        return out

    b.sends.put_batch = spy  # type: ignore[method-assign]
    return b, taken


def _request(topic: str, queue_id: int, entries: list[BatchEntry], sys_flag: int = 0,
             batch_properties: str = "") -> RemotingCommand:
    ext = {"a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
           "g": "1700000000000", "h": "0", "i": batch_properties, "j": "0", "k": "false", "m": "true"}
    return RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, ext_fields=ext, body=encode_batch(entries))


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for sub in ("store/commitlog", "store/consumequeue"):
        for p in sorted((root / sub).rglob("*")):
            if p.is_file():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requests: list[RemotingCommand],
          segment_size: int = 64 << 20) -> tuple[list[bool], list[RemotingCommand]]:
    monkeypatch.setattr(time, "time", lambda: NOW)
    slow, _ = _broker(tmp_path, "slow", fast=False, segment_size=segment_size)
    fast, taken = _broker(tmp_path, "fast", fast=True, segment_size=segment_size)
    answers = []
    for req in requests:
        for b in (slow, fast):
            b.create_topic(req.ext_fields["b"], 4)
        a = RemotingService(slow).send_message(_Peer(), req)  # type: ignore[arg-type]
        f = RemotingService(fast).send_message(_Peer(), req)  # type: ignore[arg-type]
        assert isinstance(a, RemotingCommand) and isinstance(f, RemotingCommand)
        assert (a.code, a.remark, a.ext_fields) == (f.code, f.remark, f.ext_fields)
        answers.append(f)
    for b in (slow, fast):
        b.store.commitlog.close()
    got, want = _files(tmp_path / "fast"), _files(tmp_path / "slow")
    assert {k.replace("fast", "x") for k in got} == {k.replace("slow", "x") for k in want}
    for (k1, v1), (k2, v2) in zip(sorted(got.items()), sorted(want.items())):
        assert v1 == v2, f"{k1} differs from {k2}"
    return taken, answers


def _random_entries(rng: random.Random, n: int, *, same_size: bool = False) -> list[BatchEntry]:
    out = []
    for i in range(n):
        body = rng.randbytes(100 if same_size else rng.choice([0, 1, 7, 100, 333, 4096]))
        props = [f"UNIQ_KEY\x01{rng.getrandbits(64):016X}"]
        if not same_size and rng.random() < 0.5:
            props.append(f"TAGS\x01tag-{rng.randrange(5)}")
        if not same_size and rng.random() < 0.3:
            props.append(f"KEYS\x01k{i} other")
        text = "\x02".join(props)
        if same_size or rng.random() < 0.7:
            text += "\x02"  # most producers end with a separator; some do not
        if not same_size and rng.random() < 0.1:
            text = ""
        out.append(BatchEntry(body, text, flag=rng.choice([0, 0, 3])))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_store_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = random.Random(seed)
    topic = "T" * 127 if seed == 5 else f"bp-{seed}"  # the longest topic name accepted
    reqs = [_request(topic, rng.randrange(-2, 4), _random_entries(rng, rng.randrange(1, 300), same_size=seed == 0),
                     sys_flag=SysFlag.COMPRESSED if seed == 3 else 0)
            for _ in range(5)]
    taken, answers = _same(tmp_path, monkeypatch, reqs)
    assert taken == [True] * len(reqs)
    assert all(a.code == ResponseCode.SUCCESS for a in answers)


def test_a_queue_id_past_the_topics_queues_is_refused_on_both_paths(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """As Java brokers refuse it (msgCheck: queueId >= max(write, read queues)), where the broker
    once took it modulo the write queues; a negative one still means any queue."""
    rng = random.Random(5)
    reqs = [_request("bp-q", q, _random_entries(rng, 3)) for q in (4, 7, -1, 3)]
    taken, answers = _same(tmp_path, monkeypatch, reqs)
    assert [a.code for a in answers] == [ResponseCode.INVALID_PARAMETER] * 2 + [ResponseCode.SUCCESS] * 2
    assert answers[0].remark is not None and "queueId[4] is illegal" in answers[0].remark
    # the one check refuses them before either path encodes anything
    assert taken == [True, True]


def test_a_batchs_own_properties_are_appended_to_each_message_on_both_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message group's batch names the group once, in its own properties; brokers append them to
    each message (the fast path too), and ones that need parsing per message go the per-message way."""
    rng = random.Random(11)
    # a TAGS of the batch's own comes after each message's, so it is every message's tag: the
    # fast path hashes it for all (it took the per-message path for it before)
    grouped = [_request("bp-group", 1, _random_entries(rng, 50), batch_properties=head)
               for head in ("__SHARDINGKEY\x01order-7\x02", "__SHARDINGKEY\x01order-8", "TAGS\x01t\x02")]
    taken, _ = _same(tmp_path / "a", monkeypatch, grouped)
    assert taken == [True, True, True]
    special = [_request("bp-group", 1, _random_entries(rng, 5), batch_properties=head)
               for head in ("DELAY\x012\x02", "MSG_REGION\x01x\x02", "k\x01caf\u00e9\x02")]
    taken, _ = _same(tmp_path / "b", monkeypatch, special)
    assert taken == [False] * len(special)


def test_what_needs_the_per_message_path_is_left_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(9)
    plain = _random_entries(rng, 3)
    cases = [
        plain + [BatchEntry(b"x", "DELAY\x013\x02")],  # delayed: the schedule queue
        plain + [BatchEntry(b"x", "TIMER_DELIVER_MS\x01" + str(int(NOW * 1000) + 60_000) + "\x02")],
        plain + [BatchEntry(b"x", "CLUSTER\x01mine\x02")],  # the producer named the cluster
        plain + [BatchEntry(b"x", "k\x01caf\u00e9\x02")],  # not ASCII
        plain + [BatchEntry(b"x" * (4 * 1024 * 1024 + 1), "")],  # over the size limit: rejected
        plain + [BatchEntry(b"x", "k\x01" + "v" * 32_760 + "\x02")],  # int16 overflow with CLUSTER
    ]
    reqs = [_request("bp-special", 0, c) for c in cases]
    taken, answers = _same(tmp_path, monkeypatch, reqs)
    assert taken == [False] * len(cases)
    assert answers[4].code == ResponseCode.MESSAGE_ILLEGAL  # body over the limit
    assert answers[5].code == ResponseCode.MESSAGE_ILLEGAL  # properties over int16 (was a struct.error)


def test_a_batch_that_would_cross_a_segment_goes_the_per_message_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    reqs = [_request("bp-seg", 1, _random_entries(rng, 40, same_size=True)) for _ in range(6)]
    taken, _ = _same(tmp_path, monkeypatch, reqs, segment_size=24_000)
    assert True in taken and False in taken
    assert len(list((tmp_path / "fast" / "store" / "commitlog").iterdir())) > 1


def test_malformed_batches_are_answered_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = encode_batch([BatchEntry(b"abc", "UNIQ_KEY\x01X\x02")] * 3)
    bodies = [good[:-1], good + b"\x00", good[:10], b"\xff" * 40, good[:20] + b"\xff\xff\xff\xff" + good[24:]]
    reqs = []
    for body in bodies:
        r = _request("bp-bad", 0, [BatchEntry(b"", "")])
        r.body = body
        reqs.append(r)
    taken, answers = _same(tmp_path, monkeypatch, reqs)
    assert taken == [False] * len(bodies)
    assert all(a.code == ResponseCode.MESSAGE_ILLEGAL for a in answers)


def test_stored_records_decode_to_what_was_sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    entries = _random_entries(rng, 200)
    taken, answers = _same(tmp_path, monkeypatch, [_request("bp-read", 2, entries)])
    assert taken == [True]
    seg = next((tmp_path / "fast" / "store" / "commitlog").iterdir())
    recs = decode_records(seg.read_bytes(), check_crc=True)
    assert [r.body for r in recs] == [e.body for e in entries]
    assert [r.queue_offset for r in recs] == list(range(200))
    for r, e in zip(recs, entries):
        props = dict(r.properties)
        # what a Java broker adds to every stored message
        assert (props.pop("MSG_REGION"), props.pop("CLUSTER"), props.pop("TRACE_ON")) == (
            "DefaultRegion", "DefaultCluster", "true")
        assert props == e.property_map()
    ids = answers[0].ext_fields["msgId"].split(",")
    assert ids == [f"7F00000100002A9F{r.physical_offset:016X}" for r in recs]


def test_parse_batch_and_message_ids() -> None:
    body = encode_batch([BatchEntry(b"a" * 5, "x\x01y\x02"), BatchEntry(b"", "")])
    layout = parse_batch(body, 1 << 20)
    assert layout is not None
    assert layout.starts.tolist() == [0, 5 + 4 + 20 + 2]
    assert layout.body_len.tolist() == [5, 0] and layout.props_len.tolist() == [4, 0]
    assert parse_batch(body, 4) is None  # a body over the limit
    import numpy as np

    assert offset_msg_ids("AB", np.array([1, 0x1F], np.int64)) == "AB0000000000000001,AB000000000000001F"


def test_tag_hashes_equal_the_per_message_ones() -> None:
    import pyarrow as pa

    from rocketmq_spark.codec.batch_kernels import tag_hashes
    from rocketmq_spark.codec.tags import tag_hash

    rng = random.Random(11)
    props = ["", "TAGS\x01a", "TAGS\x01", "TAGS\x01\x02", "XTAGS\x01no\x02TAGS\x01yes\x02",
             "k\x01TAGS\x01v\x02TAGS\x01w", "UNIQ_KEY\x01A\x02TAGS\x01tag-1\x02KEYS\x01k",
             "TAGS\x01" + "z~" * 3000 + "\x02", "a\x01b\x02"]
    for _ in range(1000):
        items = ["\x01".join([rng.choice(["TAGS", "XTAGS", "KEYS", "T"]),
                              "".join(rng.choice("ab\x01 Z~") for _ in range(rng.randrange(30)))])
                 for _ in range(rng.randrange(4))]
        props.append("\x02".join(items) + rng.choice(["", "\x02"]))
    arr = pa.array([p.encode() for p in props], pa.binary())
    # one rule for a repeated TAGS: the last, as a property map (and readers, and a restarted
    # broker's re-dispatch) keeps it; the hash of the first went into the consume queue before
    from rocketmq_spark.codec import decode_properties, java_string_hash, tag_of

    assert all(tag_of(p) == decode_properties(p).get("TAGS") for p in props)
    assert tag_hash("TAGS\x01A\x02k\x01v\x02TAGS\x01B\x02") == java_string_hash("B")
    want = [tag_hash(p) for p in props]
    assert sum(1 for w in want if w) > 300  # most carry a tag
    assert tag_hashes(arr).tolist() == want
    assert tag_hashes(arr.slice(3, 500)).tolist() == want[3:503]  # an Arrow slice, as the broker passes
