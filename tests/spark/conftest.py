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


class Transport:
    """How a test reaches the embedded broker: remoting (namesrvAddr) or gRPC (endpoints)."""

    def __init__(self, name: str, options: dict[str, str]) -> None:
        self.name = name
        self.options = options

    def __call__(self, text: str) -> str:
        """A topic or group name unique to this transport."""
        return f"{text}_{self.name.upper()}"


@pytest.fixture(params=["remoting", "grpc"])
def transport(request: pytest.FixtureRequest, broker: object) -> Transport:
    if request.param == "grpc":
        return Transport("grpc", {"endpoints": broker.grpc_endpoint})  # type: ignore[attr-defined]
    return Transport("remoting", {"namesrvAddr": broker.namesrv_addr})  # type: ignore[attr-defined]
