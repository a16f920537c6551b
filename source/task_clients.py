"""Clients kept by a Python worker between its read tasks.

Spark reuses a Python worker for task after task (``spark.python.worker.reuse``, on by
default), and a micro-batch's task is short: opening a client and its connections, then
closing them, was a sizeable part of a small batch's read (issue 33's profile: a few ms to
connect, more to close, against 5 ms of reading). So a task takes an idle client of the same
settings when the worker has one and gives it back when its read ends; a read that fails or
is left unfinished closes its client (nothing it saw is handed to the next task). Idle
clients are closed after :data:`IDLE_S`, and at most :data:`KEEP` are kept.

What a kept client remembers (connections, routes, brokers it found not answering) is what a
long-lived Java consumer remembers between pulls; each range still carries its broker's
address from the planner and compares its queue's mark before it hands anything on, over
whatever connection it uses (see :class:`.pull_loop.PullLoop`).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

from ..client import BrokerClient
from .queue_range import QueueRange

__all__ = ["IDLE_S", "KEEP", "close_idle", "kept_client"]

T = TypeVar("T")

#: an idle client older than this (seconds) is closed when a task looks for one
IDLE_S = 60.0
#: idle clients kept per worker at most
KEEP = 4

_lock = threading.Lock()
#: idle clients: (settings, client, idle since), oldest first
_idle: list[tuple[Hashable, BrokerClient, float]] = []


def _settings(part: QueueRange) -> Hashable:
    return (part.namesrv, part.endpoints, part.broker_down_timeout_ms, part.credentials, part.tls, part.namespace)


def _take(key: Hashable) -> BrokerClient | None:
    now = time.monotonic()
    stale: list[BrokerClient] = []
    found: BrokerClient | None = None
    with _lock:
        keep: list[tuple[Hashable, BrokerClient, float]] = []
        for k, c, since in _idle:
            if now - since > IDLE_S:
                stale.append(c)
            elif found is None and k == key:
                found = c
            else:
                keep.append((k, c, since))
        _idle[:] = keep
    for c in stale:
        c.close()
    return found


def _give_back(key: Hashable, client: BrokerClient) -> None:
    with _lock:
        _idle.append((key, client, time.monotonic()))
        over = _idle[:-KEEP] if len(_idle) > KEEP else []
        del _idle[:len(over)]
    for _k, c, _s in over:
        c.close()


def kept_client(part: QueueRange, connect: Callable[[QueueRange], BrokerClient],
                read: Callable[[BrokerClient], Iterator[T]]) -> Iterator[T]:
    """What ``read(client)`` yields, over an idle client with ``part``'s settings (else a new
    one from ``connect(part)``), given back for the next task once ``read`` ended; closed
    instead when it raised or was not read to its end."""
    key = _settings(part)
    client = _take(key) or connect(part)
    done = False
    try:
        yield from read(client)
        done = True
    finally:
        if done:
            _give_back(key, client)
        else:
            client.close()


def close_idle() -> None:
    """Close every idle client (at exit; tests)."""
    with _lock:
        idle = list(_idle)
        _idle.clear()
    for _k, c, _s in idle:
        c.close()


atexit.register(close_idle)
