"""Sending message traces (options traceEnabled, traceTopic) off the hot path.

A task hands its trace records (:mod:`rocketmq_spark.codec.trace`) to the process's
:class:`TraceDispatcher` for its settings and goes on; a daemon thread gathers them into trace
messages of up to :data:`MAX_BODY` bytes (keys: the traced message ids and keys, up to
:data:`MAX_KEYS_TEXT` characters a message) and sends them to the trace topic's queues in turn,
over a client of its own. As the Java client's trace dispatcher, tracing never fails or holds
up what is traced: a record the queue has no room for (:data:`MAX_PENDING`) is dropped, a
send that fails is dropped, both counted and logged (once a minute at most). A task waits for
what it traced at its end (:meth:`TraceDispatcher.flush`, bounded), so a worker that exits
after the task loses none.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..codec import BatchEntry, PropertyKey, encode_properties
from ..codec.trace import field_text
from ..errors import RocketMQSparkError
from ..remoting.acl import Credentials
from ..tls import TlsConfig
from .contract import BrokerClient
from .retry import ClientConfig

log = logging.getLogger(__name__)

__all__ = ["MAX_BODY", "MAX_KEYS_TEXT", "MAX_PENDING", "TRACE_PRODUCER_GROUP", "TraceCounts", "TraceDispatcher",
           "arrow_records", "dispatcher", "found_by", "or_null"]

#: a trace message's body at most (bytes; the Java dispatcher's 128,000)
MAX_BODY = 128_000
#: its KEYS property at most (bytes): a message's properties are at most 32,767 bytes
MAX_KEYS_TEXT = 30_000
#: bytes of records (and their keys) waiting to be sent at most; past it new ones are dropped (counted)
MAX_PENDING = 64 * 1024 * 1024
#: the producer group trace messages are sent as (the Java client's prefix)
TRACE_PRODUCER_GROUP = "_INNER_TRACE_PRODUCER"
#: how long :meth:`TraceDispatcher.flush` waits at most while sends fail (seconds)
FAILING_FLUSH_S = 0.5
#: a failure or drop is logged at most this often (seconds); the counts say how many
_LOG_EVERY_S = 60.0


@dataclass
class TraceCounts:
    """What a dispatcher did with the records handed to it."""

    sent: int = 0  # records in trace messages the broker stored
    failed: int = 0  # records in trace messages whose send failed
    dropped: int = 0  # records not queued: the queue was full


def arrow_records(fields: Sequence[object]) -> pa.Array:
    """Trace records built column-wise: ``fields`` are strings (the same in every record; a
    separator inside is blanked) or string arrays (one value per record, without separators),
    joined by \\x01, each record ended by \\x02 (what :mod:`rocketmq_spark.codec.trace` writes one
    record at a time)."""
    parts = [f if isinstance(f, pa.Array) else field_text(f) for f in fields]
    return pc.binary_join_element_wise(pc.binary_join_element_wise(*parts, "\x01"), "\x02", "")


def or_null(values: pa.Array) -> pa.Array:
    """``values`` with ``null`` for each empty one: how a Java client's record writes a message's
    missing tags or keys."""
    return pc.if_else(pc.equal(values, ""), "null", values)


def found_by(ids: pa.Array, keys: pa.Array) -> pa.Array:
    """Per record, what its trace message is found by: the message id and its keys
    (space-separated, "" for none), each followed by a space."""
    return pc.binary_join_element_wise(
        pc.if_else(pc.equal(keys, ""), ids, pc.binary_join_element_wise(ids, keys, " ")), " ", "")


def _offsets(arr: pa.Array) -> np.ndarray:
    """The value offsets of a string array (its ``len + 1`` bounds in its data buffer)."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32, count=arr.offset + len(arr) + 1)[arr.offset:]


