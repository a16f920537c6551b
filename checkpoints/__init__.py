"""rocketmq_spark.checkpoints: broker offset store and the min-unconsumed-offset tracker."""

__all__: list[str] = []
