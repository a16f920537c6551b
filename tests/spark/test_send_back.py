"""Records a pipeline cannot process go back to RocketMQ (issue 21, seed 004): delivery=send-back
gives them to the consumer group as the Java consumer does (CONSUMER_SEND_MSG_BACK, or a send to
the group's retry topic), the broker redelivers them through %RETRY%<group> after their delay
and puts them in %DLQ%<group> past maxReconsumeTimes, where the Java client reads them with
RETRY_TOPIC and ORIGIN_MESSAGE_ID intact. On the embedded broker and on Apache RocketMQ."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from pyspark.sql import functions as F

from brokers import Target, settles_at, wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, MessageRecord, decode_records, offset_msg_id
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _name(broker: Target, text: str) -> str:
    return f"{text}_{broker.kind.upper()}_{uuid.uuid4().hex[:6]}"


def _records(client: RemotingClient, topic: str) -> list[MessageRecord]:
    out: list[MessageRecord] = []
    for q in client.message_queues(topic, refresh=True):
        at, end = client.min_offset(q), client.max_offset(q)
        while at < end:
            res = client.pull(q, at, 32)
            out += decode_records(res.body)
            at = res.next_offset
    return out


def _arrive(client: RemotingClient, topic: str, n: int, timeout_s: float = 90) -> list[MessageRecord]:
    """The records of ``topic`` once it holds ``n`` (a real broker routes a retry or dead-letter
    topic a moment after it creates it)."""
    got: list[MessageRecord] = []

    def enough() -> bool:
        nonlocal got
        try:
            got = _records(client, topic)
        except Exception:  # no route yet
            return False
        return len(got) >= n

    assert wait_until(enough, timeout_s, 0.5), f"{topic} holds {len(got)} of {n} messages"
    return got


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_message_given_back_comes_again_through_the_retry_topic_then_goes_to_the_dead_letter_topic(
        broker: Target, client: RemotingClient, transport: Any) -> None:
    topic, group = broker.create_topic(_name(broker, "SB")), _name(broker, "g_sb")
    mq = client.message_queues(topic)[0]
    client.send(mq, b"poison", "UNIQ_KEY\x01SBU1\x02TAGS\x01t\x02color\x01red\x02")
    assert settles_at(client, topic, 1) == 1
    (orig,) = _records(client, topic)
    origin = offset_msg_id(orig.store_host, orig.physical_offset)
    client.send_back(mq, orig.physical_offset, group, origin_msg_id=origin, max_reconsume_times=1, delay_level=1)

    (again,) = _arrive(client, f"%RETRY%{group}", 1)  # after its delay (level 1: 1 s)
    assert (again.payload(), again.reconsume_times) == (b"poison", 1)
    assert again.properties["RETRY_TOPIC"] == topic and again.properties["ORIGIN_MESSAGE_ID"] == origin
    assert again.properties["UNIQ_KEY"] == "SBU1" and again.properties["color"] == "red"
    assert again.properties["TAGS"] == "t"

    # given back once more: its reconsume times reached maxReconsumeTimes, so straight to the DLQ
    retry_mq = MessageQueue(again.topic, mq.broker, again.queue_id)
    client.send_back(retry_mq, again.physical_offset, group, origin_msg_id=origin, max_reconsume_times=1)
    (dead,) = _arrive(client, f"%DLQ%{group}", 1, 30)
    assert (dead.payload(), dead.reconsume_times) == (b"poison", 2)
    assert dead.properties["RETRY_TOPIC"] == topic and dead.properties["ORIGIN_MESSAGE_ID"] == origin

    # the Java consumer's other way, a send to the retry topic past the maximum: the DLQ too
    client.send_to_retry(mq, group, BatchEntry(b"second", "UNIQ_KEY\x01SBU2\x02RETRY_TOPIC\x01" + topic + "\x02"),
                         sys_flag=0, reconsume_times=2, max_reconsume_times=1)
    dead_two = _arrive(client, f"%DLQ%{group}", 2, 30)
    assert sorted(r.payload() for r in dead_two) == [b"poison", b"second"]


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_pipeline_writes_the_good_orders_and_sends_the_bad_ones_back_until_the_dead_letter_topic(
        spark: Any, broker: Target, client: RemotingClient, transport: Any, peer: Any) -> None:
    orders, good = broker.create_topic(_name(broker, "ORDERS"), 2), broker.create_topic(_name(broker, "GOOD"), 2)
    group = _name(broker, "g_orders")
    qs = client.message_queues(orders)
    bad = set(range(5, 1000, 100))  # 10 unparseable orders
    for start in range(0, 1000, 100):
        for q in qs:
            client.send_batch(q, [BatchEntry((f'{{"id": {i}, "amount": {i * 2}}}' if i not in bad else
                                              f"garbage {i}").encode())
                                  for i in range(start, start + 100) if i % len(qs) == q.queue_id])
    assert settles_at(client, orders, 1000) == 1000
    ns = broker.namesrv_addr

    def read(topic: str) -> Any:
        return (spark.read.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
                .option("startingOffsets", "earliest").load())

    parsed = read(orders).withColumn("order", F.from_json(F.col("body").cast("string"), "id INT, amount INT"))
    ok = parsed.where("order.id IS NOT NULL")
    ok.select(F.to_json("order").alias("body")).write.format("rocketmq").option("namesrvAddr", ns) \
        .option("topic", good).mode("append").save()
    # the Java consumer's way: CONSUMER_SEND_MSG_BACK, delay level 3 (10 s), reconsume count 1
    parsed.where("order.id IS NULL").write.format("rocketmq").option("namesrvAddr", ns) \
        .option("delivery", "send-back").option("consumerGroup", group).option("maxReconsumeTimes", "1") \
        .mode("append").save()

    assert settles_at(client, good, 1000 - len(bad)) == 1000 - len(bad)
    written = [json.loads(r.payload()) for r in _records(client, good)]
    assert sorted(o["id"] for o in written) == sorted(set(range(1000)) - bad)  # each good order once
    back = _arrive(client, f"%RETRY%{group}", 10)
    assert sorted(r.payload() for r in back) == sorted(f"garbage {i}".encode() for i in bad)
    assert {(r.reconsume_times, r.properties["RETRY_TOPIC"]) for r in back} == {(1, orders)}
    origins = {r.payload(): r.properties["ORIGIN_MESSAGE_ID"] for r in back}

    # read again with the group's retry topic (includeRetryTopic: rows say where they came from
    # and how often they were given back) and still unparseable: with the reason, past the maximum
    both = (spark.read.format("rocketmq").option("namesrvAddr", ns).option("topic", orders)
            .option("consumerGroup", group).option("includeRetryTopic", "true").option("startingOffsets", "earliest")
            .load())
    assert both.columns[-2:] == ["retryTopic", "reconsumeTimes"]
    seen = {(r.topic, r.retryTopic, r.reconsumeTimes) for r in both.select("topic", "retryTopic", "reconsumeTimes")
            .distinct().collect()}
    assert seen == {(orders, None, 0), (f"%RETRY%{group}", orders, 1)}, seen
    again = both.where("retryTopic IS NOT NULL").withColumn("error", F.lit("not JSON: no order id"))
    assert again.count() == 10
    assert "retryTopic" not in read(orders).columns  # without the option the schema is as it was
    again.write.format("rocketmq").option("namesrvAddr", ns).option("delivery", "send-back") \
        .option("consumerGroup", group).option("maxReconsumeTimes", "1").mode("append").save()
    _arrive(client, f"%DLQ%{group}", 10, 30)

    # a third-party consumer of the dead-letter topic sees where they came from
    lines = peer("pull", {"namesrv": ns, "topic": f"%DLQ%{group}", "group": _name(broker, "jpeer_dlq"),
                          "fromOffsets": "earliest", "count": 10, "timeoutMs": 30_000})
    got = {base64.b64decode(m["bodyB64"]): m for m in lines}
    assert sorted(got) == sorted(f"garbage {i}".encode() for i in bad)
    for body, m in got.items():
        assert m["sysProps"]["RETRY_TOPIC"] == orders and m["sysProps"]["ORIGIN_MESSAGE_ID"] == origins[body]
        assert m["props"]["error"] == "not JSON: no order id" and m["reconsumeTimes"] == 2


@pytest.mark.brokers("embedded")
@pytest.mark.transports(embedded=("remoting",))
def test_the_example_pipeline_writes_valid_orders_and_gives_the_others_back(broker: Target, client: RemotingClient,
                                                                            transport: Any, tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    topic, out, group = broker.create_topic("EX_ORDERS", 2), broker.create_topic("EX_VALID", 2), "g_example"
    q = client.message_queues(topic)[0]
    bodies = [json.dumps({"orderId": i, "customer": f"c{i % 3}", "amount": i * 1.5}) for i in range(20)]
    bodies[4], bodies[11], bodies[17] = "{not json", json.dumps({"customer": "x"}), "[]"
    client.send_batch(q, [BatchEntry(b.encode()) for b in bodies])
    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "send_back_pipeline.py")
    run = subprocess.run([sys.executable, example, "--namesrv", broker.namesrv_addr, "--topic", topic, "--group",
                          group, "--output-topic", out, "--checkpoint", str(tmp_path / "ck")],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr[-3000:]
    valid = [json.loads(r.payload()) for r in _records(client, out)]
    assert sorted(o["orderId"] for o in valid) == sorted(set(range(20)) - {4, 11, 17})
    back = _arrive(client, f"%RETRY%{group}", 3)
    assert sorted(r.payload().decode() for r in back) == sorted(bodies[i] for i in (4, 11, 17))
    assert all(r.properties["error"] == "not an order: needs orderId and amount" and r.reconsume_times == 1
               for r in back)
