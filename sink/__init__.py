"""rocketmq_spark.sink: the Spark writer (stream and batch), transactional commit."""

__all__: list[str] = []
