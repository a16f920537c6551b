"""The Spark reader and writer against a broker with ACL on: options accessKey/secretKey sign
every request (driver planning, executor pulls and sends, offset commits); a wrong secret fails
with an error naming NO_PERMISSION and the operation, never showing the secret."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import functions as F

from rocketmq_spark import EmbeddedBroker
from rocketmq_spark.client import Credentials, RemotingClient

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability]

AK = "spark-ak"
SK = "Sp4rk-S3cret-77"


@pytest.fixture(scope="module")
def acl_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(grpc_port=None, acl={AK: SK}) as mq:
        yield mq


def test_reader_and_writer_round_trip_with_credentials(spark, acl_broker: EmbeddedBroker, tmp_path) -> None:
    topic = "ACL_SPARK_RT"
    admin = RemotingClient(acl_broker.namesrv_addr, credentials=Credentials(AK, SK))
    try:
        admin.create_topic(topic, 2)
        opts = {"namesrvAddr": acl_broker.namesrv_addr, "topic": topic, "ACCESSKEY": AK, "secretkey": SK}
        df = spark.createDataFrame([(f"m{i}",) for i in range(50)], "body STRING")
        df.write.mode("append").format("rocketmq").options(**opts).save()
        back = spark.read.format("rocketmq").options(**opts).load()
        assert sorted(r.body.decode() for r in back.select("body").collect()) == sorted(f"m{i}" for i in range(50))
        # a stream with a consumer group: offsets are read from and committed to the broker, signed
        q = (spark.readStream.format("rocketmq").options(**opts).option("consumerGroup", "acl_etl")
             .option("startingOffsets", "earliest").load()
             .select(F.col("body").cast("string").alias("body"))
             .writeStream.format("memory").queryName("acl_stream").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        q.awaitTermination(120)
        assert q.exception() is None
        assert spark.table("acl_stream").count() == 50
    finally:
        admin.close()


def test_wrong_secret_fails_clearly(spark, acl_broker: EmbeddedBroker) -> None:
    topic = "ACL_SPARK_BAD"
    admin = RemotingClient(acl_broker.namesrv_addr, credentials=Credentials(AK, SK))
    try:
        admin.create_topic(topic, 1)
    finally:
        admin.close()
    opts = {"namesrvAddr": acl_broker.namesrv_addr, "topic": topic, "accessKey": AK, "secretKey": "not-the-secret"}
    with pytest.raises(Exception) as ei:
        spark.read.format("rocketmq").options(**opts).load().collect()
    text = str(ei.value)
    assert "NoPermissionError" in text or "code 16" in text, text[-2000:]
    assert "signature mismatch" in text and "not-the-secret" not in text
    with pytest.raises(Exception) as ei:
        spark.createDataFrame([("x",)], "body STRING").write.mode("append").format("rocketmq") \
            .options(**opts).save()
    assert "signature mismatch" in str(ei.value) and "not-the-secret" not in str(ei.value)
    with pytest.raises(Exception, match="secretKey"):
        spark.read.format("rocketmq").option("namesrvAddr", acl_broker.namesrv_addr).option("topic", topic) \
            .option("accessKey", AK).load().collect()
