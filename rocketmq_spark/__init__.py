"""rocketmq-spark: Spark Structured Streaming source and sink for Apache RocketMQ.

``EmbeddedBroker`` (a durable name server + broker for laptops and tests) and the
protocol client import without pyspark; Spark-facing names load on first use.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    BrokerError,
    BrokerUnavailableError,
    ConnectionFailedError,
    DataLossError,
    GroupInUseError,
    OptionError,
    ProtocolError,
    RocketMQSparkError,
)
from .model import MessageQueue

__version__ = "0.1.0"

__all__ = [
    "BrokerError",
    "BrokerUnavailableError",
    "ConnectionFailedError",
    "DataLossError",
    "EmbeddedBroker",
    "EmbeddedCluster",
    "GroupInUseError",
    "MessageQueue",
    "OptionError",
    "ProtocolError",
    "RemotingClient",
    "RocketMQDataSource",
    "RocketMQOffsetCommitter",
    "RocketMQSparkError",
    "__version__",
    "register",
]

_LAZY = {
    "EmbeddedBroker": ("rocketmq_spark.broker.server", "EmbeddedBroker"),
    "EmbeddedCluster": ("rocketmq_spark.broker.server", "EmbeddedCluster"),
    "RemotingClient": ("rocketmq_spark.client.remoting", "RemotingClient"),
    "RocketMQDataSource": ("rocketmq_spark.datasource", "RocketMQDataSource"),
    "register": ("rocketmq_spark.datasource", "register"),
    "RocketMQOffsetCommitter": ("rocketmq_spark.checkpoints.committer", "RocketMQOffsetCommitter"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'rocketmq_spark' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    # kept in the module's namespace, so later lookups skip this function; threads racing the
    # first lookup get the same object from the (locked) import and store it twice
    globals()[name] = value
    return value
