"""A running query as a member of its consumer group: what RocketMQ's consumers do to be seen
by the brokers and their tools, done for a Spark query's planning side, over either transport.
A client's :meth:`~.contract.BrokerClient.join_group` makes one of these two members:

:class:`RemotingGroupMember` (the classic protocol) sends HEART_BEAT (its client id,
CONSUME_ACTIVELY, CLUSTERING, one subscription per topic) to every broker serving its topics,
again every ``interval_s`` (the Java client's 30 s), UNREGISTER_CLIENT when closed; the brokers
list it as an online consumer of the group (``mqadmin consumerConnection``) while its connection
stays open. On that connection the brokers send it requests: RESET_CONSUMER_CLIENT_OFFSET (an
operator reset the group's offsets: kept for :meth:`RemotingGroupMember.take_resets`) and
GET_CONSUMER_RUNNING_INFO (answered from the ``running_info`` callback: what the query has
planned, processed and committed, for ``mqadmin consumerStatus``).

:class:`GrpcGroupMember` (the 5.x protocol) is a simple consumer's Telemetry session, a
Heartbeat every ``interval_s`` and NotifyClientTermination when closed: listed, but the protocol
pushes no resets and asks no running info.

Each member reaches its transport through the calls it needs (:class:`RemotingGroupCalls`,
:class:`GrpcGroupCalls`), so the transports import this module and not the other way round.

Thread safety: the heartbeat runs on a daemon thread, broker requests arrive on the
connections' reader threads; ``take_resets`` may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import RocketMQSparkError
from ..model import MessageQueue
from ..remoting.codes import RequestCode
from ..remoting.frame import RemotingCommand
from .connection import RemotingConnection
from .contract import GroupPresence, QueueStatus, ResetNotice
from .retry import ClientConfig, bounded
from .tables import parse_offset_table

log = logging.getLogger(__name__)

# GroupPresence, QueueStatus and ResetNotice are the contract's; named here too, where a reader
# of membership looks for them
__all__ = ["GroupPresence", "GrpcGroupCalls", "GrpcGroupMember", "QueueStatus", "RemotingGroupCalls",
           "RemotingGroupMember", "ResetNotice", "crashed_member"]

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


class RemotingGroupCalls(Protocol):
    """What a :class:`RemotingGroupMember` uses of the remoting client it owns (a
    :class:`~.remoting.RemotingClient`): its routes, consumer requests and identity, and the
    hook that hands it the requests brokers send on the client's connections."""

    namesrv_addrs: list[str]
    config: ClientConfig
    on_request: Callable[[RemotingConnection, RemotingCommand], None] | None

    @property
    def client_id(self) -> str: ...

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]: ...

    def broker_addr(self, broker: str, topic: str | None = None) -> str: ...

    def heartbeat_consumer(self, group: str, client_id: str, broker_addr: str, subscriptions: dict[str, str], *,
                           consume_type: str = ..., expression_type: str = ...) -> None: ...

    def unregister_consumer(self, group: str, client_id: str, broker_addr: str, *,
                            timeout_s: float | None = None) -> None: ...

    def subscription_data(self, topic: str, expression: str, expression_type: str = ...) -> dict[str, Any]: ...

    def close(self) -> None: ...


class GrpcSession(Protocol):
    """An open Telemetry stream, ended by :meth:`close`."""

    def close(self) -> None: ...


class GrpcGroupCalls(Protocol):
    """What a :class:`GrpcGroupMember` uses of the gRPC client (a
    :class:`~.grpc_client.GrpcClient`, which builds the messages): one endpoint's simple-consumer
    calls; each raises the call's error."""

    def consumer_session(self, group: str, subscriptions: dict[str, str], address: str) -> GrpcSession:
        """A Telemetry stream to ``address`` whose settings name a simple consumer of ``group``
        with ``subscriptions``, open once the endpoint answered its settings (or a request
        timeout passed)."""

    def heartbeat_consumer(self, group: str, address: str) -> None:
        """A simple consumer's Heartbeat of ``group``."""

    def notify_termination(self, group: str, address: str) -> None:
        """NotifyClientTermination: this client leaves ``group``."""


