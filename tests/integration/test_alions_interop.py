"""Interop with a real third-party client: the npm package ``ali-ons`` (pinned in
tests/integration/alions/package.json) against the embedded broker.

The node side is driven through ``tests/integration/alions/roundtrip.js``:

* ``node roundtrip.js <namesrv> <topic> produce`` reads a JSON array of messages
  on stdin and prints one JSON line per send result;
* ``node roundtrip.js <namesrv> <topic> consume <group> <n> <timeoutMs>`` prints a
  JSON array of the ``n`` messages it consumed (then closes the consumer, which
  persists its offsets with UPDATE_CONSUMER_OFFSET).

Skipped when node / npm are not installed; ``npm ci`` runs once when
``node_modules/ali-ons`` is missing.
"""

from __future__ import annotations

import base64
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

from alions_support import (
    SYS_FLAG_COMPRESSED,
    _unique,
    alions_consume,
    alions_produce,
    ensure_alions,
)
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import MessageRecord, decode_records, encode_properties
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.integration, pytest.mark.interop, pytest.mark.timeout(180)]

@pytest.fixture(scope="module")
def alions() -> Path:
    return ensure_alions()


def pull_all(client: RemotingClient, topic: str) -> list[MessageRecord]:
    """Every record of every queue of ``topic``, read with our own client."""
    out: list[MessageRecord] = []
    for mq in client.message_queues(topic):
        offset = client.min_offset(mq)
        end = client.max_offset(mq)
        while offset < end:
            res = client.pull(mq, offset, 32)
            assert res.status == "FOUND", f"pull of {mq} at {offset}: {res.status}"
            recs = decode_records(res.body, check_crc=True)
            assert recs, f"pull of {mq} at {offset} found no records"
            out.extend(recs)
            offset = res.next_offset
    return out


def big_body(seed: int, size: int = 9000) -> bytes:
    """Compressible (small alphabet of words) yet not trivially repetitive."""
    rnd = random.Random(seed)
    words = [b"rocket", b"mq", b"spark", b"\x00\xff", b"queue", b"offset", b"\xc3\xa9t\xc3\xa9", b"42"]
    buf = bytearray()
    while len(buf) < size:
        buf += rnd.choice(words) + bytes([rnd.randrange(256)])
    return bytes(buf[:size])


def _expected_keys(m: dict[str, Any]) -> list[str]:
    keys = m.get("keys") or []
    return [keys] if isinstance(keys, str) else list(keys)


def _body_of(m: dict[str, Any]) -> bytes:
    if "bodyB64" in m:
        return base64.b64decode(m["bodyB64"])
    return str(m.get("body", "")).encode()


def check_alions_received(got: list[dict[str, Any]], sent: dict[str, dict[str, Any]], topic: str,
                          id_prop: str = "case") -> None:
    """Each message ali-ons consumed matches what was sent (found by its ``case`` property)."""
    by_case = {}
    for rec in got:
        assert rec["topic"] == topic
        case = rec["props"].get(id_prop)
        assert case in sent, f"unexpected message {rec}"
        assert case not in by_case, f"message {case} delivered twice"
        by_case[case] = rec
        m = sent[case]
        assert base64.b64decode(rec["bodyB64"]) == _body_of(m), f"body of {case}"
        assert rec["tags"] == m.get("tags"), f"tags of {case}"
        assert rec["keys"] == _expected_keys(m), f"keys of {case}"
        assert rec["props"] == {id_prop: case, **m.get("props", {})}, f"user properties of {case}"
        assert "MAX_OFFSET" in rec["sysProps"] and "MIN_OFFSET" in rec["sysProps"]
    assert set(by_case) == set(sent)


# -- tests --------------------------------------------------------------------------


def test_alions_produce_then_our_client_and_alions_consume(alions: Path) -> None:
    big = big_body(1)
    assert len(zlib.compress(big)) < len(big) // 2  # compressible, so ali-ons will deflate it
    binary = bytes(range(256)) * 2
    cases: dict[str, dict[str, Any]] = {
        "plain": {"body": "hello ali-ons"},
        "tagged": {"body": "with a tag", "tags": "TagA"},
        "keyed": {"body": "several keys", "tags": "TagB", "keys": ["order-1", "user-7", "k3"]},
        "props": {"body": "user properties", "tags": "TagA", "keys": ["only-key"],
                  "props": {"color": "blue", "size": "XL", "empty": "", "spaced": "a b c",
                            "unicode": "héllo wörld ✓"}},
        "utf8": {"body": "grüße aus 東京", "tags": "TagC"},
        "binary": {"bodyB64": base64.b64encode(binary).decode(), "tags": "Bin", "keys": ["bin"]},
        "empty": {"body": "", "tags": "TagE"},
        "big": {"bodyB64": base64.b64encode(big).decode(), "tags": "Big", "keys": ["big-1", "big-2"],
                "props": {"kind": "compressed"}},
    }
    # the "case" property identifies each message on the way back
    messages = [{**m, "props": {"case": case, **m.get("props", {})}} for case, m in cases.items()]
    topic = _unique("alions_it_produce")

    with EmbeddedBroker() as mq:
        results = alions_produce(mq.namesrv_addr, topic, messages)
        sent_at = {(r["queueId"], r["queueOffset"]): (case, r["msgId"]) for case, r in zip(cases, results)}
        assert len(sent_at) == len(cases), f"two sends got the same queue position: {results}"

        # -- our client reads what ali-ons wrote
        client = RemotingClient(mq.namesrv_addr)
        try:
            records = pull_all(client, topic)
        finally:
            client.close()
        assert len(records) == len(cases)
        seen = set()
        for rec in records:
            case, msg_id = sent_at[(rec.queue_id, rec.queue_offset)]
            seen.add(case)
            m = cases[case]
            assert rec.topic == topic
            assert rec.payload() == _body_of(m), f"body of {case}"
            assert rec.tags == m.get("tags"), f"tags of {case}"
            assert rec.keys == _expected_keys(m), f"keys of {case}"
            assert rec.user_properties() == {"case": case, **m.get("props", {})}, f"user properties of {case}"
            assert rec.offset_msg_id == msg_id, f"ali-ons msgId of {case}"
            assert rec.born_timestamp > 0 and rec.store_timestamp >= rec.born_timestamp - 5000
            if case == "big":
                assert rec.sys_flag & SYS_FLAG_COMPRESSED, "ali-ons should have deflated the big body"
                assert rec.body != big and len(rec.body) < len(big)
                assert rec.payload() == big
            else:
                assert not rec.sys_flag & SYS_FLAG_COMPRESSED, f"{case} should not be compressed"
                assert rec.body == _body_of(m)
        assert seen == set(cases)

        # -- and ali-ons reads it back, with a group that has no offsets yet
        got = alions_consume(mq.namesrv_addr, topic, _unique("GID_alions_it"), len(cases))
        check_alions_received(got, cases, topic)
        for item in got:  # ali-ons derives msgId from the store host and commit-log offset
            assert sent_at[(item["queueId"], item["queueOffset"])][1] == item["msgId"]


