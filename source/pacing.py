"""Pacing a bursty topic: a micro-batch waits for ``minMessagesPerTrigger`` new messages, but
never longer than ``maxTriggerDelay`` (Spark's Kafka source's minOffsetsPerTrigger and
maxTriggerDelay, with its rules).

At each trigger the messages available past the batch's start are counted over every queue
(before maxMessagesPerTrigger caps the batch). Fewer than the minimum, and less than the delay
since the clock last started: the trigger plans no batch, and the messages wait. The clock
starts when a batch is planned, and when a trigger finds the delay run out (with or without
messages: then a batch takes what there is); before the first trigger of a run it has run
out, so a restarted query reads what waited at once. Under Trigger.AvailableNow nothing
waits: everything the run reads is there already, and the run must end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Pacing"]


class Pacing:
    """The wait of one query's batches for enough messages (see the module)."""

    def __init__(self, min_messages: int | None, max_delay_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.min_messages = min_messages
        self.max_delay_s = max_delay_ms / 1000
        self._clock = clock
        #: when the clock last started (None: not yet in this run, so the delay has run out)
        self.started: float | None = None

    def holds(self, available: int, *, available_now: bool = False) -> bool:
        """Whether the trigger waits, with ``available`` messages past the batch's start;
        False restarts the clock (the trigger plans a batch, or finds nothing to plan)."""
        if not self.min_messages or available_now:
            return False
        now = self._clock()
        if self.started is not None and now - self.started < self.max_delay_s and available < self.min_messages:
            return True
        self.started = now
        return False
