"""Example pipeline: JSON orders -> a topic of valid orders; the unparseable ones go back to RocketMQ.

    spark-submit examples/send_back_pipeline.py --namesrv 127.0.0.1:9876 --topic orders \
        --group orders-check --output-topic orders-valid

Reads the topic and the consumer group's retry topic as a stream (Trigger.AvailableNow), parses
each body as an order, writes the valid ones to --output-topic and gives the others back to the
group the way RocketMQ's Java consumer does (delivery=send-back): the broker redelivers each
through %RETRY%<group> after a delay (10 s, then longer each time), and after
--max-reconsume-times it lands in %DLQ%<group>, where RocketMQ's console and any consumer can
inspect and resend it. Run it again later to process what came back; a row read from the
retry topic says which topic it came from (retryTopic) and how often it came back
(reconsumeTimes). The package reaches the executors through the Python environment they run
(PYSPARK_PYTHON): install rocketmq-spark there, or ship the wheel with --py-files.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import rocketmq_spark

ORDER = "orderId BIGINT, customer STRING, amount DOUBLE"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="orders-check")
    p.add_argument("--output-topic", required=True)
    p.add_argument("--max-reconsume-times", type=int, default=16)
    p.add_argument("--checkpoint", default=None)
    args = p.parse_args()
    spark = SparkSession.builder.appName("rocketmq-send-back-pipeline").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    rocketmq_spark.register(spark)  # not needed when the package is installed non-editable
    orders = (spark.readStream.format("rocketmq").option("namesrvAddr", args.namesrv).option("topic", args.topic)
              .option("consumerGroup", args.group).option("consumeFromWhere", "earliest")
              .option("includeRetryTopic", "true").load()
              .withColumn("order", F.from_json(F.col("body").cast("string"), ORDER)))

    def route(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        valid = batch.where("order.orderId IS NOT NULL AND order.amount IS NOT NULL")
        (valid.select(F.to_json("order").alias("body"), F.col("order.customer").alias("tag"))
         .write.format("rocketmq").option("namesrvAddr", args.namesrv).option("topic", args.output_topic)
         .mode("append").save())
        # the rows as read (topic, broker, queueId, queueOffset) go back, with why as a property
        (batch.where("order.orderId IS NULL OR order.amount IS NULL")
         .withColumn("error", F.lit("not an order: needs orderId and amount"))
         .write.format("rocketmq").option("namesrvAddr", args.namesrv).option("delivery", "send-back")
         .option("consumerGroup", args.group).option("maxReconsumeTimes", str(args.max_reconsume_times))
         .mode("append").save())
        batch.unpersist()

    checkpoint = args.checkpoint or os.path.join(tempfile.gettempdir(), f"send-back-{args.group}")
    query = (orders.writeStream.foreachBatch(route).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
