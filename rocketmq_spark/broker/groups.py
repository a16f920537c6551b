"""Consumer groups on the broker, whatever the transport: which groups exist (created on first
use when auto-creation is on, as Java brokers do on a pull or a heartbeat), their committed
offsets and resets, their online clients (heartbeats, and the NOTIFY_CONSUMER_IDS_CHANGED push
when they change), and their retry and dead-letter topics (where a message given back goes)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from ..names import dead_letter_topic, retry_topic, topic_problem
from ..remoting.codes import RequestCode, ResponseCode
from .config import BrokerConfig
from .state import ClientRegistry, ConsumerOffsets, SubscriptionGroups, TopicConfig, TopicConfigs
from .store import MessageStore

__all__ = ["ConsumerGroups"]


class ConsumerGroups:
    """The consumer groups of one broker and what they own."""

    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicConfigs,
                 topics_changed: Callable[[], None], groups: SubscriptionGroups, offsets: ConsumerOffsets,
                 clients: ClientRegistry) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self._topics_changed = topics_changed
        self.table = groups
        self.offsets = offsets
        self.clients = clients

    # -- which groups exist ---------------------------------------------------------

    def knows(self, group: str) -> bool:
        """Whether consumer group ``group`` exists, creating it when auto-creation is on (what
        a pull or consumer heartbeat does on a Java broker)."""
        if group in self.table:
            return True
        if not self.config.auto_create_groups:
            return False
        self.table.put(group)
        return True

    def config_of(self, group: str) -> dict[str, Any]:
        """The group's SubscriptionGroupConfig (the defaults for a group not created)."""
        return self.table.table.get(group, {})

    # -- offsets --------------------------------------------------------------------

    def commit_offset(self, topic: str, group: str, queue_id: int, offset: int,
                      client: str = "") -> tuple[int, str] | None:
        """Store ``group``'s next offset of the queue (every transport's offset update). Refused,
        as (code, remark), for a group the broker does not know (an update never creates one);
        ignored, answered (SUCCESS, why), for a queue with a server-side reset its consumers
        have not pulled yet (Java alike). A negative offset (some clients' "nothing consumed
        yet") is accepted and ignored."""
        if group not in self.table:
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"Group {group} not exist!"
        if self.config.server_side_reset and self.offsets.is_reset(topic, group, queue_id):
            return ResponseCode.SUCCESS, "Offset has been previously reset"
        if offset >= 0:
            self.offsets.commit(topic, group, queue_id, offset, client)
        return None

    def take_pull_reset(self, topic: str, queue_id: int, group: str) -> int | None:
        """The offset ``group``'s offset of the queue was reset to (server-side reset), handed to
        this pull and forgotten; None when there is none."""
        if not group or not self.config.server_side_reset:
            return None
        return self.offsets.take_reset(topic, group, queue_id)

    def reset_by_time(self, topic: str, group: str, timestamp: int, read_queues: int, client: str) -> dict[int, int]:
        """Set the group's offsets of ``topic`` to the first message stored at or after
        ``timestamp`` (a negative one: the end of each queue) -> queue id: offset. With
        server-side resets (5.x) the group's next pull of each queue moves there; otherwise the
        offsets are committed now and the group's online clients are told (4.x brokers push
        RESET_CONSUMER_CLIENT_OFFSET: :meth:`notify_reset`)."""
        table: dict[int, int] = {}
        for q in range(read_queues):
            off = self.store.max_offset(topic, q) if timestamp < 0 else self.store.offset_by_time(topic, q, timestamp)
            table[q] = off
            if self.config.server_side_reset:
                self.offsets.reset(topic, group, q, off)
            else:
                self.offsets.commit(topic, group, q, off, client)
        return table

    def notify_reset(self, topic: str, group: str, timestamp: int, body: bytes) -> None:
        """Tell the group's online clients their offsets were reset (4.x: the broker pushes
        RESET_CONSUMER_CLIENT_OFFSET; 5.x brokers reset on the server side and push nothing)."""
        if self.config.server_side_reset:
            return
        for consumer, _ in self.clients.consumers(group):
            consumer.push(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                          {"topic": topic, "group": group, "timestamp": str(timestamp), "isForce": "true"}, body)

    # -- online clients -------------------------------------------------------------

    def heartbeat(self, conn: Any, body: dict[str, Any], language: str, version: int) -> None:
        """A client's heartbeat: its groups known (created when auto-creation is on), each
        consumer group's retry topic there (clustering consumers look up its route), and the
        groups whose clients changed told so."""
        changed = self.clients.heartbeat(conn, body, language, version)
        for c in body.get("consumerDataSet") or []:
            group = c.get("groupName") if isinstance(c, dict) else None
            if isinstance(group, str) and group:
                self.knows(group)
                if not topic_problem(retry_topic(group)):
                    self.retry_topic_of(group)
        self._changed(changed)

    def unregister(self, conn: Any, producer_group: str | None, consumer_group: str | None) -> None:
        self._changed(self.clients.unregister(conn, producer_group, consumer_group))

    def drop(self, conn: Any) -> None:
        """A connection closed: its clients leave their groups."""
        self._changed(self.clients.drop(conn))

    def _changed(self, groups: set[str]) -> None:
        for group in groups:
            for consumer, _ in self.clients.consumers(group):
                consumer.push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

    # -- retries --------------------------------------------------------------------

    def retry_topic_of(self, group: str) -> str:
        """The group's retry topic, created (with the group's retryQueueNums) if need be."""
        topic = retry_topic(group)
        if topic not in self.topics:
            n = max(1, int(self.config_of(group).get("retryQueueNums", 1)))
            self.topics.put(TopicConfig(topic, n, n, 6))
            self._topics_changed()
        return topic

    def dead_letter_topic_of(self, group: str) -> str:
        """The group's dead-letter topic (one queue, readable: 5.x brokers create it so),
        created if need be."""
        topic = dead_letter_topic(group)
        if topic not in self.topics:
            self.topics.put(TopicConfig(topic, 1, 1, 6))
            self._topics_changed()
        return topic

    def given_back_to(self, group: str, reconsume_times: int, delay_level: int, max_reconsume: int | None
                      ) -> tuple[str, int, int]:
        """Where a message the group gives back goes, as Java brokers decide it -> (topic,
        queue id, DELAY level): the group's retry topic, delayed by ``delay_level`` (0: 3 + its
        reconsume times); once its reconsume times reach ``max_reconsume`` (None: the group's
        retryMaxTimes), or with a negative delay level, the group's dead-letter topic, at once."""
        most = int(self.config_of(group).get("retryMaxTimes", 16)) if max_reconsume is None else max_reconsume
        if reconsume_times >= most or delay_level < 0:
            return self.dead_letter_topic_of(group), 0, 0
        topic = self.retry_topic_of(group)
        queue_id = random.randrange(self.topics.get(topic).writeQueueNums)  # type: ignore[union-attr]
        return topic, queue_id, delay_level or 3 + reconsume_times
