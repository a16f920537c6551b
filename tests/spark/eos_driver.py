"""A Spark driver for the exactly-once kill tests (run as a subprocess by test_writer_kill.py).

usage: eos_driver.py NAMESRV SRC DST CHECKPOINT MODE
MODE: normal | kill-before-commit | kill-after-record | kill-mid-commit
In the kill modes the sink's commit() SIGKILLs this driver process (after recording the
batch with its destination marks, for kill-after-record; once the first END_TRANSACTIONs were answered and their
progress marked, with more in flight, for kill-mid-commit), which is what a crashed driver
looks like to the broker.
"""

from __future__ import annotations

import os
import signal
import sys
import time

os.environ["PYSPARK_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402

from rocketmq_spark.datasource import RocketMQDataSource  # noqa: E402
from rocketmq_spark.sink import transactional  # noqa: E402
from rocketmq_spark.sink.txlog import TxLog  # noqa: E402
from rocketmq_spark.sink.writer import RocketMQStreamWriter  # noqa: E402

namesrv, src, dst, ckpt, mode = sys.argv[1:6]
DRIVER_PID = os.getpid()


class KillingWriter(RocketMQStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        if mode == "kill-mid-commit":
            marked = TxLog.mark_progress

            def mark_then_die(self, batch_id, ended):  # type: ignore[no-untyped-def]
                marked(self, batch_id, ended)
                os.kill(DRIVER_PID, signal.SIGKILL)
                time.sleep(60)

            TxLog.mark_progress = mark_then_die  # type: ignore[method-assign]
            super().commit(messages, batchId)
            raise SystemExit("the commit finished without marking progress")
        if mode == "kill-after-record":
            def record_then_die(*args, **kwargs):  # type: ignore[no-untyped-def]
                os.kill(DRIVER_PID, signal.SIGKILL)
                time.sleep(60)

            transactional._end_recorded = record_then_die  # type: ignore[attr-defined]
            super().commit(messages, batchId)
            raise SystemExit("the commit finished without ending its transactions")
        os.kill(DRIVER_PID, signal.SIGKILL)
        time.sleep(60)


class KillingSource(RocketMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "rocketmq_killing"

    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return KillingWriter(super().streamWriter(schema, overwrite).opts)  # type: ignore[attr-defined]


spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.dataSource.register(RocketMQDataSource)
spark.dataSource.register(KillingSource)
fmt = "rocketmq" if mode == "normal" else "rocketmq_killing"
q = (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", src)
     .option("consumerGroup", "g_kill").option("startingOffsets", "earliest").load().select("body")
     .writeStream.format(fmt).option("namesrvAddr", namesrv).option("topic", dst)
     .option("delivery", "exactly-once").option("checkpointLocation", ckpt)
     .trigger(availableNow=True).start())
q.awaitTermination()
spark.stop()
