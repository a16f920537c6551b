"""rocketmq_spark.source: the Spark reader (stream and batch), planning, Arrow decoding."""

from typing import TYPE_CHECKING, Any

from ..codec.schema import ARROW_SCHEMA, RETRY_SCHEMA_DDL, SCHEMA_DDL
from .options import ReaderOptions, asked_columns
from .reader import (
    Planner,
    QueueRange,
    RocketMQBatchReader,
    RocketMQPushdownBatchReader,
    RocketMQStreamReader,
)

if TYPE_CHECKING:
    from .pull_loop import read_range

__all__ = ["ARROW_SCHEMA", "RETRY_SCHEMA_DDL", "SCHEMA_DDL", "Planner", "QueueRange", "ReaderOptions",
           "RocketMQBatchReader", "RocketMQPushdownBatchReader", "RocketMQStreamReader", "asked_columns",
           "read_range"]


def __getattr__(name: str) -> Any:
    """``read_range`` (:mod:`.pull_loop`) on first use: it brings the decoders and
    pyarrow.compute, which the driver's planning processes do not need."""
    if name == "read_range":
        from .pull_loop import read_range

        return read_range
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
