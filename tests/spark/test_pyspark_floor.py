"""The oldest pyspark setup.cfg admits: a batch read (found by Spark's scan, then registered),
a batch write, an AvailableNow stream into the memory sink, and the group's offsets on the broker.

The suite's venv has the newest pyspark. This runs floor_driver.py in a child process under a
second venv with ``pyspark==<floor>`` (tests/pyspark_floor.py: built once, cached outside the
repository) and the project's wheel on PYTHONPATH, against the module's embedded broker.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from brokers import skip_or_fail
from pyspark_floor import floor_python, pyspark_floor
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties

# the first run builds the venv (pyspark's wheel from its sdist unless pip's cache holds it)
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(1800)]

DRIVER = Path(__file__).with_name("floor_driver.py")


@pytest.fixture(scope="module")
def floor() -> Path:
    try:
        return floor_python()
    except RuntimeError as exc:  # no index reachable, or no compiler for a dependency's sdist
        skip_or_fail(str(exc))
        raise


def test_reads_writes_and_commits_on_the_oldest_declared_pyspark(broker, client, tmp_path, floor,
                                                                  installed_copy) -> None:
    src, dst, group = "FLOOR_SRC", "FLOOR_DST", "g_floor"  # the embedded broker creates topics on first use
    qs = client.message_queues(src)
    for i in range(20):
        props = encode_properties({"TAGS": "even" if i % 2 == 0 else "odd", "KEYS": f"k{i}"})
        client.send_batch(qs[i % 4], [BatchEntry(b"m-%d" % i, props)])
    # SPARK_HOME would start another release's JVM under this pyspark
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", "PYSPARK_DRIVER_PYTHON")}
    env.update(PYTHONPATH=str(installed_copy), PYSPARK_PYTHON=str(floor), SPARK_LOCAL_IP="127.0.0.1")
    run = subprocess.run([str(floor), str(DRIVER), broker.namesrv_addr, src, dst, group, str(tmp_path / "ck")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])

    floor_version = pyspark_floor()
    assert (got["pyspark"], got["spark"]) == (floor_version, floor_version)
    assert got["module"].startswith(str(installed_copy))
    assert got["discovered_count"] == 20
    assert got["batch"] == sorted([f"m-{i}", i % 4, i // 4, "even" if i % 2 == 0 else "odd", [f"k{i}"]]
                                  for i in range(20))
    assert got["warnings"] == []  # register() built its thread-safe registration, no fallback

    written = [rec for q in client.message_queues(dst) for rec in decode_records(client.pull(q, 0, 32).body)]
    assert sorted((r.payload(), r.tags, r.keys) for r in written) == sorted(
        (b"w-%d" % i, "floor", [f"k{i}"]) for i in range(10))

    assert got["stream_error"] is None
    assert got["stream_batches"] == [8, 8, 4]
    assert got["stream_bodies"] == sorted(f"m-{i}" for i in range(20))
    committed = {q.key: client.query_consumer_offset(group, q) for q in qs}
    assert committed == got["stream_last_end"] == {q.key: 5 for q in qs}
