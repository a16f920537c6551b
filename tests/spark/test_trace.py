"""Message trace (traceEnabled): a Spark write's Pub records and a Spark read's SubBefore and
SubAfter records, in the Java client's trace format, on the embedded broker and Apache
RocketMQ; ``mqadmin queryMsgTraceById`` shows both for a message as it shows a Java
producer's and consumer's, and a trace topic that cannot be written fails nothing."""

from __future__ import annotations

import re

import pytest

from brokers import settles_at, wait_until
from rocketmq_spark.codec import decode_records
from rocketmq_spark.codec.trace import decode_trace

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _trace_records(client, topic: str) -> list:  # type: ignore[no-untyped-def]
    """Every record of every message of trace topic ``topic``, as its queues hold them."""
    out = []
    for mq in client.message_queues(topic, refresh=True):
        offset, end = client.min_offset(mq), client.max_offset(mq)
        while offset < end:
            res = client.pull(mq, offset, 32)
            if res.status != "FOUND":
                break
            for rec in decode_records(res.body):
                out.extend(decode_trace(rec.body.decode()))
            offset = res.next_offset
    return out


def _mqadmin_trace(real_rocketmq, broker, msg_id: str, trace_topic: str) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """``mqadmin queryMsgTraceById``'s Pub and Sub lines for ``msg_id``, by type."""
    out = real_rocketmq.mqadmin("queryMsgTraceById", "-i", msg_id, "-t", trace_topic, namesrv=broker.namesrv_addr)
    lines: dict[str, list[str]] = {"Pub": [], "Sub": []}
    for line in out.splitlines():
        kind = line.split(" ", 1)[0]
        if kind in lines:
            lines[kind].append(line)
    return lines


def test_mqadmin_shows_the_spark_writers_and_readers_records_of_a_message(spark, broker, client, real_rocketmq,
                                                                           tmp_path) -> None:
    topic = broker.create_topic("TRACED", queues=2)
    trace_topic = broker.create_topic("SPARK_TRACE", queues=2)
    # keys as a STRING column: the writer's column-wise path (its per-row path writes the same
    # records: tests/unit/test_trace_records.py)
    rows = [(f"body-{i}", f"tag{i % 2}", f"key-{i}") for i in range(6)]
    (spark.createDataFrame(rows, "body STRING, tag STRING, keys STRING").coalesce(1).write.mode("append")
     .format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
     .option("producerGroup", "pg_traced").option("traceEnabled", "true").option("traceTopic", trace_topic).save())
    assert settles_at(client, topic, 6) == 6
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", "cg_traced").option("startingOffsets", "earliest").option("traceEnabled", "true")
         .option("traceTopic", trace_topic).load()
         .selectExpr("messageId", "CAST(body AS STRING) AS body").writeStream.format("memory")
         .queryName("q_traced").option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(120), "the traced stream did not end"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    read = {r.body: r.messageId for r in spark.sql("select body, messageId from q_traced").collect()}
    assert sorted(read) == sorted(r[0] for r in rows)
    ids = set(read.values())

    # every message has its Pub, SubBefore and SubAfter record, with what a Java client writes
    def complete() -> bool:
        recs = _trace_records(client, trace_topic)
        kinds = {k: {r.fields["msgId"] for r in recs if r.type == k} for k in ("Pub", "SubBefore", "SubAfter")}
        return all(kinds[k] >= ids for k in kinds)

    assert wait_until(complete, 30), _trace_records(client, trace_topic)
    recs = _trace_records(client, trace_topic)
    pubs = {r.fields["msgId"]: r.fields for r in recs if r.type == "Pub"}
    body_of = {v: k for k, v in read.items()}
    for msg_id in ids:
        pub = pubs[msg_id]
        i = int(body_of[msg_id].split("-")[1])
        assert (pub["group"], pub["topic"], pub["tags"], pub["keys"], pub["success"]) == \
            ("pg_traced", topic, f"tag{i % 2}", f"key-{i}", "true")
        assert pub["bodyLength"] == str(len(body_of[msg_id])) and pub["msgType"] == "0"
        assert re.fullmatch(r"[\d.]+:\d+", pub["storeHost"]) and pub["offsetMsgId"]
    befores = [r.fields for r in recs if r.type == "SubBefore" and r.fields["msgId"] in ids]
    afters = [r.fields for r in recs if r.type == "SubAfter" and r.fields["msgId"] in ids]
    assert {(b["group"], b["retryTimes"]) for b in befores} == {("cg_traced", "0")}
    assert {a["group"] for a in afters} == {"cg_traced"} and {a["success"] for a in afters} == {"true"}
    # a SubAfter names the request of its SubBefore
    assert {(a["requestId"], a["msgId"]) for a in afters} <= {(b["requestId"], b["msgId"]) for b in befores}

    # mqadmin finds them by the message id (the broker's index of the trace messages' keys)
    msg_id = sorted(ids)[0]
    shown: dict[str, list[str]] = {}

    def listed() -> bool:
        try:
            shown.update(_mqadmin_trace(real_rocketmq, broker, msg_id, trace_topic))
        except RuntimeError as exc:  # Apache RocketMQ indexes keys a moment after it stores them
            if "no message" not in str(exc):
                raise
            return False
        return bool(shown["Pub"]) and bool(shown["Sub"])

    assert wait_until(listed, 60, every_s=1.0), shown
    assert "pg_traced" in shown["Pub"][0] and "success" in shown["Pub"][0]
    assert "cg_traced" in shown["Sub"][0] and "success" in shown["Sub"][0]


