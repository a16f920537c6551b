"""Driver kills: a streaming query from RocketMQ into Parquet (checkpointed) is SIGKILLed at
random points and restarted, 5 times (20 under ``pytest --soak``), with new messages arriving
between runs. The final output holds every produced message exactly once and the group's
broker offsets end at the topic's max offsets."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from brokers import settles_at
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


def test_driver_sigkilled_at_random_points_then_restarted_loses_and_repeats_nothing(
        spark, broker, client: RemotingClient, tmp_path, soak: bool) -> None:
    rounds = 20 if soak else 5
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    topic, group = "KILLS_T", "g_kills"
    broker.create_topic(topic, 4)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    produced = 0
    kills = 0
    for _ in range(rounds):
        _produce(client, topic, produced, PER_ROUND)
        produced += PER_ROUND
        before = _batches_planned(ckpt)
        proc = _start(broker, topic, group, out, ckpt)
        deadline = time.monotonic() + 180
        while _batches_planned(ckpt) <= before and proc.poll() is None:
            assert time.monotonic() < deadline, f"no batch planned within 180s (seed {seed})"
            time.sleep(0.05)
        time.sleep(rnd.uniform(0.0, 2.0))  # a random point of the batch: planning, tasks, commit
        if proc.poll() is None:
            _kill_tree(proc)
            kills += 1
        else:
            assert proc.returncode == 0, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
    proc = _start(broker, topic, group, out, ckpt)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
    assert proc.returncode == 0, err.decode()[-3000:]
    assert kills >= rounds // 2, f"only {kills} of {rounds} runs were killed mid-stream (seed {seed})"

    bodies = sorted(r.body for r in spark.read.parquet(out).select("body").collect())
    expected = [f"k-{i:07d}" for i in range(produced)]
    assert len(bodies) == len(expected), (f"{len(bodies)} rows for {produced} messages after {kills} kills "
                                          f"(seed {seed}): {len(bodies) - len(set(bodies))} duplicates")
    assert bodies == expected, f"seed {seed}"
    qs = client.message_queues(topic, refresh=True)
    assert client.query_consumer_offsets(group, qs) == client.max_offsets(qs), f"seed {seed}"
