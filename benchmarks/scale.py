"""Scale benchmark: the driver's per-trigger work as queues grow, and an executor's memory as data grows.

    planning    the stream reader's latestOffset (data-loss check + end offsets over every queue)
                and partitions(start, end), per trigger, for topics of 8, 64, 512 and 4096 queues;
                (4096 queues: four topics of 1024, one subscription, as the embedded broker takes
                at most 1024 queues per topic); every queue gets one new message before each
                trigger (the worst case: every queue has a partition and an offset to commit)
    commit      the stream reader's commit(end): the group's offset of every queue written to the
                broker (the min-unconsumed-offset rule applied first)
    memory      one partition read (the executor's read(), no Spark) of a queue holding D and then
                10 x D messages of 1 KiB, each in a fresh child process: peak RSS over the child's
                RSS before the read. It should stay flat: a task holds at most a pull window and
                one decoded batch, never the whole range.

The broker runs in a child process (``python -m rocketmq_spark.cli broker``); the reader is the
real one (``RocketMQStreamReader`` built from the same options Spark passes), driven without Spark
so the figures are the connector's own cost. Target: planning + commit < 1 s per trigger for 4096
queues.

``python -m benchmarks.scale [--quick] [--triggers T] [--results-dir DIR]``; results go to
``benchmarks/results/scale.json`` and ``scale.png`` (``scale-quick.*`` with ``--quick``: 1
trigger, memory with 2,000 and 20,000 messages).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
from collections import deque
from typing import Any

from . import _plot, _provenance, _report
from ._brokers import start_broker

QUEUE_COUNTS = (8, 64, 512, 4096)
MAX_QUEUES_PER_TOPIC = 1024
TARGET_S = 1.0
GROUP = "bench-scale"
MEMORY_BODY = 1024


def _fill(c: Any, qs: list[Any], per_queue: int = 1, body: bytes = b"x" * 100, window: int = 64) -> None:
    """``per_queue`` messages into every queue, ``window`` sends in flight."""
    from rocketmq_spark.codec import BatchEntry, encode_properties

    entries = [BatchEntry(body, encode_properties({"TAGS": "scale"}))] * per_queue
    inflight: deque[tuple[Any, Any]] = deque()
    for mq in qs:
        inflight.append((mq, c.send_async(mq, c.send_request(mq, entries))))
        if len(inflight) >= window:
            m, fut = inflight.popleft()
            c.send_results(m, per_queue, fut.result(30))
    for m, fut in inflight:
        c.send_results(m, per_queue, fut.result(30))


def planning(namesrv: str, queues: int, triggers: int, log: Any) -> dict[str, Any]:
    from pyspark.sql.datasource import ReadAllAvailable

    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.source.options import ReaderOptions
    from rocketmq_spark.source.reader import RocketMQStreamReader

    # the embedded broker (like mqadmin's defaults) takes up to 1024 queues per topic: more
    # queues are spread over several topics of one subscription
    per_topic = min(queues, MAX_QUEUES_PER_TOPIC)
    topics = [f"Scale{queues}_{i}" for i in range(queues // per_topic)]
    topic = ",".join(topics)
    c = RemotingClient(namesrv)
    try:
        qs = []
        for t in topics:
            c.create_topic(t, per_topic)
            qs += c.message_queues(t, refresh=True)
        if len(qs) != queues:
            raise AssertionError(f"{topic}: {len(qs)} queues, expected {queues}")
        reader = RocketMQStreamReader(ReaderOptions.parse(
            {"namesrvAddr": namesrv, "topic": topic, "consumerGroup": f"{GROUP}-{queues}",
             "startingOffsets": "earliest"}, stream=True))
        t0 = time.perf_counter()
        start = reader.initialOffset()
        initial_s = time.perf_counter() - t0
        plan_s: list[float] = []
        commit_s: list[float] = []
        parts_n: list[int] = []
        for _ in range(triggers):
            _fill(c, qs)
            t0 = time.perf_counter()
            end = reader.latestOffset(start, ReadAllAvailable())
            parts = reader.partitions(start, end)
            t1 = time.perf_counter()
            reader.commit(end)
            t2 = time.perf_counter()
            plan_s.append(t1 - t0)
            commit_s.append(t2 - t1)
            parts_n.append(len(parts))
            start = end
        committed = sum(1 for mq in qs[:: max(1, queues // 16)]
                        if c.query_consumer_offset(f"{GROUP}-{queues}", mq) == triggers)
        if committed != len(qs[:: max(1, queues // 16)]):
            raise AssertionError(f"{topic}: the group's offsets are not at {triggers} after the commits")
        reader.planner.client.close()
        row = {"queues": queues, "triggers": triggers, "initial_offset_s": round(initial_s, 4),
               "plan_s_median": round(statistics.median(plan_s), 4), "plan_s_max": round(max(plan_s), 4),
               "commit_s_median": round(statistics.median(commit_s), 4), "commit_s_max": round(max(commit_s), 4),
               "partitions_per_trigger": parts_n[-1]}
        row["per_trigger_s"] = round(row["plan_s_median"] + row["commit_s_median"], 4)
        log(f"  {queues:>5} queues: plan {1000 * row['plan_s_median']:8.1f} ms, commit "
            f"{1000 * row['commit_s_median']:8.1f} ms per trigger ({parts_n[-1]} partitions)")
        return row
    finally:
        c.close()


def _peak_rss_kb() -> int:
    """This process's own peak RSS. Linux's getrusage ru_maxrss survives exec, so a child spawned
    from a big parent (the benchmark runner after the decode suite holds ~1.3 GB) would report the
    parent's peak; VmHWM belongs to the current address space and starts afresh at exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _read_child(namesrv: str, topic: str, n: int, conn: Any) -> None:
    """In a fresh process: read the first ``n`` messages of the queue as an executor task does,
    batches dropped as they come (the noop sink); the process's peak RSS. With ``n`` = 1: the
    same imports and one tiny read, the executor's footprint without the data."""
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.source import QueueRange, read_range

    mq = RemotingClient(namesrv).message_queues(topic)[0]
    part = QueueRange(mq, 0, n, (namesrv,), None, "", "*", 1024, True)
    got = sum(b.num_rows for b in read_range(part, RemotingClient(namesrv)))
    conn.send({"rows": got, "peak_rss_kb": _peak_rss_kb()})


