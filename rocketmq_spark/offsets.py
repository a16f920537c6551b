"""Per-queue offsets and their one JSON form: ``{"topic": {"broker-a:0": 42, ...}, ...}``.

The same form is the reader's offsets in Spark's checkpoint (where Spark compares offsets as
JSON strings, so the order is canonical: topics sorted, then queues by broker and queue id),
the value of the startingOffsets / endingOffsets options (where -2 means earliest and -1
latest), what the committer listener reads back from Spark's progress, and what the CLI hands a
query. Every offset is the NEXT offset to read (one past the last message read).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from .model import MessageQueue

__all__ = ["EARLIEST", "GROUP_KEY", "LATEST", "MARKS_KEY", "RESET_KEY", "GroupAtPlanning", "Mark", "Offsets",
           "OffsetsFormatError", "batch_end_json", "group_of", "marks_of", "split_batch_end"]

#: option-only offsets: a queue's earliest (min) and latest (max) offset
EARLIEST, LATEST = -2, -1
_SHAPE = 'JSON like {"topic":{"broker-a:0":42}}'
#: In a stream's batch end offsets (Spark's offset log), the queues whose batch starts somewhere
#: else than the previous batch's end (an offset reset the query followed, a lost store's new
#: first offset, or where a queue new to the query starts), in the offsets form:
#: ``{"topic":{"broker-a:0":42}, "@reset":{"topic":{"broker-a:0":7}}}``. "@" is in no topic name.
RESET_KEY = "@reset"
#: In a stream's batch end offsets, per queue a fingerprint of one message the query planned past:
#: ``"@marks":{"topic":{"broker-a:0":[41,1718000000123]}}``, its offset and store time (epoch ms).
#: A broker that serves another message at that offset is not the store the query read from (it
#: lost its store, or the topic was deleted and re-created): see ``source/data_loss.py``.
MARKS_KEY = "@marks"
#: (offset, store time in epoch ms) of one message: see :data:`MARKS_KEY`
Mark = tuple[int, int]
#: In a stream's batch end offsets, what the query knew of its consumer group's offsets on the
#: brokers when it planned the batch: per queue the offsets the broker may hold from the query's
#: own writes (``held``), and when each broker had started (``boot``, epoch ms, where it says):
#: ``"@group":{"held":{"topic":{"broker-a:0":[40]}},"boot":{"broker-a":1718000000000}}``. A
#: restarted query finding another offset there, on a broker that has not restarted since, finds
#: a reset made while it was stopped (see ``source/resets.py``).
GROUP_KEY = "@group"


class GroupAtPlanning(NamedTuple):
    """The :data:`GROUP_KEY` of a batch's offsets."""

    held: dict[MessageQueue, tuple[int, ...]]
    boot: dict[str, int]


