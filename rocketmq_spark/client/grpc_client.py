"""gRPC client: RocketMQ 5's ``apache.rocketmq.v2.MessagingService`` (option ``endpoints``).

It offers the operations the reader, the offset side and the writer need, with the
same names and results as :class:`~rocketmq_spark.client.remoting.RemotingClient`:
routes (QueryRoute), min/max/timestamp offsets (QueryOffset), consumer offsets
(GetOffset/UpdateOffset), pulls (PullMessage), sends (SendMessage; transactional
half messages and EndTransaction) and, for producers, the Telemetry session that
receives transaction check-backs.

Released Java proxies answer UNIMPLEMENTED to PullMessage, QueryOffset, GetOffset and
UpdateOffset: that surfaces as :class:`RequestNotSupportedError` naming ``namesrvAddr``
as the way to read such a cluster (over remoting). Sending works against them.

Channels open lazily and are dropped when pickled (Spark ships clients to executors).
"""

from __future__ import annotations

import gzip
import logging
import os
import queue
import socket
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message as ProtoMessage

if TYPE_CHECKING:
    import pyarrow as pa

from ..codec import (
    BatchEntry,
    EncodedBatch,
    SysFlag,
    TransactionType,
    batch_entries,
    decode_properties,
    join_properties,
)
from ..errors import (
    AccessDeniedError,
    BrokerError,
    ConnectionFailedError,
    GroupNotFoundError,
    MessageIllegalError,
    NoPermissionError,
    OffsetNotFoundError,
    OptionError,
    RequestNotSupportedError,
    RequestTimeoutError,
    RocketMQSparkError,
    SystemBusyError,
    TlsError,
    TopicNotFoundError,
    access_denied,
    explain,
)
from ..model import MessageQueue, PullResult, SendResult, Txn
from ..namespaces import wrap
from ..proto import pb, pb_grpc
from ..proto.messages import millis, properties_to_message, set_millis
from ..remoting.acl import grpc_auth_metadata, grpc_needs
from ..remoting.codes import ResponseCode
from ..remoting.route import refused_queues_text
from ..tls import TlsConfig, probe_hangs_up_after_handshake, probe_plaintext_answered, probe_tls
from .contract import CheckHandler, GroupPresence, QueueStatus
from .many import SequentialManyQueueCalls
from .membership import GrpcGroupMember
from .remoting import parse_namesrv_addr
from .retry import ClientConfig, retrying

log = logging.getLogger(__name__)
#: an HTTP/2 client's start (the preface and an empty SETTINGS frame): a plaintext HTTP/2
#: server answers it with its own SETTINGS (the plaintext probe, see _tls_fault)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

__all__ = ["STATUS_ERRORS", "GrpcClient", "parse_endpoints"]


#: gRPC status code (``apache.rocketmq.v2.Code``) -> exception class; others: BrokerError. An
#: UNAUTHORIZED or FORBIDDEN status whose message is an ACL refusal becomes an
#: AuthenticationError or AuthorizationError instead (see :func:`_status_error`).
STATUS_ERRORS: dict[int, type[BrokerError]] = {
    pb.TOPIC_NOT_FOUND: TopicNotFoundError,
    pb.OFFSET_NOT_FOUND: OffsetNotFoundError,
    pb.CONSUMER_GROUP_NOT_FOUND: GroupNotFoundError,
    pb.TOO_MANY_REQUESTS: SystemBusyError,
    pb.FORBIDDEN: NoPermissionError,
    pb.UNAUTHORIZED: NoPermissionError,
    pb.NOT_IMPLEMENTED: RequestNotSupportedError,
    pb.UNSUPPORTED: RequestNotSupportedError,
    pb.BAD_REQUEST: MessageIllegalError,
    pb.MESSAGE_BODY_TOO_LARGE: MessageIllegalError,
    pb.PAYLOAD_TOO_LARGE: MessageIllegalError,
}
#: Calls a proxy may leave unimplemented, and what to do instead.
_READ_RPCS = ("PullMessage", "QueryOffset", "GetOffset", "UpdateOffset")
_MAX_MESSAGE = 64 * 1024 * 1024
_PERM_READ = (pb.READ, pb.READ_WRITE)
_PERM_WRITE = (pb.WRITE, pb.READ_WRITE)
#: a route's queue permission as brokers' 4 read / 2 write bits
_PERM_BITS = {pb.NONE: 0, pb.READ: 4, pb.WRITE: 2, pb.READ_WRITE: 6}


def parse_endpoints(value: str | Sequence[str]) -> list[str]:
    """``"h1:8081;h2:8081"`` -> ["h1:8081", "h2:8081"] (same rules as name server lists;
    ValueError for an entry that is not host:port)."""
    return parse_namesrv_addr(value)


#: what a call asked of the ACL: (resource key, the actions any of which it accepts), see
#: :func:`rocketmq_spark.remoting.acl.grpc_needs`
Needs = Sequence[tuple[str, Sequence[str]]]
#: statuses a 5.x proxy refuses a call with: UNAUTHORIZED for every ACL 2.0 refusal (its
#: ResponseBuilder maps both AuthenticationException and AuthorizationException there, with the
#: exception's message), FORBIDDEN for a topic's queue permissions ("no writable queue")
_REFUSED = (pb.UNAUTHORIZED, pb.FORBIDDEN)


def _status_error(status: pb.Status, *, address: str, operation: str, user: str | None = None,
                  needs: Needs | None = None) -> BrokerError:
    """The exception for a non-OK status; a refusal by ACL (``needs`` given: what the call asked,
    ``user`` its access key) is an :class:`~rocketmq_spark.errors.AccessDeniedError` naming the
    user, the resource and the action, never retried."""
    name = pb.Code.Name(status.code) if status.code in pb.Code.values() else status.code
    if status.code in _REFUSED and needs is not None:
        denied = access_denied(int(status.code), status.message, address=address, operation=operation, user=user,
                               needs=needs, peer="proxy")
        if denied is not None:
            return denied
    cls = STATUS_ERRORS.get(status.code, BrokerError)
    return cls(int(status.code), explain(f"{name}: {status.message}"), address=address, operation=operation)


