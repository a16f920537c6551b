"""Exactly-once across a driver killed between task success and commit (real Spark, subprocess), and
a check-back answer lost after the batch was recorded."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from brokers import Target, settles_at, wait_until
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import decode_records
from rocketmq_spark.sink.options import WriterOptions
from rocketmq_spark.sink.txlog import TxLog
from rocketmq_spark.sink.writer import _txns, check_decision, commit_batch, destination_marks, write_rows

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
BROKERS = ("embedded", "real")

DRIVER = os.path.join(os.path.dirname(__file__), "eos_driver.py")


def _restarted(spark, namesrv: str, src: str, dst: str, ckpt: str) -> None:  # type: ignore[no-untyped-def]
    """The restarted driver: the same query on the same checkpoint (what eos_driver.py runs for
    a job), in this session's SparkSession, which is another driver than the killed one: its
    JVM, Python workers and clients all started after the kill."""
    q = (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", src)
         .option("consumerGroup", f"g_kill_{src}").option("startingOffsets", "earliest").load().select("body")
         .writeStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", dst)
         .option("delivery", "exactly-once").option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


#: the killed jobs: mode -> rows copied
KILLS = {"kill-before-commit": 25, "kill-after-record": 25, "kill-mid-commit": 600}


@pytest.fixture(scope="module")
def killed(broker, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One driver (a subprocess) copying a source topic (2 queues) to a destination exactly-once
    for each of :data:`KILLS`, side by side, SIGKILLed once every job stopped at its point (see
    eos_driver.py): mode -> (src, dst, checkpoint location)."""
    base = tmp_path_factory.mktemp("killed")
    client = RemotingClient(broker.namesrv_addr)
    jobs = {}
    try:
        for mode, rows in KILLS.items():
            src = broker.create_topic(f"K_SRC_{mode[5:10]}", queues=2)
            dst = broker.create_topic(f"K_DST_{mode[5:10]}", queues=2)
            qs = client.message_queues(src)
            for i in range(rows):
                client.send(qs[i % 2], b"row-%d" % i)
            assert settles_at(client, src, rows) == rows
            jobs[mode] = (src, dst, str(base / mode))
    finally:
        client.close()
    run = subprocess.run([sys.executable, DRIVER, broker.namesrv_addr,
                          *(",".join((*job, mode)) for mode, job in jobs.items())],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    assert run.returncode == -9, run.stderr[-3000:]
    return jobs


def _written(broker, client, dst: str, at_least: int) -> list:  # type: ignore[no-untyped-def]
    """Every message of ``dst``, read on a fresh client once it holds ``at_least`` (Apache
    RocketMQ's broker indexes a committed message a moment after answering its END)."""
    c = RemotingClient(broker.namesrv_addr)
    msgs = []
    try:
        qs = client.message_queues(dst)
        wait_until(lambda: sum(c.max_offset(q) for q in qs) >= at_least, timeout_s=30)
        for q in qs:
            at, end = 0, c.max_offset(q)
            while at < end:
                res = c.pull(q, at, 32)
                msgs += decode_records(res.body)
                at = res.next_offset
    finally:
        c.close()
    return msgs


@pytest.mark.parametrize("crash", ["kill-before-commit", "kill-after-record"])
def test_driver_killed_before_commit_then_restarted_writes_each_row_once(spark, broker, client, killed,
                                                                         crash) -> None:
    src, dst, ckpt = killed[crash]
    before = sum(client.max_offset(q) for q in client.message_queues(dst))
    assert before == (25 if crash == "kill-after-record" else 0) or before == 0
    _restarted(spark, broker.namesrv_addr, src, dst, ckpt)
    rows = [r.payload() for r in _written(broker, client, dst, 25)]
    assert sorted(rows) == sorted(b"row-%d" % i for i in range(25))  # each row exactly once


def test_driver_killed_part_way_through_the_commit_writes_each_row_once(spark, broker, client, killed) -> None:
    # 600 rows: the commit's END_TRANSACTIONs go 128 at a time, 256 in flight; the driver stops
    # right after marking the first ones answered, with more sent, and dies: the broker applies
    # those, and the replay must find them in the destination rather than commit them again
    src, dst, ckpt = killed["kill-mid-commit"]
    commits = Path(ckpt) / "rocketmq-sink" / "commits"
    recorded = json.loads((commits / "0.json").read_text())
    marked = int((commits / "0.progress").read_text())
    assert 0 < marked < 600 and len(recorded["txns"]) == 600 and not (commits / "0.ended").exists()
    assert recorded["marks"], "the record holds the destination queues' marks"
    applied = sum(client.max_offset(q) for q in client.message_queues(dst))
    _restarted(spark, broker.namesrv_addr, src, dst, ckpt)
    msgs = _written(broker, client, dst, 600)
    twice = Counter(r.properties["UNIQ_KEY"] for r in msgs)
    assert set(r.payload() for r in msgs) == {b"row-%d" % i for i in range(600)}  # nothing lost
    doubled = sorted(k for k, n in twice.items() if n > 1)
    # before the replay the broker held `applied` rows (those the killed commit's ENDs stored)
    assert not doubled, f"{len(doubled)} rows stored twice (the killed commit had applied {applied}, " \
                        f"marked {marked}): {doubled[:5]}"
    assert len(msgs) == 600


@contextlib.contextmanager
def _quick_check_backs(broker, tmp_path):  # type: ignore[no-untyped-def]
    """``broker``, asking producers about open half messages within seconds: the session's
    Apache RocketMQ is configured so; an embedded broker of its own here."""
    if broker.is_real:
        yield broker
        return
    with EmbeddedBroker(str(tmp_path / "mq"), transaction_timeout_ms=500,
                        transaction_check_interval_ms=300) as mq:
        yield Target.of_embedded(mq)


def test_a_check_back_whose_answer_is_lost_after_the_record_loses_no_row(broker, tmp_path) -> None:
    # Issue 29, hole 1: the driver records a batch and dies before ending it; a broker asks a
    # producer of the group (a later task) about its half messages, and the answers never reach
    # it (a process exit, a closed connection). The replay must still commit every row, once.
    with _quick_check_backs(broker, tmp_path) as target:
        c = RemotingClient(target.namesrv_addr)
        try:
            dst = target.create_topic("K_LOST_ANSWER", queues=2)
            ck = str(tmp_path / "ck")
            opts = WriterOptions.parse({"namesrvAddr": target.namesrv_addr, "topic": dst,
                                        "delivery": "exactly-once", "checkpointLocation": ck})
            rows = [b"r-%d" % i for i in range(20)]
            report = write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": rows})]), 0)
            txns = _txns([report])
            log = TxLog(ck)
            log.record(0, txns, destination_marks(c, txns))  # what commit_batch does before any END
            asked: list[tuple[str, bool | None]] = []

            def answer_lost(props: dict[str, str], msg_id: str) -> None:
                asked.append((msg_id, check_decision(log, props, msg_id)))
                return None  # whatever was decided, nothing reaches the broker

            c.start_producer(opts.producer_group, [dst], answer_lost)
            assert wait_until(lambda: len({m for m, _ in asked}) >= 10, 60), f"check-backs asked: {asked}"
            commit_batch(opts, txns, 0)  # the replay
            msgs = _written(target, c, dst, 20)
        finally:
            c.close()
    assert sorted(r.payload() for r in msgs) == sorted(rows), f"after check-backs {asked[:5]}..."
