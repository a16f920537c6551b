"""The fault suite's Spark driver, run as its own process (so a fault can SIGKILL or SIGSTOP it
and the suite restart it on its checkpoints)::

    python tests/faults/pipeline.py CONFIG.json run|drain

Three streaming queries read topic A, each in its own consumer group with its own checkpoint:

``parquet``  the message id, source queue and offset into Parquet (file sink)
``eos``      the body into topic B, ``delivery=exactly-once``
``alo``      the body into topic C, at-least-once, ``messageGroup`` = the source queue (so
             each source queue's messages keep their order in C: the checker looks)

``run``: processing-time triggers, until the file ``<control>/drain`` appears; then (and in
``drain`` mode from the start) the queries are stopped and run again on the same checkpoints
with Trigger.AvailableNow, to a deterministic end; ``<control>/drained`` is written when all
three ended cleanly, and the process exits 0. A query failing exits 1 (the suite restarts the
driver, as a supervisor would).

After each batch, a listener writes ``<progress>/<query>.json``: the batch id, its end offsets
(the source's JSON) and the time, which the suite reads to know what was read and committed.
CONFIG holds namesrv, topic_a/b/c, out_dir, trigger_ms, fail_on_data_loss.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener  # noqa: E402

import rocketmq_spark  # noqa: E402

QUERIES = ("parquet", "eos", "alo")


def _atomic_write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


class Progress(StreamingQueryListener):
    """Writes each query's last finished batch (Spark reports progress once the batch, its
    sink commit included, is done) for the suite to read."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        #: query id -> its name here (the rocketmq sink refuses queryName as an option, which Spark
        #: passes to the sink of a named query: the queries go unnamed)
        self.names: dict[str, str] = {}

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        name = self.names.get(str(p.id))
        if name is None or not p.sources:
            return
        _atomic_write(os.path.join(self.dir, f"{name}.json"),
                      {"batch": p.batchId, "end": p.sources[0].endOffset, "rows": p.numInputRows,
                       "t": time.time(), "pid": os.getpid()})

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def start_queries(spark: SparkSession, cfg: dict[str, Any], available_now: bool, progress: Progress
                  ) -> list[StreamingQuery]:
    out = cfg["out_dir"]
    ckpt = os.path.join(out, "checkpoints")

    more = cfg.get("reader_options", {})

    def source(group: str) -> Any:
        r = spark.readStream.format("rocketmq").option("namesrvAddr", cfg["namesrv"])
        if "subscribePattern" not in more:
            r = r.option("topic", cfg["topic_a"])
        return (r.option("consumerGroup", group).option("startingOffsets", "earliest")
                .option("failOnDataLoss", str(cfg["fail_on_data_loss"]).lower()).options(**more).load())

    def trigger(w: Any) -> Any:
        if available_now:
            return w.trigger(availableNow=True)
        return w.trigger(processingTime=f"{cfg['trigger_ms'] / 1000:g} seconds")

    queries = []
    parquet = (source("faults_parquet")
               .selectExpr(f"CAST(substring(CAST(body AS STRING), 1, {cfg['id_digits']}) AS BIGINT) AS id",
                           "broker", "queueId", "queueOffset")
               .writeStream.format("parquet")
               .option("path", os.path.join(out, "parquet"))
               .option("checkpointLocation", os.path.join(ckpt, "parquet")))
    queries.append(trigger(parquet).start())
    progress.names[str(queries[-1].id)] = "parquet"
    eos = (source("faults_eos").select("body")
           .writeStream.format("rocketmq").option("namesrvAddr", cfg["namesrv"])
           .option("topic", cfg["topic_b"]).option("delivery", "exactly-once")
           # as the reader: rows a wiped broker took with its store (their source rows too) are
           # lost with it, not a query that fails at each restart
           .option("failOnDataLoss", str(cfg["fail_on_data_loss"]).lower())
           .option("checkpointLocation", os.path.join(ckpt, "eos")))
    queries.append(trigger(eos).start())
    progress.names[str(queries[-1].id)] = "eos"
    alo = (source("faults_alo").selectExpr("body", "concat(broker, ':', CAST(queueId AS STRING)) AS messageGroup")
           .writeStream.format("rocketmq").option("namesrvAddr", cfg["namesrv"])
           .option("topic", cfg["topic_c"]).option("delivery", "at-least-once")
           .option("checkpointLocation", os.path.join(ckpt, "alo")))
    queries.append(trigger(alo).start())
    progress.names[str(queries[-1].id)] = "alo"
    return queries


def main(argv: list[str]) -> int:
    config_path, mode = argv[1], argv[2]
    with open(config_path) as f:
        cfg = json.load(f)
    control = os.path.join(cfg["out_dir"], "control")
    progress = os.path.join(cfg["out_dir"], "progress")
    os.makedirs(control, exist_ok=True)
    os.makedirs(progress, exist_ok=True)
    # local[2,4]: two cores, and a failed task is retried up to 4 times as on a cluster (a
    # killed Python worker fails its task, not the query)
    spark = (SparkSession.builder.master("local[2,4]").appName(f"faults-pipeline-{mode}")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "60s").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    rocketmq_spark.register(spark)
    listener = Progress(progress)
    spark.streams.addListener(listener)
    drain = os.path.join(control, "drain")
    if mode == "run":
        queries = start_queries(spark, cfg, available_now=False, progress=listener)
        print(f"pipeline {os.getpid()}: running", flush=True)
        while not os.path.exists(drain):
            # raises the query's error when one failed: the process exits non-zero
            if spark.streams.awaitAnyTermination(1):
                failed = [q for q in queries if q.exception() is not None]
                for q in failed:
                    print(f"query {listener.names.get(str(q.id))} failed: {q.exception()}", file=sys.stderr,
                          flush=True)
                return 1
        for q in queries:
            q.stop()
    elif mode != "drain":
        print(f"unknown mode {mode!r}: run or drain", file=sys.stderr)
        return 2
    print(f"pipeline {os.getpid()}: draining", flush=True)
    for q in start_queries(spark, cfg, available_now=True, progress=listener):
        q.awaitTermination()  # raises when the query failed
    _atomic_write(os.path.join(control, "drained"), {"t": time.time(), "pid": os.getpid()})
    print(f"pipeline {os.getpid()}: drained", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
