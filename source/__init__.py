"""rocketmq_spark.source: the Spark reader (stream and batch), planning, Arrow decoding."""

__all__: list[str] = []
