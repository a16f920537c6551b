"""Namespaces: how a namespace's topics and groups are named on the wire, as the Java client's
``ClientConfig.setNamespace`` names them (NamespaceUtil in apache/rocketmq).

A resource ``R`` of namespace ``ns`` travels as ``ns%R``; a retry or dead-letter topic keeps its
prefix in front (``%RETRY%ns%group``, ``%DLQ%ns%group``); system topics (``TBW102``,
``SCHEDULE_TOPIC_XXXX``, ``rmq_sys_*``, ...) and system groups (``CID_RMQ_SYS_*``) are never
wrapped. Wrapping is idempotent: a name already in the namespace is left as it is.

Brokers and name servers of Apache RocketMQ know nothing of namespaces: a wrapped name is an
ordinary topic or group name to them, and that is what keeps two namespaces apart on one
cluster. (The Java client's later ``setNamespaceV2`` only adds request fields ``ns``/``nsd``
that Apache RocketMQ 5.x ignores; see docs/production.md.)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .names import AUTO_CREATE_TOPIC, DLQ_PREFIX, RETRY_PREFIX

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["NAMESPACE_RULE", "SEPARATOR", "is_system_resource", "namespace_of", "namespace_problem", "unwrap",
           "unwrap_columns", "wrap"]

#: between a namespace and a resource name
SEPARATOR = "%"
_NAMESPACE_CHARS = re.compile(r"^[a-zA-Z0-9_|-]+$")
#: a namespace is at most this long (a topic of one character must still fit in 127)
NAMESPACE_MAX_LENGTH = 64
#: what is accepted, for error messages
NAMESPACE_RULE = (f"accepted: letters, digits, '_', '|' and '-' (not '%', which separates it from the name), at most "
                  f"{NAMESPACE_MAX_LENGTH} characters, not starting with rmq_sys_ or CID_RMQ_SYS_")

#: TopicValidator's system topics (never wrapped)
_SYSTEM_TOPICS = frozenset({
    AUTO_CREATE_TOPIC, "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "CHECKPOINT_TOPIC",
})
_SYSTEM_TOPIC_PREFIX = "rmq_sys_"
_SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"


def namespace_problem(namespace: str) -> str | None:
    """None when ``namespace`` may name a namespace, else what is wrong with it."""
    if not _NAMESPACE_CHARS.match(namespace):
        return "the namespace may contain only letters, digits, '_', '|' and '-'"
    if len(namespace) > NAMESPACE_MAX_LENGTH:
        return f"the namespace is {len(namespace)} characters long"
    if namespace.startswith((_SYSTEM_TOPIC_PREFIX, _SYSTEM_GROUP_PREFIX)):
        return "the namespace would make its names system names, which are never wrapped"
    return None


def is_system_resource(name: str) -> bool:
    """A system topic or group: the same in every namespace."""
    return name in _SYSTEM_TOPICS or name.startswith((_SYSTEM_TOPIC_PREFIX, _SYSTEM_GROUP_PREFIX))


def _prefix_and_rest(name: str) -> tuple[str, str]:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def wrap(namespace: str, name: str) -> str:
    """``name`` (a topic, a group, a retry or dead-letter topic) as namespace ``namespace``
    sends it; unchanged without a namespace, for a system name, or when already wrapped."""
    if not namespace or not name or is_system_resource(name):
        return name
    prefix, rest = _prefix_and_rest(name)
    if rest.startswith(namespace + SEPARATOR):
        return name
    return f"{prefix}{namespace}{SEPARATOR}{rest}"


def unwrap(namespace: str, name: str) -> str:
    """``name`` as the user of namespace ``namespace`` knows it: the namespace taken out;
    unchanged when it is not in that namespace (another one's, or none)."""
    if not namespace or not name or is_system_resource(name):
        return name
    prefix, rest = _prefix_and_rest(name)
    head = namespace + SEPARATOR
    return prefix + rest[len(head):] if rest.startswith(head) else name


def namespace_of(name: str) -> str:
    """The namespace a wire name is in ("" for none): the part before the first separator,
    after a retry or dead-letter prefix (what a 5.x proxy puts in ``Resource.resource_namespace``)."""
    if not name or is_system_resource(name):
        return ""
    _, rest = _prefix_and_rest(name)
    index = rest.find(SEPARATOR)
    return rest[:index] if index > 0 else ""


def unwrap_columns(batch: pa.RecordBatch, namespace: str, names: tuple[str, ...] = ("topic", "retryTopic")
                   ) -> pa.RecordBatch:
    """``batch`` with the columns ``names`` (those present) holding the names the user knows
    (:func:`unwrap` of each value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not namespace:
        return batch
    pattern = "^(" + re.escape(RETRY_PREFIX) + "|" + re.escape(DLQ_PREFIX) + ")?" + re.escape(namespace + SEPARATOR)
    columns = list(batch.columns)
    for name in names:
        index = batch.schema.get_field_index(name)
        if index < 0:
            continue
        col = columns[index]
        # system names never start with the namespace (namespace_problem), so one replace is unwrap()
        columns[index] = pc.replace_substring_regex(col, pattern=pattern, replacement=r"\1", max_replacements=1)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)