def _loaded(value: str | Mapping[str, Any]) -> Any:
    """The decoded object of offsets JSON text (a decoded object as it is)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        raise OffsetsFormatError(f"not JSON; expected {_SHAPE}") from None


class OffsetsFormatError(ValueError):
    """Text or an object that is not in the offsets JSON form; ``queue_key`` names the queue
    entry at fault ("" for a topic's entry, None when the whole value is wrong)."""

    def __init__(self, message: str, queue_key: str | None = None) -> None:
        super().__init__(message)
        self.queue_key = queue_key


class Offsets(Mapping[MessageQueue, int]):
    """An immutable mapping queue -> next offset (parsed from an option, also :data:`EARLIEST`
    or :data:`LATEST`) that reads and writes the offsets JSON form.

    Kept in :class:`MessageQueue` order, so equal offsets give equal JSON text. The
    constructor takes any mapping or pairs and converts the values with ``int()`` without
    checking them (:meth:`from_json` checks)."""

    __slots__ = ("_by_queue",)

    def __init__(self, by_queue: Mapping[MessageQueue, int] | Iterable[tuple[MessageQueue, int]] = ()) -> None:
        self._by_queue = {mq: int(off) for mq, off in sorted(dict(by_queue).items())}

    def __getitem__(self, mq: MessageQueue) -> int:
        return self._by_queue[mq]

    def __iter__(self) -> Iterator[MessageQueue]:
        return iter(self._by_queue)

    def __len__(self) -> int:
        return len(self._by_queue)

    def __repr__(self) -> str:
        return f"Offsets({self.dumps()})"

    def __getstate__(self) -> dict[MessageQueue, int]:
        return self._by_queue

    def __setstate__(self, state: dict[MessageQueue, int]) -> None:
        self._by_queue = state

    @property
    def topics(self) -> list[str]:
        """The topics that have a queue here, sorted."""
        return sorted({mq.topic for mq in self._by_queue})

    def to_json(self) -> dict[str, dict[str, int]]:
        """The canonical object: topics sorted, queues by (broker, queueId)."""
        out: dict[str, dict[str, int]] = {}
        for mq, off in self._by_queue.items():  # kept sorted by MessageQueue's order
            out.setdefault(mq.topic, {})[mq.key] = off
        return out

    def dumps(self) -> str:
        """:meth:`to_json` as JSON text (canonical: what Spark compares)."""
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, value: str | Mapping[str, Any], *, special: bool = False) -> Offsets:
        """Parse the offsets JSON form (a string or the decoded object). ``special`` accepts the
        options' -2 (earliest) and -1 (latest); otherwise offsets are >= 0. Raises
        :class:`OffsetsFormatError` naming what is wrong."""
        obj = _loaded(value)
        if not isinstance(obj, Mapping):
            raise OffsetsFormatError(f"a JSON {type(obj).__name__}, not an object; expected {_SHAPE}")
        lowest = EARLIEST if special else 0
        out: dict[MessageQueue, int] = {}
        def not_queues(topic: Any, queues: Any) -> str:
            return f"topic {topic!r} maps to a {type(queues).__name__}, not an object of queues; expected {_SHAPE}"

        for key, mq, off in _queue_items(obj, "", not_queues):
            if isinstance(off, bool) or not isinstance(off, int) or off < lowest:
                accepted = "an integer >= -2 (-2 earliest, -1 latest)" if special else "an integer >= 0"
                raise OffsetsFormatError(f"offset {off!r} of queue {key!r}: {accepted}", key)
            out[mq] = off
        return cls(out)


def _queue_items(tree: Mapping[Any, Any], prefix: str,
                 not_queues: Callable[[Any, Any], str]) -> Iterator[tuple[str, MessageQueue, Any]]:
    """(queue key, queue, value) of a ``{"topic": {"broker:queueId": value}}`` tree; a topic
    that does not map to an object raises ``not_queues(topic, what it maps to)``, a key that is
    not ``broker:queueId`` names itself (``prefix`` before the message)."""
    for topic, queues in tree.items():
        if not isinstance(queues, Mapping):
            raise OffsetsFormatError(not_queues(topic, queues), "")
        for key, value in queues.items():
            try:
                mq = MessageQueue.from_key(str(topic), str(key))
            except ValueError:
                raise OffsetsFormatError(f"{prefix}queue {key!r} of topic {topic!r} is not 'broker:queueId'",
                                         str(key)) from None
            yield str(key), mq, value


def batch_end_json(ends: Mapping[MessageQueue, int], resets: Mapping[MessageQueue, int],
                   marks: Mapping[MessageQueue, Mark] | None = None,
                   group: GroupAtPlanning | None = None) -> dict[str, Any]:
    """A stream batch's end offsets with the starts of the queues it reads from a reset offset
    or from where a queue new to the query started (a replay must read the same ranges),
    the queues' marks (:data:`MARKS_KEY`) and the group's offsets at planning (:data:`GROUP_KEY`)."""
    out: dict[str, Any] = Offsets(ends).to_json()
    if resets:
        out[RESET_KEY] = Offsets(resets).to_json()
    if marks:
        by_topic: dict[str, dict[str, list[int]]] = {}
        for mq, (off, ts) in sorted(marks.items()):
            by_topic.setdefault(mq.topic, {})[mq.key] = [int(off), int(ts)]
        out[MARKS_KEY] = by_topic
    if group is not None and (group.held or group.boot):
        held: dict[str, dict[str, list[int]]] = {}
        for mq, offs in sorted(group.held.items()):
            held.setdefault(mq.topic, {})[mq.key] = sorted({int(o) for o in offs})
        out[GROUP_KEY] = {"held": held, "boot": {b: int(ms) for b, ms in sorted(group.boot.items())}}
    return out


