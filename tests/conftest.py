"""Shared fixtures: an embedded broker on loopback and a client for it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# Spark's Python workers must run this interpreter, not whatever python3 is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="reliability tests in their long version (more kills, more frames, longer outages)")


def pytest_configure(config: pytest.Config) -> None:
    # module-level settings (hypothesis example counts) read this; set before test modules import
    if config.getoption("--soak"):
        os.environ["RMQ_SPARK_SOAK"] = "1"


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --soak``: reliability tests scale their rounds up."""
    return bool(request.config.getoption("--soak"))


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """One embedded broker per test module (temp data dir, ephemeral ports)."""
    with EmbeddedBroker() as mq:
        yield mq


@pytest.fixture()
def client(broker: EmbeddedBroker) -> Iterator[RemotingClient]:
    c = RemotingClient(broker.namesrv_addr)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture()
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    return f"T_{name}"[:100]
