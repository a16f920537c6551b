"""The broker: its state (topics, offsets, groups, clients, the store) and the operations every
transport calls, each in a module named for its concept: :mod:`.send` (one check of a send, the
records it stores), :mod:`.pull` (who may pull, long polling), :mod:`.groups` (consumer groups,
their offsets, clients and retries), :mod:`.transactions`, :mod:`.delayed`; the remoting
handlers are :mod:`.remoting_service`, beside the gRPC servicer :mod:`.grpc_service`.
Durability is :mod:`.flusher`, the settings :mod:`.config`, the storage :mod:`.store`.

Runs on one asyncio event loop. Disk writes happen on the loop (page cache); fsync runs in an
executor through :class:`~.flusher.Flusher`, which groups concurrent sync-flush sends into one
fsync.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from ..codec import pack_host
from ..names import AUTO_CREATE_TOPIC, topic_problem
from .config import BrokerConfig
from .connection import Connection
from .delayed import DelayedDelivery
from .flusher import Flusher
from .groups import ConsumerGroups
from .keyindex import KeyIndex
from .pull import Pulls
from .send import Sends
from .state import (
    HALF_TOPIC,
    OP_TOPIC,
    SYSTEM_TOPICS,
    ClientRegistry,
    ConsumerOffsets,
    SubscriptionGroups,
    TopicConfig,
    TopicConfigs,
)
from .store import MessageStore
from .transactions import Transactions

log = logging.getLogger(__name__)

__all__ = ["Broker"]


class Broker:
    """One broker: its state and the operations on it by concept (:attr:`sends`, :attr:`pulls`,
    :attr:`groups`, :attr:`transactions`, :attr:`delayed`). The transports' services are over it
    (:class:`.RemotingService`, :class:`.MessagingServicer`); it knows neither."""

    def __init__(self, config: BrokerConfig, advertised_addr: str) -> None:
        self.config = config
        self.addr = advertised_addr
        #: when this broker (its store) started: GET_BROKER_RUNTIME_INFO's bootTimestamp
        self.boot_ms = int(time.time() * 1000)
        store_host = pack_host(advertised_addr)[0]
        self._peer_cache: dict[str, bytes] = {}
        root = config.data_dir
        self.store = MessageStore(os.path.join(root, "store"), store_host, config.store_config())
        self.topics = TopicConfigs(os.path.join(root, "config"))
        self.offsets = ConsumerOffsets(os.path.join(root, "config"))
        self.clients = ClientRegistry()
        #: messages by key (QUERY_MESSAGE), built as topics are queried
        self.key_index = KeyIndex(self.store)
        self.on_topics_changed: list[Callable[[], None]] = []
        self.flusher: Flusher | None = None
        self.groups = ConsumerGroups(config, self.store, self.topics, self._topics_changed,
                                     SubscriptionGroups(os.path.join(root, "config"), self.offsets), self.offsets,
                                     self.clients)
        self.pulls = Pulls(config, self.store, self.topics, self.groups)
        self.transactions = Transactions(self.store, self.offsets, self.clients, config, addr=advertised_addr,
                                         pack_peer=self.pack_peer)
        #: open transactions by half-queue offset
        self.pending_tx = self.transactions.pending
        self.delayed = DelayedDelivery(self.store, self.offsets, pack_peer=self.pack_peer)
        #: delayed messages not delivered yet, by schedule-queue offset
        self.pending_delay = self.delayed.pending
        self.sends = Sends(config, self.store, self.topics, self.create_topic, self.groups, self.transactions,
                           self.delayed, store_host)
        self._tasks: list[asyncio.Task[None]] = []
        if config.auto_create_topics and AUTO_CREATE_TOPIC not in self.topics:
            self.topics.put(TopicConfig(AUTO_CREATE_TOPIC, 8, 8, 7))
        self.transactions.load()
        self.delayed.load()

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        self.flusher = Flusher(self.store, self.offsets, sync=cfg.flush == "sync",
                               interval_s=cfg.flush_interval_ms / 1000.0)
        self.flusher.start()
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))
        self._tasks.append(asyncio.ensure_future(self.delayed.run()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.pulls.stop()
        if self.flusher:
            await self.flusher.stop()
        self.store.close()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self.transactions.check()
                # Recovery starts its scan of half messages here; saving it once a second
                # (not per END_TRANSACTION: min() over the open ones) only makes that scan longer.
                self.transactions.save_progress()
                if self.config.retention_hours > 0:
                    self.store.delete_expired(int(self.config.retention_hours * 3600_000))
            except Exception:
                log.exception("broker housekeeping failed")

    # -- connections ----------------------------------------------------------------

    def on_close(self, conn: Connection) -> None:
        self.groups.drop(conn)

    def pack_peer(self, peer: str) -> bytes:
        """A peer address (``host:port``) packed as records store hosts (cached)."""
        packed = self._peer_cache.get(peer)
        if packed is None:
            try:
                packed = pack_host(peer)[0]
            except ValueError:
                packed = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
            if len(self._peer_cache) > 4096:
                self._peer_cache.clear()
            self._peer_cache[peer] = packed
        return packed

    async def durable(self) -> None:
        """With ``flush=sync``: return once everything stored so far is fsynced (raises
        when the flush failed). With async flushing: at once."""
        if self.config.flush == "sync" and self.flusher is not None:
            await self.flusher.wait_durable(self.store.commitlog.write_pos)

    # -- topics ---------------------------------------------------------------------

    def topic_table(self) -> dict[str, tuple[int, int, int]]:
        return {t.topicName: (t.readQueueNums, t.writeQueueNums, t.perm) for t in self.topics
                if t.topicName not in (HALF_TOPIC, OP_TOPIC)}

    def create_topic(self, topic: str, queue_nums: int | None = None, perm: int = 6) -> bool:
        """Auto-create ``topic`` (route miss or first send). False when not allowed."""
        if topic in self.topics:
            return True
        if not self.config.auto_create_topics or topic_problem(topic) or topic in SYSTEM_TOPICS:
            return False
        n = queue_nums or self.config.default_queue_nums
        self.topics.put(TopicConfig(topic, n, n, perm))
        log.info("auto-created topic %s with %d queues", topic, n)
        self._topics_changed()
        return True

    def put_topic(self, cfg: TopicConfig) -> None:
        """Create or change a topic (UPDATE_AND_CREATE_TOPIC, checked by the caller)."""
        self.topics.put(cfg)
        self._topics_changed()

    def _topics_changed(self) -> None:
        for fn in self.on_topics_changed:
            fn()

    # -- admin helpers (tests, CLI) -------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.addr,
            "topics": sorted(self.topic_table()),
            "commitLog": [self.store.commitlog.min_pos, self.store.commitlog.write_pos],
        }
