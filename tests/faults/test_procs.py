"""Signals to process trees, and the Python workers of a local SparkSession."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from brokers import wait_until

from .procs import (
    Suspender,
    descendants,
    kill_tree,
    process_state,
    signal_tree,
    spark_python_workers,
    suspended,
)

pytestmark = pytest.mark.faults

#: a parent that starts two sleeping children and waits
_TREE = ("import subprocess, sys, time; kids = [subprocess.Popen([sys.executable, '-c', 'import time; "
         "time.sleep(600)']) for _ in range(2)]; time.sleep(600)")


@pytest.fixture()
def tree() -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], start_new_session=True)
    try:
        assert wait_until(lambda: len(descendants(proc.pid)) == 2, 10)
        yield proc, descendants(proc.pid)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
        proc.wait(10)


def _gone(pid: int) -> bool:
    return process_state(pid) in (None, "Z")


def test_suspended_stops_a_whole_tree_and_always_continues_it(tree: tuple[subprocess.Popen[bytes], list[int]]
                                                              ) -> None:
    proc, kids = tree
    everyone = [proc.pid, *kids]
    with suspended(proc.pid) as stopped:
        assert sorted(stopped) == sorted(everyone)
        assert wait_until(lambda: all(process_state(p) == "T" for p in everyone), 5)
    assert wait_until(lambda: all(process_state(p) == "S" for p in everyone), 5)

    with pytest.raises(RuntimeError, match="test failed"), suspended(kids, tree=False):
        assert wait_until(lambda: all(process_state(p) == "T" for p in kids), 5)
        assert process_state(proc.pid) != "T"
        raise RuntimeError("test failed while they were stopped")
    assert wait_until(lambda: all(process_state(p) == "S" for p in kids), 5)


def test_kill_tree_kills_the_parent_and_its_children(tree: tuple[subprocess.Popen[bytes], list[int]]) -> None:
    proc, kids = tree
    with Suspender() as s:
        s.stop(proc.pid)  # a stopped tree dies too
        assert sorted(kill_tree(proc.pid)) == sorted([proc.pid, *kids])
        assert proc.wait(10) == -signal.SIGKILL
        assert wait_until(lambda: all(_gone(p) for p in kids), 10)
        assert s.resume_all() != []  # gone by now: no error


def test_signalling_this_process_or_init_is_refused() -> None:
    for pid in (os.getpid(), 1):
        with pytest.raises(ValueError, match="refusing"):
            signal_tree(pid, signal.SIGSTOP)


@pytest.mark.spark
def test_spark_python_workers_finds_the_task_workers_and_they_can_be_stopped(spark: Any) -> None:
    sc = spark.sparkContext
    task_pids = set(sc.parallelize(range(4), 2).map(lambda _: os.getpid()).distinct().collect())
    workers = spark_python_workers(spark, role="worker")
    assert task_pids <= {w.pid for w in workers}
    assert {w.module for w in workers if w.pid in task_pids} == {"pyspark.worker"}
    daemons = spark_python_workers(spark, role="daemon")
    assert {w.ppid for w in workers if w.pid in task_pids} <= {d.pid for d in daemons}

    with suspended([w for w in workers if w.pid in task_pids]) as stopped:
        assert set(stopped) >= task_pids
        assert wait_until(lambda: all(process_state(p) == "T" for p in task_pids), 5)  # signals land async
    assert sc.parallelize(range(4), 2).map(lambda x: x * 2).sum() == 12  # continued: the next job runs