def _tls_fault(detail: str, address: str, operation: str, tls: TlsConfig | None) -> TlsError | None:
    """The TlsError an UNAVAILABLE call means, if it means one (gRPC words TLS faults in its
    status detail; a plaintext channel to a TLS-only server sees the connection closed, and a
    probe tells that server apart from one that is down)."""
    low = detail.lower()
    if tls is not None:
        if "hostname verification" in low:
            return TlsError(address, operation, f"certificate verify failed ({detail}): the server's certificate does "
                            "not name the host connected to; connect by a name or address the certificate lists "
                            "(gRPC always checks it)")
        if "certificate_verify_failed" in low or "certificate verify failed" in low:
            return TlsError(address, operation, f"certificate verify failed ({detail}): set tlsCaFile to the PEM file "
                            "of the CA that signed the server's certificate, and connect by a name or address the "
                            "certificate lists (gRPC always checks it)")
        if "handshake" in low or "wrong_version_number" in low or "ssl" in low or "tls" in low:
            return TlsError(address, operation, f"the TLS handshake failed ({detail}): if the endpoint serves "
                            "plaintext set tls=false; if it requires a client certificate set tlsCertFile and "
                            "tlsKeyFile")
        host, _, port = address.rpartition(":")
        if (tls.cert_file is None and "refused" not in low and port.isdigit()
                and probe_hangs_up_after_handshake(tls.context(address), host.strip("[]"), int(port), 3.0)):
            return TlsError(address, operation, f"the endpoint ends every TLS session right after the handshake "
                            f"({detail}): it requires a client certificate (mutual TLS); set tlsCertFile and "
                            "tlsKeyFile")
        return None
    if "refused" in low or "deadline" in low:
        return None
    host, _, port = address.rpartition(":")
    # a permissive endpoint (Apache RocketMQ's default) speaks both: it requires TLS only when it
    # also gives a plaintext HTTP/2 start no answer now
    if (port.isdigit() and probe_tls(host.strip("[]"), int(port), 3.0)
            and not probe_plaintext_answered(host.strip("[]"), int(port), _H2_PREFACE, 3.0)):
        return TlsError(address, operation, f"the endpoint requires TLS: it hung up on a plaintext call ({detail}) "
                        "and accepts a TLS handshake; set tls=true (CLI: --tls)")
    return None


def _rpc_error(exc: grpc.RpcError, *, address: str, operation: str, rpc: str,
               tls: TlsConfig | None = None, user: str | None = None, needs: Needs | None = None
               ) -> RocketMQSparkError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        tls_error = _tls_fault(str(detail), address, operation, tls)
        if tls_error is not None:
            return tls_error
    if code == grpc.StatusCode.UNIMPLEMENTED:
        hint = (" (released RocketMQ 5 proxies do not serve pulls or consumer offsets over gRPC): read this "
                "cluster over remoting with the option namesrvAddr, its name server list host:port;host:port"
                if rpc in _READ_RPCS else "")
        return RequestNotSupportedError(12, f"the gRPC endpoint does not implement {rpc}{hint}",
                                        address=address, operation=operation)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimeoutError(address, operation, f"no answer in time ({detail})")
    if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
        denied = access_denied(16, str(detail or ""), address=address, operation=operation, user=user,
                               needs=needs or (), peer="gRPC endpoint")
        return denied or NoPermissionError(16, f"{code.name}: {detail}", address=address, operation=operation)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, None):
        return ConnectionFailedError(address, operation, detail)
    return BrokerError(code.value[0], f"{code.name}: {detail}", address=address, operation=operation)


