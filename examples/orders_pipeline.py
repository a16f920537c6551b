"""Example pipeline: RocketMQ orders -> per-customer totals in Parquet.

    spark-submit examples/orders_pipeline.py --namesrv 127.0.0.1:9876 --topic orders \
        --group orders-etl --output /tmp/orders-out

Reads the topic as a stream until everything available now is processed
(Trigger.AvailableNow), keeps the consumer group's offsets on the broker (the reader
writes each finished batch's end, the run's last one when it ends; RocketMQOffsetCommitter
covers a query stopped between two triggers), and writes one Parquet dataset.
The package reaches the executors through the Python environment they run
(PYSPARK_PYTHON): install rocketmq-spark there, or ship the wheel with --py-files.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import rocketmq_spark


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="orders-etl")
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", default=None)
    args = p.parse_args()
    spark = SparkSession.builder.appName("rocketmq-orders-pipeline").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    rocketmq_spark.register(spark)  # not needed when the package is installed non-editable
    committer = rocketmq_spark.RocketMQOffsetCommitter(args.namesrv, args.group, topics=[args.topic])
    spark.streams.addListener(committer)
    orders = (spark.readStream.format("rocketmq").option("namesrvAddr", args.namesrv).option("topic", args.topic)
              .option("consumerGroup", args.group).option("startingOffsets", "group")
              .option("consumeFromWhere", "earliest").load()
              .select(F.from_json(F.col("body").cast("string"),
                                  "orderId BIGINT, customer STRING, amount DOUBLE").alias("o"), "tag")
              .select("o.*", "tag"))
    query = (orders.writeStream.format("parquet").option("path", args.output)
             .option("checkpointLocation", args.checkpoint or os.path.join(args.output, "_checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        print(f"query failed: {query.exception()}", file=sys.stderr)
        return 1
    totals = (spark.read.parquet(args.output).groupBy("customer")
              .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("amount")).orderBy("customer"))
    totals.show(truncate=False)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