def _in_child(target: Any, *args: Any) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(*args, child))
    p.start()
    if not parent.poll(300):
        p.kill()
        raise AssertionError(f"{target.__name__} did not answer within 300 s")
    out: dict[str, Any] = parent.recv()
    p.join(30)
    return out


def memory(namesrv: str, sizes: tuple[int, ...], log: Any) -> list[dict[str, Any]]:
    from rocketmq_spark.client import RemotingClient
    from rocketmq_spark.codec import BatchEntry, encode_properties

    c = RemotingClient(namesrv)
    rows = []
    try:
        body = bytes(range(256)) * (MEMORY_BODY // 256)
        props = encode_properties({"TAGS": "mem"})
        for n in sizes:
            topic = f"ScaleMem{n}"
            c.create_topic(topic, 1)
            mq = c.message_queues(topic, refresh=True)[0]
            sent = 0
            while sent < n:
                k = min(512, n - sent)
                c.send_batch(mq, [BatchEntry(body, props)] * k)
                sent += k
            base = _in_child(_read_child, namesrv, topic, 1)
            res = _in_child(_read_child, namesrv, topic, n)
            if res["rows"] != n:
                raise AssertionError(f"memory read of {topic}: {res['rows']} rows, expected {n}")
            row = {"messages": n, "body_size": MEMORY_BODY, "data_mb": round(n * MEMORY_BODY / 1e6, 1),
                   "baseline_rss_mb": round(base["peak_rss_kb"] / 1024, 1),
                   "peak_rss_mb": round(res["peak_rss_kb"] / 1024, 1),
                   "peak_over_baseline_mb": round((res["peak_rss_kb"] - base["peak_rss_kb"]) / 1024, 1)}
            rows.append(row)
            log(f"  {n:>9,} messages ({row['data_mb']:,} MB): peak RSS {row['peak_rss_mb']} MB, "
                f"{row['peak_over_baseline_mb']} MB over the process without data")
    finally:
        c.close()
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="1 trigger per topic; memory with 2,000 / 20,000 messages")
    p.add_argument("--triggers", type=int, default=None, help="triggers per topic (default 5; 1 with --quick)")
    p.add_argument("--memory-messages", type=int, default=None,
                   help="D: the memory scenario reads D then 10 x D 1-KiB messages (default 20,000)")
    _report.add_results_dir(p)