class GrpcClient(SequentialManyQueueCalls):
    """Talks to RocketMQ 5 gRPC endpoints (a proxy, or the embedded broker's); a
    :class:`~.contract.BrokerClient`.

    Threads: as the contract says, one thread at a time; only the channel table is locked. A
    producer's check-backs are answered on its Telemetry thread (see :meth:`start_producer`)."""

    compresses_bodies = False

    def __init__(self, endpoints: str | Sequence[str], config: ClientConfig | None = None) -> None:
        self.endpoints = parse_endpoints(endpoints)
        if not self.endpoints:
            raise ValueError("no gRPC endpoint given")
        self.config = config or ClientConfig()
        if self.config.tls is not None and not self.config.tls.verify_hostname:
            raise OptionError("tlsVerifyHostname", "false", "gRPC (option endpoints) always checks that the server's "
                              "certificate names the host connected to: connect by a name or address the certificate "
                              "lists and leave tlsVerifyHostname=true, or read and write over remoting (namesrvAddr)")
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.MessagingServiceStub]] = {}
        self._routes: dict[str, tuple[float, list[pb.MessageQueue]]] = {}
        self._broker_endpoints: dict[str, str] = {}
        self._index = 0
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:12]}"
        self._telemetry: _Telemetry | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"endpoints": self.endpoints, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.endpoints = state["endpoints"]
        self.config = state["config"]
        self._init_runtime()

    # -- channels -------------------------------------------------------------------

    def stub(self, address: str) -> pb_grpc.MessagingServiceStub:
        """The stub of the channel to ``address``, opened on first use."""
        with self._lock:
            entry = self._channels.get(address)
            if entry is None:
                options = [
                    ("grpc.max_receive_message_length", _MAX_MESSAGE),
                    ("grpc.max_send_message_length", _MAX_MESSAGE),
                ]
                tls = self.config.tls
                if tls is None:
                    channel = grpc.insecure_channel(address, options=options)
                else:
                    roots, key, chain = tls.pem_files(address)
                    creds = grpc.ssl_channel_credentials(root_certificates=roots, private_key=key,
                                                         certificate_chain=chain)
                    channel = grpc.secure_channel(address, creds, options=options)
                if self.config.namespace:
                    channel = grpc.intercept_channel(channel, _NamespaceStamp(self.config.namespace))
                entry = self._channels[address] = (channel, pb_grpc.MessagingServiceStub(channel))
            return entry[1]

    def connection_epoch(self, broker: str) -> tuple[str, int] | None:
        """None: a gRPC channel reconnects by itself, out of the caller's sight."""
        return None

    def broker_boot_ms(self, broker: str) -> int | None:
        """None: the 5.x protocol does not say when a broker started."""
        return None

    def metadata(self) -> list[tuple[str, str]]:
        """Per-call metadata; with credentials it is signed (RocketMQ 5 MQv2-HMAC-SHA1)."""
        date_time = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = [
            ("x-mq-client-id", self.client_id),
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", "rocketmq-spark"),
            ("x-mq-date-time", date_time),
            ("x-mq-request-id", uuid.uuid4().hex),
        ]
        if self.config.namespace:
            out.append(("x-mq-namespace", self.config.namespace))  # as the 5.x Java SDK names it
        creds = getattr(self.config, "credentials", None)
        if creds is not None:
            out.extend(grpc_auth_metadata(creds, date_time))
        return out

    def _user(self) -> str | None:
        """The access key calls are signed with (None: unsigned); never the secret."""
        creds = getattr(self.config, "credentials", None)
        return creds.access_key if creds is not None else None

    def close(self) -> None:
        tele, self._telemetry = self._telemetry, None
        if tele is not None:
            tele.close()
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel, _ in channels:
            channel.close()

    def _call(self, address: str, rpc: str, request: Any, operation: str, *,
              ok: tuple[int, ...] = (pb.OK,), timeout_s: float | None = None) -> Any:
        """One unary call with bounded retries on transient faults; a non-OK status raises."""
        timeout = timeout_s or self.config.request_timeout_s
        user, needs = self._user(), grpc_needs(rpc, request)

        def once() -> Any:
            method = getattr(self.stub(address), rpc)
            try:
                resp = method(request, timeout=timeout, metadata=self.metadata())
            except grpc.RpcError as exc:
                raise _rpc_error(exc, address=address, operation=operation, rpc=rpc, tls=self.config.tls,
                                 user=user, needs=needs) from None
            if resp.status.code not in ok:
                raise _status_error(resp.status, address=address, operation=operation, user=user, needs=needs)
            return resp

        return retrying(once, self.config)

    def _access_point(self, rpc: str, request: Any, operation: str) -> Any:
        """A call to the configured endpoints in turn (one down is tolerated)."""
        last: RocketMQSparkError | None = None
        n = len(self.endpoints)
        for i in range(n):
            addr = self.endpoints[(self._index + i) % n]
            try:
                resp = self._call(addr, rpc, request, operation)
            except ConnectionFailedError as exc:
                last = exc
                continue
            self._index = (self._index + i) % n
            return resp
        assert last is not None
        raise last

    # -- routes ---------------------------------------------------------------------

    def _route(self, topic: str, *, refresh: bool = False) -> list[pb.MessageQueue]:
        cached = self._routes.get(topic)
        now = time.monotonic()
        if cached and not refresh and now - cached[0] < self.config.route_refresh_s:
            return cached[1]
        req = pb.QueryRouteRequest()
        req.topic.name = topic
        host, _, port = self.endpoints[self._index].rpartition(":")
        req.endpoints.scheme = pb.IPv6 if ":" in host else pb.IPv4
        req.endpoints.addresses.add(host=host.strip("[]"), port=int(port))
        resp = self._access_point("QueryRoute", req, f"route lookup of topic {topic!r}")
        queues = list(resp.message_queues)
        for q in queues:  # a 5.x proxy names the namespace apart: requests name the queues as brokers do
            q.topic.name = wire_name(q.topic)
        for q in queues:
            addrs = q.broker.endpoints.addresses
            if addrs:
                a = addrs[0]
                self._broker_endpoints[q.broker.name] = (f"[{a.host}]:{a.port}" if ":" in a.host
                                                         else f"{a.host}:{a.port}")
        self._routes[topic] = (now, queues)
        return queues

    def route(self, topic: str, *, refresh: bool = False) -> list[pb.MessageQueue]:
        """The topic's queues as the endpoints route them, cached for ``route_refresh_s``
        seconds unless ``refresh``; TopicNotFoundError when the endpoints do not know the topic."""
        return self._route(topic, refresh=refresh)

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        """The topic's queues that can be read (or written to). None of them, though the topic
        has queues: :class:`NoPermissionError` naming their permission, as the remoting client."""
        wanted = _PERM_WRITE if writable else _PERM_READ
        route = self._route(topic, refresh=refresh)
        out = sorted(MessageQueue(topic, q.broker.name, q.id) for q in route if q.permission in wanted)
        if not out and route:
            raise NoPermissionError(
                ResponseCode.NO_PERMISSION,
                refused_queues_text(topic, {_PERM_BITS.get(q.permission, 0) for q in route}, writable=writable),
                address=self.endpoints[self._index], operation=f"route of topic {topic!r}")
        return out

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        """The gRPC endpoint serving ``broker``'s queues (from routes; else the access point)."""
        addr = self._broker_endpoints.get(broker)
        if addr is None and topic is not None:
            self._route(topic, refresh=True)
            addr = self._broker_endpoints.get(broker)
        return addr or self.endpoints[self._index]

    def remember_broker_addr(self, broker: str, addr: str) -> None:
        self._broker_endpoints.setdefault(broker, addr)

    def _pb_queue(self, mq: MessageQueue) -> pb.MessageQueue:
        for q in self._route(mq.topic):
            if q.id == mq.queue_id and q.broker.name == mq.broker:
                return q
        out = pb.MessageQueue(id=mq.queue_id)
        out.topic.name = mq.topic
        out.broker.name = mq.broker
        return out

    # -- offsets --------------------------------------------------------------------

    def _query_offset(self, mq: MessageQueue, policy: int, ts: int | None, what: str) -> int:
        req = pb.QueryOffsetRequest(query_offset_policy=policy)
        req.message_queue.CopyFrom(self._pb_queue(mq))
        if ts is not None:
            set_millis(req.timestamp, ts)
        resp = self._call(self.broker_addr(mq.broker, mq.topic), "QueryOffset", req, f"{what} of {mq}")
        return int(resp.offset)

    def min_offset(self, mq: MessageQueue) -> int:
        return self._query_offset(mq, pb.BEGINNING, None, "min offset")

    def max_offset(self, mq: MessageQueue) -> int:
        return self._query_offset(mq, pb.END, None, "max offset")

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """First offset whose store time >= ``timestamp_ms`` (max offset when none)."""
        return self._query_offset(mq, pb.TIMESTAMP, timestamp_ms, "search offset by timestamp")

    def query_consumer_offset(self, group: str, mq: MessageQueue) -> int | None:
        """The group's committed (next-to-consume) offset, or None when it has none."""
        req = pb.GetOffsetRequest()
        req.group.name = group
        req.message_queue.CopyFrom(self._pb_queue(mq))
        try:
            resp = self._call(self.broker_addr(mq.broker, mq.topic), "GetOffset", req,
                              f"query offset of group {group!r} for {mq}")
        except OffsetNotFoundError:
            return None
        return int(resp.offset)

    def update_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        req = pb.UpdateOffsetRequest(offset=offset)
        req.group.name = group
        req.message_queue.CopyFrom(self._pb_queue(mq))
        self._call(self.broker_addr(mq.broker, mq.topic), "UpdateOffset", req,
                   f"update offset of group {group!r} for {mq}")

    # -- pulls ----------------------------------------------------------------------

    def pull_async(self, mq: MessageQueue, offset: int, max_nums: int, *, group: str = "",
                   subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> tuple[Any, int, str]:
        """Start a pull (the stream runs while the caller does other work); resolve it with
        :meth:`pull_result`."""
        req = pb.PullMessageRequest(offset=offset, batch_size=max_nums)
        req.group.name = group or "rocketmq-spark"
        req.message_queue.CopyFrom(self._pb_queue(mq))
        req.filter_expression.type = pb.SQL if expression_type == "SQL92" else pb.TAG
        req.filter_expression.expression = subscription or "*"
        set_millis(req.long_polling_timeout, suspend_ms)
        addr = self.broker_addr(mq.broker, mq.topic)
        call = self.stub(addr).PullMessage(req, timeout=self.config.request_timeout_s + suspend_ms / 1000.0,
                                           metadata=self.metadata())
        return call, offset, req.group.name

    def pull_async_many(self, mq: MessageQueue, offsets: Sequence[int], max_nums: int, *, group: str = "",
                        subscription: str = "*", expression_type: str = "TAG") -> list[tuple[Any, int, str]]:
        """One PullMessage stream per offset (streams are not written together)."""
        return [self.pull_async(mq, off, max_nums, group=group, subscription=subscription,
                                expression_type=expression_type) for off in offsets]

    def pull_result(self, mq: MessageQueue, pending: tuple[Any, int, str]) -> PullResult:
        call, offset, group = pending
        addr = self._broker_endpoints.get(mq.broker, self.endpoints[self._index])
        needs = [(f"Group:{group}", ("Sub",)), (f"Topic:{mq.topic}", ("Sub",))]
        status: pb.Status | None = None
        messages: list[pb.Message] = []
        next_offset = -1
        try:
            for item in call:
                kind = item.WhichOneof("content")
                if kind == "message":
                    messages.append(item.message)
                elif kind == "status":
                    status = item.status
                elif kind == "next_offset":
                    next_offset = item.next_offset
        except grpc.RpcError as exc:
            raise _rpc_error(exc, address=addr, operation=f"pull of {mq}", rpc="PullMessage",
                             tls=self.config.tls, user=self._user(), needs=needs) from None
        code = status.code if status is not None else pb.OK
        if code == pb.OK:
            state = "FOUND" if messages else ("NO_MATCHED_MSG" if next_offset > offset else "NO_NEW_MSG")
        elif code == pb.MESSAGE_NOT_FOUND:
            state = "NO_MATCHED_MSG" if next_offset > offset else "NO_NEW_MSG"
        elif code == pb.ILLEGAL_OFFSET:
            state = "OFFSET_ILLEGAL"
        else:
            assert status is not None
            raise _status_error(status, address=addr, operation=f"pull of {mq}", user=self._user(), needs=needs)
        if next_offset < 0:
            next_offset = messages[-1].system_properties.queue_offset + 1 if messages else offset
        low = high = -1
        if state == "OFFSET_ILLEGAL":
            # the answer carries no range; the reader tells a reset from retention by it, as the
            # classic protocol's answer lets it
            low, high = self.min_offset(mq), self.max_offset(mq)
        return PullResult(state, next_offset, low, high, b"", tuple(messages))

    def pull(self, mq: MessageQueue, offset: int, max_nums: int = 32, *, group: str = "",
             subscription: str = "*", suspend_ms: int = 0, expression_type: str = "TAG") -> PullResult:
        return retrying(lambda: self.pull_result(mq, self.pull_async(
            mq, offset, max_nums, group=group, subscription=subscription, suspend_ms=suspend_ms,
            expression_type=expression_type)), self.config)

    def rows(self, mq: MessageQueue, results: Sequence[PullResult], end: int | None = None,
             columns: Sequence[str] | None = None) -> pa.RecordBatch:
        from ..codec.arrow import RETRY_COLUMNS, columns_to_batch, no_retry_origin

        batch = columns_to_batch(message_columns([m for r in results for m in r.messages]), mq.broker, end)
        if columns is None:
            return batch
        if not set(RETRY_COLUMNS).isdisjoint(columns):
            # the rows built from gRPC messages have no retry origin: retryTopic null, reconsumeTimes 0
            batch = no_retry_origin(batch)
        return batch.select(list(columns))

    # -- consumer group ---------------------------------------------------------------

    def group_consumers(self, group: str, topics: Sequence[str]) -> dict[str, list[str]] | None:
        """None: the 5.x protocol has no call listing a group's online consumers."""
        return None

    def join_group(self, group: str, subscriptions: dict[str, str],
                   running_info: Callable[[], dict[MessageQueue, QueueStatus]], *,
                   expression_type: str = "TAG") -> GroupPresence | None:
        """What the 5.x protocol allows: a simple consumer's Telemetry session (its settings name
        the group and subscriptions; brokers list it as an online consumer) and a Heartbeat on
        the Java client's interval, NotifyClientTermination when closed. The protocol pushes no
        resets to a consumer (brokers reset on the server side: the reader finds them by the
        group's offsets changing) and has no running-info request, so ``running_info`` is not
        asked (see :class:`~.membership.GrpcGroupMember`). Subscriptions are tag expressions
        (``expression_type`` TAG: SQL92 reads need remoting)."""
        member = GrpcGroupMember(self, self.endpoints[self._index], group, subscriptions)
        member.start()
        return member

    def consumer_session(self, group: str, subscriptions: dict[str, str], address: str) -> _Telemetry:
        """A simple consumer's Telemetry stream to ``address`` (its settings name ``group`` and
        ``subscriptions``), started: a group member's session."""
        session = _Telemetry(self, address, [], None, consumer=(group, dict(subscriptions)))
        session.start()
        return session

    def heartbeat_consumer(self, group: str, address: str) -> None:
        """A simple consumer's Heartbeat of ``group`` to ``address``."""
        req = pb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER)
        req.group.name = group
        self._call(address, "Heartbeat", req, f"heartbeat of group {group!r}")

    def notify_termination(self, group: str, address: str) -> None:
        """NotifyClientTermination of ``group`` to ``address``: this client leaves the group."""
        req = pb.NotifyClientTerminationRequest()
        req.group.name = group
        self._call(address, "NotifyClientTermination", req, f"leaving group {group!r}")

    def make_group_known(self, group: str, mq: MessageQueue, subscriptions: dict[str, str]) -> None:
        """One pull at the max offset (an empty answer): the broker creates the group on it."""
        self.pull(mq, self.max_offset(mq), 1, group=group, subscription=subscriptions.get(mq.topic, "*"))

    def store_time_at(self, mq: MessageQueue, offset: int) -> int | None:
        """Store time (epoch ms) of the message at ``offset``, None when there is none."""
        res = self.pull(mq, offset, 1)
        if res.status != "FOUND" or not res.messages:
            return None
        return _store_ms(res.messages[0].system_properties)

    @staticmethod
    def store_time_in(res: PullResult, offset: int) -> int | None:
        """See the client contract: from the messages' system properties."""
        if res.status == "FOUND":
            for m in res.messages:
                if m.system_properties.queue_offset == offset:
                    return _store_ms(m.system_properties)
        return None

    def stored_sizes(self, mq: MessageQueue, start: int, count: int) -> list[int]:
        """The 5.x protocol has no request for a consume queue's entries."""
        raise RequestNotSupportedError(ResponseCode.REQUEST_CODE_NOT_SUPPORTED, "the 5.x gRPC protocol does not "
                                       "serve consume-queue entries (message sizes): use namesrvAddr",
                                       address=";".join(self.endpoints), operation=f"stored sizes of {mq}")

    # -- sending ----------------------------------------------------------------------

    def send_request(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *, producer_group: str = "",
                     sys_flag: int = 0, born_ts: int | None = None,
                     batch_properties: str = "") -> list[pb.SendMessageRequest]:
        """One SendMessage request per entry (properties as remoting writes them, then
        ``batch_properties``, as a broker appends a batch's own to each of its messages).

        One message a request, as the official SDKs send: a 5.x proxy (5.3.3) turns a
        multi-message request into a batch whose header carries the first message's properties,
        which the broker appends to every message (each gets the first one's tag, keys and
        UNIQ_KEY). gRPC proxies pick the queue themselves (a message group's by hash)."""
        prepared = (sys_flag & SysFlag.TRANSACTION_MASK) == TransactionType.PREPARED
        born = born_ts if born_ts is not None else int(time.time() * 1000)
        host = socket.gethostname()
        out = []
        for e in batch_entries(entries):
            body = zlib.decompress(e.body) if sys_flag & SysFlag.COMPRESSED else e.body
            props = decode_properties(join_properties(e.properties, batch_properties))
            if not props.get("UNIQ_KEY"):
                props["UNIQ_KEY"] = uuid.uuid4().hex.upper()
            msg = properties_to_message(mq.topic, body, props, prepared=prepared, born_ms=born, born_host=host)
            out.append(pb.SendMessageRequest(messages=[msg]))
        return out

    def send_back(self, mq: MessageQueue, commit_log_offset: int, group: str, *, origin_msg_id: str,
                  max_reconsume_times: int = 16, delay_level: int = 0) -> None:
        """Not in the 5.x protocol: its consumers give a message back by letting its
        invisibility lapse (ChangeInvisibleDuration), which needs a receipt handle from a
        receive; a message read by offset has none."""
        raise OptionError("endpoints", None, "delivery=send-back gives messages back with CONSUMER_SEND_MSG_BACK, "
                          "which only the remoting protocol has: use namesrvAddr")

    def send_to_retry(self, mq: MessageQueue, group: str, entry: BatchEntry, *, sys_flag: int, reconsume_times: int,
                      max_reconsume_times: int, producer_group: str = "rocketmq-spark") -> SendResult:
        """Not over gRPC (see :meth:`send_back`)."""
        raise OptionError("endpoints", None, "delivery=send-back sends to a retry topic with the remoting "
                          "protocol only: use namesrvAddr")

    def send_async_many(self, sends: Sequence[tuple[MessageQueue, list[pb.SendMessageRequest]]]
                        ) -> list[Future[Any]]:
        """:meth:`send_async` of each (gRPC calls are separate requests on one channel); one
        that cannot be sent (no route) fails alone, the others stay in flight."""
        out: list[Future[Any]] = []
        for mq, req in sends:
            try:
                out.append(self.send_async(mq, req))
            except RocketMQSparkError as exc:
                failed: Future[Any] = Future()
                failed.set_exception(exc)
                out.append(failed)
        return out

    def send_async(self, mq: MessageQueue, request: list[pb.SendMessageRequest]) -> Future[Any]:
        """Send without waiting, every request in flight at once, except a message group's: those
        one after the other (the proxy keeps their order only if each has landed before the next
        is sent). Resolves to one SendMessageResponse holding every entry (see :meth:`send_results`)."""
        addr = self.broker_addr(mq.broker, mq.topic)
        mapped: Future[Any] = Future()

        def resolve(f: Future[Any]) -> None:
            try:
                mapped.set_result(f.result())
            except grpc.RpcError as exc:
                mapped.set_exception(_rpc_error(exc, address=addr, operation=f"send to {mq}", rpc="SendMessage",
                                                tls=self.config.tls, user=self._user(),
                                                needs=[(f"Topic:{mq.topic}", ("Pub",))]))
            except BaseException as exc:
                mapped.set_exception(exc)

        self._send_calls(addr, request).add_done_callback(resolve)
        return mapped

    def _send_calls(self, addr: str, request: list[pb.SendMessageRequest]) -> Future[Any]:
        stub, meta, timeout = self.stub(addr), self.metadata(), self.config.request_timeout_s

        def call(r: pb.SendMessageRequest) -> Any:
            return stub.SendMessage.future(r, timeout=timeout, metadata=meta)

        if len(request) == 1:
            return call(request[0])
        merged: Future[Any] = Future()
        answers: list[Any] = [None] * len(request)

        def finish(upto: int) -> None:
            resp = pb.SendMessageResponse()
            bad = [a.status for a in answers[:upto] if a.status.code != pb.OK]
            resp.status.CopyFrom(bad[0] if bad else answers[0].status)
            for a in answers[:upto]:
                resp.entries.extend(a.entries)
            merged.set_result(resp)

        if any(r.messages[0].system_properties.message_group for r in request):
            def chain(i: int, fut: Any) -> None:
                try:
                    answers[i] = fut.result()
                    if answers[i].status.code != pb.OK or i + 1 == len(request):
                        finish(i + 1)
                        return
                    call(request[i + 1]).add_done_callback(lambda f: chain(i + 1, f))
                except Exception as exc:  # grpc.RpcError (or a failed call): send_async maps it
                    merged.set_exception(exc)

            call(request[0]).add_done_callback(lambda f: chain(0, f))
            return merged
        calls = [call(r) for r in request]
        left = [len(calls)]
        lock = threading.Lock()

        def done(_: Any) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                answers[:] = [c.result() for c in calls]
            except Exception as exc:  # grpc.RpcError: send_async maps it
                merged.set_exception(exc)
                return
            finish(len(calls))

        for c in calls:
            c.add_done_callback(done)
        return merged

    def check_sent(self, mq: MessageQueue, count: int, answer: Any) -> None:
        self.send_results(mq, count, answer)

    def send_results(self, mq: MessageQueue, count: int, resp: Any) -> list[SendResult]:
        addr = self._broker_endpoints.get(mq.broker, "?")
        user, needs = self._user(), [(f"Topic:{mq.topic}", ("Pub",))]
        if resp.status.code != pb.OK:
            raise _status_error(resp.status, address=addr, operation=f"send to {mq}", user=user, needs=needs)
        out = []
        for e in resp.entries:
            if e.status.code != pb.OK:
                raise _status_error(e.status, address=addr, operation=f"send to {mq}", user=user, needs=needs)
            out.append(SendResult(e.message_id, mq, int(e.offset), e.transaction_id))
        if len(out) != count:
            raise BrokerError(-1, f"{count} messages sent, {len(out)} results", address=addr,
                              operation=f"send to {mq}")
        return out

    def send_batch(self, mq: MessageQueue, entries: list[BatchEntry] | EncodedBatch, *, producer_group: str = "",
                   sys_flag: int = 0, born_ts: int | None = None, batch_properties: str = "") -> list[SendResult]:
        """Send and wait (see :meth:`send_request`, :meth:`send_async`); errors are
        RocketMQSparkError (the caller retries)."""
        reqs = self.send_request(mq, entries, producer_group=producer_group, sys_flag=sys_flag, born_ts=born_ts,
                                 batch_properties=batch_properties)
        addr = self.broker_addr(mq.broker, mq.topic)
        try:
            resp = self.send_async(mq, reqs).result(self.config.request_timeout_s * len(reqs))
        except TimeoutError:
            raise RequestTimeoutError(addr, f"send to {mq}", f"no answer within "
                                      f"{self.config.request_timeout_s * len(reqs):g}s") from None
        return self.send_results(mq, len(reqs), resp)

    def send(self, mq: MessageQueue, body: bytes, properties: str = "", **kw: Any) -> SendResult:
        """Send one message and wait (:meth:`send_batch`)."""
        return self.send_batch(mq, [BatchEntry(body, properties)], **kw)[0]

    def _end_request(self, topic: str, msg_id: str, transaction_id: str, commit: bool,
                     from_check: bool) -> pb.EndTransactionRequest:
        req = pb.EndTransactionRequest(message_id=msg_id, transaction_id=transaction_id,
                                       resolution=pb.COMMIT if commit else pb.ROLLBACK,
                                       source=pb.SOURCE_SERVER_CHECK if from_check else pb.SOURCE_CLIENT)
        req.topic.name = topic
        return req

    def end_transaction(self, broker: str, *, topic: str, msg_id: str, transaction_id: str, commit: bool,
                        from_check: bool = False) -> bool:
        """EndTransaction; False when the server answers INVALID_TRANSACTION_ID: it has no such
        open transaction (the embedded broker: no half message there; an Apache 5.x proxy: it
        holds no data for that id: ended through it before, or the proxy restarted)."""
        req = self._end_request(topic, msg_id, transaction_id, commit, from_check)
        try:
            self._call(self.broker_addr(broker, topic), "EndTransaction", req,
                       f"{'commit' if commit else 'rollback'} of transaction {msg_id}")
        except BrokerError as exc:
            if exc.code == pb.INVALID_TRANSACTION_ID:
                return False
            raise
        return True

    def end_transactions(self, txns: Sequence[Txn], *, commit: bool, producer_group: str = "",
                         window: int = 256, on_progress: Callable[[int], None] | None = None,
                         retry_failed: bool = True, on_applied: Callable[[int], None] | None = None) -> list[Txn]:
        """EndTransaction for every ``txns``, up to ``window`` in flight; returns those answered
        INVALID_TRANSACTION_ID (gone, or unknown to the proxy: see :meth:`end_transaction`;
        an Apache 5.x proxy relays an END oneway and answers OK whether or not the broker still
        holds the half, so a half its broker lost is not seen here); a failed one is retried
        alone (with the client's bounded retries), or with ``retry_failed=False`` not: no more
        are sent, those in flight are waited for, and the first failure is raised. The producer
        group is the client's (its settings name it), so ``producer_group`` is not sent.
        ``on_progress``, ``on_applied``: see the client contract."""
        pending: deque[tuple[int, Txn, Future[Any]]] = deque()
        failed: list[RocketMQSparkError] = []
        gone: list[Txn] = []
        what = f"{'commit' if commit else 'rollback'} of transaction"

        def settle(t: Txn, fut: Future[Any]) -> bool:
            addr = self._broker_endpoints.get(t.broker, "?")
            try:
                resp = fut.result(self.config.request_timeout_s)
                if resp.status.code == pb.OK:
                    return True
                if resp.status.code == pb.INVALID_TRANSACTION_ID:
                    gone.append(t)
                    return False
                err: RocketMQSparkError = _status_error(resp.status, address=addr, operation=f"{what} {t.msg_id}",
                                                        user=self._user(), needs=[(f"Topic:{t.topic}", ("Pub",))])
            except grpc.RpcError as exc:
                err = _rpc_error(exc, address=addr, operation=f"{what} {t.msg_id}", rpc="EndTransaction",
                                 tls=self.config.tls, user=self._user(), needs=[(f"Topic:{t.topic}", ("Pub",))])
            except TimeoutError:
                err = RequestTimeoutError(addr, f"{what} {t.msg_id}",
                                          f"no answer within {self.config.request_timeout_s:g}s")
            if not retry_failed:
                failed.append(err)
                return False
            if self.end_transaction(t.broker, topic=t.topic, msg_id=t.msg_id, transaction_id=t.transaction_id,
                                    commit=commit):
                return True
            gone.append(t)
            return False

        def settle_to(keep: int, *, report: bool) -> None:
            # the prefix applied stops at the first failure or gone transaction
            done = -1
            while len(pending) > keep:
                i, t, fut = pending.popleft()
                applied = settle(t, fut)
                if applied and on_applied is not None:
                    on_applied(i)
                if applied and not failed and not gone:
                    done = i
            if on_progress is not None and done >= 0 and report:
                on_progress(done + 1)

        step = max(1, window // 2)
        for i, t in enumerate(txns):
            if failed:
                break
            stub = self.stub(self.broker_addr(t.broker, t.topic))
            req = self._end_request(t.topic, t.msg_id, t.transaction_id, commit, False)
            pending.append((i, t, stub.EndTransaction.future(req, timeout=self.config.request_timeout_s,
                                                             metadata=self.metadata())))
            if len(pending) > window:
                settle_to(window, report=(i + 1 - window) % step == 0)
        settle_to(0, report=True)
        if failed:
            raise failed[0]
        return gone

    def transaction(self, result: SendResult, msg_id: str) -> Txn:
        """A half message is named by the transaction id the proxy gave (commit-log position 0)."""
        return Txn(result.queue.broker, result.queue.topic, result.queue_offset, 0, msg_id, result.transaction_id)

    def half_transaction(self, mq: MessageQueue, answer: Any, msg_id: str) -> Txn:
        return self.transaction(self.send_results(mq, 1, answer)[0], msg_id)

    def start_producer(self, group: str, topics: Sequence[str], on_check: CheckHandler | None = None) -> None:
        """Announce a producer of ``topics`` (Telemetry settings, then a heartbeat). With
        ``on_check``, transaction check-backs are answered: it gets the message's properties
        and id and returns True (commit), False (rollback) or None (not known yet). The 5.x
        protocol names no producer group (the proxy keys check-backs by the client), so
        ``group`` is not sent."""
        if self._telemetry is not None:
            self._telemetry.add_topics(topics)
            return
        addr = self.endpoints[self._index]
        telemetry = _Telemetry(self, addr, list(topics), on_check)
        telemetry.start()  # raises an ACL refusal of the settings
        self._telemetry = telemetry
        self._call(addr, "Heartbeat", pb.HeartbeatRequest(client_type=pb.PRODUCER), "heartbeat")


class _Telemetry:
    """A producer's Telemetry stream: settings out, server settings and check-backs in."""

    def __init__(self, client: GrpcClient, address: str, topics: list[str],
                 on_check: CheckHandler | None, *, consumer: tuple[str, dict[str, str]] | None = None) -> None:
        self.client = client
        self.address = address
        self.topics = topics
        self.on_check = on_check
        #: a consumer's session instead: (group, topic -> tag expression)
        self.consumer = consumer
        self._out: queue.Queue[pb.TelemetryCommand | None] = queue.Queue()
        self._settled = threading.Event()
        self._call: Any = None
        self._thread: threading.Thread | None = None
        #: an ACL refusal of the settings (a status command, or the stream ended with one)
        self.refused: AccessDeniedError | None = None

    def _requests(self) -> Iterator[pb.TelemetryCommand]:
        while True:
            cmd = self._out.get()
            if cmd is None:
                return
            yield cmd

    def _settings(self) -> pb.TelemetryCommand:
        if self.consumer is not None:
            group, subscriptions = self.consumer
            settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER)
            settings.subscription.group.name = group
            for topic, expression in sorted(subscriptions.items()):
                entry = settings.subscription.subscriptions.add()
                entry.topic.name = topic
                entry.expression.type = pb.TAG
                entry.expression.expression = expression or "*"
        else:
            settings = pb.Settings(client_type=pb.PRODUCER)
            settings.publishing.topics.extend(pb.Resource(name=t) for t in self.topics)
        settings.user_agent.language = pb.PYTHON
        settings.user_agent.version = "rocketmq-spark"
        set_millis(settings.request_timeout, int(self.client.config.request_timeout_s * 1000))
        return pb.TelemetryCommand(settings=settings)

    def add_topics(self, topics: Sequence[str]) -> None:
        new = [t for t in topics if t not in self.topics]
        if new:
            self.topics.extend(new)
            self._out.put(self._settings())

    def start(self) -> None:
        self._out.put(self._settings())
        stub = self.client.stub(self.address)
        self._call = stub.Telemetry(self._requests(), metadata=self.client.metadata())
        self._thread = threading.Thread(target=self._run, name="rocketmq-grpc-telemetry", daemon=True)
        self._thread.start()
        if not self._settled.wait(self.client.config.request_timeout_s):
            log.warning("no settings from %s within %.0fs; sending anyway", self.address,
                        self.client.config.request_timeout_s)
        if self.refused is not None:  # the next call would be refused the same way: say so now
            self.close()
            raise self.refused

    def _refusal(self, err: RocketMQSparkError) -> None:
        """Keeps an ACL refusal of the settings for :meth:`start`; logs any other error."""
        if isinstance(err, AccessDeniedError):
            self.refused = err
        else:
            log.info("telemetry stream to %s: %s", self.address, err)

    def _run(self) -> None:
        operation, user = "telemetry settings", self.client._user()
        needs = grpc_needs("Telemetry", self._settings())
        try:
            for cmd in self._call:
                kind = cmd.WhichOneof("command")
                if cmd.HasField("status") and cmd.status.code not in (pb.OK, pb.CODE_UNSPECIFIED):
                    # (the status is beside the command oneof: a refused settings command has no settings)
                    self._refusal(_status_error(cmd.status, address=self.address, operation=operation, user=user,
                                                needs=needs))
                    self._settled.set()
                elif kind == "settings":
                    self._settled.set()
                elif kind == "recover_orphaned_transaction_command":
                    self._answer(cmd.recover_orphaned_transaction_command)
        except grpc.RpcError as exc:
            if not (isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.CANCELLED):
                self._refusal(_rpc_error(exc, address=self.address, operation=operation, rpc="Telemetry", user=user,
                                         needs=needs))
        finally:
            self._settled.set()

    def _answer(self, cmd: pb.RecoverOrphanedTransactionCommand) -> None:
        if self.on_check is None:
            return
        msg = cmd.message
        props = dict(msg.user_properties)
        msg_id = msg.system_properties.message_id
        try:
            decision = self.on_check(props, msg_id)
        except Exception:  # a bad check-back must not end the stream
            log.exception("answering the check-back of transaction %s failed", msg_id)
            return
        if decision is None:
            return  # still undecided: the server asks again
        try:
            self.client.end_transaction("", topic=wire_name(msg.topic), msg_id=msg_id,
                                        transaction_id=cmd.transaction_id, commit=decision, from_check=True)
        except RocketMQSparkError as exc:
            log.warning("answering the check-back of transaction %s failed: %s", msg_id, exc)

    def close(self) -> None:
        self._out.put(None)
        if self._call is not None:
            self._call.cancel()
        if self._thread is not None:
            self._thread.join(5)


