"""A Spark driver for the exactly-once lost-store test (run as a subprocess by test_store_loss.py).

usage: eos_lost_driver.py NAMESRV SRC_DIR DST CHECKPOINT HANDSHAKE_DIR MODE
Copies the lines of the text files in SRC_DIR to topic DST with delivery=exactly-once
(Trigger.AvailableNow). MODE pause: the sink's commit() (every task has sent its half messages)
first creates HANDSHAKE_DIR/prepared, then waits up to 240 s for HANDSHAKE_DIR/lost (the test takes
the destination broker's store away meanwhile) before committing. MODE normal: it commits at once.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

from rocketmq_spark.datasource import RocketMQDataSource  # noqa: E402
from rocketmq_spark.sink.writer import RocketMQStreamWriter  # noqa: E402

namesrv, src, dst, ckpt, handshake, mode = sys.argv[1:7]


class PausingWriter(RocketMQStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        open(os.path.join(handshake, "prepared"), "w").close()
        deadline = time.monotonic() + 240
        while not os.path.exists(os.path.join(handshake, "lost")):
            if time.monotonic() > deadline:
                raise SystemExit("the test did not take the destination's store away within 240 s")
            time.sleep(0.1)
        super().commit(messages, batchId)


class PausingSource(RocketMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketmq_pausing"

    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return PausingWriter(super().streamWriter(schema, overwrite).opts)  # type: ignore[attr-defined]


spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.dataSource.register(RocketMQDataSource)
spark.dataSource.register(PausingSource)
fmt = "rocketmq_pausing" if mode == "pause" else "rocketmq"
q = (spark.readStream.format("text").load(src).selectExpr("value AS body")
     .writeStream.format(fmt).option("namesrvAddr", namesrv).option("topic", dst)
     .option("delivery", "exactly-once").option("checkpointLocation", ckpt)
     .trigger(availableNow=True).start())
q.awaitTermination()
spark.stop()
