"""SQL92 property filters (subExpressionType=SQL92) on the embedded broker and Apache RocketMQ
(the reference): the shared table of expressions (tests/sql92_cases.py) gives the same
deliveries on both, a stream reads just the matching messages with the offsets of the others
passed, and a broker without enablePropertyFilter is refused with an error that says so."""

from __future__ import annotations

import pytest

from brokers import settles_at, wait_until
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties
from rocketmq_spark.errors import BrokerError
from sql92_cases import SQL92_CASES

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def test_the_shared_expression_table_delivers_the_same_messages_on_both_brokers(broker, client) -> None:
    topic = broker.create_topic("SQL92_TABLE", queues=1)
    (mq,) = client.message_queues(topic)
    for i, (_expr, props, _delivered) in enumerate(SQL92_CASES):
        client.send_batch(mq, [BatchEntry(b"case-%d" % i, encode_properties({"TAGS": "t", **props}))])
    assert settles_at(client, topic, len(SQL92_CASES)) == len(SQL92_CASES)
    wrong = []
    for i, (expr, props, delivered) in enumerate(SQL92_CASES):
        # the first message at or after offset i that the filter lets through: i itself when it matches
        res = client.pull(mq, i, 1, group="g_sql92_table", subscription=expr, expression_type="SQL92")
        got = res.status == "FOUND" and decode_records(res.body)[0].queue_offset == i
        if got != delivered:
            wrong.append(f"{expr!r} on {props}: delivered={got}, the table says {delivered}")
    assert not wrong, "\n".join(wrong)


def test_a_stream_reads_just_the_matching_messages_and_passes_the_others(spark, broker, client, tmp_path) -> None:
    topic = broker.create_topic("SQL92_STREAM", queues=2)
    qs = client.message_queues(topic)
    for i in range(40):
        props = {"TAGS": "t", "a": str(i), "region": ("eu", "us", "apac")[i % 3]}
        client.send_batch(qs[i % 2], [BatchEntry(b"m-%d" % i, encode_properties(props))])
    assert settles_at(client, topic, 40) == 40
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", "g_sql92").option("startingOffsets", "earliest")
         .option("subExpressionType", "SQL92").option("subExpression", "a > 5 AND region IN ('eu', 'us')").load()
         .selectExpr("CAST(body AS STRING) AS body").writeStream.format("memory").queryName("q_sql92")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None, q.exception()
    got = sorted(r.body for r in spark.sql("select body from q_sql92").collect())
    assert got == sorted(f"m-{i}" for i in range(6, 40) if i % 3 != 2)
    # the group's offsets pass the filtered messages: each queue's end
    assert wait_until(lambda: [client.query_consumer_offset("g_sql92", m) for m in qs] == [20, 20], 30)


@pytest.mark.brokers("embedded")
def test_a_broker_without_property_filters_refuses_naming_the_setting(tmp_path) -> None:
    # the broker.conf default, as on Apache RocketMQ: enablePropertyFilter=false
    with EmbeddedBroker(str(tmp_path / "mq")) as mq:
        c = RemotingClient(mq.namesrv_addr)
        try:
            c.create_topic("SQL92_OFF", 1)
            (q,) = c.message_queues("SQL92_OFF")
            c.send(q, b"x")
            with pytest.raises(BrokerError, match=r"does not support consumer to filter message by SQL92.*"
                                                  r"enablePropertyFilter=true"):
                c.pull(q, 0, 1, group="g", subscription="a > 1", expression_type="SQL92")
        finally:
            c.close()


def test_a_running_sql92_query_is_listed_with_its_filter(spark, broker, client, real_rocketmq, tmp_path) -> None:
    # the group's heartbeats carry the SQL92 subscription (expressionType SQL92), as a Java
    # consumer's do: mqadmin consumerConnection shows the filter, not "*"
    topic = broker.create_topic("SQL92_MEMBER", queues=1)
    expr = "a > 5 AND region IN ('eu')"
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", broker.namesrv_addr).option("topic", topic)
         .option("consumerGroup", "g_sql92_member").option("subExpressionType", "SQL92").option("subExpression", expr)
         .load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="1 second").start())
    try:
        out = ""

        def listed() -> bool:
            nonlocal out
            try:
                out = real_rocketmq.mqadmin("consumerConnection", "-g", "g_sql92_member", namesrv=broker.namesrv_addr)
            except RuntimeError as exc:  # not listed yet: "no consumer" is an exception there
                out = str(exc)
                return False
            return topic in out

        assert wait_until(listed, 60, every_s=1.0), out
        (line,) = [ln for ln in out.splitlines() if ln.startswith(topic)]
        assert line.split(None, 1)[1].strip() == expr, out
    finally:
        q.stop()
