"""Exactly-once across a driver killed between task success and commit (real Spark, subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from brokers import wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import decode_records

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
BROKERS = ("embedded", "real")

DRIVER = os.path.join(os.path.dirname(__file__), "eos_driver.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, DRIVER, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def _killed(broker, client, tmp_path, src: str, dst: str, rows: int, crash: str):  # type: ignore[no-untyped-def]
    """``rows`` rows in ``src`` (2 queues), then the driver copying them to ``dst`` exactly-once,
    killed at ``crash``; -> (src, dst, checkpoint location)."""
    broker.create_topic(src, queues=2)
    broker.create_topic(dst, queues=2)
    qs = client.message_queues(src)
    for i in range(rows):
        client.send(qs[i % 2], b"row-%d" % i)
    ckpt = str(tmp_path / "ck")
    killed = _run(broker.namesrv_addr, src, dst, ckpt, crash)
    assert killed.returncode == -9, killed.stderr[-3000:]
    return src, dst, ckpt


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
def test_driver_killed_before_commit_then_restarted_writes_each_row_once(broker, client, tmp_path, crash) -> None:
    src, dst, ckpt = _killed(broker, client, tmp_path, f"K_SRC_{crash[5:10]}", f"K_DST_{crash[5:10]}", 25, crash)
    before = sum(client.max_offset(q) for q in client.message_queues(dst))
    assert before == (25 if crash == "kill-after-record" else 0) or before == 0
    done = _run(broker.namesrv_addr, src, dst, ckpt, "normal")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r.payload() for r in _written(broker, client, dst, 25)]
    assert sorted(rows) == sorted(b"row-%d" % i for i in range(25))  # each row exactly once


def test_driver_killed_part_way_through_the_commit_loses_nothing_and_doubles_at_most_its_ends_in_flight(
        broker, client, tmp_path) -> None:
    # 600 rows: the commit's END_TRANSACTIONs go 128 at a time, 256 in flight; the driver dies
    # right after marking the first 256 answered, with the next 128 sent
    src, dst, ckpt = _killed(broker, client, tmp_path, "K_SRC_mid", "K_DST_mid", 600, "kill-mid-commit")
    commits = tmp_path / "ck" / "rocketmq-sink" / "commits"
    recorded = json.loads((commits / "0.json").read_text())["txns"]
    marked = int((commits / "0.progress").read_text())
    assert marked == 256 and len(recorded) == 600 and not (commits / "0.ended").exists()
    done = _run(broker.namesrv_addr, src, dst, ckpt, "normal")
    assert done.returncode == 0, done.stderr[-3000:]
    msgs = _written(broker, client, dst, 600)
    assert set(r.payload() for r in msgs) == {b"row-%d" % i for i in range(600)}  # nothing lost
    twice = Counter(r.properties["UNIQ_KEY"] for r in msgs)
    doubled = {k for k, n in twice.items() if n > 1}
    assert all(n <= 2 for n in twice.values())
    # only ENDs the first commit had in flight past its mark can have been applied twice
    in_flight = {t[4] for t in recorded[marked:marked + 256]}
    assert doubled <= in_flight, sorted(doubled - in_flight)[:5]
