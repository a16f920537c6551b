"""A running query as a member of its consumer group: what RocketMQ's consumers do to be seen
by the brokers and their tools, done for a Spark query's planning side.

Over the classic protocol a member sends HEART_BEAT (its client id, CONSUME_ACTIVELY,
CLUSTERING, one subscription per topic) to every broker serving its topics, again every
``interval_s`` (the Java client's 30 s), UNREGISTER_CLIENT when closed; the brokers list it as
an online consumer of the group (``mqadmin consumerConnection``) while its connection stays
open. On that connection the brokers send it requests: RESET_CONSUMER_CLIENT_OFFSET (an
operator reset the group's offsets: kept for :meth:`GroupMember.take_resets`) and
GET_CONSUMER_RUNNING_INFO (answered from the ``running_info`` callback: what the query has
planned, processed and committed, for ``mqadmin consumerStatus``).

Thread safety: the heartbeat runs on a daemon thread, broker requests arrive on the
connections' reader threads; :meth:`GroupMember.take_resets` may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import RocketMQSparkError
from ..model import MessageQueue
from .retry import bounded

if TYPE_CHECKING:
    from .retry import ClientConfig

log = logging.getLogger(__name__)

__all__ = ["GroupMember", "GroupPresence", "QueueStatus", "ResetNotice", "crashed_member"]

#: Java's heartbeatBrokerInterval
HEARTBEAT_INTERVAL_S = 30.0
#: how long leaving the group waits for a broker's answer (seconds): a query's stop waits for
#: it, and a broker that does not answer drops the client with its connection anyway
_UNREGISTER_TIMEOUT_S = 3.0


def crashed_member(client_id: str) -> bool:
    """Whether ``client_id`` names a :class:`GroupMember` of a process of this host that is gone
    (``rocketmq-spark@<host>@<pid>@<member>``, see :attr:`GroupMember.client_id`): a driver that
    crashed where a broker could not see its connection close (a partition, a paused broker)
    stays listed there until the broker's channel expiry (120 s on Apache RocketMQ). Nothing
    consumes under such an id; a restarted query of the group may pass it. Ids of other hosts,
    of this process, of live processes and of other clients are never taken for gone."""
    parts = client_id.split("@")
    if len(parts) != 4 or parts[0] != "rocketmq-spark" or parts[1] != socket.gethostname():
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    try:  # killed but not yet reaped by its parent
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[:1] == ["Z"]
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class ResetNotice:
    """A broker's RESET_CONSUMER_CLIENT_OFFSET: the group's new offsets of one topic's queues
    (next-offsets) and the time (epoch ms) they were computed for."""

    offsets: dict[MessageQueue, int]
    timestamp_ms: int
    broker_addr: str


class GroupPresence(Protocol):
    """What a reader holds of its membership, whichever transport: the resets pushed to it
    (oldest first, each once) and leaving the group."""

    def take_resets(self) -> list[ResetNotice]: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class QueueStatus:
    """A queue as the query sees it (next-offsets; -1 when not known yet)."""

    planned: int = -1  # end of the last planned batch
    processed: int = -1  # what Spark finished (what the query may commit)
    committed: int = -1  # what the broker holds for the group, as the query last wrote or read it
    last_planned_ms: int = 0
    last_committed_ms: int = 0


class GroupMember:
    """One query's membership of ``group`` on the brokers of ``subscriptions`` (topic -> tag
    expression), over a :class:`~.remoting.RemotingClient` of its own, closed with the member:
    its heartbeat thread shares no connection or route cache with the query's planning thread,
    and the brokers send their requests on the connections it heartbeats on. ``running_info()``
    returns the queues' :class:`QueueStatus`; it is called from a connection's reader thread."""

    def __init__(self, namesrv_addrs: Sequence[str], config: ClientConfig, group: str, subscriptions: dict[str, str],
                 running_info: Callable[[], dict[MessageQueue, QueueStatus]], *,
                 interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        from .remoting import RemotingClient

        self.client = RemotingClient(namesrv_addrs, config, on_request=self._on_request)
        self.group = group
        self.subscriptions = dict(subscriptions)
        self.running_info = running_info
        self.interval_s = interval_s
        self.client_id = f"{self.client.client_id}@{id(self):x}"
        self.started_ms = int(time.time() * 1000)
        self._resets: list[ResetNotice] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._addrs: set[str] = set()
        #: brokers whose latest heartbeat failed (not answering: close does not wait for them)
        self._failing: set[str] = set()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """One heartbeat round now (so the brokers list the query before its first batch),
        then one every ``interval_s`` on a daemon thread."""
        self.heartbeat()
        self._thread = threading.Thread(target=self._run, name=f"rocketmq-member-{self.group}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the heartbeats and unregister from every broker (best effort, one attempt each,
        none to a broker whose latest heartbeat failed: a broker that is down drops the client
        when its connection closes, and a query's stop must not wait on it). A heartbeat still
        under way when the wait for the thread ends sees the stop and unregisters where it
        registered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            addrs = sorted(self._addrs - self._failing)
        for addr in addrs:
            self._unregister(addr)
        self.client.close()

    def _unregister(self, addr: str) -> None:
        try:
            with bounded(0.0):
                self.client.unregister_consumer(self.group, self.client_id, addr, timeout_s=min(
                    self.client.config.request_timeout_s, _UNREGISTER_TIMEOUT_S))
        except RocketMQSparkError as exc:
            log.info("unregister of group %s from %s failed (it drops us with the connection): %s",
                     self.group, addr, exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.heartbeat()

    def heartbeat(self) -> None:
        """HEART_BEAT to every broker serving the topics now (new brokers included)."""
        addrs: set[str] = set()
        for topic in self.subscriptions:
            try:
                addrs |= {self.client.broker_addr(q.broker, topic) for q in self.client.message_queues(topic)}
            except RocketMQSparkError as exc:
                log.info("heartbeat of group %s: no route of topic %s now: %s", self.group, topic, exc)
        for addr in sorted(addrs):
            if self._stop.is_set():
                return
            try:
                self.client.heartbeat_consumer(self.group, self.client_id, addr, self.subscriptions,
                                               consume_type="CONSUME_ACTIVELY")
            except RocketMQSparkError as exc:
                log.info("heartbeat of group %s to %s failed: %s", self.group, addr, exc)
                with self._lock:
                    self._failing.add(addr)
                continue
            with self._lock:
                self._addrs.add(addr)
                self._failing.discard(addr)
            if self._stop.is_set():  # closed meanwhile: do not leave this registration behind
                self._unregister(addr)

    # -- requests from brokers --------------------------------------------------------

    def take_resets(self) -> list[ResetNotice]:
        """The resets brokers pushed since the last call, oldest first."""
        with self._lock:
            out, self._resets = self._resets, []
        return out

    def _on_request(self, conn: Any, cmd: Any) -> None:
        """A broker's request on one of the member's connections (its heartbeats' channels)."""
        from ..remoting.codes import RequestCode

        ext = cmd.ext_fields
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET and ext.get("group") == self.group:
            from .remoting import parse_offset_table

            topic = ext.get("topic", "")
            offsets = {mq: off for mq, off in parse_offset_table(cmd.body).items() if mq.topic == topic}
            try:
                ts = int(ext.get("timestamp", "-1"))
            except ValueError:
                ts = -1
            log.info("group %s: broker %s reset %d queues of %s (timestamp %d)", self.group, conn.address,
                     len(offsets), topic, ts)
            with self._lock:
                self._resets.append(ResetNotice(offsets, ts, conn.address))
        elif cmd.code == RequestCode.GET_CONSUMER_RUNNING_INFO and ext.get("consumerGroup") == self.group:
            conn.reply(cmd.response_to(body=self.running_info_body()))

    def running_info_body(self) -> bytes:
        """ConsumerRunningInfo as fastjson writes it (map keys that are MessageQueue objects are
        written as objects, which Java's tools read back)."""
        props = {
            "PROP_CONSUME_TYPE": "CONSUME_ACTIVELY",
            "PROP_CONSUMEORDERLY": "false",
            "PROP_CLIENT_VERSION": "rocketmq-spark",
            "PROP_CONSUMER_START_TIMESTAMP": str(self.started_ms),
            "PROP_NAMESERVER_ADDR": ";".join(self.client.namesrv_addrs),
            "PROP_THREADPOOL_CORE_SIZE": "1",
            "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
        }
        subs = [self.client.subscription_data(topic, expr) for topic, expr in sorted(self.subscriptions.items())]
        try:
            queues = self.running_info()
        except Exception:  # a broken callback must not leave the tool without an answer
            log.exception("running info of group %s", self.group)
            queues = {}
        entries = []
        for mq, st in sorted(queues.items()):
            key = json.dumps({"brokerName": mq.broker, "queueId": mq.queue_id, "topic": mq.topic},
                             separators=(",", ":"))
            info = {"commitOffset": st.committed, "cachedMsgMinOffset": st.processed,
                    "cachedMsgMaxOffset": st.planned, "cachedMsgCount": max(0, st.planned - st.processed)
                    if st.planned >= 0 and st.processed >= 0 else 0,
                    "cachedMsgSizeInMiB": 0, "transactionMsgMinOffset": 0, "transactionMsgMaxOffset": 0,
                    "transactionMsgCount": 0, "locked": False, "tryUnlockTimes": 0, "lastLockTimestamp": 0,
                    "droped": False, "lastPullTimestamp": st.last_planned_ms,
                    "lastConsumeTimestamp": st.last_committed_ms}
            entries.append(f"{key}:{json.dumps(info, separators=(',', ':'))}")
        body = (f'{{"jstack":"","mqTable":{{{",".join(entries)}}},"properties":{json.dumps(props)},'
                f'"statusTable":{{}},"subscriptionSet":{json.dumps(subs)}}}')
        return body.encode()
