"""A Spark Connect client, as a user writes one (run by test_connect.py in a child process).

usage: connect_client.py URL NAMESRV READ_TOPIC WRITE_TOPIC GROUP CHECKPOINT

A child process because a Connect session cannot share a Python process with the suite's
classic session (pyspark refuses one while the other exists, and marks the process as
Connect for good). Prints one line ``RESULT <json>`` with what each step saw.
"""

from __future__ import annotations

import json
import sys

from driver_support import stream_to_memory, watch  # beside this script, on its sys.path
from pyspark.sql import SparkSession

import rocketmq_spark
from rocketmq_spark import RocketMQDataSource

url, namesrv, read_topic, write_topic, group, ckpt = sys.argv[1:7]

spark = SparkSession.builder.remote(url).getOrCreate()
result: dict[str, object] = {"session": type(spark).__module__}
spark.dataSource.register(RocketMQDataSource)

rows = (spark.read.format("rocketmq").option("namesrvAddr", namesrv).option("topic", read_topic).load()
        .select("body", "queueId", "queueOffset", "tag").collect())
result["batch"] = sorted([bytes(r.body).decode(), r.queueId, r.queueOffset, r.tag] for r in rows)

(spark.createDataFrame([(f"w-{i}", "connect") for i in range(6)], "body STRING, tag STRING").write.mode("append")
 .format("rocketmq").option("namesrvAddr", namesrv).option("topic", write_topic).save())

query = stream_to_memory(spark, namesrv, read_topic, group, ckpt, "connect_stream")
result["stream_error"] = None if query.exception() is None else str(query.exception())
# a Connect session's progress objects answer by attribute (p["numInputRows"] is None there)
batches = [p for p in query.recentProgress if p.numInputRows]
result["stream_batches"] = [p.numInputRows for p in batches]
result["stream_last_end"] = json.loads(batches[-1].sources[0].endOffset)[read_topic] if batches else None
result["stream_bodies"] = sorted(bytes(r.body).decode() for r in spark.sql("select body from connect_stream").collect())


# register() cannot reach a SparkContext here: it falls back to the registration above, and says so
warnings = watch()
rocketmq_spark.register(spark)
result["register_warnings"] = warnings.seen
spark.stop()
print("RESULT " + json.dumps(result), flush=True)
