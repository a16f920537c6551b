"""A Spark driver for the driver-kill tests (run as a subprocess by test_driver_kills.py).

usage: parquet_driver.py NAMESRV TOPIC GROUP OUT CHECKPOINT
Reads TOPIC (startingOffsets earliest, 2,000 messages per trigger) into Parquet under OUT with
a checkpoint, Trigger.AvailableNow, the offset committer listener on; exits 0 when caught up.
"""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

import rocketmq_spark  # noqa: E402
from rocketmq_spark import RocketMQOffsetCommitter  # noqa: E402

namesrv, topic, group, out, ckpt = sys.argv[1:6]
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rocketmq_spark.register(spark)
spark.streams.addListener(RocketMQOffsetCommitter(namesrv, group, topics=[topic]))
q = (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", topic)
     .option("consumerGroup", group).option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "2000")
     .load().selectExpr("CAST(body AS STRING) AS body", "queueId", "queueOffset")
     .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
     .trigger(availableNow=True).start())
q.awaitTermination()
spark.stop()
