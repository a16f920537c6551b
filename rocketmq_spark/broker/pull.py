"""The broker's pull path, whatever the transport: who may pull a queue (:meth:`Pulls.refusal`),
the messages a pull gets (:meth:`Pulls.get`, through the group's tag filter), and long polling
(:meth:`Pulls.wait_for_messages`: a pull that found nothing waits for the queue's next message)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable

from ..codec.properties import decode_properties
from ..codec.record import properties_text
from ..codec.sql92 import Sql92Error, Sql92Filter, compile_sql92
from ..codec.tags import tag_filter
from ..remoting.codes import ResponseCode
from .config import BrokerConfig
from .groups import ConsumerGroups
from .state import TopicConfigs
from .store import GetResult, MessageStore

__all__ = ["Pulls"]


class Pulls:
    """Pulls of one broker's queues."""

    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicConfigs,
                 groups: ConsumerGroups) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self.groups = groups
        self._waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        store.listeners.append(self._on_new_messages)

    def refusal(self, topic: str, queue_id: int, group: str) -> tuple[int, str] | None:
        """Why a pull of ``topic``'s queue by ``group`` is refused, as (response code, remark),
        or None: the topic must exist and be readable, the queue be one of its read queues, and
        the group be known (created here when auto-creation is on, as a Java broker does on a
        pull). Every transport's pull asks it."""
        cfg = self.topics.get(topic)
        if cfg is None:
            return ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
        if not cfg.perm & 4:
            return ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling is forbidden"
        if not 0 <= queue_id < cfg.readQueueNums:
            return (ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                                               f"topicConfig.readQueueNums:[{cfg.readQueueNums}]")
        if group and not self.groups.knows(group):
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
        return None

    def filter_refusal(self, kind: str, expression: str) -> tuple[int, str] | None:
        """Why a pull with a subscription of expression type ``kind`` (not TAG) is refused, as a
        Java broker refuses it, or None: SQL92 needs enable_property_filter; another type, or
        an expression that does not compile, cannot be parsed."""
        if kind.upper() != "SQL92":
            return ResponseCode.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed"
        if not self.config.enable_property_filter:
            return ResponseCode.SYSTEM_ERROR, f"The broker does not support consumer to filter message by {kind}"
        try:
            self._sql92(expression)
        except Sql92Error:
            # a Java broker compiles it (ConsumerFilterManager.build), logs the failure and
            # filters nothing; the embedded broker says so instead of delivering everything
            return ResponseCode.SUBSCRIPTION_PARSE_FAILED, "parse the consumer's subscription failed"
        return None

    @staticmethod
    @functools.lru_cache(maxsize=256)
    def _sql92(expression: str) -> Sql92Filter:
        return compile_sql92(expression)

    def get(self, topic: str, queue_id: int, offset: int, max_nums: int, subscription: str = "*",
            expression_type: str = "TAG") -> GetResult:
        """Up to ``max_nums`` messages (at most the broker's pull limits) of the queue from
        ``offset`` that match ``subscription``: a tag expression, or with ``expression_type``
        SQL92 a filter over each message's properties (see :meth:`filter_refusal`)."""
        count = max(1, min(max_nums, self.config.max_pull_messages))
        if expression_type.upper() == "SQL92":
            sql = self._sql92(subscription)

            def matches(_taghash: int, record: bytes) -> bool:
                return sql.matches(decode_properties(properties_text(record)))  # the rest not decoded

            return self.store.get(topic, queue_id, offset, count, self.config.max_pull_bytes, matches)
        return self.store.get(topic, queue_id, offset, count, self.config.max_pull_bytes, tag_filter(subscription))

    async def wait_for_messages(self, topic: str, queue_ids: Iterable[int], timeout_s: float) -> None:
        """Return when any of the queues gets new messages, or after ``timeout_s`` (long polling)."""
        keys = [(topic, q) for q in queue_ids]
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, []).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                lst = self._waiters.get(key)
                if lst and fut in lst:
                    lst.remove(fut)

    def _on_new_messages(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def stop(self) -> None:
        """Wake no waiter again: each is cancelled."""
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.cancel()
