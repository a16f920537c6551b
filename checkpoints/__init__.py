"""rocketmq_spark.checkpoints: broker offset store and the min-unconsumed-offset tracker."""

from .offset_store import BrokerOffsetStore, OffsetStore
from .tracker import InFlightTracker

__all__ = ["BrokerOffsetStore", "InFlightTracker", "OffsetStore"]
