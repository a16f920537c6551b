"""The fault suite's producer and its send log: every message sent, and what became of its send.

Each message carries a unique id, an integer from 0 up, as the first :data:`ID_DIGITS` ASCII
digits of its body (the rest is padding); every send attempt uses new ids, so a message is
never sent twice and any second copy downstream is a duplicate made downstream.

The producer runs one thread per queue of the topic (so a fault at one broker does not stall
the queues of the other, and each queue's sends are strictly one after another: the ids of a
queue grow with its offsets), each sending batches of ``batch`` messages at its share of
``rate``, with no retries of its own. Each send's outcome goes to the send log (JSON lines,
flushed at once and fsynced every second) after the broker answered or the request failed:

``acked``    the broker answered SUCCESS: the messages are stored (at ``offset`` onwards)
``unknown``  the request may have reached the broker (a timeout, the connection lost after it
             was written, or an answer that says stored-but-not-flushed): they may or may not
             be stored, so the checker counts them neither as lost when absent nor as
             duplicates when present once
``failed``   never written (no connection, no route) or refused by the broker: not stored
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties
from rocketmq_spark.errors import ConnectionFailedError, RocketMQSparkError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting.codes import ResponseCode
from rocketmq_spark.remoting.frame import RemotingCommand

log = logging.getLogger(__name__)

__all__ = ["ID_DIGITS", "Producer", "SendLog", "body_of", "id_of", "queue_key"]

ID_DIGITS = 10
#: answers meaning "stored, but not flushed/replicated in time": stored, yet not a plain ack
_STORED_MAYBE = (ResponseCode.FLUSH_DISK_TIMEOUT, ResponseCode.SLAVE_NOT_AVAILABLE, ResponseCode.FLUSH_SLAVE_TIMEOUT)


def body_of(msg_id: int, size: int) -> bytes:
    """The body of message ``msg_id``: its id in :data:`ID_DIGITS` digits, padded to ``size``."""
    head = b"%0*d" % (ID_DIGITS, msg_id)
    return head + b"." * max(0, size - len(head))


def id_of(body: bytes | str | None) -> int | None:
    """The id a body carries, None when it carries none (not a message of the suite)."""
    if body is None:
        return None
    head = body[:ID_DIGITS]
    if isinstance(head, str):
        head = head.encode()
    return int(head) if len(head) == ID_DIGITS and head.isdigit() else None


def queue_key(mq: MessageQueue) -> str:
    """``broker:queueId``, the form the send log and the checker name queues by."""
    return f"{mq.broker}:{mq.queue_id}"


@dataclass
class SendLog:
    """What the send log says: per id, the queue of its send and the outcome."""

    #: id -> queue key, for acked sends; ``acked_offsets``: id -> its offset in that queue
    acked: dict[int, str] = field(default_factory=dict)
    acked_offsets: dict[int, int] = field(default_factory=dict)
    unknown: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    #: lines that could not be read (a torn last line is normal after a crash of the writer)
    bad_lines: int = 0

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SendLog:
        out = cls()
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                    first, n, status = int(rec["first"]), int(rec["n"]), rec["status"]
                except (ValueError, KeyError, TypeError):
                    out.bad_lines += 1
                    continue
                ids = range(first, first + n)
                if status == "acked":
                    offset = rec.get("offset")
                    for i, msg_id in enumerate(ids):
                        out.acked[msg_id] = rec["queue"]
                        if offset is not None:
                            out.acked_offsets[msg_id] = int(offset) + i
                elif status == "unknown":
                    out.unknown.update(ids)
                else:
                    out.failed.update(ids)
        return out


class _LogWriter:
    """Appends JSON lines, flushed at once, fsynced at most every second and on close."""

    def __init__(self, path: str) -> None:
        self._f: IO[str] = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self._synced = time.monotonic()

    def write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)
            self._f.flush()
            if time.monotonic() - self._synced >= 1.0:
                os.fsync(self._f.fileno())
                self._synced = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()


class Producer:
    """Sends ``rate`` messages a second (``batch`` per request) to every queue of ``topic``
    through the name servers ``namesrv``, logging each send to ``log_path``.

    :meth:`start` begins, :meth:`pause` stops sending (returning once no send is in flight)
    until :meth:`resume`, :meth:`stop` ends it and closes the log. ``counts`` tells how many
    messages each outcome had so far."""

    def __init__(self, namesrv: str, topic: str, log_path: str, *, rate: float = 200.0, batch: int = 10,
                 body_size: int = 100, request_timeout_s: float = 3.0) -> None:
        self.namesrv = namesrv
        self.topic = topic
        self.rate = rate
        self.batch = batch
        self.body_size = body_size
        self.config = ClientConfig(request_timeout_s=request_timeout_s, connect_timeout_s=2.0, retries=1)
        self._log = _LogWriter(log_path)
        self._next_id = 0
        self._ids = threading.Lock()
        self._running = threading.Event()  # set: sending allowed
        self._stopping = threading.Event()
        self._busy = 0
        self._idle = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.counts = {"acked": 0, "unknown": 0, "failed": 0}
        self.queues: list[MessageQueue] = []
        #: seconds spent sending (not paused) before the latest pause or stop, and since when
        #: sending is allowed again (None: paused, stopped or not started)
        self._active_s = 0.0
        self._active_since: float | None = None

    # -- control ---------------------------------------------------------------------------

    def start(self) -> None:
        admin = RemotingClient(self.namesrv, self.config)
        try:
            self.queues = sorted(admin.message_queues(self.topic, refresh=True),
                                 key=lambda q: (q.broker, q.queue_id))
        finally:
            admin.close()
        self._running.set()
        self._active_since = time.monotonic()
        per_queue = self.rate / len(self.queues)
        for mq in self.queues:
            t = threading.Thread(target=self._loop, args=(mq, per_queue), name=f"producer-{queue_key(mq)}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def pause(self, timeout_s: float = 30.0) -> None:
        """No new send starts; returns once those in flight ended (or ``timeout_s`` passed)."""
        self._running.clear()
        self._account()
        with self._idle:
            self._idle.wait_for(lambda: self._busy == 0, timeout_s)

    def resume(self) -> None:
        if self._active_since is None and not self._stopping.is_set():
            self._active_since = time.monotonic()
        self._running.set()

    def _account(self) -> None:
        if self._active_since is not None:
            self._active_s += time.monotonic() - self._active_since
            self._active_since = None

    @property
    def active_s(self) -> float:
        """Seconds the producer was allowed to send (started, not paused, not stopped): what
        the number of messages it sent can be held against."""
        since = self._active_since
        return self._active_s + (time.monotonic() - since if since is not None else 0.0)

    def stop(self) -> None:
        """Ends every thread (each finishes the send it is in) and closes the log."""
        self._account()
        self._stopping.set()
        self._running.set()
        for t in self._threads:
            t.join(60)
        self._log.close()

    @property
    def stopped(self) -> bool:
        return self._stopping.is_set()

    @property
    def sent(self) -> int:
        return sum(self.counts.values())

    # -- sending ---------------------------------------------------------------------------

    def _take_ids(self) -> int:
        with self._ids:
            first = self._next_id
            self._next_id += self.batch
            return first

    def _loop(self, mq: MessageQueue, rate: float) -> None:
        client = RemotingClient(self.namesrv, self.config)
        interval = self.batch / rate
        next_at = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._running.wait()
                if self._stopping.is_set():
                    return
                with self._idle:
                    if not self._running.is_set():
                        continue
                    self._busy += 1
                try:
                    status = self._send_once(client, mq)
                finally:
                    with self._idle:
                        self._busy -= 1
                        self._idle.notify_all()
                next_at = max(next_at + interval, time.monotonic() - interval)
                if status == "failed":  # the broker is away: do not spin on it
                    next_at = max(next_at, time.monotonic() + 0.5)
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stopping.wait(delay)
        finally:
            client.close()

    def _send_once(self, client: RemotingClient, mq: MessageQueue) -> str:
        first = self._take_ids()
        entries = [BatchEntry(body_of(first + i, self.body_size), encode_properties({"KEYS": str(first + i)}))
                   for i in range(self.batch)]
        rec: dict[str, Any] = {"first": first, "n": self.batch, "queue": queue_key(mq), "t": round(time.time(), 3)}
        offset = None
        try:
            req = client.send_request(mq, entries)
            addr = client.broker_addr(mq.broker, mq.topic)
            conn = client.connection(addr)  # connect errors: nothing was written
        except RocketMQSparkError as exc:
            status, rec["error"] = "failed", str(exc)[:300]
        else:
            try:
                resp = conn.invoke(RemotingCommand(req.code, ext_fields=req.ext_fields, body=req.body),
                                   self.config.request_timeout_s, f"send to {mq}")
            except ConnectionFailedError as exc:  # written (or maybe written): the outcome is unknown
                status, rec["error"] = "unknown", str(exc)[:300]
            else:
                if resp.code == ResponseCode.SUCCESS:
                    status = "acked"
                    offset = int(resp.ext_fields.get("queueOffset", -1))
                elif resp.code in _STORED_MAYBE:
                    status, rec["error"] = "unknown", f"code {resp.code} {resp.remark}"
                else:
                    status, rec["error"] = "failed", f"code {resp.code} {resp.remark}"
        rec["status"] = status
        if offset is not None:
            rec["offset"] = offset
        self._log.write(rec)
        with self._ids:
            self.counts[status] += self.batch
        return status
