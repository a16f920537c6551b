"""The min-unconsumed-offset rule, per queue.

Ranges ``[start, end)`` are registered when planned and completed in any order. A
queue's committable offset (the NEXT offset to consume, as brokers store it) is the
smallest start still in flight, else the highest completed end; it never moves
backwards. This is what the Java client's ``ProcessQueue.removeMessage`` returns:
a later range finishing first can never carry the commit past an earlier one.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Iterable

__all__ = ["InFlightTracker"]


class InFlightTracker:
    """Ranges in flight and the committable offset per queue (see the module docstring).

    Offsets are next-offsets; ranges are ``[start, end)``. Thread-safe (one lock); queue keys
    are any hashable (``MessageQueue`` in the reader). Pickles without its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[Hashable, Counter[tuple[int, int]]] = {}
        self._done_high: dict[Hashable, int] = {}
        self._committed: dict[Hashable, int] = {}

    def __getstate__(self) -> dict[str, object]:
        with self._lock:
            return {"inflight": self._inflight, "done": self._done_high, "committed": self._committed}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._lock = threading.Lock()
        self._inflight = state["inflight"]  # type: ignore[assignment]
        self._done_high = state["done"]  # type: ignore[assignment]
        self._committed = state["committed"]  # type: ignore[assignment]

    def register(self, queue: Hashable, start: int, end: int) -> None:
        """A range was planned; it holds the commit at ``start`` until completed. An empty
        range is ignored; a reversed one (``end < start``) raises ValueError."""
        if end < start:
            raise ValueError(f"range [{start}, {end}) of {queue} is reversed")
        if end == start:
            return
        with self._lock:
            self._inflight.setdefault(queue, Counter())[(start, end)] += 1

    def complete(self, queue: Hashable, start: int, end: int) -> None:
        """A range was processed. Completing an unregistered range only raises the high mark."""
        with self._lock:
            ranges = self._inflight.get(queue)
            if ranges and ranges.get((start, end)):
                ranges[(start, end)] -= 1
                if not ranges[(start, end)]:
                    del ranges[(start, end)]
            self._done_high[queue] = max(self._done_high.get(queue, end), end)

    def complete_through(self, queue: Hashable, end: int) -> None:
        """Everything planned below ``end`` is processed (Spark commits batches in order):
        the ranges ending at or before ``end`` are dropped, the high mark is at least ``end``."""
        with self._lock:
            ranges = self._inflight.get(queue)
            if ranges:
                for key in [k for k in ranges if k[1] <= end]:
                    del ranges[key]
            self._done_high[queue] = max(self._done_high.get(queue, end), end)

    def committable(self, queue: Hashable) -> int | None:
        """The offset it is safe to commit now: the lowest start in flight, or the highest
        completed end when that is lower or nothing is in flight; None while the queue has
        neither. Never lower than an answer it gave before (each answer is remembered)."""
        with self._lock:
            ranges = self._inflight.get(queue)
            high = self._done_high.get(queue)
            if ranges:
                candidate: int | None = min(s for s, _ in ranges)
                if high is not None and candidate is not None and high < candidate:
                    candidate = high
            else:
                candidate = high
            if candidate is None:
                return self._committed.get(queue)
            prev = self._committed.get(queue)
            if prev is not None and candidate < prev:
                candidate = prev
            self._committed[queue] = candidate
            return candidate

    def reset(self, queue: Hashable, offset: int) -> None:
        """The group's offset of ``queue`` was reset to ``offset`` and the query follows: what was
        planned or done before no longer counts; the commit starts again from ``offset`` (it
        may move backwards this once)."""
        with self._lock:
            self._inflight.pop(queue, None)
            self._done_high.pop(queue, None)
            self._committed[queue] = offset

    def queues(self) -> Iterable[Hashable]:
        """Every queue a range was registered or completed for (a snapshot)."""
        with self._lock:
            return list(set(self._inflight) | set(self._done_high))
