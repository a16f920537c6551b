"""Broker metadata kept beside the store: topic configs, consumer offsets, online clients.

Topic configs and consumer offsets are JSON files replaced atomically (temp file,
fsync, rename), in the layout Java brokers use::

    config/topics.json             {"topicConfigTable": {"<topic>": {...}}}
    config/consumerOffset.json     {"offsetTable": {"<topic>@<group>": {"<queueId>": offset}}}
    config/subscriptionGroup.json  {"subscriptionGroupTable": {"<group>": {"groupName": ...}}}

A committed consumer offset is the NEXT offset to consume.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from ..files import atomic_write
from ..names import AUTO_CREATE_TOPIC

log = logging.getLogger(__name__)

__all__ = [
    "ClientChannel",
    "ClientRegistry",
    "HALF_TOPIC",
    "OP_TOPIC",
    "SCHEDULE_TOPIC",
    "SYSTEM_TOPICS",
    "ConsumerOffsets",
    "SubscriptionGroups",
    "TopicConfig",
    "TopicConfigs",
]

#: the internal topics of transactions (half messages, their end markers) and delayed delivery
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: Topics the broker itself uses; never auto-created from a client's send.
SYSTEM_TOPICS = frozenset({AUTO_CREATE_TOPIC, HALF_TOPIC, OP_TOPIC, SCHEDULE_TOPIC})


@dataclass(slots=True)
class TopicConfig:
    topicName: str
    readQueueNums: int = 4
    writeQueueNums: int = 4
    perm: int = 6
    topicFilterType: str = "SINGLE_TAG"
    topicSysFlag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)


class TopicConfigs:
    """Topic name -> :class:`TopicConfig`, persisted on every change (changes are rare)."""

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, "topics.json")
        os.makedirs(config_dir, exist_ok=True)
        self.table: dict[str, TopicConfig] = {}
        self.version = 0
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                obj = json.load(fh)
            for name, cfg in (obj.get("topicConfigTable") or {}).items():
                known = {k: v for k, v in cfg.items() if k in TopicConfig.__dataclass_fields__}
                self.table[name] = TopicConfig(**known)
            self.version = int((obj.get("dataVersion") or {}).get("counter", 0))

    def get(self, name: str) -> TopicConfig | None:
        return self.table.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.table

    def __iter__(self) -> Iterator[TopicConfig]:
        return iter(list(self.table.values()))

    def put(self, cfg: TopicConfig) -> None:
        self.table[cfg.topicName] = cfg
        self.version += 1
        self.persist()

    def remove(self, name: str) -> bool:
        if self.table.pop(name, None) is None:
            return False
        self.version += 1
        self.persist()
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "topicConfigTable": {k: asdict(v) for k, v in sorted(self.table.items())},
            "dataVersion": {"counter": self.version, "timestamp": 0},
        }

    def persist(self) -> None:
        atomic_write(self.path, json.dumps(self.to_json(), indent=1).encode())


class ConsumerOffsets:
    """``topic@group`` -> queueId -> next offset to consume.

    Updates mark the table dirty; :meth:`snapshot` hands the JSON to the flusher,
    which writes it off the event loop.
    """

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, "consumerOffset.json")
        os.makedirs(config_dir, exist_ok=True)
        self.table: dict[str, dict[int, int]] = {}
        #: server-side resets not yet picked up by a pull of the group (``topic@group`` -> queue ->
        #: offset): commits of those queues are ignored until then (Java's resetOffsetTable)
        self.resets: dict[str, dict[int, int]] = {}
        self.dirty = False
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                obj = json.load(fh)
            for key, queues in (obj.get("offsetTable") or {}).items():
                self.table[key] = {int(q): int(o) for q, o in queues.items()}

    @staticmethod
    def key(topic: str, group: str) -> str:
        return f"{topic}@{group}"

    def query(self, topic: str, group: str, queue_id: int) -> int | None:
        return self.table.get(self.key(topic, group), {}).get(queue_id)

    def commit(self, topic: str, group: str, queue_id: int, offset: int, client: str = "") -> None:
        queues = self.table.setdefault(self.key(topic, group), {})
        old = queues.get(queue_id)
        if old is not None and offset < old:
            # Real brokers accept a lower offset (it is how offsets are reset); only log it.
            log.info("consumer offset of %s@%s queue %d moved back %d -> %d by %s",
                     topic, group, queue_id, old, offset, client or "?")
        queues[queue_id] = offset
        self.dirty = True

    def reset(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        """A server-side reset: the offset is written, and held until the group's next pull."""
        self.commit(topic, group, queue_id, offset, "reset")
        self.resets.setdefault(self.key(topic, group), {})[queue_id] = offset

    def is_reset(self, topic: str, group: str, queue_id: int) -> bool:
        return queue_id in self.resets.get(self.key(topic, group), {})

    def take_reset(self, topic: str, group: str, queue_id: int) -> int | None:
        """The pending reset of the queue, removed (a pull of the group picks it up)."""
        return self.resets.get(self.key(topic, group), {}).pop(queue_id, None)

    def groups_of(self, topic: str) -> list[str]:
        suffix_groups = []
        for key in self.table:
            t, _, g = key.partition("@")
            if t == topic:
                suffix_groups.append(g)
        return sorted(suffix_groups)

    def snapshot(self) -> bytes | None:
        if not self.dirty:
            return None
        self.dirty = False
        obj = {"offsetTable": {k: {str(q): o for q, o in sorted(v.items())}
                               for k, v in sorted(self.table.items())}}
        return json.dumps(obj, indent=1).encode()