def test_our_client_produces_alions_consumes(alions: Path) -> None:
    big = big_body(2, 9000)
    topic = _unique("alions_it_consume")
    cases: dict[str, dict[str, Any]] = {
        "plain": {"body": "from python"},
        "tagged": {"body": "tag only", "tags": "TagA"},
        "keyed": {"body": "keys", "tags": "TagB", "keys": ["a-1", "b-2", "c-3"]},
        "props": {"body": "props", "tags": "TagA", "keys": ["p"],
                  "props": {"color": "red", "n": "17", "unicode": "naïve ☃"}},
        "binary": {"bodyB64": base64.b64encode(bytes(range(255, -1, -1))).decode(), "tags": "Bin"},
        "big": {"bodyB64": base64.b64encode(big).decode(), "tags": "Big", "keys": ["big"],
                "props": {"kind": "zlib"}},
    }

    with EmbeddedBroker() as mq:
        client = RemotingClient(mq.namesrv_addr)
        try:
            client.create_topic(topic, 4)
            queues = client.message_queues(topic)
            assert len(queues) == 4
            for i, (case, m) in enumerate(cases.items()):
                props: dict[str, str] = {}
                if m.get("tags") is not None:
                    props["TAGS"] = m["tags"]
                if m.get("keys"):
                    props["KEYS"] = " ".join(m["keys"])
                props.update({"case": case, **m.get("props", {})})
                body = _body_of(m)
                q = queues[i % len(queues)]
                if case == "big":
                    res = client.send(q, zlib.compress(body), encode_properties(props), sys_flag=SYS_FLAG_COMPRESSED)
                else:
                    res = client.send(q, body, encode_properties(props))
                assert res.queue == q

            # the big one is stored deflated, as sent
            stored = {r.properties["case"]: r for r in pull_all(client, topic)}
            assert stored["big"].sys_flag & SYS_FLAG_COMPRESSED
            assert stored["big"].body == zlib.compress(big)
        finally:
            client.close()

        got = alions_consume(mq.namesrv_addr, topic, _unique("GID_alions_it"), len(cases))
        check_alions_received(got, cases, topic)
        by_case = {r["props"]["case"]: r for r in got}
        assert base64.b64decode(by_case["big"]["bodyB64"]) == big, "ali-ons did not inflate the big body"
        for case, rec in by_case.items():
            assert rec["msgId"] == stored[case].offset_msg_id
            assert (rec["queueId"], rec["queueOffset"]) == (stored[case].queue_id, stored[case].queue_offset)


def test_alions_committed_offsets_survive_restart(alions: Path, tmp_path: Path) -> None:
    topic = _unique("alions_it_offsets")
    group = _unique("GID_alions_it_offsets")
    n = 10

    with EmbeddedBroker(data_dir=str(tmp_path / "broker")) as mq:
        client = RemotingClient(mq.namesrv_addr)
        try:
            client.create_topic(topic, 4)
            queues = client.message_queues(topic)
            for i in range(n):
                client.send(queues[i % len(queues)], f"m{i}".encode(), encode_properties({"i": str(i)}))
            max_offsets = {q: client.max_offset(q) for q in queues}
            assert sum(max_offsets.values()) == n
            assert all(client.query_consumer_offset(group, q) is None for q in queues)
        finally:
            client.close()

        got = alions_consume(mq.namesrv_addr, topic, group, n)
        assert sorted(base64.b64decode(r["bodyB64"]) for r in got) == sorted(f"m{i}".encode() for i in range(n))

        mq.restart()

        client = RemotingClient(mq.namesrv_addr)
        try:
            committed: dict[MessageQueue, int | None] = {q: client.query_consumer_offset(group, q) for q in queues}
            assert committed == max_offsets, f"committed {committed}, queue ends {max_offsets}"
            assert sum(v or 0 for v in committed.values()) == n
            # the data itself survived too
            assert {q: client.max_offset(q) for q in queues} == max_offsets
        finally:
            client.close()
