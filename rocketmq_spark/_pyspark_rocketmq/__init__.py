"""Installed as the top-level module ``pyspark_rocketmq``: Spark registers every installed
``pyspark_*`` module's ``DefaultSource`` as a data source, so ``format("rocketmq")``
works without calling ``rocketmq_spark.register(spark)`` (spark-submit included)."""

from rocketmq_spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