@pytest.mark.brokers("real")
def test_a_trace_topic_that_does_not_exist_fails_nothing(spark, broker, client) -> None:
    # (what the tasks count and log of it: tests/unit/test_trace_records.py)
    topic = broker.create_topic("TRACED_NOWHERE", queues=1)
    (spark.createDataFrame([("a",), ("b",)], "body STRING").coalesce(1).write.mode("append").format("rocketmq")
     .option("namesrvAddr", broker.namesrv_addr).option("topic", topic).option("traceEnabled", "true")
     .option("traceTopic", "NO_SUCH_TRACE_TOPIC").save())
    assert settles_at(client, topic, 2) == 2
    back = (spark.read.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
            .option("traceEnabled", "true").option("traceTopic", "NO_SUCH_TRACE_TOPIC").load()
            .selectExpr("CAST(body AS STRING) AS body").collect())
    assert sorted(r.body for r in back) == ["a", "b"]


def test_an_exactly_once_write_traces_its_half_messages_and_their_commit(spark, broker, client) -> None:
    topic = broker.create_topic("TRACED_EOS", queues=2)
    trace_topic = broker.create_topic("SPARK_TRACE_EOS", queues=1)
    (spark.createDataFrame([(f"eos-{i}",) for i in range(5)], "body STRING").coalesce(1).write.mode("append")
     .format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
     .option("delivery", "exactly-once").option("producerGroup", "pg_traced_eos").option("traceEnabled", "true")
     .option("traceTopic", trace_topic).save())
    assert settles_at(client, topic, 5) == 5
    ids = set()
    for mq in client.message_queues(topic):
        res = client.pull(mq, 0, 32)
        ids |= {r.properties["UNIQ_KEY"] for r in decode_records(res.body)} if res.status == "FOUND" else set()
    assert len(ids) == 5

    def traced() -> bool:
        recs = _trace_records(client, trace_topic)
        pubs = {r.fields["msgId"]: r.fields for r in recs if r.type == "Pub"}
        ends = {r.fields["msgId"]: r.fields for r in recs if r.type == "EndTransaction"}
        return set(pubs) >= ids and set(ends) >= ids

    assert wait_until(traced, 30), _trace_records(client, trace_topic)
    recs = _trace_records(client, trace_topic)
    # the half message's send (type 1: Trans_Msg_Half), then the driver's commit (type 2)
    assert {r.fields["msgType"] for r in recs if r.type == "Pub"} == {"1"}
    ends = [r.fields for r in recs if r.type == "EndTransaction"]
    assert {(e["transactionState"], e["msgType"], e["group"], e["topic"]) for e in ends} == {
        ("COMMIT_MESSAGE", "2", "pg_traced_eos", topic)}
