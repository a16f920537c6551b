"""rocketmq_spark.source: the Spark reader (stream and batch), planning, Arrow decoding."""

from ..codec.arrow import ARROW_SCHEMA, RETRY_SCHEMA_DDL, SCHEMA_DDL
from .options import ReaderOptions
from .reader import Planner, QueueRange, RocketMQBatchReader, RocketMQStreamReader

__all__ = ["ARROW_SCHEMA", "RETRY_SCHEMA_DDL", "SCHEMA_DDL", "Planner", "QueueRange", "ReaderOptions",
           "RocketMQBatchReader", "RocketMQStreamReader"]