def group_of(value: str | Mapping[str, Any]) -> GroupAtPlanning | None:
    """The :data:`GROUP_KEY` of a stream batch's offsets, None when it has none (a batch planned
    before it was written, or without a consumer group); OffsetsFormatError when it is not in the
    form written."""
    obj = _loaded(value)
    raw = obj.get(GROUP_KEY) if isinstance(obj, Mapping) else None
    if raw is None:
        return None
    shape = 'an object like {"held":{"topic":{"broker-a:0":[40]}},"boot":{"broker-a":1718000000000}}'
    if not isinstance(raw, Mapping) or not isinstance(raw.get("held", {}), Mapping) \
            or not isinstance(raw.get("boot", {}), Mapping):
        raise OffsetsFormatError(f"{GROUP_KEY} is not {shape}")
    held: dict[MessageQueue, tuple[int, ...]] = {}
    for key, mq, offs in _queue_items(raw.get("held", {}), f"{GROUP_KEY}: ",
                                      lambda topic, _queues: f"{GROUP_KEY} held of topic {topic!r} is not {shape}"):
        if not isinstance(offs, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                 for x in offs):
            raise OffsetsFormatError(f"{GROUP_KEY}: held offsets {offs!r} of queue {key!r} are not a list of "
                                     f"offsets", key)
        held[mq] = tuple(offs)
    boot: dict[str, int] = {}
    for broker, ms in raw.get("boot", {}).items():
        if not isinstance(ms, int) or isinstance(ms, bool):
            raise OffsetsFormatError(f"{GROUP_KEY}: boot time {ms!r} of broker {broker!r} is not epoch ms")
        boot[str(broker)] = ms
    return GroupAtPlanning(held, boot)


def marks_of(value: str | Mapping[str, Any]) -> dict[MessageQueue, Mark]:
    """The marks of a stream batch's offsets (:func:`batch_end_json`), {} when it has none;
    OffsetsFormatError when they are not in the form written."""
    obj = _loaded(value)
    marks = obj.get(MARKS_KEY) if isinstance(obj, Mapping) else None
    if marks is None:
        return {}
    out: dict[MessageQueue, Mark] = {}
    shape = 'an object like {"topic":{"broker-a:0":[offset, storeTimeMs]}}'
    if not isinstance(marks, Mapping):
        raise OffsetsFormatError(f"{MARKS_KEY} is a JSON {type(marks).__name__}, not {shape}")
    for key, mq, mark in _queue_items(marks, f"{MARKS_KEY}: ",
                                      lambda topic, _queues: f"{MARKS_KEY} of topic {topic!r} is not {shape}"):
        if (not isinstance(mark, list) or len(mark) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in mark)):
            raise OffsetsFormatError(f"{MARKS_KEY}: mark {mark!r} of queue {key!r} is not [offset, storeTimeMs]", key)
        out[mq] = (mark[0], mark[1])
    return out


def split_batch_end(value: str | Mapping[str, Any]) -> tuple[Offsets, Offsets]:
    """(ends, reset starts) of a stream batch's offsets (:func:`batch_end_json`; its marks are
    read by :func:`marks_of`); any offsets object without resets reads as its offsets and no resets."""
    obj = _loaded(value)
    if isinstance(obj, Mapping) and (RESET_KEY in obj or MARKS_KEY in obj or GROUP_KEY in obj):
        rest = {k: v for k, v in obj.items() if k not in (RESET_KEY, MARKS_KEY, GROUP_KEY)}
        return Offsets.from_json(rest), Offsets.from_json(obj.get(RESET_KEY, {}))
    return Offsets.from_json(obj), Offsets()