class _Chunk:
    """Records waiting to be sent: ``records`` (each ended by \\x02) and, per record, the
    keys it is found by, space-separated and ending with a space; ``at``: the first not taken."""

    __slots__ = ("at", "data", "key_data", "key_offsets", "offsets")

    def __init__(self, records: pa.Array, keys: pa.Array) -> None:
        records, keys = records.cast(pa.string()), keys.cast(pa.string())  # 32-bit offsets
        self.offsets, self.key_offsets = _offsets(records), _offsets(keys)
        self.data, self.key_data = records.buffers()[2], keys.buffers()[2]
        self.at = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1 - self.at

    @property
    def size(self) -> int:
        """Bytes of the records not taken yet and of their keys."""
        i = self.at
        return int(self.offsets[-1] - self.offsets[i] + self.key_offsets[-1] - self.key_offsets[i])

    def fitting(self, room: int) -> int:
        """Keep only the first records that fit in ``room`` bytes (with their keys): how many."""
        both = self.offsets + self.key_offsets
        n = max(0, int(np.searchsorted(both, both[0] + room, side="right")) - 1)
        if n < len(self):
            self.offsets, self.key_offsets = self.offsets[:n + 1], self.key_offsets[:n + 1]
        return n

    def take(self, body_room: int, keys_room: int, least: int) -> tuple[bytes, bytes, int]:
        """(records, their keys, how many) from ``at``: as many as fit ``body_room`` bytes and
        ``keys_room`` characters of keys, at least ``least``."""
        o, k, i = self.offsets, self.key_offsets, self.at
        n = min(int(np.searchsorted(o, o[i] + body_room, side="right")),
                int(np.searchsorted(k, k[i] + keys_room, side="right"))) - 1 - i
        n = min(max(n, least), len(self))
        j = i + n
        self.at = j
        return (self.data[int(o[i]):int(o[j])].to_pybytes() if n else b"",
                self.key_data[int(k[i]):int(k[j])].to_pybytes() if n else b"", n)


