"""A Spark driver for the exactly-once kill tests (run as a subprocess by test_writer_kill.py).

usage: eos_driver.py NAMESRV JOB [JOB ...]    JOB = SRC,DST,CHECKPOINT,MODE
MODE: normal | kill-before-commit | kill-after-record | kill-mid-commit

Each job is a streaming query copying SRC to DST exactly-once on its own checkpoint; they run
side by side in this one driver (a Spark driver costs 20 s and more to start). In a kill mode
the query's sink commit() (in the Python process Spark runs a data source's driver side in)
stops at its point, marks it in a file beside the checkpoint and waits: at the start of the commit
(kill-before-commit), after recording the batch with its destination marks
(kill-after-record), or once the first END_TRANSACTIONs were answered and their progress
marked, with more sent (kill-mid-commit). When every killing job waits at its point, the
driver SIGKILLs itself: what a crashed driver looks like to the broker, for all of them at
once. Without killing jobs it ends when its queries do.
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

namesrv = sys.argv[1]
JOBS = [tuple(arg.split(",")) for arg in sys.argv[2:]]
#: checkpoint -> mode of the killing jobs
MODES = {os.path.abspath(ck): mode for _src, _dst, ck, mode in JOBS if mode != "normal"}
DRIVER_PID = os.getpid()


def _arrived_path(ckpt: str) -> str:
    return os.path.abspath(ckpt) + ".at-kill-point"


def _stop_here(ckpt: str) -> None:
    """The job of checkpoint ``ckpt`` reached its kill point: say so, and wait there for the
    driver's SIGKILL (a sink's commit runs in a Python process of the driver's own, so this
    waits in that process and the driver's main thread watches for the marks)."""
    with open(_arrived_path(ckpt), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(600)
    raise SystemExit("the driver was not killed")


def _mode_of(ckpt: str | None) -> str:
    return MODES.get(os.path.abspath(ckpt or ""), "normal")


def _stop_points() -> None:
    """Patch the commit's steps (in the process the commit runs in) to stop jobs at their
    kill-after-record and kill-mid-commit points."""
    marked, end_recorded = TxLog.mark_progress, transactional._end_recorded  # type: ignore[attr-defined]
    if getattr(marked, "stops", False):
        return

    def mark_then_stop(self, batch_id, ended):  # type: ignore[no-untyped-def]
        marked(self, batch_id, ended)
        ckpt = os.path.dirname(os.path.dirname(self.dir))  # <checkpoint>/rocketmq-sink/commits
        if _mode_of(ckpt) == "kill-mid-commit":
            _stop_here(ckpt)

    def record_then_stop(client, opts, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _mode_of(opts.checkpoint_location) == "kill-after-record":
            _stop_here(opts.checkpoint_location)
        return end_recorded(client, opts, *args, **kwargs)

    mark_then_stop.stops = True  # type: ignore[attr-defined]
    TxLog.mark_progress = mark_then_stop  # type: ignore[method-assign]
    transactional._end_recorded = record_then_stop  # type: ignore[attr-defined]


class KillingWriter(RocketMQStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        mode = _mode_of(self.opts.checkpoint_location)
        if mode == "kill-before-commit":
            _stop_here(self.opts.checkpoint_location or "")
        _stop_points()
        super().commit(messages, batchId)
        if mode != "normal":
            raise SystemExit(f"{mode}: the commit finished without reaching its kill point")


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
queries = []
for src, dst, ckpt, mode in JOBS:
    fmt = "rocketmq" if mode == "normal" else "rocketmq_killing"
    queries.append(spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", src)
                   .option("consumerGroup", f"g_kill_{src}").option("startingOffsets", "earliest").load()
                   .select("body").writeStream.format(fmt).option("namesrvAddr", namesrv).option("topic", dst)
                   .option("delivery", "exactly-once").option("checkpointLocation", ckpt)
                   .trigger(availableNow=True).start())
if MODES:
    deadline = time.monotonic() + 240
    while not all(os.path.exists(_arrived_path(ck)) for ck in MODES):
        ended = [q for q, (_s, _d, ck, _m) in zip(queries, JOBS, strict=True)
                 if os.path.abspath(ck) in MODES and not q.isActive]
        if ended:
            sys.exit(f"a query ended before its kill point: {ended[0].exception()}")
        if time.monotonic() > deadline:
            sys.exit(f"not every job reached its kill point in 240 s: {[_arrived_path(ck) for ck in MODES]}")
        time.sleep(0.1)
    os.kill(DRIVER_PID, signal.SIGKILL)
for q in queries:
    q.awaitTermination()
spark.stop()
