"""One local[2] SparkSession shared by the Spark tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from pyspark.sql import SparkSession

    import rocketmq_spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("rocketmq-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    rocketmq_spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def peer() -> Callable[..., list[dict[str, Any]]]:
    """Runs one JavaPeer command (one JVM, the Apache RocketMQ Java client) and returns its
    output lines; the peer is built once (tests/java_peer.py)."""
    import java_peer
    from brokers import skip_or_fail
    from real_rocketmq import cache_root, java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the Java client peer cannot run here: {missing}")
    lib = provision()
    classes = java_peer.build(lib, cache_root())

    def run(command: str, args: dict[str, Any], timeout: float = 90) -> list[dict[str, Any]]:
        return java_peer.run(lib, classes, command, args, timeout=timeout)

    return run
