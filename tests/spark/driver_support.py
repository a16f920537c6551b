"""What the child driver scripts share (they run by path: this file beside them is on their
sys.path): what the library logged at WARNING or above, and the AvailableNow stream each runs."""

from __future__ import annotations

import logging
from typing import Any


class Warnings(logging.Handler):
    """Keeps the message of every record at WARNING or above (register()'s fallback among them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage())


def watch(logger: str = "rocketmq_spark") -> Warnings:
    """A :class:`Warnings` on ``logger``."""
    handler = Warnings()
    logging.getLogger(logger).addHandler(handler)
    return handler


def stream_to_memory(spark: Any, namesrv: str, topic: str, group: str, checkpoint: str, name: str) -> Any:
    """``topic`` read by ``group`` from its earliest offset, 8 messages a trigger, into the memory
    table ``name`` under Trigger.AvailableNow; the query once it ended (or after 120 s)."""
    query = (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "8")
             .load().writeStream.format("memory").queryName(name).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    return query