def print_report(plan_rows: list[dict[str, Any]], mem_rows: list[dict[str, Any]]) -> None:
    biggest = plan_rows[-1]
    growth = mem_rows[-1]["peak_over_baseline_mb"] - mem_rows[0]["peak_over_baseline_mb"]
    print()
    print(f"{'queues':>7} {'plan ms':>9} {'commit ms':>10} {'total ms':>9} {'initial ms':>11}")
    for r in plan_rows:
        print(f"{r['queues']:>7} {1000 * r['plan_s_median']:>9.1f} {1000 * r['commit_s_median']:>10.1f} "
              f"{1000 * r['per_trigger_s']:>9.1f} {1000 * r['initial_offset_s']:>11.1f}")
    print(f"target: planning + commit < {TARGET_S:g} s per trigger at {biggest['queues']} queues: "
          f"{biggest['per_trigger_s']:.3f} s ({'met' if biggest['per_trigger_s'] < TARGET_S else 'NOT met'})")
    print(f"memory: data x{mem_rows[-1]['messages'] // mem_rows[0]['messages']} -> peak RSS over baseline "
          f"{mem_rows[0]['peak_over_baseline_mb']} MB -> {mem_rows[-1]['peak_over_baseline_mb']} MB "
          f"({growth:+.1f} MB)")


def plot_panels(plan_rows: list[dict[str, Any]], mem_rows: list[dict[str, Any]]) -> list[_plot.Panel]:
    return [
        _plot.Panel("planning (latestOffset + partitions) + commit per trigger, by queue count", "seconds",
                    [_plot.Bar(f"{r['queues']} queues: plan", r["plan_s_median"]) for r in plan_rows]
                    + [_plot.Bar(f"{r['queues']} queues: commit", r["commit_s_median"]) for r in plan_rows]
                    + [_plot.Bar(f"{r['queues']} queues: plan + commit", r["per_trigger_s"]) for r in plan_rows],
                    target=TARGET_S),
        _plot.Panel("executor: peak RSS of one partition read over the process without data", "MB",
                    [_plot.Bar(f"{r['messages']:,} x 1 KiB ({r['data_mb']} MB)", r["peak_over_baseline_mb"])
                     for r in mem_rows]),
    ]


def run(args: argparse.Namespace) -> int:
    quick = bool(args.quick)
    triggers = args.triggers or (1 if quick else 5)
    d = args.memory_messages or (2_000 if quick else 20_000)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as workdir, start_broker("cli", workdir) as h:
        print(f"scale: broker pid {h.pid} at {h.namesrv_addr}; {triggers} triggers per topic", flush=True)
        print("planning and commit per trigger:", flush=True)
        plan_rows = [planning(h.namesrv_addr, q, triggers, print) for q in QUEUE_COUNTS]
        print("executor memory, one partition read in a fresh process:", flush=True)
        mem_rows = memory(h.namesrv_addr, (d, 10 * d), print)
    total = time.perf_counter() - t_start
    print_report(plan_rows, mem_rows)
    met = plan_rows[-1]["per_trigger_s"] < TARGET_S
    doc = {
        "benchmark": "scale",
        "created": _provenance.created(),
        "quick": quick,
        "machine": _provenance.machine_info(),
        "setup": {"queue_counts": list(QUEUE_COUNTS), "triggers": triggers, "new_messages_per_queue_per_trigger": 1,
                  "memory_body_size": MEMORY_BODY, "memory_sizes": [d, 10 * d], "broker": "cli child process"},
        "target_s_per_trigger": TARGET_S,
        "target_met": met,
        "planning": plan_rows,
        "memory": mem_rows,
        "memory_growth_mb": round(mem_rows[-1]["peak_over_baseline_mb"] - mem_rows[0]["peak_over_baseline_mb"], 1),
        "total_elapsed_s": round(total, 2),
    }
    _report.write_results(_report.results_path(args, "scale"), doc, plot_panels(plan_rows, mem_rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
