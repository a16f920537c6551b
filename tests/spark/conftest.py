"""One local[2] SparkSession shared by the Spark tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

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