class _Heartbeats:
    """What both members do on a clock: a heartbeat now (on the caller's thread), then one every
    ``interval_s`` on a daemon thread until :meth:`_stop_beating`."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def heartbeat(self) -> None:
        raise NotImplementedError

    def _start_beating(self, thread_name: str) -> None:
        self.heartbeat()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.heartbeat()

    def _stop_beating(self) -> None:
        """Stop the thread; a heartbeat under way is waited for up to 5 s."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


class RemotingGroupMember(_Heartbeats):
    """One query's membership of ``group`` on the brokers of ``subscriptions`` (topic -> tag
    expression), over ``client``, a remoting client of its own that it takes over (the brokers'
    requests on its connections come to the member) and closes with itself: its heartbeat thread
    shares no connection or route cache with the query's planning thread, and the brokers send
    their requests on the connections it heartbeats on. ``running_info()`` returns the queues'
    :class:`QueueStatus`; it is called from a connection's reader thread."""

    def __init__(self, client: RemotingGroupCalls, group: str, subscriptions: dict[str, str],
                 running_info: Callable[[], dict[MessageQueue, QueueStatus]], *,
                 interval_s: float = HEARTBEAT_INTERVAL_S, expression_type: str = "TAG") -> None:
        super().__init__(interval_s)
        self.client = client
        client.on_request = self._on_request
        self.group = group
        self.subscriptions = dict(subscriptions)
        self.expression_type = expression_type  # of every subscription: TAG or SQL92
        self.running_info = running_info
        self.client_id = f"{client.client_id}@{id(self):x}"
        self.started_ms = int(time.time() * 1000)
        self._resets: list[ResetNotice] = []
        self._lock = threading.Lock()
        self._addrs: set[str] = set()
        #: brokers whose latest heartbeat failed (not answering: close does not wait for them)
        self._failing: set[str] = set()

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """One heartbeat round now (so the brokers list the query before its first batch),
        then one every ``interval_s`` on a daemon thread."""
        self._start_beating(f"rocketmq-member-{self.group}")

    def close(self) -> None:
        """Stop the heartbeats and unregister from every broker (best effort, one attempt each,
        none to a broker whose latest heartbeat failed: a broker that is down drops the client
        when its connection closes, and a query's stop must not wait on it). A heartbeat still
        under way when the wait for the thread ends sees the stop and unregisters where it
        registered."""
        self._stop_beating()
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
                                               consume_type="CONSUME_ACTIVELY", expression_type=self.expression_type)
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

    def _on_request(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        """A broker's request on one of the member's connections (its heartbeats' channels)."""
        ext = cmd.ext_fields
        if cmd.code == RequestCode.RESET_CONSUMER_CLIENT_OFFSET and ext.get("group") == self.group:
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
        subs = [self.client.subscription_data(topic, expr, self.expression_type)
                for topic, expr in sorted(self.subscriptions.items())]
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


class GrpcGroupMember(_Heartbeats):
    """A running query's presence in ``group`` over gRPC, at one endpoint ``address`` of
    ``client`` (see :meth:`~.grpc_client.GrpcClient.join_group`): heartbeats that fail are
    logged, the next one is tried on time."""

    def __init__(self, client: GrpcGroupCalls, address: str, group: str, subscriptions: dict[str, str], *,
                 interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        super().__init__(interval_s)
        self.client = client
        self.address = address
        self.group = group
        self.subscriptions = dict(subscriptions)
        self._session: GrpcSession | None = None

    def start(self) -> None:
        """Open the session, one heartbeat now, then one every ``interval_s`` on a daemon thread."""
        self._session = self.client.consumer_session(self.group, self.subscriptions, self.address)
        self._start_beating(f"rocketmq-grpc-member-{self.group}")

    def heartbeat(self) -> None:
        try:
            self.client.heartbeat_consumer(self.group, self.address)
        except RocketMQSparkError as exc:
            log.info("heartbeat of group %s to %s failed: %s", self.group, self.address, exc)

    def take_resets(self) -> list[ResetNotice]:
        return []  # the 5.x protocol pushes none

    def close(self) -> None:
        """Stop the heartbeats, tell the endpoint (best effort) and end the session."""
        self._stop_beating()
        try:
            self.client.notify_termination(self.group, self.address)
        except RocketMQSparkError as exc:
            log.info("termination notice of group %s to %s failed: %s", self.group, self.address, exc)
        if self._session is not None:
            self._session.close()
