"""``demo``: embedded broker -> sample orders -> Spark streaming query -> Parquet, the group's
offsets committed, its progress and the totals per customer shown."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from ..model import MessageQueue
from ..offsets import Offsets
from .common import PROG, CliError, Parser, group_arg, make_client, namesrv_arg, positive_int_arg, table, topic_arg
from .produce import Message, fmt_bytes, send_messages
from .progress import progress_rows, progress_table


def add_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    d = sub.add_parser("demo",
                       help="the main job: embedded broker -> orders -> Spark streaming query -> Parquet",
                       description="Start an embedded broker in a temp dir (unless -n names a cluster), produce "
                                   "sample orders, read them with a Spark streaming query (format rocketmq, "
                                   "Trigger.AvailableNow) into Parquet, commit the group's offsets, show the "
                                   "progress and the totals per customer.")
    d.add_argument("-n", "--namesrv", type=namesrv_arg, default=None, metavar="HOST:PORT[;HOST:PORT]",
                   help="run against this cluster instead of an embedded broker (default: embedded, temp dir)")
    d.add_argument("--topic", default="orders", type=topic_arg)
    d.add_argument("--group", default="demo-etl", type=group_arg)
    d.add_argument("--messages", type=positive_int_arg, default=10_000, help="orders to produce (default 10000)")
    d.add_argument("--max-messages-per-trigger", type=positive_int_arg, default=None,
                   help="admission control per micro-batch (default: a quarter of --messages)")
    d.add_argument("-o", "--output", help="keep the Parquet output and checkpoint here (default: a temp dir)")
    d.set_defaults(func=_cmd_demo)


_DEMO_CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace")
_DEMO_SCHEMA = "orderId BIGINT, customer STRING, amount DECIMAL(12,2), items INT"

#: Spark's driver logs: warnings and up, and no "Setting default log level" banner (shown
#: only when the REPL logger's level differs from the root's).
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
logger.resolve.name = org.apache.spark.sql.execution.streaming.ResolveWriteToStream
logger.resolve.level = error
logger.resolve2.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.resolve2.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def _demo_orders(n: int, seed: int = 7) -> Iterator[tuple[Message, str, int, bool]]:
    """(message, customer, amount in cents, refunded) for ``n`` sample orders."""
    rng = random.Random(seed)
    for i in range(n):
        customer = _DEMO_CUSTOMERS[rng.randrange(len(_DEMO_CUSTOMERS))]
        cents = rng.randrange(500, 50_000)
        refund = rng.random() < 0.1
        body = json.dumps({"orderId": i, "customer": customer, "amount": cents / 100,
                           "items": rng.randrange(1, 6)}, separators=(",", ":")).encode()
        yield Message(body, "refund" if refund else "paid", [f"order-{i}"]), customer, cents, refund


def _end_offsets(progress: Any, topic: str) -> dict[str, int]:
    for src in progress.get("sources") or []:
        raw = src.get("endOffset")
        try:
            obj = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get(topic), dict):
            return {k: int(v) for k, v in obj[topic].items()}
    return {}


def _progress_dict(p: Any) -> dict[str, Any]:
    if isinstance(p, dict):
        return p
    raw = getattr(p, "json", None)
    if isinstance(raw, str):
        return json.loads(raw)
    return json.loads(str(p))


def _step(n: int, text: str) -> None:
    print(f"[{n}/5] {text}", flush=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    """Embedded broker -> sample orders -> Spark streaming query -> Parquet, offsets committed."""
    t_start = time.monotonic()
    topic, group, n = args.topic, args.group, args.messages
    per_trigger = args.max_messages_per_trigger or max(1, -(-n // 4))
    cluster = getattr(args, "namesrv", None) or getattr(args, "global_namesrv", None)
    if args.output and os.path.isdir(args.output) and os.listdir(args.output):
        raise CliError(f"--output {args.output} is not empty: pass a new directory (its checkpoint would "
                       "belong to another run)")
    with contextlib.ExitStack() as stack:
        work = tempfile.mkdtemp(prefix="rocketmq-spark-demo-")
        stack.callback(shutil.rmtree, work, True)
        out_dir = os.path.abspath(args.output) if args.output else os.path.join(work, "output")
        ns = _demo_broker(stack, work, cluster)  # 1
        client = make_client(ns, args)
        stack.callback(client.close)
        queues, start, expected, sent = _demo_produce(client, ns, topic, n)  # 2
        t_spark = time.monotonic()
        spark = _demo_spark(work)  # 3
        stack.callback(spark.stop)
        _step(3, f"Spark {spark.version} (local[2]) started in {time.monotonic() - t_spark:.1f}s")
        # 4: earliest on a fresh broker; on a cluster, where this run's orders start
        _demo_query(stack, spark, ns, topic, group, "earliest" if not cluster else start.dumps(), per_trigger,
                    out_dir, sum(start.values()), sent)
        rc = _demo_report(spark, client, ns, topic, group, queues, out_dir, expected, sent)  # 5
        kept = f"output kept in {out_dir}" if args.output else "output removed on exit (pass --output DIR to keep it)"
        print(f"\ndone in {time.monotonic() - t_start:.1f}s (Spark start included); {kept}")
    return rc


def _demo_broker(stack: contextlib.ExitStack, work: str, cluster: str | None) -> str:
    """Step 1: the cluster given, or an embedded broker in ``work`` -> its name server."""
    if cluster:
        _step(1, f"using the cluster at name server {cluster}")
        return cluster
    from ..broker.server import EmbeddedBroker

    mq = stack.enter_context(EmbeddedBroker(os.path.join(work, "broker")))
    _step(1, f"embedded broker up: name server {mq.namesrv_addr}, broker {mq.broker_addr} (data in a temp dir)")
    return mq.namesrv_addr


def _demo_produce(client: Any, ns: str, topic: str, n: int
                  ) -> tuple[list[MessageQueue], Offsets, dict[str, list[int]], int]:
    """Step 2: ``n`` sample orders to ``topic`` (created on every broker when missing) -> (its
    queues, their offsets before, per customer [orders, refunds, net cents] sent, how many)."""
    if topic not in client.topic_list():
        brokers = client.cluster_brokers()
        if not brokers:
            raise CliError(f"the name server {ns} knows no broker: start one with `{PROG} broker`")
        for addr in brokers.values():
            client.create_topic(topic, 4, broker_addr=addr)
    queues = client.message_queues(topic, refresh=True)
    start = Offsets(client.max_offsets(queues))
    expected: dict[str, list[int]] = {}

    def orders() -> Iterator[Message]:
        for msg, customer, cents, refund in _demo_orders(n):
            e = expected.setdefault(customer, [0, 0, 0])
            e[0] += 1
            e[1] += refund
            e[2] += -cents if refund else cents
            yield msg

    sent, nbytes, nq, secs = send_messages(client, topic, orders(), n)
    _step(2, f"produced {sent:,} orders (JSON, tags paid/refund, {fmt_bytes(nbytes)}) to topic {topic} "
             f"over {nq} queues in {secs:.2f}s")
    return queues, start, expected, sent


def _demo_query(stack: contextlib.ExitStack, spark: Any, ns: str, topic: str, group: str, starting: str,
                per_trigger: int, out_dir: str, start_total: int, sent: int) -> None:
    """Step 4: the streaming query (AvailableNow, JSON parsed, to Parquet under ``out_dir``) with
    the committer listener, each batch printed as it ends."""
    from pyspark.sql import functions as F

    from ..checkpoints.committer import RocketMQOffsetCommitter

    committer = RocketMQOffsetCommitter(ns, group, topics=[topic], measure_lag=False)
    spark.streams.addListener(committer)
    stack.callback(committer.client.close)
    stack.callback(spark.streams.removeListener, committer)
    source = (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", starting)
              .option("maxMessagesPerTrigger", str(per_trigger)).load())
    parsed = (source.select(F.from_json(F.col("body").cast("string"), _DEMO_SCHEMA).alias("o"),
                            F.col("tag").alias("status"), "queueId", "queueOffset", "storeTimestamp")
              .select("o.*", "status", "queueId", "queueOffset", "storeTimestamp"))
    _step(4, f"streaming query: format(\"rocketmq\") group {group}, maxMessagesPerTrigger={per_trigger}, "
             "Trigger.AvailableNow -> parse JSON -> Parquet")
    t_query = time.monotonic()
    orders_dir = os.path.join(out_dir, "orders")
    query = (parsed.writeStream.format("parquet").option("path", orders_dir)
             .option("checkpointLocation", os.path.join(out_dir, "_checkpoint")).queryName("rocketmq_demo")
             .trigger(availableNow=True).start())
    end_total = start_total + sent
    seen = -1
    batches = 0
    read = 0
    while True:
        finished = query.awaitTermination(0.2)
        for p in map(_progress_dict, query.recentProgress):
            if p.get("batchId", -1) <= seen:
                continue
            seen = p["batchId"]
            nrows = int(p.get("numInputRows") or 0)
            if not nrows:
                continue
            batches += 1
            read += nrows
            ends = _end_offsets(p, topic)
            lag = end_total - sum(ends.values()) if ends else end_total - start_total - read
            ms = (p.get("durationMs") or {}).get("triggerExecution", 0)
            print(f"      batch {p['batchId']}: {nrows:,} orders in {ms / 1000:.1f}s; read {read:,}/{sent:,}, "
                  f"lag {lag:,}", flush=True)
        if finished:
            break
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    print(f"      query done: {batches} batches, {read:,} orders in {time.monotonic() - t_query:.1f}s; "
          f"Parquet in {orders_dir}")


def _demo_report(spark: Any, client: Any, ns: str, topic: str, group: str, queues: list[MessageQueue],
                 out_dir: str, expected: dict[str, list[int]], sent: int) -> int:
    """Step 5: the group's progress on the brokers, the totals per customer from the Parquet
    output, checked against what was produced -> the exit code (1: totals differ, or a lag)."""
    from pyspark.sql import functions as F

    maxes = client.max_offsets(queues)
    deadline = time.monotonic() + 20  # listener events arrive asynchronously
    while time.monotonic() < deadline:
        if client.query_consumer_offsets(group, queues) == maxes:
            break
        time.sleep(0.1)
    rows = progress_rows(client, group, topic, ns)
    total_lag = sum(r.lag for r in rows)
    _step(5, f"consumer progress of group {group} (committed by the query): total lag {total_lag:,}")
    print(progress_table(rows, indent="      "))

    totals_dir = os.path.join(out_dir, "totals_by_customer")
    orders_df = spark.read.parquet(os.path.join(out_dir, "orders"))
    refund = F.col("status") == "refund"
    totals = (orders_df.groupBy("customer")
              .agg(F.count(F.lit(1)).alias("orders"),
                   F.sum(F.when(refund, 1).otherwise(0)).alias("refunds"),
                   F.sum(F.when(refund, -F.col("amount")).otherwise(F.col("amount"))).alias("net_amount"))
              .orderBy("customer"))
    result = totals.collect()  # a few rows: computed once, then written from the driver
    spark.createDataFrame(result, totals.schema).coalesce(1).write.mode("overwrite").parquet(totals_dir)
    print(f"\nnet amount per customer (Parquet {totals_dir}):")
    print(table(["CUSTOMER", "ORDERS", "REFUNDS", "NET AMOUNT"],
                 [[r.customer, r.orders, r.refunds, r.net_amount] for r in result], indent="  "))
    got = {r.customer: [r.orders, r.refunds, int(r.net_amount * 100)] for r in result}
    count = sum(v[0] for v in got.values())
    print(f"  total: {count:,} orders, net {sum(Decimal(v[2]) for v in got.values()) / 100:,.2f}")
    if got != expected:
        print(f"{PROG}: error: the Parquet totals differ from what was produced ({count} of {sent} orders)",
              file=sys.stderr)
        return 1
    if total_lag:
        print(f"{PROG}: error: group {group} still lags {total_lag} messages after the run", file=sys.stderr)
        return 1
    return 0


def _demo_spark(work: str) -> Any:
    """A quiet local[2] SparkSession that runs Python workers on this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # local[2] talks over loopback; this also spares the "hostname resolves to a loopback" warning
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = os.path.join(work, "log4j2.properties")
    with open(log4j, "w") as fh:
        fh.write(_LOG4J2)
    from pyspark.sql import SparkSession

    import rocketmq_spark

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    rocketmq_spark.register(spark)
    return spark
