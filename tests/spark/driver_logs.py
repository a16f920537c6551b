"""What a child driver script logged at WARNING or above, for the test that runs it to read
(the scripts run by path: this file beside them is on their sys.path)."""

from __future__ import annotations

import logging


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