class SubscriptionGroups:
    """The consumer groups the broker knows. As on Java brokers, a group exists once it was
    created (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP) or, with auto-creation on, once a consumer
    pulled or sent a heartbeat in it; offsets of a group that does not exist are refused.
    Groups that already have committed offsets (data dirs from before this file) exist."""

    def __init__(self, config_dir: str, offsets: ConsumerOffsets) -> None:
        self.path = os.path.join(config_dir, "subscriptionGroup.json")
        os.makedirs(config_dir, exist_ok=True)
        self.table: dict[str, dict[str, Any]] = {}
        if os.path.exists(self.path):
            with open(self.path, "rb") as fh:
                obj = json.load(fh)
            for name, cfg in (obj.get("subscriptionGroupTable") or {}).items():
                if isinstance(cfg, dict):
                    self.table[str(name)] = cfg
        for key in offsets.table:
            self.table.setdefault(key.partition("@")[2], self._default(key.partition("@")[2]))

    @staticmethod
    def _default(group: str) -> dict[str, Any]:
        return {"groupName": group, "consumeEnable": True, "consumeFromMinEnable": True,
                "consumeBroadcastEnable": True, "retryQueueNums": 1, "retryMaxTimes": 16,
                "brokerId": 0, "whichBrokerWhenConsumeSlowly": 1}

    def __contains__(self, group: object) -> bool:
        return group in self.table

    def put(self, group: str, config: dict[str, Any] | None = None) -> None:
        """Creates or updates ``group`` (missing settings take Java's defaults)."""
        cfg = self._default(group)
        cfg.update({k: v for k, v in (config or {}).items() if k != "groupName"})
        self.table[group] = cfg
        self.persist()

    def persist(self) -> None:
        obj = {"subscriptionGroupTable": dict(sorted(self.table.items()))}
        atomic_write(self.path, json.dumps(obj, indent=1).encode())


@dataclass(slots=True)
class ClientChannel:
    """What one connection told us in its heartbeats."""

    client_id: str = ""
    language: str = "JAVA"
    version: int = 0
    producer_groups: set[str] = field(default_factory=set)
    consumer_groups: dict[str, dict[str, Any]] = field(default_factory=dict)


class ClientRegistry:
    """Online producers and consumers by group; a closed connection's clients are dropped."""

    def __init__(self) -> None:
        self.channels: dict[Any, ClientChannel] = {}

    def heartbeat(self, conn: Any, body: dict[str, Any], language: str, version: int) -> set[str]:
        """Record a heartbeat; returns consumer groups whose membership changed."""
        ch = self.channels.get(conn)
        if ch is None:
            ch = self.channels[conn] = ClientChannel()
        ch.client_id = str(body.get("clientID", ch.client_id))
        ch.language = language
        ch.version = version
        for p in body.get("producerDataSet") or []:
            if isinstance(p, dict) and p.get("groupName"):
                ch.producer_groups.add(str(p["groupName"]))
        changed: set[str] = set()
        for c in body.get("consumerDataSet") or []:
            if isinstance(c, dict) and c.get("groupName"):
                g = str(c["groupName"])
                if g not in ch.consumer_groups:
                    changed.add(g)
                ch.consumer_groups[g] = c
        return changed

    def unregister(self, conn: Any, producer_group: str | None, consumer_group: str | None) -> set[str]:
        ch = self.channels.get(conn)
        if ch is None:
            return set()
        if producer_group:
            ch.producer_groups.discard(producer_group)
        changed: set[str] = set()
        if consumer_group and ch.consumer_groups.pop(consumer_group, None) is not None:
            changed.add(consumer_group)
        return changed

    def drop(self, conn: Any) -> set[str]:
        ch = self.channels.pop(conn, None)
        return set(ch.consumer_groups) if ch else set()

    def consumers(self, group: str) -> list[tuple[Any, ClientChannel]]:
        return [(c, ch) for c, ch in self.channels.items() if group in ch.consumer_groups]

    def consumer_ids(self, group: str) -> list[str]:
        return sorted({ch.client_id for _, ch in self.consumers(group)})

    def producers(self, group: str) -> list[Any]:
        return [c for c, ch in self.channels.items() if group in ch.producer_groups]
