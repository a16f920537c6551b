"""rocketmq_spark.source: the Spark reader (stream and batch), planning, Arrow decoding."""

from ..codec.arrow import ARROW_SCHEMA, RETRY_SCHEMA_DDL, SCHEMA_DDL
from .options import ReaderOptions, asked_columns
from .reader import (
    Planner,
    QueueRange,
    RocketMQBatchReader,
    RocketMQPushdownBatchReader,
    RocketMQStreamReader,
    read_range,
)

__all__ = ["ARROW_SCHEMA", "RETRY_SCHEMA_DDL", "SCHEMA_DDL", "Planner", "QueueRange", "ReaderOptions",
           "RocketMQBatchReader", "RocketMQPushdownBatchReader", "RocketMQStreamReader", "asked_columns",
           "read_range"]