class TraceDispatcher:
    """Trace records to ``topic`` (as it travels: wrapped in a namespace already) over a
    client ``connect()`` opens on first use; see the module docstring."""

    def __init__(self, connect: Callable[[], BrokerClient], topic: str) -> None:
        self.topic = topic
        self.counts = TraceCounts()
        self._connect = connect
        self._client: BrokerClient | None = None
        self._pending: deque[_Chunk] = deque()
        self._waiting = 0  # records in ``_pending``
        self._waiting_bytes = 0  # their bytes and their keys'
        self._cond = threading.Condition()
        self._busy = 0  # records taken off the queue and not sent (or failed) yet
        self._failing = False  # the last send failed
        self._closed = False
        self._rr = itertools.count()
        self._last_log = 0.0
        self._thread = threading.Thread(target=self._run, name=f"rocketmq-trace-{topic}", daemon=True)
        self._thread.start()

    def add(self, records: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Queue ``(record text, its keys)`` pairs; returns at once."""
        recs, keys = [], []
        for text, ks in records:
            recs.append(text)
            keys.append("".join(f"{k} " for k in ks))
        if recs:
            self.add_arrays(pa.array(recs, pa.string()), pa.array(keys, pa.string()))

    def add_arrays(self, records: pa.Array, keys: pa.Array) -> None:
        """Queue records given as Arrow strings (no nulls): each record ended by \\x02, and per
        record its keys, each followed by a space; returns at once. Records past
        :data:`MAX_PENDING` bytes waiting are dropped (counted, logged)."""
        n = len(records)
        if not n:
            return
        chunk = _Chunk(records, keys)
        with self._cond:
            kept = chunk.fitting(MAX_PENDING - self._waiting_bytes)
            if kept:
                self._pending.append(chunk)
                self._waiting += kept
                self._waiting_bytes += chunk.size
                self._cond.notify()
            self.counts.dropped += n - kept
        if kept < n:
            self._note(f"{n - kept} trace records dropped: {MAX_PENDING // (1024 * 1024)} MiB of records were waiting "
                       f"to be sent to {self.topic!r}")

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every record queued so far to be sent (or to fail);
        True when none is left. While sends fail (the trace topic missing, its broker out of
        reach) the wait is :data:`FAILING_FLUSH_S` at most: a task's end does not pay a full
        wait each time for records that are not going anywhere."""
        if self._failing:
            timeout_s = min(timeout_s, FAILING_FLUSH_S)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._waiting or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (up to ``timeout_s``), stop the thread, close the client."""
        self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        with self._cond:  # a thread still sending keeps its client (it ends with the process)
            client = None if self._thread.is_alive() else self._client
            self._client = None
        if client is not None:
            client.close()

    # -- the sending thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if not self._waiting:
                    return
                try:
                    body, keys, n = self._take()
                except Exception as exc:  # never let the thread die: what is queued is dropped
                    body, keys, n = b"", b"", self._waiting
                    self._pending.clear()
                    self._waiting = self._waiting_bytes = 0
                    self.counts.failed += n
                    self._cond.notify_all()
                    failure: str | None = f"{n} trace records to {self.topic!r} dropped: {exc!r}"
                else:
                    failure = None
                    self._busy = n
            if failure is not None:
                self._note(failure)
                continue
            try:
                self._send(body, keys)
            except Exception as exc:  # never let tracing stop: count, log, go on
                self.counts.failed += n
                self._failing = True
                self._note(f"sending {n} trace records to {self.topic!r} failed: {exc}{_hint(exc, self.topic)}")
            else:
                self.counts.sent += n
                self._failing = False
            finally:
                with self._cond:
                    self._busy = 0
                    self._cond.notify_all()

    def _take(self) -> tuple[bytes, bytes, int]:
        """The records of the next trace message and their keys (called holding the lock)."""
        bodies, keys, count = [], [], 0
        body_room, keys_room = MAX_BODY, MAX_KEYS_TEXT
        pending = self._pending
        while pending and body_room > 0 and keys_room > 0:
            chunk = pending[0]
            body, ks, n = chunk.take(body_room, keys_room, 0 if count else 1)
            if not n:
                break
            bodies.append(body)
            keys.append(ks)
            self._waiting_bytes -= len(body) + len(ks)
            count += n
            body_room -= len(body)
            keys_room -= len(ks)
            if not len(chunk):
                pending.popleft()
        self._waiting -= count
        return b"".join(bodies), b"".join(keys), count

    def _send(self, body: bytes, keys: bytes) -> None:
        # a message's SubBefore and SubAfter may share a trace message: each key once
        unique = " ".join(dict.fromkeys(k for k in keys.decode().split(" ") if k))
        props = {PropertyKey.KEYS: unique, PropertyKey.UNIQ_KEY: uuid.uuid4().hex.upper(), PropertyKey.WAIT: "true"}
        if self._client is None:
            self._client = self._connect()
        client = self._client
        queues = client.message_queues(self.topic, writable=True)
        if not queues:
            raise RocketMQSparkError(f"topic {self.topic!r} has no writable queue")
        mq = queues[next(self._rr) % len(queues)]
        client.send_batch(mq, [BatchEntry(body, encode_properties(props))], producer_group=TRACE_PRODUCER_GROUP)

    def _note(self, what: str) -> None:
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            c = self.counts
            log.warning("message trace: %s (so far in this process: %d records sent, %d failed, %d dropped; "
                        "tracing never fails the query)", what, c.sent, c.failed, c.dropped)


def _hint(exc: BaseException, topic: str) -> str:
    text = str(exc).lower()
    if "topic" in text and ("not exist" in text or "no route" in text or "not found" in text):
        return (f". Create the topic {topic!r} (Apache RocketMQ creates RMQ_SYS_TRACE_TOPIC with "
                "traceTopicEnable=true in broker.conf), or name another with the option traceTopic")
    return ""


_lock = threading.Lock()
_dispatchers: dict[Hashable, TraceDispatcher] = {}


def dispatcher(topic: str, namesrv: Sequence[str], endpoints: str | None, credentials: Credentials | None,
               tls: TlsConfig | None, config: ClientConfig | None = None) -> TraceDispatcher:
    """The process's dispatcher of trace topic ``topic`` (as it travels) on the brokers of these
    settings: one thread and one client however many tasks (reads and writes) trace there. The
    client, opened on first use, has no namespace: the topic is already wrapped."""
    key: Hashable = (topic, tuple(namesrv), endpoints, credentials, tls)

    def open_client() -> BrokerClient:
        from . import connect  # (the package imports its modules first)

        return connect(namesrv, endpoints, config, credentials=credentials, tls=tls)

    with _lock:
        d = _dispatchers.get(key)
        if d is None:
            d = _dispatchers[key] = TraceDispatcher(open_client, topic)
        return d


def _close_all() -> None:
    with _lock:
        ds = list(_dispatchers.values())
        _dispatchers.clear()
    for d in ds:
        d.close(2.0)


atexit.register(_close_all)
