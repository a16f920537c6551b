"""Namespaces with the Apache RocketMQ Java client as the peer, on the embedded broker and on
Apache RocketMQ 5.5.0 (the suite's shared broker): the option ``namespace`` names topics and
groups as the Java client's ``setNamespace`` does (``ns%topic``, ``%RETRY%ns%group``), so a
Spark query and a Java client of one namespace share topics and consumer offsets, and two
namespaces on one cluster do not see each other's topics. The peer is
tests/java_peer/JavaPeer.java (rocketmq-client 5.5.0); each peer command is one JVM."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from brokers import Target, settles_at, wait_until
from real_rocketmq import NEWEST
from rocketmq_spark.checkpoints import RocketMQOffsetCommitter
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.interop]

BROKERS = ("embedded", "real")

Peer = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def peer() -> Peer:
    """The Java client peer on rocketmq-client 5.5.0 (the newest release's namespace rules)."""
    import java_peer
    from brokers import skip_or_fail
    from real_rocketmq import cache_root, java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the Java client peer cannot run here: {missing}")
    lib = provision(NEWEST)
    classes = java_peer.build(lib, cache_root())

    def run(command: str, args: dict[str, Any], timeout: float = 90) -> list[dict[str, Any]]:
        return java_peer.run(lib, classes, command, args, timeout=timeout)

    return run


@pytest.fixture()
def client(broker: Target) -> Iterator[RemotingClient]:
    """A client with no namespace: it sees the names as brokers keep them."""
    c = RemotingClient(broker.namesrv_addr)
    try:
        yield c
    finally:
        c.close()


def _names(broker: Target) -> tuple[str, str, str]:
    """(a namespace, a topic, a group) unique to this broker kind and run."""
    tag = f"{broker.kind.upper()}_{uuid.uuid4().hex[:6]}"
    return f"ns_{tag}", f"ORDERS_{tag}", f"billing_{tag}"


def _read(spark, broker: Target, namespace: str, topic: str) -> list[Any]:
    return (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("namespace", namespace)
            .option("topic", topic).load().collect())


def _bodies(lines: list[dict[str, Any]]) -> list[str]:
    return sorted(base64.b64decode(m["bodyB64"]).decode() for m in lines if "bodyB64" in m)


def test_round_trip_with_the_java_client_in_one_namespace(spark, broker, client, peer, tmp_path: Path) -> None:
    """Java produces, a Spark stream of the namespace reads it and commits the group's offsets,
    Spark writes (remoting; and gRPC on the embedded broker: the real proxy serves no pulls
    over gRPC, and its writes are the remoting ones behind it), and a Java consumer of the
    namespace resumes where the query committed: it gets exactly what Spark wrote. One topic
    name in another namespace stays apart. (Two JVMs per broker: the suite's time is short.)"""
    ns, topic, group = _names(broker)
    other = ns + "_other"
    for space in (ns, other):  # the same topic name in two namespaces: two topics on the broker
        broker.create_topic(f"{space}%{topic}", queues=2)
    # setNamespaceV2 too: its request fields ns/nsd ride along, and brokers ignore them as Apache RocketMQ does
    sent = peer("produce", {"namesrv": broker.namesrv_addr, "namespace": ns, "namespaceV2": ns, "topic": topic,
                            "group": "jpeer_ns_producer", "messages": [{"body": f"java-{i}"} for i in range(6)]})
    assert [s["status"] for s in sent] == ["SEND_OK"] * 6, sent
    # the Java client wrapped the topic: the broker holds the messages under ns%topic
    wire = [MessageQueue(f"{ns}%{topic}", broker.broker_name, q) for q in (0, 1)]
    assert settles_at(client, f"{ns}%{topic}", 6) == 6

    committer = RocketMQOffsetCommitter(broker.namesrv_addr, group, topics=[topic], namespace=ns)
    spark.streams.addListener(committer)
    try:
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
             .option("namespace", ns).option("topic", topic).option("consumerGroup", group)
             .option("startingOffsets", "earliest").load()
             .writeStream.format("memory").queryName(f"ns_{uuid.uuid4().hex[:8]}")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        rows = spark.sql(f"SELECT topic, messageId, body FROM {q.name}").collect()
        assert sorted(bytes(r.body).decode() for r in rows) == [f"java-{i}" for i in range(6)]
        assert {r.topic for r in rows} == {topic}  # the user's name, not the wire name
        assert {r.messageId for r in rows} == {s["msgId"] for s in sent}
        # the offsets are the group's as the Java client names it: ns%group, of ns%topic
        assert wait_until(lambda: [client.query_consumer_offset(f"{ns}%{group}", m) for m in wire] == [3, 3],
                          timeout_s=30)
    finally:
        spark.streams.removeListener(committer)

    written = [f"spark-{i}" for i in range(4)]
    df = spark.createDataFrame([(b,) for b in written], "body STRING")
    (df.write.format("rocketmq").mode("append").option("namesrvAddr", broker.namesrv_addr)
     .option("namespace", ns).option("topic", topic).option("producerGroup", "spark_ns_producer").save())
    if not broker.is_real:
        written += ["grpc-0", "grpc-1"]
        (spark.createDataFrame([("grpc-0",), ("grpc-1",)], "body STRING").write.format("rocketmq").mode("append")
         .option("endpoints", broker.grpc_endpoint).option("namespace", ns).option("topic", topic).save())
    assert settles_at(client, f"{ns}%{topic}", 6 + len(written)) == 6 + len(written)

    lines = peer("pull", {"namesrv": broker.namesrv_addr, "namespace": ns, "topic": topic, "group": group,
                          "fromOffsets": "committed", "count": len(written), "idleMs": 3000, "timeoutMs": 30_000})
    assert _bodies(lines) == sorted(written)  # nothing Spark had read again, everything Spark wrote
    assert {m["topic"] for m in lines} == {topic}  # the Java client unwraps it as our reader does

    assert _read(spark, broker, other, topic) == []  # the other namespace's topic of that name is empty


@pytest.mark.brokers("embedded")  # the real 5.x proxy serves no pulls over gRPC
def test_grpc_read_names_the_users_topic(spark, broker, client) -> None:
    """The embedded gRPC endpoint hands names back as a 5.x proxy does (namespace apart); the
    rows still name the user's topic."""
    ns, topic, _ = _names(broker)
    broker.create_topic(f"{ns}%{topic}", queues=1)
    client.send_batch(MessageQueue(f"{ns}%{topic}", broker.broker_name, 0), [BatchEntry(b"over-grpc")])
    rows = (spark.read.format("rocketmq").option("endpoints", broker.grpc_endpoint).option("namespace", ns)
            .option("topic", topic).load().collect())
    assert [(r.topic, bytes(r.body)) for r in rows] == [(topic, b"over-grpc")]


@pytest.mark.brokers("embedded")  # the CLI's wrapping does not depend on the broker: one run is enough
def test_cli_commands_take_the_namespace(spark, broker, client) -> None:
    import subprocess
    import sys

    ns, topic, group = _names(broker)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rocketmq_spark.cli", *args, "-n", broker.namesrv_addr],
                              capture_output=True, text=True, timeout=120, check=False)

    assert cli("topic", "create", "--namespace", ns, topic, "-q", "2").returncode == 0
    res = cli("produce", "--namespace", ns, "-t", topic, "--count", "6")
    assert res.returncode == 0, res.stderr
    rows = _read(spark, broker, ns, topic)
    assert len(rows) == 6 and {r.topic for r in rows} == {topic}
    wire = [MessageQueue(f"{ns}%{topic}", broker.broker_name, q) for q in (0, 1)]
    client.create_group(f"{ns}%{group}")
    for q in wire:
        client.update_consumer_offset(f"{ns}%{group}", q, 1)
    res = cli("progress", "--namespace", ns, "-g", group, "-t", topic, "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["group"] == f"{ns}%{group}" and out["topics"] == [f"{ns}%{topic}"]  # the names brokers keep
    assert out["totalLag"] == 4

    bad = cli("produce", "--namespace", "a%b", "-t", topic)
    assert bad.returncode == 2 and "accepted: letters, digits" in bad.stderr and len(bad.stderr.splitlines()) == 1
