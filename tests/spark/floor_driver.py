"""A Spark driver run on the oldest pyspark setup.cfg admits (by test_pyspark_floor.py).

usage: floor_driver.py NAMESRV READ_TOPIC WRITE_TOPIC GROUP CHECKPOINT

Runs under the floor venv's interpreter with the project's wheel on PYTHONPATH, against a
broker the test started. Prints one line ``RESULT <json>`` with what each step saw; the test
asserts on it and on the broker.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable

import pyspark  # noqa: E402
from driver_support import stream_to_memory, watch  # noqa: E402  (beside this script, on its sys.path)
from pyspark.sql import SparkSession  # noqa: E402

import rocketmq_spark  # noqa: E402

namesrv, read_topic, write_topic, group, ckpt = sys.argv[1:6]
result: dict[str, object] = {"pyspark": pyspark.__version__, "module": rocketmq_spark.__file__}


warnings = watch()

spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-floor")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
result["spark"] = spark.version


def reader():  # type: ignore[no-untyped-def]
    return spark.read.format("rocketmq").option("namesrvAddr", namesrv)


# before register(): the installed pyspark_rocketmq module, found by Spark's scan
result["discovered_count"] = reader().option("topic", read_topic).load().count()

rocketmq_spark.register(spark)
rows = reader().option("topic", read_topic).load().select("body", "queueId", "queueOffset", "tag", "keys").collect()
result["batch"] = sorted([bytes(r.body).decode(), r.queueId, r.queueOffset, r.tag, r.keys] for r in rows)

written = [(f"w-{i}", "floor", [f"k{i}"]) for i in range(10)]
(spark.createDataFrame(written, "body STRING, tag STRING, keys ARRAY<STRING>").write.mode("append")
 .format("rocketmq").option("namesrvAddr", namesrv).option("topic", write_topic).save())

query = stream_to_memory(spark, namesrv, read_topic, group, ckpt, "floor_stream")
result["stream_error"] = None if query.exception() is None else str(query.exception())
batches = [p for p in query.recentProgress if p["numInputRows"]]
result["stream_batches"] = [p["numInputRows"] for p in batches]
result["stream_last_end"] = json.loads(batches[-1]["sources"][0]["endOffset"])[read_topic] if batches else None
result["stream_bodies"] = sorted(bytes(r.body).decode() for r in spark.sql("select body from floor_stream").collect())
result["warnings"] = warnings.seen
spark.stop()
print("RESULT " + json.dumps(result), flush=True)
