"""Broker answers in the forms Java's fastjson writes: ``Map<MessageQueue, ...>`` tables
(offset tables, topic stats, a consumer's running info), whose keys are JSON objects and so are
not standard JSON, and JSON object bodies in Java's lenient JSON.

What does not parse: :func:`object_body` raises a ProtocolError naming what was read; the table
parsers leave such entries out (a tool shows the rest).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from ..errors import ProtocolError
from ..model import MessageQueue
from ..remoting.route import loads_lenient

__all__ = ["object_body", "parse_offset_table", "parse_running_info", "parse_topic_stats"]


def object_body(body: bytes | None, what: str) -> dict[str, Any]:
    """A JSON object body (Java's lenient form accepted); anything else is a ProtocolError."""
    try:
        obj = loads_lenient(body or b"{}")
    except ProtocolError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what}: the answer is a JSON {type(obj).__name__}, not an object")
    return obj


_MQ_ENTRY = re.compile(r"\{([^{}]*)\}\s*:\s*(-?\d+)")


def parse_offset_table(body: bytes | None, *, default_broker: str = "") -> dict[MessageQueue, int]:
    """``{"offsetTable":{{"brokerName":..,"queueId":..,"topic":..}:offset,...}}`` as fastjson
    writes a ``Map<MessageQueue, Long>`` (object keys, not standard JSON) -> offsets."""
    out: dict[MessageQueue, int] = {}
    if not body:
        return out
    for m in _MQ_ENTRY.finditer(body.decode(errors="replace")):
        try:
            key = json.loads("{" + m.group(1) + "}")
        except ValueError:
            continue
        if isinstance(key, dict) and "topic" in key and "queueId" in key:
            mq = MessageQueue(str(key["topic"]), str(key.get("brokerName") or default_broker), int(key["queueId"]))
            out[mq] = int(m.group(2))
    return out


_STATS_ENTRY = re.compile(r"\{([^{}]*)\}\s*:\s*\{([^{}]*)\}")


def _queue_maps(body: bytes | None, default_broker: str = "") -> Iterator[tuple[MessageQueue, dict[str, Any]]]:
    """The entries of a fastjson ``Map<MessageQueue, Object>`` (object keys, not standard JSON:
    ``{{"brokerName":..,"queueId":..,"topic":..}:{..},..}``) -> (queue, value); entries that do
    not parse are left out."""
    if not body:
        return
    for m in _STATS_ENTRY.finditer(body.decode(errors="replace")):
        try:
            key = json.loads("{" + m.group(1) + "}")
            val = json.loads("{" + m.group(2) + "}")
            mq = MessageQueue(str(key["topic"]), str(key.get("brokerName") or default_broker), int(key["queueId"]))
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
        if isinstance(val, dict):
            yield mq, val


def parse_topic_stats(body: bytes | None, *, default_broker: str = "") -> dict[MessageQueue, tuple[int, int]]:
    """A TopicStatsTable (``{"offsetTable":{<queue>:{"maxOffset":..,"minOffset":..,..},..}}``)
    -> (min, max) offsets per queue; entries that do not parse are left out."""
    out: dict[MessageQueue, tuple[int, int]] = {}
    for mq, val in _queue_maps(body, default_broker):
        try:
            out[mq] = (int(val["minOffset"]), int(val["maxOffset"]))
        except (ValueError, KeyError, TypeError, OverflowError):
            continue
    return out


def parse_running_info(body: bytes | None) -> dict[MessageQueue, dict[str, Any]]:
    """The queues of a ConsumerRunningInfo body (``mqTable``, as
    :meth:`~.membership.RemotingGroupMember.running_info_body` or a Java consumer writes it) -> queue ->
    its ProcessQueueInfo fields."""
    return dict(_queue_maps(body))
