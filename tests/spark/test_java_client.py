"""Interop with the Apache RocketMQ Java client (rocketmq-client of real_rocketmq.VERSION, 5.5.0,
classic remoting) as a peer, on the embedded broker and on the real Apache RocketMQ: the Java producer (plain and
transactional) feeds our Spark reader, and our Spark writer feeds the Java push consumer and
lite pull consumer. The peer is tests/java_peer/JavaPeer.java (see tests/java_peer.py); each
command is one JVM, so every test starts exactly one."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import functions as F

from brokers import Target, settles_at
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import SysFlag, decode_records
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.interop]

BROKERS = ("embedded", "real")

Peer = Callable[..., list[dict[str, Any]]]  # the peer fixture (conftest.py)

#: bodies above this many bytes are compressed by both producers (the Java client's
#: compressMsgBodyOverHowmuch and our writer's compressThreshold default alike)
COMPRESS_THRESHOLD = 4096
#: a binary body over the threshold that zlib shrinks (so the Java client stores it compressed)
BIG_BINARY = bytes(range(256)) * 24  # 6 KiB
#: a text body over the threshold for our writer
BIG_TEXT = "".join(f"line {i:05d}: the quick brown fox\n" for i in range(300))  # ~10 KiB


def _name(broker: Target, text: str) -> str:
    """A topic or group name unique to this broker kind and run (the real broker lives per session)."""
    return f"{text}_{broker.kind.upper()}_{uuid.uuid4().hex[:6]}"


def _stored(client: RemotingClient, topic: str, broker_name: str, queue_id: int, offset: int):
    """The record at ``offset`` as the broker stored it (body not inflated)."""
    res = client.pull(MessageQueue(topic, broker_name, queue_id), offset, 1)
    assert res.status == "FOUND", (topic, queue_id, offset, res.status)
    rec = decode_records(res.body)[0]
    assert rec.queue_offset == offset
    return rec


def _read(spark, broker: Target, topic: str):
    """Every row of ``topic`` through our reader, timestamps as epoch milliseconds too."""
    return (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic).load()
            .withColumn("bornMs", F.expr("unix_millis(bornTimestamp)"))
            .withColumn("storeMs", F.expr("unix_millis(storeTimestamp)"))
            .collect())


def _write(spark, broker: Target, topic: str, rows: list[tuple], **opts: str) -> None:
    df = spark.createDataFrame(rows, "body STRING, tag STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>")
    (df.write.format("rocketmq").mode("append").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
     .options(**opts).save())


def test_java_producer_messages_read_by_spark_with_every_field(spark, broker, client, peer) -> None:
    topic = broker.create_topic(_name(broker, "JAVA_PRODUCED"), queues=4)
    specs: list[dict[str, Any]] = [
        {"body": f"java-{i}", "tags": "TagA" if i % 2 else "TagB", "keys": [f"k{i}", "shared"],
         "props": {"color": "red", "n": str(i)}} for i in range(5)]
    specs += [
        {"bodyB64": base64.b64encode(BIG_BINARY).decode(), "tags": "big", "keys": ["big"], "props": {"size": "6k"}},
        {"body": "pinned to queue 2", "tags": "pinned", "keys": ["pin"], "props": {"where": "q2"}, "queueId": 2},
        {"body": "grüße, 世界", "tags": "标签", "keys": ["ключ"], "props": {"city": "Zürich"}},
        {"body": "bare"},  # no tag, keys or properties
    ]
    t0 = int(time.time() * 1000)
    sent = peer("produce", {"namesrv": broker.namesrv_addr, "topic": topic, "messages": specs,
                            "group": _name(broker, "jpeer_producer"), "compressThreshold": COMPRESS_THRESHOLD})
    t1 = int(time.time() * 1000)
    assert [s["status"] for s in sent] == ["SEND_OK"] * len(specs), sent
    assert sent[6]["queueId"] == 2
    assert settles_at(client, topic, len(specs)) == len(specs)

    rows = _read(spark, broker, topic)
    assert len(rows) == len(specs)
    by_id = {r.messageId: r for r in rows}
    assert set(by_id) == {s["msgId"] for s in sent}  # messageId is the Java client's msgId (UNIQ_KEY)
    for spec, res in zip(specs, sent):
        r = by_id[res["msgId"]]
        body = base64.b64decode(spec["bodyB64"]) if "bodyB64" in spec else spec["body"].encode()
        assert bytes(r.body) == body
        assert r.topic == topic and r.broker == res["brokerName"] == broker.broker_name
        assert (r.queueId, r.queueOffset) == (res["queueId"], res["queueOffset"])
        assert r.tag == spec.get("tags")
        assert sorted(r.keys or []) == sorted(spec.get("keys", []))
        assert r.properties == spec.get("props", {})
        assert r.storeHost == broker.broker_addr and r.bornHost.startswith("127.0.0.1:")
        assert t0 <= r.bornMs <= r.storeMs <= t1
    # the big one went in compressed (the Java client did it), and the reader inflated it
    big = sent[5]
    rec = _stored(client, topic, big["brokerName"], big["queueId"], big["queueOffset"])
    assert rec.sys_flag & SysFlag.COMPRESSED and len(rec.body) < len(BIG_BINARY)


def test_spark_writer_rows_consumed_by_java_push_consumer(spark, broker, client, peer) -> None:
    topic = broker.create_topic(_name(broker, "SPARK_TO_JAVA_PUSH"), queues=2)
    rows = [(f"w{i}", f"tag{i % 3}", [f"key{i}", "shared"], {"idx": str(i), "name": "wörter"}) for i in range(12)]
    rows.append((BIG_TEXT, "big", ["big"], {"size": str(len(BIG_TEXT))}))
    _write(spark, broker, topic, rows, maxBatchMessages="4", compressThreshold=str(COMPRESS_THRESHOLD))
    assert settles_at(client, topic, len(rows)) == len(rows)
    ours = {bytes(r.body).decode(): r for r in _read(spark, broker, topic)}
    assert set(ours) == {row[0] for row in rows}
    big = ours[BIG_TEXT]
    assert _stored(client, topic, big.broker, big.queueId, big.queueOffset).sys_flag & SysFlag.COMPRESSED

    # The push consumer's first pulls race its own heartbeat: the heartbeat that carries the
    # rebalance's new subscription version is dropped when the periodic one holds the client's
    # heartbeat lock (MQClientInstance.sendHeartbeatToAllBrokerWithLockV2 only tries the lock),
    # and a real broker then answers every pull SUBSCRIPTION_NOT_LATEST (25) until the next
    # periodic heartbeat, 30 s later by default (later rebalance rounds change nothing, so they
    # send none). A heartbeat every second bounds that wait; the embedded broker does not compare
    # subscription versions.
    lines = peer("consume", {"namesrv": broker.namesrv_addr, "topic": topic, "group": _name(broker, "jpeer_push"),
                             "count": len(rows), "timeoutMs": 30_000, "from": "first", "heartbeatMs": 1000})
    assert lines[-1] == {"done": True, "received": len(rows)}, lines[-1]
    got: dict[str, dict[str, Any]] = {}
    for m in lines[:-1]:
        got.setdefault(m["msgId"], m)  # redeliveries carry the same msgId
    by_body = {base64.b64decode(m["bodyB64"]).decode(): m for m in got.values()}
    assert len(by_body) == len(got) == len(rows)
    for body, tag, keys, props in rows:
        m, r = by_body[body], ours[body]
        assert m["tags"] == tag and sorted(m["keys"]) == sorted(keys) and m["props"] == props
        assert m["msgId"] == r.messageId  # our UNIQ_KEY is the Java client's msgId
        assert (m["queueId"], m["queueOffset"]) == (r.queueId, r.queueOffset)
        assert m["storeHost"] == r.storeHost == broker.broker_addr
        assert (m["bornTimestamp"], m["storeTimestamp"]) == (r.bornMs, r.storeMs)


def test_java_transactions_seen_by_spark_reader(spark, broker, client, peer) -> None:
    topic = broker.create_topic(_name(broker, "JAVA_TX"), queues=2, message_type="TRANSACTION")
    specs = [{"body": f"tx-{local}", "tags": "tx", "keys": [f"tx-{local}"], "props": {"local": local},
              "local": local} for local in ("commit", "rollback", "unknown")]
    # the first check-back: ~3-5 s on the real broker of this suite, ~6-7 s on the embedded one
    lines = peer("produce-transactional", {"namesrv": broker.namesrv_addr, "topic": topic, "messages": specs,
                                           "group": _name(broker, "jpeer_tx"), "waitCheckMs": 20_000})
    res = {line["local"]: line for line in lines}
    assert [line["status"] for line in lines] == ["SEND_OK"] * 3, lines
    assert {k: v["localState"] for k, v in res.items()} == {
        "commit": "COMMIT_MESSAGE", "rollback": "ROLLBACK_MESSAGE", "unknown": "UNKNOW"}
    # only the open one was checked back (and answered COMMIT); the ended ones never were. (A real
    # broker writes the records that end a transaction in batches, every transactionOpBatchInterval:
    # unless that is well under transactionTimeOut it checks back ended transactions too, and a
    # second COMMIT stores the committed message twice.)
    assert {k: v["checked"] > 0 for k, v in res.items()} == {"commit": False, "rollback": False, "unknown": True}

    assert settles_at(client, topic, 2) == 2
    rows = _read(spark, broker, topic)
    assert sorted(bytes(r.body) for r in rows) == [b"tx-commit", b"tx-unknown"]
    for r in rows:
        local = bytes(r.body).decode()[3:]
        assert r.messageId == res[local]["msgId"]
        assert r.queueId == res[local]["queueId"]  # the real queue, not the half queue
        assert r.tag == "tx" and r.keys == [f"tx-{local}"]
        assert r.properties == {"local": local}  # the transaction's system properties stay out
        assert r.storeHost == broker.broker_addr


def test_java_lite_pull_consumer_reads_everything_the_writer_wrote(spark, broker, client, peer) -> None:
    topic = broker.create_topic(_name(broker, "SPARK_TO_JAVA_PULL"), queues=4)
    rows = [(f"p{i}", f"t{i % 2}", [f"pk{i}"], {"i": str(i)}) for i in range(40)]
    _write(spark, broker, topic, rows, maxBatchMessages="5")
    assert settles_at(client, topic, len(rows)) == len(rows)
    ours = {r.messageId: r for r in _read(spark, broker, topic)}
    assert len(ours) == len(rows)
    assert len({r.queueId for r in ours.values()}) > 1  # the rows are spread over queues

    lines = peer("pull", {"namesrv": broker.namesrv_addr, "topic": topic, "group": _name(broker, "jpeer_pull"),
                          "fromOffsets": "earliest", "count": len(rows), "timeoutMs": 30_000})
    # with count given the peer stops at len(rows): a duplicate would leave a row out below
    assert sorted(base64.b64decode(m["bodyB64"]).decode() for m in lines) == sorted(row[0] for row in rows)
    expected = {body: (tag, keys, props) for body, tag, keys, props in rows}
    for m in lines:
        r = ours[m["msgId"]]
        body = base64.b64decode(m["bodyB64"]).decode()
        assert bytes(r.body).decode() == body
        assert (m["tags"], m["keys"], m["props"]) == expected[body]
        assert (m["queueId"], m["queueOffset"]) == (r.queueId, r.queueOffset)
        assert (m["bornTimestamp"], m["storeTimestamp"], m["storeHost"]) == (r.bornMs, r.storeMs, r.storeHost)
