"""Driver kills: a streaming query from RocketMQ into Parquet (checkpointed) is SIGKILLed and
restarted, with new messages arriving between runs: 3 times at points spread over a batch
(planning, tasks, the commit) in a CI run, 20 times at random points under ``pytest --soak``
(the fault suite kills drivers at random too). The last run, in this session's SparkSession (a
driver of its own, started after the kills), catches up; the output then holds every produced
message exactly once and the group's broker offsets end at the topic's max offsets."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from brokers import settles_at, wait_until
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability, pytest.mark.slow]
BROKERS = ("embedded", "real")

DRIVER = os.path.join(os.path.dirname(__file__), "parquet_driver.py")
PER_ROUND = 3_000


def _produce(client: RemotingClient, topic: str, first: int, n: int) -> None:
    qs = client.message_queues(topic)
    for i in range(first, first + n, 250):
        client.send_batch(qs[(i // 250) % len(qs)],
                          [BatchEntry(b"k-%07d" % j, encode_properties({"TAGS": "k"}))
                           for j in range(i, min(first + n, i + 250))])
    assert settles_at(client, topic, first + n) == first + n


def _batches_planned(ckpt: str) -> int:
    d = os.path.join(ckpt, "offsets")
    return len([f for f in os.listdir(d) if f.isdigit()]) if os.path.isdir(d) else 0


def _start(broker, topic: str, group: str, out: str, ckpt: str) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, DRIVER, broker.namesrv_addr, topic, group, out, ckpt],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver with its JVM and Python workers (its whole session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _catch_up(spark, client: RemotingClient, namesrv: str, topic: str, group: str, out: str,  # type: ignore[no-untyped-def]
              ckpt: str) -> None:
    """What parquet_driver.py runs, in this session's SparkSession: the query on the same
    checkpoint until caught up, the committer listener writing its last batch's offsets (Spark
    hands the listener the last progress event after the query ends: waited for)."""
    committer = RocketMQOffsetCommitter(namesrv, group, topics=[topic])
    spark.streams.addListener(committer)
    try:
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("maxMessagesPerTrigger", "2000").load()
             .selectExpr("CAST(body AS STRING) AS body", "queueId", "queueOffset")
             .writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination(600)
        assert q.exception() is None, q.exception()
        qs = client.message_queues(topic, refresh=True)
        wait_until(lambda: client.query_consumer_offsets(group, qs) == client.max_offsets(qs), 60)
    finally:
        spark.streams.removeListener(committer)


def test_driver_sigkilled_at_random_points_then_restarted_loses_and_repeats_nothing(
        spark, broker, client: RemotingClient, tmp_path, soak: bool) -> None:
    rounds = 20 if soak else 3
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    # how long after a batch is planned each run is killed: spread over the batch in a CI run
    delays = [rnd.uniform(0.0, 2.0) for _ in range(rounds)] if soak else [0.1, 0.8, 1.6]
    topic, group = "KILLS_T", "g_kills"
    broker.create_topic(topic, 4)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    produced = 0
    kills = 0
    for delay in delays:
        _produce(client, topic, produced, PER_ROUND)
        produced += PER_ROUND
        before = _batches_planned(ckpt)
        proc = _start(broker, topic, group, out, ckpt)
        deadline = time.monotonic() + 180
        while _batches_planned(ckpt) <= before and proc.poll() is None:
            assert time.monotonic() < deadline, f"no batch planned within 180s (seed {seed})"
            time.sleep(0.05)
        time.sleep(delay)  # a point of the batch: planning, tasks, commit
        if proc.poll() is None:
            _kill_tree(proc)
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
    _catch_up(spark, client, broker.namesrv_addr, topic, group, out, ckpt)
    assert kills >= rounds // 2, f"only {kills} of {rounds} runs were killed mid-stream (seed {seed})"

    bodies = sorted(r.body for r in spark.read.parquet(out).select("body").collect())
    expected = [f"k-{i:07d}" for i in range(produced)]
    assert len(bodies) == len(expected), (f"{len(bodies)} rows for {produced} messages after {kills} kills "
                                          f"(seed {seed}): {len(bodies) - len(set(bodies))} duplicates")
    assert bodies == expected, f"seed {seed}"
    qs = client.message_queues(topic, refresh=True)
    assert client.query_consumer_offsets(group, qs) == client.max_offsets(qs), f"seed {seed}"
