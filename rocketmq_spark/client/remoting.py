"""Remoting client: broker operations over name-server routes (:mod:`.routes`), with bounded retries.

Sockets open lazily on first use and are dropped when pickled, so a client can be
built on Spark's driver and shipped to executors.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..codec import (
    BatchEntry,
    EncodedBatch,
    MessageRecord,
    decode_records,
    encode_batch,
    iter_records,
    java_string_hash,
    join_properties,
    offset_of_msg_id,
    subscribed_tags,
)
from ..errors import (
    BrokerError,
    ConnectionFailedError,
    OffsetResetPendingError,
    ProtocolError,
    RequestTimeoutError,
    RocketMQSparkError,
    broker_error,
)
from ..model import MessageQueue, PullResult, SendResult, Txn
from ..names import AUTO_CREATE_TOPIC, retry_topic
from ..remoting.acl import Credentials, request_needs, sign_request
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import FLAG_ONEWAY, RemotingCommand, plain_json
from ..remoting.route import MASTER_ID, TopicRouteData, loads_lenient
from .admin import RemotingAdmin
from .connection import RemotingConnection, Reply
from .contract import CheckHandler, GroupPresence, QueueStatus
from .membership import RemotingGroupMember
from .retry import ClientConfig, may_retry, retrying
from .routes import DEFAULT_TOPIC_QUEUE_NUMS, NameServers
from .tables import object_body, parse_topic_stats

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

__all__ = ["ClientConfig", "Credentials", "RemotingClient", "parse_namesrv_addr"]

T = TypeVar("T")

#: per-queue requests in flight at once in the pipelined calls (max/min offsets, group offsets)
_WINDOW = 256
#: the ``version`` a 5.0.0 broker puts in its responses (MQVersion.Version.V5_0_0's ordinal;
#: 4.9.7 answers 407, 5.3.3 answers 479, 5.5.0 answers 513)
_V5_0_0 = 413
#: V5_1_1's: the first release whose search by time answers the first message stored at or
#: after the time (BoundaryType.LOWER); the ones before answer the nearest message
_V5_1_1 = 435

#: the remark of a broker that ignored a commit because a server-side reset waits (5.x and ours)
_RESET_WAITS = "Offset has been previously reset"
#: per-queue requests a slave serves, sent where reads go (:meth:`.NameServers.read_addr`): the
#: Java consumer reads, and commits and queries its offsets, on a slave while the master is down
_READ_CODES = frozenset({RequestCode.PULL_MESSAGE, RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
                         RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, RequestCode.QUERY_CONSUMER_OFFSET,
                         RequestCode.UPDATE_CONSUMER_OFFSET, RequestCode.QUERY_CONSUME_QUEUE})

#: how a broker without enablePropertyFilter refuses an SQL92 pull (PullMessageProcessor's remark)
_NO_PROPERTY_FILTER = "does not support consumer to filter message by"

#: the range of a Java long, what the broker's offsets are
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1

_PULL_STATUS: dict[int, str] = {
    ResponseCode.SUCCESS: "FOUND",
    ResponseCode.PULL_NOT_FOUND: "NO_NEW_MSG",
    ResponseCode.PULL_RETRY_IMMEDIATELY: "NO_MATCHED_MSG",
    ResponseCode.PULL_OFFSET_MOVED: "OFFSET_ILLEGAL",
}


def _header_template(ext: dict[str, str], holes: Sequence[str]) -> tuple[str, ...] | None:
    """Header fields ``ext`` as the JSON header writes them (in their order), but for the values
    of ``holes`` (keys of ``ext``): the text before, between and after those values; None when a
    field needs escaping. A request sent per message or per pull fills in only the holes:
    encoding its header field by field was over a tenth of a read task's or a send's time."""
    plain = {k: plain_json(v) for k, v in ext.items() if k not in holes}
    if any(v is None for v in plain.values()):
        return None
    pieces: list[str] = []
    text = ""
    for n, k in enumerate(ext):
        sep = "," if n else ""
        if k in holes:
            pieces.append(f'{text}{sep}"{k}":"')
            text = '"'
        else:
            text += f'{sep}"{k}":"{plain[k]}"'
    return (*pieces, text)


def _send_template(ext: dict[str, str]) -> tuple[str, ...] | None:
    """:func:`_header_template` of a single send's fields (in :meth:`RemotingClient.send_request`'s
    order), the born time (``g``) and properties (``i``) left to fill; None when the order is
    another. (A batch send's header comes once per batch: the encoder writes it.)"""
    return _header_template(ext, ("g", "i")) if list(ext) == list("abcdefghijkmn") else None


#: a pull's header fields (the offset left to fill) and their JSON template
#: (:func:`_header_template`), by consumer group, queue, messages asked, subscription, long-polling
#: time and expression type
_PULLS: dict[tuple[str, MessageQueue, int, str, int, str], tuple[dict[str, str], tuple[str, ...] | None]] = {}


#: a single send's header fields (born time and properties left to fill) and their JSON
#: template (:func:`_send_template`), by producer group, queue, sysFlag and message flag
_SINGLE_SENDS: dict[tuple[str, str, int, str, int, int], tuple[dict[str, str], tuple[str, ...] | None]] = {}


#: what a broker's END_TRANSACTION answer (SYSTEM_ERROR) says when the commit-log position it was
#: given holds no half message, or another record than the one named (Java brokers check the
#: record's producer group and both offsets; older ones spell the remarks lower-case). A record
#: with no producer group at all there (a plain message of a new store) makes Apache RocketMQ
#: 5.5.0 answer its NullPointerException on the missing property, named pgroupRead; a position
#: in the middle of a record, the IllegalArgumentException of the size read there. Only these
#: two exceptions: another one may be transient, and a half taken as gone is not ended again
_NOT_THE_HALF = ("find prepared transaction message failed", "the producer group wrong",
                 "the transaction state table offset wrong", "the commit log offset wrong",
                 'because "pgroupread" is null', "illegalargumentexception: newlimit < 0")


def _half_gone(code: int, remark: str | None) -> bool:
    """A broker's answer to END_TRANSACTION of a half message it does not hold (:data:`_NOT_THE_HALF`).
    Not "ended before": Java brokers and the embedded one apply a second END of a half still in
    the commit log (it stays there after its END), so the half is gone with its commit log (a
    store lost or replaced, or files deleted by retention)."""
    text = (remark or "").lower()
    return code == ResponseCode.SYSTEM_ERROR and any(r in text for r in _NOT_THE_HALF)


def _failed_replies(exc: RocketMQSparkError, n: int) -> list[Reply]:
    """``n`` replies already failed with ``exc``: requests that could not be written, settled
    with the ones that were."""
    out = [Reply() for _ in range(n)]
    for reply in out:
        reply.set_exception(exc)
    return out


def _every_answer(out: list[T | None], request: Callable[[int], tuple[str, str]]) -> list[T]:
    """``out`` (one slot per request, in order) once every slot is filled. Callers match answers
    to their requests by position, so a slot left empty (a connection that gave fewer answers
    than requests, a path that forgot one) must not be dropped: the answers after it would go
    to the wrong queues. ``request(i)``: (operation, address) of request ``i``, for the error."""
    missing = [i for i, r in enumerate(out) if r is None]
    if missing:
        operation, address = request(missing[0])
        raise RocketMQSparkError(f"{operation} at {address}: no answer kept for request {missing[0] + 1} of "
                                 f"{len(out)} ({len(missing)} missing); none of the answers is used, as they "
                                 "are matched to their requests by position")
    return cast("list[T]", out)


def parse_namesrv_addr(value: str | Sequence[str]) -> list[str]:
    """``"h1:9876;h2:9876"`` (``,`` also accepted) -> ["h1:9876", "h2:9876"]; ValueError for
    an entry that is not host:port."""
    items = value.replace(",", ";").split(";") if isinstance(value, str) else list(value)
    out = [a.strip() for a in items if a and a.strip()]
    for a in out:
        host, sep, port = a.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"name server address {a!r} is not host:port")
    return out


