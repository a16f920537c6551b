"""subscribePattern: the topics a query reads are those of the name servers' topic list whose
name matches a regular expression (as a whole, like Java's ``Pattern.matches`` in Spark's Kafka
source), looked up again at every trigger so a topic created while the query runs is read from
its first message, as a new queue is.

System topics never match unless named with ``topic``: retry and dead-letter topics
(``%RETRY%``, ``%DLQ%``), RocketMQ's own (TopicValidator's: ``TBW102``, ``SCHEDULE_TOPIC_XXXX``,
``RMQ_SYS_*``, ``rmq_sys_*``, ...), and the topics brokers create for their cluster's and their
own name. In a namespace only its topics are listed, matched by the names its users know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ..names import DLQ_PREFIX, RETRY_PREFIX
from ..namespaces import SEPARATOR, is_system_resource, unwrap

__all__ = ["is_system_topic", "matching_topics"]

#: prefixes of system topics besides TopicValidator's set (which namespaces.is_system_resource knows)
_SYSTEM_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, "RMQ_SYS_", "rmq_sys_", "SCHEDULE_TOPIC_")
#: suffix of a cluster's reply topic (request-reply messaging), created with it
_REPLY_SUFFIX = "_REPLY_TOPIC"


def is_system_topic(name: str, cluster_names: Iterable[str] = ()) -> bool:
    """Whether topic ``name`` (as it travels) is one of RocketMQ's own, which a pattern never
    matches: see the module."""
    if is_system_resource(name) or name.startswith(_SYSTEM_PREFIXES):
        return True
    names = set(cluster_names)
    return name in names or (name.endswith(_REPLY_SUFFIX) and name[:-len(_REPLY_SUFFIX)] in names)


def matching_topics(pattern: str, listed: Iterable[str], namespace: str = "",
                    cluster_names: Iterable[str] = ()) -> list[str]:
    """The topics of ``listed`` (wire names) that ``pattern`` matches as a whole, sorted: in
    ``namespace`` those of it, matched by the name without it; never a system topic."""
    rx = re.compile(pattern)
    names = set(cluster_names)
    out = []
    for wire in listed:
        if namespace and not wire.startswith(namespace + SEPARATOR):
            continue
        if is_system_topic(wire, names) or not rx.fullmatch(unwrap(namespace, wire)):
            continue
        out.append(wire)
    return sorted(out)
