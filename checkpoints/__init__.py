"""rocketmq_spark.checkpoints: broker offset store, the min-unconsumed-offset tracker, group
progress and lag, and the listener-based committer for the batches Spark never commits.

Only the committer imports pyspark, and it loads on first use: the rest (the command line's
``progress`` among its users) works without Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .offset_store import BrokerOffsetStore, OffsetStore
from .progress import QueueLag, QueueProgress, group_progress, queue_lag, queue_lags
from .tracker import InFlightTracker

if TYPE_CHECKING:
    from .committer import RocketMQOffsetCommitter

__all__ = ["BrokerOffsetStore", "InFlightTracker", "OffsetStore", "QueueLag", "QueueProgress",
           "RocketMQOffsetCommitter", "group_progress", "queue_lag", "queue_lags"]


def __getattr__(name: str) -> Any:
    if name == "RocketMQOffsetCommitter":
        from .committer import RocketMQOffsetCommitter

        return RocketMQOffsetCommitter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
