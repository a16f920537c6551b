"""rocketmq_spark.checkpoints: broker offset store, the min-unconsumed-offset tracker, and
the listener-based committer for the batches Spark never commits."""

from .committer import QueueLag, RocketMQOffsetCommitter, queue_lag
from .offset_store import BrokerOffsetStore, OffsetStore
from .tracker import InFlightTracker

__all__ = ["BrokerOffsetStore", "InFlightTracker", "OffsetStore", "QueueLag", "RocketMQOffsetCommitter", "queue_lag"]