def wire_name(resource: pb.Resource) -> str:
    """The name a resource has on the brokers: a 5.x proxy hands the namespace apart
    (``resource_namespace``) from the name in it; the Java SDK joins them so."""
    return wrap(resource.resource_namespace, resource.name)


def stamp_namespace(message: Any, namespace: str) -> None:
    """Name ``namespace`` in every ``Resource`` of a request (its names are wrapped already:
    a 5.0/5.1 proxy wraps ``name`` in ``resource_namespace`` again, which leaves it as it is;
    5.2+ proxies read only ``name``)."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        items = (value,) if isinstance(value, ProtoMessage) else value  # else a repeated field
        if field.message_type.full_name == _RESOURCE:
            for item in items:
                item.resource_namespace = namespace
        elif not field.message_type.GetOptions().map_entry:
            for item in items:
                stamp_namespace(item, namespace)


_RESOURCE = pb.Resource.DESCRIPTOR.full_name


class _NamespaceStamp(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                      grpc.StreamStreamClientInterceptor):
    """Every request on a channel gets :func:`stamp_namespace`: one place for every call."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        stamp_namespace(request, self.namespace)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        stamp_namespace(request, self.namespace)
        return continuation(details, request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        def stamped() -> Iterator[Any]:
            for request in requests:
                stamp_namespace(request, self.namespace)
                yield request

        return continuation(details, stamped())


def _store_ms(sp: pb.SystemProperties) -> int | None:
    """A message's store time (epoch ms), None when the answer carries none."""
    return millis(sp.store_timestamp) if sp.HasField("store_timestamp") else None


def message_columns(messages: Sequence[pb.Message]) -> dict[str, list[Any]]:
    """Pulled gRPC messages as column lists (see :data:`rocketmq_spark.codec.arrow.ARROW_SCHEMA`);
    times in epoch millis."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "topic", "queueId", "queueOffset", "messageId", "tag", "keys", "body", "properties",
        "bornTimestamp", "storeTimestamp", "bornHost", "storeHost")}
    topic, qid, qoff, mid = cols["topic"], cols["queueId"], cols["queueOffset"], cols["messageId"]
    tag, keys, body, props = cols["tag"], cols["keys"], cols["body"], cols["properties"]
    born, store, bhost, shost = cols["bornTimestamp"], cols["storeTimestamp"], cols["bornHost"], cols["storeHost"]
    for m in messages:
        sp = m.system_properties
        topic.append(wire_name(m.topic))
        qid.append(sp.queue_id)
        qoff.append(sp.queue_offset)
        mid.append(sp.message_id)
        tag.append(sp.tag if sp.HasField("tag") else None)
        keys.append(list(sp.keys))
        data = m.body
        if sp.body_encoding == pb.GZIP:
            data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else zlib.decompress(data)
        body.append(data)
        props.append(list(m.user_properties.items()))
        born.append(millis(sp.born_timestamp))
        store.append(_store_ms(sp))
        bhost.append(sp.born_host or None)
        shost.append(sp.store_host or None)
    return cols
