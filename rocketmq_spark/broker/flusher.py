"""Durability: fsync of the commit log, consume queues and offsets, grouped (group commit)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..files import atomic_write
from .state import ConsumerOffsets
from .store import MessageStore

log = logging.getLogger(__name__)

__all__ = ["Flusher"]


class Flusher:
    """Durability of the store and the offsets file.

    ``async`` mode fsyncs every ``interval``; ``sync`` mode fsyncs as soon as a writer
    waits, so a send's success means its bytes are on disk. Concurrent waiters share
    one fsync (group commit).
    """

    def __init__(self, store: MessageStore, offsets: ConsumerOffsets, *, sync: bool, interval_s: float,
                 extra: list[Callable[[], None]] | None = None) -> None:
        self.store = store
        self.offsets = offsets
        self.sync = sync
        self.interval_s = interval_s
        self.flushed_pos = store.commitlog.write_pos
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._round = 0
        self._lock = asyncio.Lock()
        self._extra = extra or []

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        await self.flush_once()

    async def wait_durable(self, pos: int | None = None) -> None:
        """Return once everything appended before this call (and the offsets) is on disk."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        target = self.store.commitlog.write_pos if pos is None else pos
        self._waiters.append((target, self._round + 1, fut))
        self._wake.set()
        await fut

    async def _run(self) -> None:
        while True:
            try:
                if self.sync:
                    try:
                        await asyncio.wait_for(self._wake.wait(), self.interval_s)
                    except TimeoutError:
                        pass
                else:
                    await asyncio.sleep(self.interval_s)
                self._wake.clear()
                await self.flush_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep flushing; fail the waiters of this round
                log.exception("flush failed")
                for _, _, fut in self._waiters:
                    if not fut.done():
                        fut.set_exception(exc)
                self._waiters.clear()
                await asyncio.sleep(0.1)

    async def flush_once(self) -> None:
        """One flush round; rounds never overlap (they share the checkpoint's temp file)."""
        async with self._lock:
            self._round += 1
            this_round = self._round
            snap = self.store.flush_snapshot()
            offsets_json = self.offsets.snapshot()
            loop = asyncio.get_running_loop()
            path = self.offsets.path

            def job() -> None:
                if snap is not None:
                    snap[1]()
                if offsets_json is not None:
                    atomic_write(path, offsets_json)
                for fn in self._extra:
                    fn()

            done = loop.run_in_executor(None, job)
            try:
                try:
                    await asyncio.shield(done)
                except asyncio.CancelledError:
                    # The job goes on in its thread: keep the lock until it is finished, or
                    # the next round (the final one at stop) would share its temp file.
                    await done
                    raise
            except BaseException:
                self.store.mark_dirty()
                if offsets_json is not None:
                    self.offsets.dirty = True
                raise
            if snap is not None:
                self.flushed_pos = max(self.flushed_pos, snap[0])
            still = []
            for target, rnd, fut in self._waiters:
                if fut.done():
                    continue
                if target <= self.flushed_pos and rnd <= this_round:
                    fut.set_result(None)
                else:
                    still.append((target, rnd, fut))
            self._waiters = still
            if still:
                self._wake.set()
