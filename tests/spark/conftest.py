"""Fixtures of the Spark tests (their SparkSession, ``spark``, is the session-wide one of
tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def installed_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This project as a user installs it: its wheel, built once per session, installed with
    no dependencies into a folder to put on PYTHONPATH. (The editable install of the test venv
    hides ``pyspark_rocketmq`` from Spark's scan, and cannot serve another interpreter.)"""
    root = Path(__file__).resolve().parent.parent.parent
    work = tmp_path_factory.mktemp("installed")
    wheels, site = work / "wheels", work / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(root)],
                   check=True, capture_output=True, timeout=300)
    wheel = next(wheels.glob("rocketmq_spark-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return site


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[dict[str, Any]]]:
    """Runs one JavaPeer command (one JVM, the Apache RocketMQ Java client) and returns its
    output lines; the peer is built once (tests/java_peer.py). Each run's user.home (the
    client's logs) is kept under pytest's temporary directory, so a failed exchange can be
    read afterwards."""
    import java_peer
    from brokers import skip_or_fail
    from real_rocketmq import cache_root, java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the Java client peer cannot run here: {missing}")
    lib = provision()
    classes = java_peer.build(lib, cache_root())

    def run(command: str, args: dict[str, Any], timeout: float = 90) -> list[dict[str, Any]]:
        home = tmp_path_factory.mktemp(f"java-peer-{command}")
        return java_peer.run(lib, classes, command, args, timeout=timeout, home=home)

    return run
