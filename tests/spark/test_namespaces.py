"""Namespaces with the Apache RocketMQ Java client as the peer, on the embedded broker and on
Apache RocketMQ 5.5.0 (one start for this module): the option ``namespace`` names topics and
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

from brokers import Target, wait_until
from real_rocketmq import NEWEST, RealRocketMQ
from rocketmq_spark.checkpoints import RocketMQOffsetCommitter
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.interop]

BROKERS = ("embedded", "real")

Peer = Callable[..., list[dict[str, Any]]]


@pytest.fixture(scope="module")
def real_rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRocketMQ]:
    """Apache RocketMQ 5.5.0 (name server, broker, proxy) for this module (the conftest's
    session broker is another release)."""
    from brokers import skip_or_fail
    from real_rocketmq import java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(NEWEST), tmp_path_factory.mktemp("rocketmq-ns"), version=NEWEST)
    rmq.start()
    try:
        yield rmq
    finally:
        rmq.stop(grace_s=5)


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


def test_java_produces_spark_reads_and_two_namespaces_stay_apart(spark, broker, client, peer) -> None:
    ns, topic, _ = _names(broker)
    other = ns + "_other"
    for space in (ns, other):  # the same topic name in two namespaces: two topics on the broker
        broker.create_topic(f"{space}%{topic}", queues=2)
    sent = peer("produce", {"namesrv": broker.namesrv_addr, "namespace": ns, "topic": topic,
                            "group": "jpeer_ns_producer", "messages": [{"body": f"java-{i}"} for i in range(6)]})
    assert [s["status"] for s in sent] == ["SEND_OK"] * 6, sent
    # the Java client wrapped the topic: the broker holds the messages under ns%topic
    wire = [MessageQueue(f"{ns}%{topic}", broker.broker_name, q) for q in (0, 1)]
    assert sum(client.max_offset(q) for q in wire) == 6

    rows = _read(spark, broker, ns, topic)
    assert sorted(bytes(r.body).decode() for r in rows) == [f"java-{i}" for i in range(6)]
    assert {r.topic for r in rows} == {topic}  # the user's name, not the wire name
    assert {r.messageId for r in rows} == {s["msgId"] for s in sent}
    assert _read(spark, broker, other, topic) == []  # the other namespace's topic of that name is empty


def test_spark_writes_java_consumes_in_the_namespace(spark, broker, client, peer) -> None:
    ns, topic, group = _names(broker)
    broker.create_topic(f"{ns}%{topic}", queues=2)
    df = spark.createDataFrame([(f"spark-{i}",) for i in range(8)], "body STRING")
    (df.write.format("rocketmq").mode("append").option("namesrvAddr", broker.namesrv_addr)
     .option("namespace", ns).option("topic", topic).option("producerGroup", "spark_ns_producer").save())
    wire = [MessageQueue(f"{ns}%{topic}", broker.broker_name, q) for q in (0, 1)]
    assert sum(client.max_offset(q) for q in wire) == 8

    lines = peer("pull", {"namesrv": broker.namesrv_addr, "namespace": ns, "topic": topic, "group": group,
                          "fromOffsets": "earliest", "count": 8, "timeoutMs": 30_000})
    assert _bodies(lines) == sorted(f"spark-{i}" for i in range(8))
    assert {m["topic"] for m in lines} == {topic}  # the Java client unwraps it as our reader does


def test_spark_writes_over_grpc_java_consumes_in_the_namespace(spark, broker, peer) -> None:
    """gRPC: every Resource names the namespace; names are wrapped (5.2+ proxies read only the
    name, 5.0/5.1 ones wrap it again, which leaves it as it is)."""
    ns, topic, group = _names(broker)
    broker.create_topic(f"{ns}%{topic}", queues=2)
    df = spark.createDataFrame([(f"grpc-{i}",) for i in range(5)], "body STRING")
    (df.write.format("rocketmq").mode("append").option("endpoints", broker.grpc_endpoint)
     .option("namespace", ns).option("topic", topic).save())
    lines = peer("pull", {"namesrv": broker.namesrv_addr, "namespace": ns, "topic": topic, "group": group,
                          "fromOffsets": "earliest", "count": 5, "timeoutMs": 30_000})
    assert _bodies(lines) == sorted(f"grpc-{i}" for i in range(5))
    if not broker.is_real:  # the real 5.x proxy serves no pulls over gRPC
        rows = (spark.read.format("rocketmq").option("endpoints", broker.grpc_endpoint).option("namespace", ns)
                .option("topic", topic).load().collect())
        assert sorted(bytes(r.body).decode() for r in rows) == sorted(f"grpc-{i}" for i in range(5))
        assert {r.topic for r in rows} == {topic}


def test_java_consumer_resumes_where_spark_committed_the_groups_offsets(spark, broker, client, peer,
                                                                         tmp_path: Path) -> None:
    ns, topic, group = _names(broker)
    broker.create_topic(f"{ns}%{topic}", queues=2)
    wire = [MessageQueue(f"{ns}%{topic}", broker.broker_name, q) for q in (0, 1)]
    for i in range(10):
        client.send_batch(wire[i % 2], [BatchEntry(f"before-{i}".encode())])
    committer = RocketMQOffsetCommitter(broker.namesrv_addr, group, topics=[topic], namespace=ns)
    spark.streams.addListener(committer)
    try:
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr)
             .option("namespace", ns).option("topic", topic).option("consumerGroup", group)
             .option("startingOffsets", "earliest").load()
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None
        # the offsets are the group's as the Java client names it: ns%group, of ns%topic
        assert wait_until(lambda: [client.query_consumer_offset(f"{ns}%{group}", m) for m in wire] == [5, 5],
                          timeout_s=30)
    finally:
        spark.streams.removeListener(committer)
    for i in range(4):
        client.send_batch(wire[i % 2], [BatchEntry(f"after-{i}".encode())])
    lines = peer("pull", {"namesrv": broker.namesrv_addr, "namespace": ns, "topic": topic, "group": group,
                          "fromOffsets": "committed", "idleMs": 3000, "timeoutMs": 30_000})
    assert _bodies(lines) == sorted(f"after-{i}" for i in range(4))  # nothing Spark had read again


def test_namespace_v2_fields_leave_names_as_they_are(spark, broker, client, peer) -> None:
    """The Java client's setNamespaceV2 adds the request fields ns and nsd and wraps nothing;
    Apache RocketMQ (and the embedded broker) ignore those fields: the messages land in the
    plain topic, which is why the option namespace wraps names as setNamespace does."""
    ns, topic, _ = _names(broker)
    broker.create_topic(topic, queues=1)
    sent = peer("produce", {"namesrv": broker.namesrv_addr, "namespaceV2": ns, "topic": topic,
                            "group": "jpeer_nsv2", "messages": [{"body": "v2"}]})
    assert [s["status"] for s in sent] == ["SEND_OK"], sent
    rows = spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic).load()
    assert [bytes(r.body) for r in rows.collect()] == [b"v2"]


def test_cli_commands_take_the_namespace(spark, broker, client) -> None:
    import subprocess
    import sys

    ns, topic, group = _names(broker)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "rocketmq_spark.cli", *args, "-n", broker.namesrv_addr],
                              capture_output=True, text=True, timeout=120, check=False)

    assert cli("topic", "create", "--namespace", ns, topic, "-q", "2").returncode == 0
    if broker.real is not None:
        broker.real.topic_route_ready(f"{ns}%{topic}")
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