class RemotingClient(RemotingAdmin):
    """Talks to name servers and brokers over the classic remoting protocol; a
    :class:`~.contract.BrokerClient`, plus the admin calls of :class:`~.admin.RemotingAdmin`
    (topics, groups, listings, resets) for tools.

    With credentials (``credentials=`` or ``config.credentials``; the argument wins) every
    request to name servers and brokers is signed (ACL 1.0). ``on_request`` gets the requests
    brokers send on its connections (other than the check-backs :meth:`start_producer` answers),
    on the connection's reader thread, as are the check-backs.

    Threads: as the contract says, one thread at a time; only the connection table is locked."""

    compresses_bodies = True

    def __init__(
        self,
        namesrv_addr: str | Sequence[str],
        config: ClientConfig | None = None,
        *,
        on_request: Callable[[RemotingConnection, RemotingCommand], None] | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.namesrv_addrs = parse_namesrv_addr(namesrv_addr)
        if not self.namesrv_addrs:
            raise ValueError("no name server address given")
        self.config = config or ClientConfig()
        if credentials is not None:
            self.config = self.config.with_credentials(credentials)
        self.on_request = on_request
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._on_check: CheckHandler | None = None
        self._producer_group = ""
        self._producer_addrs: set[str] = set()
        self._conns: dict[str, RemotingConnection] = {}
        self._conn_lock = threading.Lock()
        self._opened: dict[str, int] = {}  # address -> connections opened to it (see connection_epoch)
        #: broker -> (the connection epoch it answered over, its boot time or None), see broker_boot_ms
        self._boots: dict[str, tuple[tuple[str, int] | None, int | None]] = {}
        #: queue -> the broker id its last pull's answer suggested for the next one (not the master)
        self._pull_from: dict[MessageQueue, int] = {}
        #: route lookups and broker addresses
        self.names = NameServers(self.namesrv_addrs, self.config, self._conn)

    def __getstate__(self) -> dict[str, Any]:
        return {"namesrv_addrs": self.namesrv_addrs, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.namesrv_addrs = state["namesrv_addrs"]
        self.config = state["config"]
        self.on_request = None
        self._init_runtime()

    # -- connections ----------------------------------------------------------------

    def _sign(self, cmd: RemotingCommand) -> None:
        creds = self.config.credentials
        if creds is not None:
            sign_request(cmd, creds)

    def connection(self, address: str) -> RemotingConnection:
        """The connection to ``address``, opened on first use or after it closed;
        ConnectionFailedError when it cannot be opened."""
        with self._conn_lock:
            conn = self._conns.get(address)
            if conn is None or conn.closed:
                # Signing lives in the connection so that every way a request leaves (send,
                # send_many, replies to check-backs, callers using connection() directly) is covered.
                conn = RemotingConnection(address, connect_timeout_s=self.config.connect_timeout_s,
                                          on_request=self._on_broker_request,
                                          signer=self._sign if self.config.credentials is not None else None,
                                          tls=self.config.tls)
                self._conns[address] = conn
                self._opened[address] = self._opened.get(address, 0) + 1
            return conn

    def connection_epoch(self, broker: str) -> tuple[str, int] | None:
        """(address, connections opened to it) of ``broker`` (the member its reads go to, see
        :meth:`.NameServers.read_addr`); None before the first one."""
        addr = self.names.read_addrs.get(broker) or self.names.broker_addrs.get(broker)
        with self._conn_lock:
            n = self._opened.get(addr, 0) if addr is not None else 0
        return (addr, n) if addr is not None and n else None

    def broker_boot_ms(self, broker: str) -> int | None:
        """When ``broker``'s store started (GET_BROKER_RUNTIME_INFO's bootTimestamp, what mqadmin
        brokerStatus shows), asked once per connection; None when the broker does not say (or
        refuses the request, e.g. under ACL). Raises the request's faults."""
        epoch = self.connection_epoch(broker)
        known = self._boots.get(broker)
        if known is not None and epoch is not None and known[0] == epoch:
            return known[1]
        addr = self.broker_addr(broker)
        op = f"runtime info of broker {broker}"
        try:
            resp: RemotingCommand | None = self.invoke(addr, RemotingCommand(RequestCode.GET_BROKER_RUNTIME_INFO), op)
        except BrokerError:  # refused (ACL, an older broker): not asked again over this connection
            resp = None
        boot: int | None = None
        if resp is not None:
            obj = loads_lenient(resp.body or b"{}")
            table = obj.get("table") if isinstance(obj, dict) else None
            raw = table.get("bootTimestamp") if isinstance(table, dict) else None
            try:
                boot = int(raw) if raw is not None else None
            except (TypeError, ValueError):
                boot = None
        self._boots[broker] = (self.connection_epoch(broker), boot)
        return boot

    def _on_broker_request(self, conn: RemotingConnection, cmd: RemotingCommand) -> None:
        """A request a broker sent on one of our connections: a transaction check-back is
        answered by the producer's handler (see :meth:`start_producer`), the rest go to
        ``on_request``."""
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE and self._on_check is not None:
            self._answer_check(conn, cmd, self._on_check)
        elif self.on_request is not None:
            self.on_request(conn, cmd)

    def _conn(self, address: str, operation: str) -> RemotingConnection:
        try:
            return self.connection(address)
        except ConnectionFailedError as exc:
            self.names.note_failed(address)
            raise ConnectionFailedError(address, operation, exc.args[0]) from None

    def close(self) -> None:
        with self._conn_lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for c in conns:
            c.close()

    def _retrying(self, fn: Callable[[], T]) -> T:
        return retrying(fn, self.config)

    def invoke(self, address: str, cmd: RemotingCommand, operation: str,
               timeout_s: float | None = None, *, ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
               started: float | None = None) -> RemotingCommand:
        """One request to ``address`` with bounded retries on transient faults; an answer
        whose code is not in ``ok`` raises the broker's error (:func:`~rocketmq_spark.errors.broker_error`).
        ``started``: when a first attempt of this request went out elsewhere (its retry budget
        counts from then, see :func:`~.retry.retrying`)."""
        timeout = timeout_s or self.config.request_timeout_s

        return retrying(lambda: self._invoke_once(address, cmd, operation, timeout, ok), self.config, started=started)

    def _invoke_once(self, address: str, cmd: RemotingCommand, operation: str, timeout: float,
                     ok: tuple[int, ...]) -> RemotingCommand:
        """One attempt of :meth:`invoke`; an address that does not answer is noted (reads of its
        group go to another member meanwhile, see :meth:`.NameServers.read_addr`)."""
        try:
            resp = self._conn(address, operation).invoke(
                RemotingCommand(cmd.code, ext_fields=cmd.ext_fields, body=cmd.body, ext_json=cmd.ext_json), timeout,
                operation)
        except (ConnectionFailedError, RequestTimeoutError):
            self.names.note_failed(address)
            raise
        self.names.note_answered(address)
        if resp.code not in ok:
            raise self._refused(resp, address, operation, cmd.code, cmd.ext_fields, cmd.body)
        return resp

    # -- name server (see :mod:`.routes`) ---------------------------------------------

    def _invoke_namesrv(self, cmd: RemotingCommand, operation: str,
                        ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        return self.names.invoke(cmd, operation, ok)

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """See :meth:`.NameServers.route`."""
        return self.names.route(topic, refresh=refresh)

    def cluster_brokers(self) -> dict[str, str]:
        """Broker name -> master address of every broker the name servers know."""
        return self.names.cluster_brokers()

    def cluster_members(self) -> dict[str, dict[int, str]]:
        """See :meth:`.NameServers.cluster_members`."""
        return self.names.cluster_members()

    def cluster_names(self) -> set[str]:
        """See :meth:`.NameServers.cluster_names`."""
        return self.names.cluster_names()

    def remember_broker_addr(self, broker: str, addr: str) -> None:
        """See :meth:`.NameServers.remember_broker_addr`."""
        self.names.remember_broker_addr(broker, addr)

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        """See :meth:`.NameServers.message_queues`."""
        return self.names.message_queues(topic, refresh=refresh, writable=writable)

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        """See :meth:`.NameServers.broker_addr`."""
        return self.names.broker_addr(broker, topic)

    def read_addr(self, broker: str, topic: str | None = None) -> str:
        """See :meth:`.NameServers.read_addr`: where reads of ``broker`` and its group's offsets go."""
        return self.names.read_addr(broker, topic)

    def offsets_home(self, broker: str) -> str | None:
        """The address the group offsets of ``broker``'s queues went to last (its master, or a
        slave while the master is down); None before any."""
        return self.names.read_addrs.get(broker)

    def _addr_of(self, broker: str) -> str:
        """The address known for ``broker``, "?" when none (for error messages: no lookup)."""
        return self.names.broker_addrs.get(broker, "?")

    def _refused(self, resp: RemotingCommand, address: str, operation: str, code: int,
                 ext: dict[str, str], body: bytes | None = None) -> BrokerError:
        """The error of a broker's answer ``resp`` to request ``code`` (``ext``, ``body``): for
        an ACL refusal, an :class:`~rocketmq_spark.errors.AccessDeniedError` naming the user
        (the access key), the resource and the action the request needed."""
        creds = self.config.credentials
        needs = request_needs(code, ext, body) if resp.code == ResponseCode.NO_PERMISSION else None
        return broker_error(resp.code, resp.remark, address=address, operation=operation,
                            user=creds.access_key if creds is not None else None, needs=needs)

    def _read_addr_of(self, mq: MessageQueue) -> str:
        """Where the last read of ``mq``'s broker went (for error messages and failure notes: no lookup)."""
        return self.names.read_addrs.get(mq.broker) or self._addr_of(mq.broker)

    # -- broker operations ----------------------------------------------------------

    def _queue_addr(self, mq: MessageQueue, code: int) -> str:
        """Where a per-queue request goes: reads and the group's offsets to :meth:`read_addr`
        (a slave while the master is down), the rest to the master."""
        if code in _READ_CODES:
            return self.names.read_addr(mq.broker, mq.topic)
        return self.broker_addr(mq.broker, mq.topic)

    def _mq_call(self, mq: MessageQueue, code: int, ext: dict[str, str], operation: str,
                 ok: tuple[int, ...] = (ResponseCode.SUCCESS,), started: float | None = None) -> RemotingCommand:
        """One per-queue request, retried (bounded); each attempt asks where it goes again, so a
        read whose master stopped answering goes on to a slave."""
        cmd = RemotingCommand(code, ext_fields={**ext, "bname": mq.broker})
        op = f"{operation} of {mq}"
        timeout = self.config.request_timeout_s
        return retrying(lambda: self._invoke_once(self._queue_addr(mq, code), cmd, op, timeout, ok), self.config,
                        started=started)

    def _mq_calls(self, calls: Sequence[tuple[MessageQueue, int, dict[str, str]]], operation: str,
                  ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> list[RemotingCommand | RocketMQSparkError]:
        """Many per-queue requests, pipelined: chunks of ``_WINDOW`` written at once to each broker's
        connection instead of one round trip each (planning thousands of queues per trigger).

        Returns one response or error per call, in order. A call that meets a transient fault
        is retried alone through :meth:`_mq_call` (bounded retries); once a broker has failed
        that way its remaining calls fail with the same error instead of each paying the retry
        budget again."""
        out: list[RemotingCommand | RocketMQSparkError | None] = [None] * len(calls)
        inflight: list[tuple[int, str, Reply, float]] = []
        dead: dict[str, RocketMQSparkError] = {}
        timeout = self.config.request_timeout_s

        def settle(i: int, addr: str, fut: Reply, sent: float) -> None:
            mq, code, ext = calls[i]
            op = f"{operation} of {mq}"
            if addr in dead and not fut.done():
                out[i] = dead[addr]  # its broker stopped answering: no wait per request
                return
            try:
                # the requests of a chunk went out together: each waits until the chunk's deadline
                resp = fut.result(sent + timeout - time.monotonic())
                if resp.code in ok:
                    out[i] = resp
                    return
                err: RocketMQSparkError = self._refused(resp, addr, op, code, ext)
            except TimeoutError:
                err = RequestTimeoutError(addr, op, f"no response within {timeout:g}s")
            except RocketMQSparkError as exc:
                err = exc
            if addr in dead:
                out[i] = dead[addr] if err.retriable else err
                return
            if isinstance(err, (ConnectionFailedError, RequestTimeoutError)):
                self.names.note_failed(addr)
            if not may_retry(err, self.config, sent):
                out[i] = err
                if isinstance(err, ConnectionFailedError):
                    dead[addr] = err
                return
            try:  # the pipelined request was the first attempt: the retry budget counts from it
                out[i] = self._mq_call(mq, code, ext, operation, ok, started=sent)
            except RocketMQSparkError as exc:
                out[i] = exc
                if isinstance(exc, ConnectionFailedError):
                    dead[addr] = exc

        # requests go out per broker in chunks of _WINDOW frames, one write each; the previous
        # chunk's answers are settled while the next one is on the wire
        by_addr: dict[str, list[int]] = {}
        for i, (mq, code, _ext) in enumerate(calls):
            try:
                by_addr.setdefault(self._queue_addr(mq, code), []).append(i)
            except RocketMQSparkError as exc:
                out[i] = exc
        for addr, idx in by_addr.items():
            for k in range(0, len(idx), _WINDOW):
                chunk = [i for i in idx[k:k + _WINDOW] if addr not in dead]
                for i in idx[k:k + _WINDOW]:
                    if addr in dead:
                        out[i] = dead[addr]
                if not chunk:
                    continue
                sent = time.monotonic()
                try:
                    conn = self._conn(addr, f"{operation} of {calls[chunk[0]][0]}")
                    futs = conn.send_many([
                        RemotingCommand(calls[i][1], ext_fields={**calls[i][2], "bname": calls[i][0].broker})
                        for i in chunk])
                except ConnectionFailedError as exc:
                    futs = _failed_replies(exc, len(chunk))
                for item in inflight:
                    settle(*item)
                inflight = [(i, addr, fut, sent) for i, fut in zip(chunk, futs)]
        for item in inflight:
            settle(*item)
        return _every_answer(out, lambda i: (f"{operation} of {calls[i][0]}",
                                             self._read_addr_of(calls[i][0])))

    @staticmethod
    def _raise_first(results: list[RemotingCommand | RocketMQSparkError]) -> list[RemotingCommand]:
        for r in results:
            if isinstance(r, RocketMQSparkError):
                raise r
        return results  # type: ignore[return-value]

    def _answer_int(self, mq: MessageQueue, resp: RemotingCommand, key: str, operation: str,
                    default: int | None = None) -> int:
        """An integer header field of a broker's answer; a missing (without ``default``) or
        non-integer one is a ProtocolError naming the field, the operation and the address."""
        raw = resp.ext_fields.get(key)
        if raw is None or raw == "":
            if default is not None:
                return default
            problem = f"has no {key} field"
        else:
            try:
                value = int(raw)
            except ValueError:
                value = None
            if value is not None and _I64_MIN <= value <= _I64_MAX:
                return value
            problem = f"has {key}={raw[:80]!r}, not a 64-bit integer"
        raise ProtocolError(f"{operation} at {self._addr_of(mq.broker)}: the broker's answer "
                            f"(code {resp.code}) {problem}")

    def max_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """:meth:`max_offset` of many queues, pipelined; raises the first failure."""
        res = self._raise_first(self._mq_calls(
            [(mq, RequestCode.GET_MAX_OFFSET, {"topic": mq.topic, "queueId": str(mq.queue_id)}) for mq in mqs],
            "max offset"))
        return {mq: self._answer_int(mq, r, "offset", "max offset") for mq, r in zip(mqs, res)}

    def min_offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int]:
        """:meth:`min_offset` of many queues, pipelined; raises the first failure."""
        res = self._raise_first(self._mq_calls(
            [(mq, RequestCode.GET_MIN_OFFSET, {"topic": mq.topic, "queueId": str(mq.queue_id)}) for mq in mqs],
            "min offset"))
        return {mq: self._answer_int(mq, r, "offset", "min offset") for mq, r in zip(mqs, res)}

    def query_consumer_offsets(self, group: str, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, int | None]:
        """:meth:`query_consumer_offset` of many queues, pipelined; raises the first failure."""
        operation = f"query offset of group {group!r}"
        res = self._raise_first(self._mq_calls(
            [(mq, RequestCode.QUERY_CONSUMER_OFFSET,
              {"topic": mq.topic, "consumerGroup": group, "queueId": str(mq.queue_id),
               "setZeroIfNotFound": "false"}) for mq in mqs],
            operation, ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND)))
        out: dict[MessageQueue, int | None] = {}
        unsure: list[MessageQueue] = []
        for mq, r in zip(mqs, res):
            if r.code != ResponseCode.SUCCESS:
                out[mq] = None
                continue
            out[mq] = self._answer_int(mq, r, "offset", operation)
            if out[mq] == 0 and r.version < _V5_0_0:
                unsure.append(mq)
        if unsure:
            self._confirm_zero_offsets(group, unsure, out)
        return out

    def _confirm_zero_offsets(self, group: str, mqs: list[MessageQueue], out: dict[MessageQueue, int | None]) -> None:
        """A 4.x broker ignores ``setZeroIfNotFound`` and answers 0 for a group that never
        committed on a young queue (one whose first message is still in memory, or that is
        empty): its offset table (GET_ALL_CONSUMER_OFFSET) tells a committed 0 from none."""
        by_addr: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            by_addr.setdefault(self.read_addr(mq.broker, mq.topic), []).append(mq)
        for addr, queues in by_addr.items():
            resp = self.invoke(addr, RemotingCommand(RequestCode.GET_ALL_CONSUMER_OFFSET),
                               f"consumer offset table (group {group!r})")
            table = object_body(resp.body, f"consumer offset table at {addr}").get("offsetTable") or {}
            if not isinstance(table, dict):
                raise ProtocolError(f"consumer offset table at {addr}: offsetTable is not an object")
            for mq in queues:
                committed = table.get(f"{mq.topic}@{group}")
                if not isinstance(committed, dict) or str(mq.queue_id) not in committed:  # JSON keys are strings
                    out[mq] = None

    def update_consumer_offsets(self, group: str, offsets: dict[MessageQueue, int]
                                ) -> dict[MessageQueue, RocketMQSparkError]:
        """:meth:`update_consumer_offset` of many queues, pipelined; returns the failures
        (queue -> error) rather than raising, so one broker's fault does not stop the rest."""
        mqs = list(offsets)
        res = self._mq_calls(
            [(mq, RequestCode.UPDATE_CONSUMER_OFFSET,
              {"topic": mq.topic, "consumerGroup": group, "queueId": str(mq.queue_id),
               "commitOffset": str(offsets[mq])}) for mq in mqs],
            f"update offset of group {group!r}")
        out: dict[MessageQueue, RocketMQSparkError] = {}
        for mq, r in zip(mqs, res):
            if isinstance(r, RocketMQSparkError):
                out[mq] = r
            elif r.remark == _RESET_WAITS:  # answered SUCCESS, not stored (see OffsetResetPendingError)
                out[mq] = OffsetResetPendingError(r.code, r.remark, address=self._read_addr_of(mq),
                                                  operation=f"update offset of group {group!r} on {mq}")
        return out

    def offset_ranges(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        """(min, max) offsets of many queues: one GET_TOPIC_STATS_INFO per topic and broker
        (mqadmin's topicStatus request), pipelined; a broker that does not serve it (or
        refuses it, e.g. under ACL) is asked per queue (pipelined GET_MIN/MAX_OFFSET).
        Raises the first failure."""
        groups: dict[tuple[str, str], list[MessageQueue]] = {}
        for mq in mqs:
            groups.setdefault((mq.broker, mq.topic), []).append(mq)
        keys = list(groups)
        sent: list[tuple[str, Future[RemotingCommand]]] = []
        for broker, topic in keys:
            addr = self.read_addr(broker, topic)
            sent.append((addr, self._conn(addr, f"topic stats of {topic!r}").send(
                RemotingCommand(RequestCode.GET_TOPIC_STATS_INFO, ext_fields={"topic": topic}))))
        deadline = time.monotonic() + self.config.request_timeout_s  # they went out together
        out: dict[MessageQueue, tuple[int, int]] = {}
        for (broker, topic), (addr, fut) in zip(keys, sent):
            wanted = groups[(broker, topic)]
            op = f"topic stats of {topic!r}"
            try:
                resp = fut.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise RequestTimeoutError(addr, op, f"no response within {self.config.request_timeout_s:g}s") from None
            except ConnectionFailedError as exc:
                raise ConnectionFailedError(addr, op, exc.args[0]) from None
            table = parse_topic_stats(resp.body, default_broker=broker) if resp.code == ResponseCode.SUCCESS else {}
            if any(MessageQueue(mq.topic, mq.broker, mq.queue_id) not in table for mq in wanted):
                if resp.code not in (ResponseCode.SUCCESS, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                     ResponseCode.NO_PERMISSION):
                    raise self._refused(resp, addr, op, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic})
                lows, highs = self.min_offsets(wanted), self.max_offsets(wanted)
                out.update({mq: (lows[mq], highs[mq]) for mq in wanted})
                continue
            out.update({mq: table[mq] for mq in wanted})
        return out

    def max_offset(self, mq: MessageQueue) -> int:
        resp = self._mq_call(mq, RequestCode.GET_MAX_OFFSET,
                             {"topic": mq.topic, "queueId": str(mq.queue_id)}, "max offset")
        return self._answer_int(mq, resp, "offset", "max offset")

    def min_offset(self, mq: MessageQueue) -> int:
        resp = self._mq_call(mq, RequestCode.GET_MIN_OFFSET,
                             {"topic": mq.topic, "queueId": str(mq.queue_id)}, "min offset")
        return self._answer_int(mq, resp, "offset", "min offset")

    def stored_sizes(self, mq: MessageQueue, start: int, count: int) -> list[int]:
        """The stored sizes (bytes) of the messages at offsets ``start``, ``start + 1``, ... of
        ``mq``, at most ``count``, as its consume queue records them (QUERY_CONSUME_QUEUE,
        mqadmin's queryCq); fewer when the queue ends (or its retention starts) first. A broker
        answers from one consume-queue file at a time: the rest is asked again."""
        out: list[int] = []
        while len(out) < count:
            at = start + len(out)
            resp = self._mq_call(mq, RequestCode.QUERY_CONSUME_QUEUE,
                                 {"topic": mq.topic, "queueId": str(mq.queue_id), "index": str(at),
                                  "count": str(count - len(out))}, "consume queue query")
            if not resp.body:  # no entry at `at` ("Index .. is not exist!")
                break
            op = f"consume queue query of {mq} at {self._read_addr_of(mq)}"
            entries = object_body(resp.body, op).get("queueData") or []
            try:
                sizes = [int(e["physicSize"]) for e in entries]
            except (KeyError, TypeError, ValueError):
                raise ProtocolError(f"{op}: an entry without a whole-number physicSize in "
                                    f"{resp.body[:200]!r}") from None
            if not sizes:
                break
            out.extend(sizes[:count - len(out)])
        return out

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """First offset whose store time >= ``timestamp_ms`` (max offset when none).

        Brokers before 5.1.1 (4.x, 5.0.x, 5.1.0) answer the offset of the message stored
        nearest to the time instead: one before it when that is closer, any one of several
        stored in the same millisecond, the last message rather than the max offset when all
        are older. Their answer is only a start here: :meth:`_first_stored_since` reads store
        times around it (a pull of one message each, a few for a typical answer)."""
        resp = self._mq_call(mq, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                             {"topic": mq.topic, "queueId": str(mq.queue_id), "timestamp": str(timestamp_ms)},
                             "search offset by timestamp")
        found = self._answer_int(mq, resp, "offset", "search offset by timestamp")
        return found if resp.version >= _V5_1_1 else self._first_stored_since(mq, timestamp_ms, found)

    def _first_stored_since(self, mq: MessageQueue, timestamp_ms: int, guess: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms`` (its max offset when
        none), searched from ``guess``: galloping away from it until the answer is bracketed,
        then halving. Store times never decrease along a queue (the broker stamps appends in
        order)."""
        lo, hi = self.min_offset(mq), self.max_offset(mq)

        def since(offset: int) -> bool:  # offset in [lo, hi); a message gone meanwhile counts as later
            stored = self.store_time_at(mq, offset)
            return stored is None or stored >= timestamp_ms

        # invariants: below == lo - 1 or not since(below); above == hi or since(above)
        start = min(max(guess, lo), hi)
        below, above, step = lo - 1, hi, 1
        if start < hi and not since(start):
            below = start
            while below + step < hi:
                if since(below + step):
                    above = below + step
                    break
                below, step = below + step, step * 2
        else:
            above = start
            while above - step >= lo:
                if not since(above - step):
                    below = above - step
                    break
                above, step = above - step, step * 2
        while above - below > 1:
            mid = (below + above) // 2
            if since(mid):
                above = mid
            else:
                below = mid
        return above

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The group's committed (next-to-consume) offset, or None when it never committed one.

        Brokers answer a never-committed queue whose first message is still in memory with 0
        (so a new push consumer reads a young topic from its start); this asks them not to
        (``setZeroIfNotFound=false``, 5.x) or checks their offset table (4.x), so None means
        "never committed" on every broker version."""
        return self.query_consumer_offsets(group, [mq])[mq]

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        self._mq_call(mq, RequestCode.UPDATE_CONSUMER_OFFSET,
                      {"topic": mq.topic, "consumerGroup": group, "queueId": str(mq.queue_id),
                       "commitOffset": str(offset)},
                      f"update offset of group {group!r}")

    def send_back(self, mq: MessageQueue, commit_log_offset: int, group: str, *, origin_msg_id: str,
                  max_reconsume_times: int = 16, delay_level: int = 0) -> None:
        self._mq_call(mq, RequestCode.CONSUMER_SEND_MSG_BACK,
                      {"offset": str(commit_log_offset), "group": group, "delayLevel": str(delay_level),
                       "originMsgId": origin_msg_id, "originTopic": mq.topic, "unitMode": "false",
                       "maxReconsumeTimes": str(max_reconsume_times)},
                      f"send back to group {group!r} of the message at commit log offset {commit_log_offset}")

    def send_to_retry(self, mq: MessageQueue, group: str, entry: BatchEntry, *, sys_flag: int, reconsume_times: int,
                      max_reconsume_times: int, producer_group: str = "rocketmq-spark") -> SendResult:
        target = MessageQueue(retry_topic(group), mq.broker, 0)
        req = self.send_request(target, [entry], producer_group=producer_group, sys_flag=sys_flag)
        req.ext_fields = {**req.ext_fields, "j": str(reconsume_times), "l": str(max_reconsume_times)}
        resp = self.invoke_master(mq.broker, mq.topic, req, f"send to {target}")
        return self.send_results(target, 1, resp)[0]

    def pull_request(self, mq: MessageQueue, offset: int, max_nums: int, *, group: str = "",
                     subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> RemotingCommand:
        """The PULL_MESSAGE request :meth:`pull_async` sends (no offset committed with it;
        ``suspend_ms`` > 0: the broker may hold it that long for new messages); ``subscription``
        is a tag expression, or with ``expression_type`` SQL92 a property filter."""
        key = (group, mq, max_nums, subscription, suspend_ms, expression_type)
        cached = _PULLS.get(key)
        if cached is None:
            sys_flag = 0x4 | (0x2 if suspend_ms > 0 else 0)
            fields = {
                "consumerGroup": group or "rocketmq-spark",
                "topic": mq.topic,
                "queueId": str(mq.queue_id),
                "queueOffset": "0",
                "maxMsgNums": str(max_nums),
                "sysFlag": str(sys_flag),
                "commitOffset": "0",
                "suspendTimeoutMillis": str(suspend_ms),
                "subscription": subscription,
                "subVersion": "0",
                "expressionType": expression_type,
                "bname": mq.broker,
            }
            cached = (fields, _header_template(fields, ("queueOffset",)))
            if len(_PULLS) >= 4096:
                _PULLS.clear()
            _PULLS[key] = cached
        ext = cached[0].copy()  # the order stays: the offset is set in place
        ext["queueOffset"] = at = str(offset)
        template = cached[1]
        return RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=ext,
                               ext_json=None if template is None else (ext, f"{template[0]}{at}{template[1]}"))

    def _pull_addr(self, mq: MessageQueue) -> str:
        """Where a pull of ``mq`` goes: the member of its group the last answer suggested (the
        master unless the broker said otherwise), see :meth:`.NameServers.read_addr`."""
        return self.names.read_addr(mq.broker, mq.topic, self._pull_from.get(mq, MASTER_ID))

    def pull_async(self, mq: MessageQueue, offset: int, max_nums: int, *, group: str = "", subscription: str = "*",
                   suspend_ms: int = 0, expression_type: str = "TAG") -> Future[RemotingCommand]:
        """Send a pull without waiting; resolve it with :meth:`pull_result`."""
        addr = self._pull_addr(mq)
        fut = self._conn(addr, f"pull of {mq}").send(
            self.pull_request(mq, offset, max_nums, group=group, subscription=subscription, suspend_ms=suspend_ms,
                              expression_type=expression_type))
        fut.hold_s = suspend_ms / 1000.0  # type: ignore[attr-defined]  # the broker may hold it that long
        return fut

    def pull_async_many(self, mq: MessageQueue, offsets: Sequence[int], max_nums: int, *, group: str = "",
                        subscription: str = "*", expression_type: str = "TAG") -> list[Reply]:
        """Pulls at ``offsets`` written to the broker with one ``sendall``."""
        addr = self._pull_addr(mq)
        return self._conn(addr, f"pull of {mq}").send_many(
            [self.pull_request(mq, off, max_nums, group=group, subscription=subscription,
                               expression_type=expression_type) for off in offsets])

    def pull_result(self, mq: MessageQueue, pending: Future[RemotingCommand] | Reply) -> PullResult:
        """Wait for a pull: the request timeout, plus the time a long-polling pull may be held.
        (Run once per 32 messages from a real broker: the operation's name is written only for
        an error.)"""
        wait = self.config.request_timeout_s + getattr(pending, "hold_s", 0.0)
        addr = self._read_addr_of(mq)
        try:
            resp = pending.result(wait)
        except TimeoutError:
            self.names.note_failed(addr)
            raise ConnectionFailedError(addr, f"pull of {mq}", f"no response within {wait:g}s") from None
        except ConnectionFailedError:
            self.names.note_failed(addr)
            raise
        self.names.note_answered(addr)
        self._follow_suggestion(mq, resp)
        status = _PULL_STATUS.get(resp.code)
        master = self.names.members.get(mq.broker, {}).get(MASTER_ID) or self.names.broker_addrs.get(mq.broker)
        if status is None:
            raise self._pull_refused(mq, resp, addr, master)
        ext = resp.ext_fields
        try:
            found = int(ext["nextBeginOffset"]), int(ext["minOffset"]), int(ext["maxOffset"])
        except (KeyError, ValueError):
            found = None
        if found is None or min(found) < _I64_MIN or max(found) > _I64_MAX:
            op = f"pull of {mq}"  # a field missing (-1) or not a 64-bit integer (ProtocolError)
            found = (self._answer_int(mq, resp, "nextBeginOffset", op, -1),
                     self._answer_int(mq, resp, "minOffset", op, -1), self._answer_int(mq, resp, "maxOffset", op, -1))
        return PullResult(status, *found, resp.body, from_slave="" if addr == master else addr)

    def _pull_refused(self, mq: MessageQueue, resp: RemotingCommand, addr: str, master: str | None) -> Exception:
        """The error of a pull's answer that is not a pull status."""
        op = f"pull of {mq}"
        if resp.code == ResponseCode.TOPIC_NOT_EXIST and addr != master:
            # a slave copies its master's topics once a minute: one that does not know the topic yet
            # cannot serve it now, as a broker that is down cannot (ridden out within
            # brokerDownTimeoutMs, until the master is back or the slave has the topic)
            return ConnectionFailedError(addr, op, f"the slave does not know topic {mq.topic!r} yet (a slave copies "
                                         "its master's topics once a minute); waiting for it or the master")
        if resp.code == ResponseCode.SYSTEM_ERROR and _NO_PROPERTY_FILTER in (resp.remark or ""):
            return BrokerError(resp.code, f"{resp.remark}: a property filter (subExpressionType=SQL92) needs a broker "
                               "started with enablePropertyFilter=true in its broker.conf",
                               address=addr, operation=op)
        # (the consumer group is not known here: the topic is named)
        return self._refused(resp, addr, op, RequestCode.PULL_MESSAGE, {"topic": mq.topic})

    def _follow_suggestion(self, mq: MessageQueue, resp: RemotingCommand) -> None:
        """The broker id a pull's answer suggests for the queue's next pull (suggestWhichBrokerId:
        a master whose consumer lags past its memory suggests a slave when slaveReadEnable is
        on; a slave suggests the master), kept as the Java client's PullAPIWrapper keeps it."""
        raw = resp.ext_fields.get("suggestWhichBrokerId")
        try:
            suggested = int(raw) if raw else MASTER_ID
        except ValueError:
            return
        if suggested == MASTER_ID:
            self._pull_from.pop(mq, None)
        elif 0 < suggested < 1 << 20:
            self._pull_from[mq] = suggested

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, group: str = "",
             subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> PullResult:
        return self._retrying(lambda: self.pull_result(mq, self.pull_async(
            mq, offset, max_nums, group=group, subscription=subscription, suspend_ms=suspend_ms,
            expression_type=expression_type)))

    def rows(self, mq: MessageQueue, results: Sequence[PullResult], end: int | None = None,
             columns: Sequence[str] | None = None) -> pa.RecordBatch:
        from ..codec.arrow import decode_to_batch

        return decode_to_batch([r.body for r in results if r.body], mq.broker, end, columns)

    def store_time_at(self, mq: MessageQueue, offset: int) -> int | None:
        """Store time (epoch ms) of the message at ``offset``, None when there is none."""
        res = self.pull(mq, offset, 1)
        recs = decode_records(res.body) if res.status == "FOUND" and res.body else []
        return recs[0].store_timestamp if recs else None

    @staticmethod
    def store_time_in(res: PullResult, offset: int) -> int | None:
        """See the client contract: from the records' heads."""
        if res.status == "FOUND":
            for rec in iter_records(res.body):
                if rec.queue_offset == offset:
                    return rec.store_timestamp
        return None

    def query_messages(self, topic: str, key: str, *, max_num: int = 64, begin_ms: int = 0,
                       end_ms: int = 2**63 - 1, unique: bool = False) -> list[MessageRecord]:
        """The messages of ``topic`` stored from ``begin_ms`` to ``end_ms`` (epoch ms, both
        included) that carry ``key`` among their KEYS, or with ``unique`` whose message id
        (UNIQ_KEY, else the offset id) is ``key``: QUERY_MESSAGE (mqadmin queryMsgByKey, the Java
        client's queryMessage) to each broker group of the topic's route (its master, else a
        slave), in the order the groups are routed and each group's in commit-log order.

        A broker answers its newest ``max_num`` matches at most (at most 64; 32 with
        ``unique``: the broker decides). Brokers find keys by hash: the messages whose keys or
        topic only collide are left out here, as the Java client does. A broker group that has
        none answers QUERY_NOT_FOUND, counted as none; TopicNotFoundError when the topic is not
        routed. Java brokers index asynchronously: a message just stored may not be found yet."""
        route = self.route(topic)
        ext = {"topic": topic, "key": key, "maxNum": str(max_num), "beginTimestamp": str(begin_ms),
               "endTimestamp": str(end_ms), "_UNIQUE_KEY_QUERY": "true" if unique else "false"}
        out: list[MessageRecord] = []
        for b in route.broker_datas:
            addr = route.any_addr(b.broker_name)
            if addr is None:
                continue
            resp = self.invoke(addr, RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields=ext),
                               f"query of topic {topic} by key {key!r}",
                               ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if resp.code == ResponseCode.SUCCESS and resp.body:
                out.extend(decode_records(resp.body))
        if unique:
            return [r for r in out if r.msg_id == key]
        return [r for r in out if r.topic == topic and key in r.keys]

    # -- sending ------------------------------------------------------------------

    def send(self, mq: MessageQueue, body: bytes, properties: str = "", *, producer_group: str = "rocketmq-spark",
             sys_flag: int = 0, flag: int = 0, born_ts: int | None = None) -> SendResult:
        """Send one message (retried on transient faults)."""
        return self.send_batch(mq, [BatchEntry(body, properties, flag)], producer_group=producer_group,
                               sys_flag=sys_flag, born_ts=born_ts)[0]

    def send_request(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *,
                     producer_group: str = "rocketmq-spark", sys_flag: int = 0,
                     born_ts: int | None = None, batch_properties: str = "") -> RemotingCommand:
        """A SEND_MESSAGE_V2 (one entry) or SEND_BATCH_MESSAGE (several, or an
        :class:`EncodedBatch`) request. ``batch_properties`` are the batch's own properties:
        brokers append them to each message's, and a 5.x proxy types the batch by them."""
        if type(entries) is list and len(entries) == 1:
            # one message (a half message each): the fields from a template per queue and flags
            entry = entries[0]
            key = (producer_group, mq.topic, mq.queue_id, mq.broker, sys_flag, entry.flag)
            cached = _SINGLE_SENDS.get(key)
            if cached is None:
                fields = self._send_fields(mq, producer_group, sys_flag, "0", entry.flag, "", False)
                cached = (fields, _send_template(fields))
                if len(_SINGLE_SENDS) >= 4096:
                    _SINGLE_SENDS.clear()
                _SINGLE_SENDS[key] = cached
            ext = cached[0].copy()  # the order stays: g and i are set in place
            ext["g"] = born = str(born_ts if born_ts is not None else int(time.time() * 1000))
            ext["i"] = props = join_properties(entry.properties, batch_properties)
            template = cached[1]
            ext_json = None
            if template is not None:
                escaped = plain_json(props)
                if escaped is not None:
                    ext_json = (ext, f"{template[0]}{born}{template[1]}{escaped}{template[2]}")
            return RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=ext, body=entry.body, ext_json=ext_json)
        if isinstance(entries, EncodedBatch):
            batch, flag, props, body = True, 0, batch_properties, entries.body
        else:
            batch = len(entries) > 1
            flag = entries[0].flag
            props = batch_properties if batch else join_properties(entries[0].properties, batch_properties)
            body = encode_batch(entries) if batch else entries[0].body
        ext = self._send_fields(mq, producer_group, sys_flag,
                                str(born_ts if born_ts is not None else int(time.time() * 1000)), flag, props, batch)
        code = RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2
        return RemotingCommand(code, ext_fields=ext, body=body)

    @staticmethod
    def _send_fields(mq: MessageQueue, producer_group: str, sys_flag: int, born: str, flag: int, props: str,
                     batch: bool) -> dict[str, str]:
        """A send's header fields (SendMessageRequestHeaderV2's short names, in this order)."""
        return {
            "a": producer_group, "b": mq.topic, "c": AUTO_CREATE_TOPIC, "d": str(DEFAULT_TOPIC_QUEUE_NUMS),
            "e": str(mq.queue_id), "f": str(sys_flag), "g": born, "h": str(flag), "i": props, "j": "0",
            "k": "false", "m": "true" if batch else "false", "n": mq.broker,
        }

    def send_async(self, mq: MessageQueue, request: RemotingCommand) -> Future[RemotingCommand]:
        """Send without waiting (several sends may be in flight); see :meth:`send_results`."""
        addr = self.broker_addr(mq.broker, mq.topic)
        return self._conn(addr, f"send to {mq}").send(RemotingCommand(request.code, ext_fields=request.ext_fields,
                                                                       body=request.body))

    def send_async_many(self, sends: Sequence[tuple[MessageQueue, RemotingCommand]]) -> list[Reply]:
        """:meth:`send_async` of several requests, those for one broker written together (one
        ``sendall``: a syscall per message cost more than encoding it); answers in order."""
        by_addr: dict[str, list[int]] = {}
        for i, (mq, _) in enumerate(sends):
            by_addr.setdefault(self.broker_addr(mq.broker, mq.topic), []).append(i)
        out: list[Reply | None] = [None] * len(sends)
        for addr, idx in by_addr.items():
            # a request not sent yet goes as it is (its opaque set); one sent before, as a copy
            reqs = [r if not r.opaque else RemotingCommand(r.code, ext_fields=r.ext_fields, body=r.body,
                                                           ext_json=r.ext_json)
                    for r in (sends[i][1] for i in idx)]
            try:
                futs = self._conn(addr, f"send to {sends[idx[0]][0]}").send_many(reqs)
            except RocketMQSparkError as exc:
                futs = _failed_replies(exc, len(idx))
            for i, f in zip(idx, futs):
                out[i] = f
        return _every_answer(out, lambda i: (f"send to {sends[i][0]}", self._addr_of(sends[i][0].broker)))

    def send_results(self, mq: MessageQueue, count: int, resp: RemotingCommand) -> list[SendResult]:
        self.check_sent(mq, count, resp)
        ids = resp.ext_fields.get("msgId", "").split(",")
        first = self._answer_int(mq, resp, "queueOffset", f"send to {mq}", 0)
        qid = self._answer_int(mq, resp, "queueId", f"send to {mq}", mq.queue_id)
        q = MessageQueue(mq.topic, mq.broker, qid)
        txid = resp.ext_fields.get("transactionId", "")
        return [SendResult(ids[i] if i < len(ids) else "", q, first + i, txid) for i in range(count)]

    def check_sent(self, mq: MessageQueue, count: int, answer: RemotingCommand) -> None:
        if answer.code != ResponseCode.SUCCESS:
            raise self._refused(answer, self._addr_of(mq.broker), f"send to {mq}", RequestCode.SEND_MESSAGE_V2,
                                {"b": mq.topic})

    def send_batch(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *,
                   producer_group: str = "rocketmq-spark", sys_flag: int = 0,
                   born_ts: int | None = None, batch_properties: str = "") -> list[SendResult]:
        """Send one message (single send) or several (batch send) to one queue, with retries
        (``batch_properties``: see :meth:`send_request`)."""
        req = self.send_request(mq, entries, producer_group=producer_group, sys_flag=sys_flag, born_ts=born_ts,
                                batch_properties=batch_properties)
        resp = self.invoke_master(mq.broker, mq.topic, req, f"send to {mq}")
        return self.send_results(mq, len(entries), resp)

    def invoke_master(self, broker: str, topic: str | None, cmd: RemotingCommand, operation: str) -> RemotingCommand:
        """:meth:`invoke` to ``broker``'s master, its address found again for every attempt: a
        retry after the master failed goes to the member elected in its place (see
        :meth:`.NameServers.broker_addr`), where :meth:`invoke` would try the dead address again."""
        timeout = self.config.request_timeout_s
        return retrying(lambda: self._invoke_once(self.broker_addr(broker, topic), cmd, operation, timeout,
                                                  (ResponseCode.SUCCESS,)), self.config)

    def end_transaction(self, broker: str, *, producer_group: str, commit_log_offset: int, queue_offset: int,
                        msg_id: str, commit: bool, from_check: bool = False, topic: str | None = None) -> bool:
        """END_TRANSACTION; False when the broker has no such half message (gone: see
        :func:`_half_gone`). Brokers apply a second commit of the same half again (a duplicate):
        end each half message once."""
        req = self.end_transaction_request(broker, producer_group=producer_group, commit_log_offset=commit_log_offset,
                                           queue_offset=queue_offset, msg_id=msg_id, commit=commit,
                                           from_check=from_check)
        try:
            self.invoke_master(broker, topic, req, f"{'commit' if commit else 'rollback'} of transaction {msg_id}")
        except BrokerError as exc:
            if _half_gone(exc.code, exc.remark):
                return False
            raise
        return True

    def end_transactions(self, txns: Sequence[Txn], *, commit: bool, producer_group: str = "rocketmq-spark",
                         window: int = 256, on_progress: Callable[[int], None] | None = None,
                         retry_failed: bool = True, on_applied: Callable[[int], None] | None = None) -> list[Txn]:
        """END_TRANSACTION for every ``txns``, written a chunk (``window // 2``) per broker at a
        time, up to ``window`` in flight; returns those the broker holds no half message for
        (gone, see :func:`_half_gone`); a failed one is retried alone, or with
        ``retry_failed=False`` not: no more are sent, those in flight are waited for, and the
        first failure is raised. ``on_progress``, ``on_applied``: see the client contract."""
        pending: deque[tuple[int, Txn, Reply]] = deque()
        what = f"{'commit' if commit else 'rollback'} of transactions"
        failed: list[RocketMQSparkError] = []
        gone: list[Txn] = []

        def settle(t: Txn, fut: Reply) -> bool:
            try:
                resp = fut.result(self.config.request_timeout_s)
                if resp.code == ResponseCode.SUCCESS:
                    return True
                if _half_gone(resp.code, resp.remark):
                    gone.append(t)
                    return False

                err: RocketMQSparkError = self._refused(resp, self._addr_of(t.broker), f"{what} ({t.msg_id})",
                                                        RequestCode.END_TRANSACTION, {})
            except TimeoutError:
                err = RequestTimeoutError(self._addr_of(t.broker), f"{what} ({t.msg_id})",
                                          f"no response within {self.config.request_timeout_s:g}s")
            except RocketMQSparkError as exc:
                err = exc
            if not retry_failed:
                failed.append(err)
                return False
            if self.end_transaction(t.broker, producer_group=producer_group, commit_log_offset=t.commit_log_offset,
                                    queue_offset=t.queue_offset, msg_id=t.msg_id, commit=commit, topic=t.topic):
                return True
            gone.append(t)
            return False

        def settle_to(keep: int) -> None:
            # answers are settled in the order of txns: the prefix applied grows with each, up
            # to the first failure or gone half (a gone half is not applied: its caller decides)
            done = -1
            while len(pending) > keep:
                i, t, fut = pending.popleft()
                applied = settle(t, fut)
                if applied and on_applied is not None:
                    on_applied(i)
                if applied and not failed and not gone:
                    done = i
            if on_progress is not None and done >= 0:
                on_progress(done + 1)

        chunk = max(1, window // 2)
        for start in range(0, len(txns), chunk):
            if failed:
                break
            part = txns[start:start + chunk]
            replies = self._send_ends(part, commit=commit, producer_group=producer_group, what=what)
            pending.extend((start + k, t, reply) for k, (t, reply) in enumerate(zip(part, replies)))
            if len(pending) > window:
                settle_to(window - chunk)
        settle_to(0)
        if failed:
            raise failed[0]
        return gone

    def _send_ends(self, txns: Sequence[Txn], *, commit: bool, producer_group: str, what: str) -> list[Reply]:
        """END_TRANSACTION of each of ``txns`` without waiting, those for one broker written
        together; one reply each, in order (failed where the request could not be written: a
        broker in no route now, a connection that cannot be opened)."""
        out: list[Reply | None] = [None] * len(txns)
        by_addr: dict[str, list[int]] = {}
        for k, t in enumerate(txns):
            try:
                by_addr.setdefault(self.broker_addr(t.broker, t.topic), []).append(k)
            except RocketMQSparkError as exc:  # no route now: retried alone when settled
                out[k] = _failed_replies(exc, 1)[0]
        for addr, idx in by_addr.items():
            reqs = [self.end_transaction_request(t.broker, producer_group=producer_group,
                                                 commit_log_offset=t.commit_log_offset, queue_offset=t.queue_offset,
                                                 msg_id=t.msg_id, commit=commit)
                    for t in (txns[k] for k in idx)]
            try:
                futs = self._conn(addr, what).send_many(reqs)
            except RocketMQSparkError as exc:
                futs = _failed_replies(exc, len(idx))
            for k, f in zip(idx, futs):
                out[k] = f
        return _every_answer(out, lambda k: (f"{what} ({txns[k].msg_id})",
                                             self._addr_of(txns[k].broker)))

    @staticmethod
    def end_transaction_request(broker: str, *, producer_group: str, commit_log_offset: int, queue_offset: int,
                                msg_id: str, commit: bool, from_check: bool = False) -> RemotingCommand:
        """The END_TRANSACTION request that commits or rolls back one half message (``msg_id``
        is its UNIQ_KEY; ``queue_offset``/``commit_log_offset`` where the broker stored it).
        ``broker`` names the broker for a 5.x proxy; an answer to a broker's check names none."""
        ext = {"producerGroup": producer_group, "tranStateTableOffset": str(queue_offset),
               "commitLogOffset": str(commit_log_offset), "commitOrRollback": "8" if commit else "12",
               "fromTransactionCheck": "1" if from_check else "0", "msgId": msg_id, "transactionId": msg_id}
        if broker:
            ext["bname"] = broker
        # the header's extFields written here (one a message: faster than the encoder's way)
        group_j, id_j, broker_j = plain_json(producer_group), plain_json(msg_id), plain_json(broker)
        written = None
        if group_j is not None and id_j is not None and broker_j is not None:
            written = (f'"producerGroup":"{group_j}","tranStateTableOffset":"{ext["tranStateTableOffset"]}",'
                       f'"commitLogOffset":"{ext["commitLogOffset"]}","commitOrRollback":"{ext["commitOrRollback"]}",'
                       f'"fromTransactionCheck":"{ext["fromTransactionCheck"]}","msgId":"{id_j}",'
                       f'"transactionId":"{id_j}"' + (f',"bname":"{broker_j}"' if broker else ""))
        return RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=ext,
                               ext_json=None if written is None else (ext, written))

    def heartbeat_producer(self, group: str, client_id: str, broker_addr: str) -> None:
        """Register as a producer of ``group`` so the broker can check transactions back here."""
        body = json.dumps({"clientID": client_id, "producerDataSet": [{"groupName": group}],
                           "consumerDataSet": []}).encode()
        self.invoke(broker_addr, RemotingCommand(RequestCode.HEART_BEAT, body=body), "heartbeat")

    @staticmethod
    def subscription_data(topic: str, expression: str, expression_type: str = "TAG") -> dict[str, Any]:
        """A subscription as Java's SubscriptionData serializes (heartbeats, running info): a TAG
        expression with its tags and their hash codes, or an SQL92 filter as it is."""
        tags = sorted(subscribed_tags(expression) or ()) if expression_type == "TAG" else []
        return {"topic": topic, "subString": expression or "*", "tagsSet": tags,
                "codeSet": [java_string_hash(t) for t in tags], "subVersion": int(time.time() * 1000),
                "expressionType": expression_type, "classFilterMode": False}

    def heartbeat_consumer(self, group: str, client_id: str, broker_addr: str,
                           subscriptions: dict[str, str], *, consume_type: str = "CONSUME_PASSIVELY",
                           expression_type: str = "TAG") -> None:
        """HEART_BEAT as a consumer of ``group`` (CLUSTERING) subscribed to ``subscriptions``
        (topic -> tag expression). Brokers create the group (with autoCreateSubscriptionGroup)
        and its retry topic %RETRY%<group>, which RocketMQ's tools (mqadmin consumerProgress)
        need; until UNREGISTER_CLIENT or the connection closes, the client is listed as an
        online consumer of the group. ``consume_type``: CONSUME_ACTIVELY for a consumer that
        pulls itself (a pull or lite-pull consumer, a Spark query), CONSUME_PASSIVELY for a push
        consumer. ``expression_type``: how the expressions filter (TAG, or SQL92 property filters)."""
        subs = [self.subscription_data(topic, expr, expression_type) for topic, expr in sorted(subscriptions.items())]
        body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
            "groupName": group, "consumeType": consume_type, "messageModel": "CLUSTERING",
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": subs, "unitMode": False}]}).encode()
        self.invoke(broker_addr, RemotingCommand(RequestCode.HEART_BEAT, body=body), f"heartbeat of group {group!r}")

    def join_group(self, group: str, subscriptions: dict[str, str],
                   running_info: Callable[[], dict[MessageQueue, QueueStatus]], *,
                   expression_type: str = "TAG") -> GroupPresence | None:
        """Become an online consumer of ``group`` on the brokers of ``subscriptions`` until the
        member is closed (see :class:`~.membership.RemotingGroupMember`), over a client of its own."""
        member = RemotingGroupMember(RemotingClient(self.namesrv_addrs, self.config), group, subscriptions,
                                     running_info, expression_type=expression_type)
        member.start()
        return member

    def unregister_consumer(self, group: str, client_id: str, broker_addr: str, *,
                            timeout_s: float | None = None) -> None:
        """UNREGISTER_CLIENT: ``client_id`` is no longer a consumer of ``group`` on that broker
        (``timeout_s``: the request timeout, default the config's)."""
        self.invoke(broker_addr, RemotingCommand(RequestCode.UNREGISTER_CLIENT, ext_fields={
            "clientID": client_id, "consumerGroup": group}), f"unregister from group {group!r}", timeout_s)

    def consumer_ids(self, group: str, broker_addr: str, broker_name: str = "") -> list[str]:
        """Client ids of the group's online consumers on one broker ([] when none: brokers
        answer that as SYSTEM_ERROR "no consumer for this group"). A 5.x proxy routes the
        request by ``broker_name``."""
        ext = {"consumerGroup": group, **({"bname": broker_name} if broker_name else {})}
        resp = self.invoke(broker_addr, RemotingCommand(RequestCode.GET_CONSUMER_LIST_BY_GROUP, ext_fields=ext),
                           f"consumer list of group {group!r}",
                           ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
        if resp.code == ResponseCode.SYSTEM_ERROR:
            # a broker's words for "none"; a 5.x proxy (5.3.3) answers a NullPointerException about
            # the missing ConsumerGroupInfo instead
            if (resp.remark or "").startswith("no consumer for this group") or '"consumerGroupInfo" is null' in (
                    resp.remark or ""):
                return []
            raise broker_error(resp.code, resp.remark, address=broker_addr,
                               operation=f"consumer list of group {group!r}")
        if not resp.body:
            return []
        ids = object_body(resp.body, f"consumer list of group {group!r} at {broker_addr}").get("consumerIdList", [])
        if not isinstance(ids, list):
            raise ProtocolError(f"consumer list of group {group!r} at {broker_addr}: consumerIdList is not a list")
        return [str(i) for i in ids]

    @property
    def client_id(self) -> str:
        """How this client names itself to brokers (host@pid, as the Java client does)."""
        return f"rocketmq-spark@{socket.gethostname()}@{os.getpid()}"

    def group_consumers(self, group: str, topics: Sequence[str]) -> dict[str, list[str]] | None:
        """Client ids of the group's online consumers by broker name, on the brokers serving
        ``topics``; brokers that cannot be reached are logged and left out."""
        out: dict[str, list[str]] = {}
        seen: set[str] = set()
        for topic in topics:
            for b in self.route(topic).broker_datas:
                if not b.master_addr or b.broker_name in seen:
                    continue
                seen.add(b.broker_name)
                try:
                    ids = self.consumer_ids(group, b.master_addr, b.broker_name)
                except ConnectionFailedError as exc:
                    log.warning("consumers of group %s on broker %s not checked: %s", group, b.broker_name, exc)
                    continue
                if ids:
                    out[b.broker_name] = ids
        return out

    def make_group_known(self, group: str, mq: MessageQueue, subscriptions: dict[str, str]) -> None:
        """One consumer heartbeat to the broker of ``mq`` (it creates the group and its retry
        topic), unregistered at once, then one pull at the max offset (an empty answer)."""
        addr = self.broker_addr(mq.broker, mq.topic)
        self.heartbeat_consumer(group, self.client_id, addr, subscriptions)
        self.unregister_consumer(group, self.client_id, addr)
        self.pull(mq, self.max_offset(mq), 1, group=group, subscription=subscriptions.get(mq.topic, "*"))

    def start_producer(self, group: str, topics: Sequence[str], on_check: CheckHandler | None = None) -> None:
        """A producer heartbeat of ``group`` to each broker with writable queues of ``topics``
        (once per broker); brokers send their check-backs of the group's transactions over
        these connections, answered by ``on_check`` with a oneway END_TRANSACTION.

        A broker that cannot be reached (restarting, refusing) is logged and left out, and
        heartbeated by the next call that names it: the sends to it fail on their own (a
        writer goes to other brokers meanwhile), and a missing heartbeat only keeps the
        broker's check-backs away, which never commit here. Failing the task for it made one
        broker down for seconds fail every exactly-once task and then the query."""
        if on_check is not None:
            self._on_check = on_check
        self._producer_group = group
        addrs = {self.broker_addr(q.broker, t) for t in topics for q in self.message_queues(t, writable=True)}
        for addr in sorted(addrs - self._producer_addrs):
            try:
                self.heartbeat_producer(group, self.client_id, addr)
            except ConnectionFailedError as exc:
                log.warning("producer heartbeat of group %s to %s failed (%s); sending on, heartbeated again by "
                            "the next start", group, addr, exc)
                continue
            self._producer_addrs.add(addr)

    def _answer_check(self, conn: RemotingConnection, cmd: RemotingCommand, on_check: CheckHandler) -> None:
        """CHECK_TRANSACTION_STATE: the half message's record is in the body, its positions in
        the header; a message that does not decode is not ours to answer."""
        try:
            rec = decode_records(cmd.body)[0]
            queue_offset = int(cmd.ext_fields.get("tranStateTableOffset", "0"))
            commit_log_offset = int(cmd.ext_fields.get("commitLogOffset", "0"))
        except (RocketMQSparkError, ValueError, IndexError):
            return
        msg_id = cmd.ext_fields.get("msgId") or rec.properties.get("UNIQ_KEY", "")
        decision = on_check(rec.properties, msg_id)
        if decision is None:
            return  # undecided: the broker asks again later
        answer = self.end_transaction_request("", producer_group=self._producer_group,
                                              commit_log_offset=commit_log_offset, queue_offset=queue_offset,
                                              msg_id=msg_id, commit=decision, from_check=True)
        answer.flag = FLAG_ONEWAY
        conn.reply(answer)

    def transaction(self, result: SendResult, msg_id: str) -> Txn:
        """A half message is named by its positions: its offset message id holds the commit-log one."""
        return Txn(result.queue.broker, result.queue.topic, result.queue_offset, offset_of_msg_id(result.msg_id),
                   msg_id)

    def half_transaction(self, mq: MessageQueue, answer: RemotingCommand, msg_id: str) -> Txn:
        """The usual answer (SUCCESS, one message id, an in-range queue offset) read directly,
        no :class:`SendResult` built; anything else as :meth:`send_results` reads it (which
        raises what is wrong with it)."""
        if answer.code == ResponseCode.SUCCESS:
            ext = answer.ext_fields
            try:
                queue_offset = int(ext["queueOffset"])
                commit_log_offset = offset_of_msg_id(ext["msgId"])
            except (KeyError, ValueError, ProtocolError):
                pass
            else:
                if -(1 << 63) <= queue_offset < (1 << 63):
                    return Txn(mq.broker, mq.topic, queue_offset, commit_log_offset, msg_id)
        return self.transaction(self.send_results(mq, 1, answer)[0], msg_id)
