"""Interop with the official RocketMQ 5 Python SDK (rocketmq-python-client) over the embedded
broker's gRPC endpoint; the SDK runs in a subprocess (tests/rmq5_peer.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.interop]

PEER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "rmq5_peer.py")


def _peer(*args: str, stdin: object = None, timeout: float = 180) -> object:
    proc = subprocess.run([sys.executable, PEER, *args], input=None if stdin is None else json.dumps(stdin),
                          capture_output=True, text=True, timeout=timeout)
    marker = "\nRESULT "
    if proc.returncode != 0 or marker not in proc.stdout:
        raise AssertionError(f"rmq5_peer {args[0]} failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.rsplit(marker, 1)[1])


def test_official_producer_messages_read_by_spark_over_both_transports(spark, broker, client) -> None:
    topic = "RMQ5_PRODUCED"
    client.create_topic(topic, queues=4)
    specs = [{"body": f"order-{i}", "tag": "TagA" if i % 2 else "TagB", "keys": [f"k{i}", "shared"],
              "props": {"color": "red", "n": str(i)}} for i in range(12)]
    ids = _peer("produce", broker.grpc_endpoint, topic, stdin=specs)
    assert isinstance(ids, list) and len(set(ids)) == len(specs)
    # a message group's messages go to a FIFO topic: a 5.x proxy refuses them elsewhere, and so does ours
    fifo = {"body": "fifo-1", "tag": "F", "group": "customer-7"}
    # refused by the SDK itself once it has our route's accepted types, else by our endpoint
    with pytest.raises(AssertionError, match=r"message_type:FIFO, queue access type:NORMAL|"
                                             r"expected type is NORMAL, but actual type is FIFO"):
        _peer("produce", broker.grpc_endpoint, topic, stdin=[fifo])
    client.create_topic(topic + "_FIFO", queues=4, message_type="FIFO")
    (fifo_id,) = _peer("produce", broker.grpc_endpoint, topic + "_FIFO", stdin=[fifo])
    got = spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic + "_FIFO") \
        .load().collect()
    assert [(bytes(r.body), r.tag, r.messageId) for r in got] == [(b"fifo-1", "F", fifo_id)]

    def read(**where: str):
        return (spark.read.format("rocketmq").options(**where).option("topic", topic).load()
                .select(F.col("body").cast("string").alias("body"), "messageId", "tag",
                        F.array_sort("keys").alias("keys"), "properties", "queueId", "queueOffset", "bornTimestamp",
                        "storeTimestamp", "bornHost", "storeHost"))

    over_remoting = read(namesrvAddr=broker.namesrv_addr)
    over_grpc = read(endpoints=broker.grpc_endpoint)
    # both transports give the same rows, field for field
    assert_df_equality(over_remoting.orderBy("body"), over_grpc.orderBy("body"), ignore_nullable=True)
    rows = {r.body: r for r in over_grpc.collect()}
    assert set(rows) == {s["body"] for s in specs}
    for spec, msg_id in zip(specs, ids):
        r = rows[spec["body"]]
        assert r.messageId == msg_id
        assert r.tag == spec["tag"] and r.keys == sorted(spec.get("keys", []))
        assert r.properties == spec.get("props", {})
        assert r.storeHost == broker.broker_addr and r.bornHost
        assert r.storeTimestamp is not None and r.bornTimestamp is not None


@pytest.mark.parametrize("where", ["remoting", "grpc"])
def test_official_simple_consumer_receives_what_our_writer_wrote(spark, broker, client, where) -> None:
    topic, group = f"RMQ5_WRITTEN_{where.upper()}", f"rmq5-simple-{where}"
    client.create_topic(topic, queues=2)
    rows = [(f"w{i}", f"tag{i % 3}", [f"key{i}"], {"idx": str(i)}) for i in range(20)]
    df = spark.createDataFrame(rows, "body STRING, tag STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>")
    opts = {"namesrvAddr": broker.namesrv_addr} if where == "remoting" else {"endpoints": broker.grpc_endpoint}
    df.write.mode("append").format("rocketmq").options(**opts).option("topic", topic) \
        .option("maxBatchMessages", "4").save()  # several batches: both queues get rows
    got = _peer("consume", broker.grpc_endpoint, topic, group, str(len(rows)), "60")
    assert isinstance(got, list)
    by_body = {m["body"]: m for m in got}
    assert len(got) == len(rows) == len(by_body)  # each once
    for body, tag, keys, props in rows:
        m = by_body[body]
        assert (m["tag"], m["keys"], m["props"]) == (tag, keys, props)
    # acks moved the group's offsets on the broker to the end of every queue
    qs = client.message_queues(topic)
    assert all(client.max_offset(mq) > 0 for mq in qs) or where == "grpc"  # (gRPC: the proxy picks queues)
    for mq in qs:
        assert (client.query_consumer_offset(group, mq) or 0) == client.max_offset(mq)
