"""The embedded broker's RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``).

It serves the same store as the remoting port, on the broker's event loop (grpc.aio),
so messages sent over one protocol are readable over the other:

- producers: QueryRoute, Heartbeat, Telemetry (settings; transaction check-backs go out
  as RecoverOrphanedTransactionCommand), SendMessage, EndTransaction,
  NotifyClientTermination;
- offset readers (the calls released Java proxies leave unimplemented): QueryOffset,
  GetOffset, UpdateOffset, PullMessage (long polling; ILLEGAL_OFFSET with the corrected
  next offset);
- POP consumers (the official SimpleConsumer): ReceiveMessage, AckMessage,
  ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue, QueryAssignment.

POP state (which offsets are received and not yet acked, and until when they are
invisible) lives in memory; the group's committed offset on the broker never passes the
smallest un-acked offset, so after a restart every un-acked message is delivered again.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from ..codec import MessageRecord, decode_record, encode_properties, iter_records, java_string_hash
from ..codec.tags import tag_filter
from ..errors import ProtocolError
from ..proto import pb, pb_grpc
from ..proto.messages import message_to_properties, millis, name_resource, record_to_message, set_millis
from ..remoting.acl import verify_grpc_metadata
from ..remoting.codes import RequestCode, ResponseCode
from ..tls import ServerTls
from .broker import Broker
from .errors import SendRejected
from .send import message_type
from .state import TopicConfig

log = logging.getLogger(__name__)

__all__ = ["MessagingServicer", "grpc_producer_group", "start_grpc_server"]

#: The broker's remoting response codes (refused sends, pulls, offset updates) as gRPC status codes.
_CODES: dict[int, int] = {
    ResponseCode.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    ResponseCode.SYSTEM_ERROR: pb.BAD_REQUEST,
    ResponseCode.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: pb.CONSUMER_GROUP_NOT_FOUND,
    ResponseCode.NO_PERMISSION: pb.FORBIDDEN,
    ResponseCode.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    ResponseCode.SYSTEM_BUSY: pb.TOO_MANY_REQUESTS,
}
_ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
_TYPE_OF = {"NORMAL": pb.NORMAL, "FIFO": pb.FIFO, "DELAY": pb.DELAY, "TRANSACTION": pb.TRANSACTION}


def _topic_type(cfg: TopicConfig | None) -> str:
    return (cfg.attributes or {}).get("message.type", "NORMAL") if cfg is not None else "NORMAL"

#: Longest invisible duration a POP receive may ask for (Java's default maximum: 12 h).
_MAX_INVISIBLE_MS = 12 * 3600_000


def grpc_producer_group(topic: str) -> str:
    """gRPC has no producer groups: half messages sent over it belong to this one, and
    check-backs go to the Telemetry sessions that publish ``topic``."""
    return f"GRPC_PRODUCER%{topic}"


def _status(code: int, message: str = "OK") -> pb.Status:
    return pb.Status(code=code, message=message)


def _peer_address(context: grpc.aio.ServicerContext) -> str:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` -> ``1.2.3.4:5`` / ``[::1]:5``."""
    peer = context.peer() or ""
    _, _, addr = peer.partition(":")
    return addr or "127.0.0.1:0"


def _metadata(context: grpc.aio.ServicerContext, key: str) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return ""


def _transaction_id(commit_log_offset: int, half_offset: int) -> str:
    return f"{commit_log_offset:X}-{half_offset:X}"


def _parse_transaction_id(text: str) -> tuple[int, int] | None:
    pos, sep, half = text.partition("-")
    try:
        return (int(pos, 16), int(half, 16)) if sep else None
    except ValueError:
        return None


class _TelemetrySession:
    """One client's Telemetry stream. Registered in the broker's client registry (as a
    producer of :func:`grpc_producer_group` of each published topic, or a consumer of its
    group) so the broker's check-backs reach it through :meth:`push`."""

    def __init__(self, client_id: str, peer: str) -> None:
        self.client_id = client_id
        #: the client's address, as a remoting connection names its peer (consumer listings show it)
        self.peer = peer
        self.out: asyncio.Queue[pb.TelemetryCommand | None] = asyncio.Queue()

    def push(self, code: int, fields: dict[str, str], body: bytes = b"") -> None:
        if code != RequestCode.CHECK_TRANSACTION_STATE:
            return  # remoting-only notifications (consumer ids changed, reset offsets)
        try:
            rec = decode_record(body)
        except ProtocolError:
            log.warning("check-back for %s carries an unreadable record", self.client_id)
            return
        msg = record_to_message(rec, message_id=fields.get("msgId") or None)
        txid = _transaction_id(int(fields.get("commitLogOffset", "0")), int(fields.get("tranStateTableOffset", "0")))
        cmd = pb.TelemetryCommand()
        cmd.recover_orphaned_transaction_command.message.CopyFrom(msg)
        cmd.recover_orphaned_transaction_command.transaction_id = txid
        self.out.put_nowait(cmd)


@dataclass(slots=True)
class _Inflight:
    """A POP-received message not acked yet."""

    queue_id: int
    offset: int
    deadline: float  # time.monotonic()
    attempts: int
    handle: str = ""


@dataclass
class _PopGroup:
    """POP progress of one consumer group on one topic."""

    next: dict[int, int] = field(default_factory=dict)  # queue -> next offset never received
    unacked: dict[int, dict[int, _Inflight]] = field(default_factory=dict)  # queue -> offset -> entry
    handles: dict[str, _Inflight] = field(default_factory=dict)
    rotation: int = 0


class MessagingServicer(pb_grpc.MessagingServiceServicer):
    """``apache.rocketmq.v2.MessagingService`` over one :class:`Broker` (runs on its loop)."""

    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self._rr = itertools.count()
        self._pop: dict[tuple[str, str], _PopGroup] = {}

    # -- routes and clients -----------------------------------------------------------

    def _endpoints(self) -> pb.Endpoints:
        scheme = pb.IPv6 if ":" in self.host else pb.IPv4
        return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=self.host, port=self.port)])

    def _topic(self, topic: str, *, create: bool = True) -> TopicConfig | None:
        cfg = self.broker.topics.get(topic)
        if cfg is None and create and self.broker.create_topic(topic):
            cfg = self.broker.topics.get(topic)
        return cfg

    def _queue(self, topic: str, queue_id: int, perm: int) -> pb.MessageQueue:
        kind = _topic_type(self.broker.topics.get(topic))
        accepted = _ACCEPTED_TYPES if kind == "MIXED" else (_TYPE_OF.get(kind, pb.MESSAGE_TYPE_UNSPECIFIED),)
        mq = pb.MessageQueue(id=queue_id, permission=perm, accept_message_types=accepted)
        name_resource(mq.topic, topic)
        mq.broker.name = self.broker.config.broker_name
        mq.broker.id = 0
        mq.broker.endpoints.CopyFrom(self._endpoints())
        return mq

    async def QueryRoute(self, request: pb.QueryRouteRequest, context: Any) -> pb.QueryRouteResponse:
        topic = request.topic.name
        cfg = self._topic(topic)
        if cfg is None:
            return pb.QueryRouteResponse(status=_status(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist"))
        queues = []
        for i in range(max(cfg.readQueueNums, cfg.writeQueueNums)):
            readable = i < cfg.readQueueNums and cfg.perm & 4
            writable = i < cfg.writeQueueNums and cfg.perm & 2
            perm = (pb.READ_WRITE if readable and writable else pb.READ if readable
                    else pb.WRITE if writable else pb.NONE)
            queues.append(self._queue(topic, i, perm))
        return pb.QueryRouteResponse(status=_status(pb.OK), message_queues=queues)

    async def QueryAssignment(self, request: pb.QueryAssignmentRequest, context: Any) -> pb.QueryAssignmentResponse:
        topic = request.topic.name
        if self._topic(topic) is None:
            return pb.QueryAssignmentResponse(status=_status(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist"))
        # One assignment per broker: POP receives serve every queue of the topic here.
        return pb.QueryAssignmentResponse(status=_status(pb.OK), assignments=[
            pb.Assignment(message_queue=self._queue(topic, 0, pb.READ_WRITE))])

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(status=_status(pb.OK))

    async def NotifyClientTermination(self, request: pb.NotifyClientTerminationRequest,
                                      context: Any) -> pb.NotifyClientTerminationResponse:
        return pb.NotifyClientTerminationResponse(status=_status(pb.OK))

    def _settings(self, asked: pb.Settings) -> pb.Settings:
        """The server's answer to a client's settings: what the SDKs need to work
        (a backoff policy, publishing.max_body_size, the subscription's batch and polling)."""
        out = pb.Settings()
        if asked.HasField("client_type"):
            out.client_type = asked.client_type
        policy = out.backoff_policy
        policy.max_attempts = 3 if asked.WhichOneof("pub_sub") == "publishing" else 16
        set_millis(policy.exponential_backoff.initial, 100)
        set_millis(policy.exponential_backoff.max, 5000)
        policy.exponential_backoff.multiplier = 2.0
        set_millis(out.request_timeout, 3000)
        if asked.WhichOneof("pub_sub") == "subscription":
            sub = out.subscription
            sub.CopyFrom(asked.subscription)
            sub.fifo = False
            sub.receive_batch_size = 32
            set_millis(sub.long_polling_timeout, min(20_000, self.broker.config.max_suspend_ms))
        else:
            out.publishing.topics.extend(asked.publishing.topics)
            out.publishing.max_body_size = self.broker.config.max_message_size
            out.publishing.validate_message_type = False
        return out

    async def Telemetry(self, request_iterator: AsyncIterator[pb.TelemetryCommand],
                        context: Any) -> AsyncIterator[pb.TelemetryCommand]:
        peer = _peer_address(context)
        session = _TelemetrySession(_metadata(context, "x-mq-client-id") or peer, peer)
        clients = self.broker.clients

        async def read() -> None:
            try:
                async for cmd in request_iterator:
                    if cmd.WhichOneof("command") != "settings":
                        continue  # stack traces, verify results: nothing to do here
                    asked = cmd.settings
                    hb: dict[str, Any] = {"clientID": session.client_id}
                    if asked.WhichOneof("pub_sub") == "publishing":
                        hb["producerDataSet"] = [{"groupName": grpc_producer_group(t.name)}
                                                 for t in asked.publishing.topics]
                    elif asked.subscription.HasField("group"):
                        hb["consumerDataSet"] = [{"groupName": asked.subscription.group.name}]
                    clients.heartbeat(session, hb, "GRPC", 0)
                    session.out.put_nowait(pb.TelemetryCommand(status=_status(pb.OK),
                                                               settings=self._settings(asked)))
            except (asyncio.CancelledError, grpc.RpcError):
                pass
            finally:
                session.out.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item = await session.out.get()
                if item is None:
                    break
                yield item
        finally:
            reader.cancel()
            clients.drop(session)

    # -- sending ------------------------------------------------------------------------

    async def SendMessage(self, request: pb.SendMessageRequest, context: Any) -> pb.SendMessageResponse:
        if not request.messages:
            return pb.SendMessageResponse(status=_status(pb.BAD_REQUEST, "no messages"))
        born_host = self.broker.pack_peer(_peer_address(context))
        # Messages without a group share one queue (round-robin per request, so a batch
        # stays one store write); a group's messages go to its queue by hash, in order.
        round_robin = next(self._rr)
        runs: list[tuple[tuple[str, int, int, int], list[tuple[int, bytes, dict[str, str]]]]] = []
        now_ms = int(time.time() * 1000)
        entries: list[pb.SendResultEntry | None] = [None] * len(request.messages)
        for i, msg in enumerate(request.messages):
            topic = msg.topic.name
            try:
                body, props, sys_flag = message_to_properties(msg)
            except ProtocolError as exc:
                entries[i] = pb.SendResultEntry(status=_status(pb.BAD_REQUEST, str(exc)))
                continue
            cfg = self._topic(topic)
            expected, actual = _topic_type(cfg), message_type(props, sys_flag)
            if actual != expected and expected != "MIXED":  # what a 5.x proxy checks
                entries[i] = pb.SendResultEntry(status=_status(
                    pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"TopicMessageType validate failed, the expected type is "
                                                            f"{expected}, but actual type is {actual}"))
                continue
            writable = cfg.writeQueueNums if cfg is not None else 1
            group = msg.system_properties.message_group if msg.system_properties.HasField("message_group") else ""
            queue = ((java_string_hash(group) & 0x7FFFFFFF) if group else round_robin) % max(1, writable)
            key = (topic, queue, sys_flag, millis(msg.system_properties.born_timestamp) or now_ms)
            if runs and runs[-1][0] == key:
                runs[-1][1].append((i, body, props))
            else:
                runs.append((key, [(i, body, props)]))
        for (topic, queue, sys_flag, born_ms), items in runs:
            if sys_flag:
                for _, _, props in items:
                    props.setdefault("PGROUP", grpc_producer_group(topic))
            raw = [(body, encode_properties(props), 0) for _, body, props in items]
            try:
                acc = self.broker.sends.put_messages(topic, queue, raw, sys_flag=sys_flag, born_ts=born_ms,
                                               born_host=born_host)
            except SendRejected as exc:
                refused = _status(_CODES.get(exc.code, pb.INTERNAL_SERVER_ERROR), exc.remark)
                for i, _, _ in items:
                    entries[i] = pb.SendResultEntry(status=refused)
                continue
            for (i, _, props), stored in zip(items, acc.stored):
                txid = _transaction_id(stored.physical_offset, stored.queue_offset) if acc.prepared else ""
                entries[i] = pb.SendResultEntry(status=_status(pb.OK), message_id=props.get("UNIQ_KEY", ""),
                                                transaction_id=txid, offset=stored.queue_offset)
        try:
            await self.broker.durable()
        except Exception as exc:  # the flush failed: nothing is acknowledged as durable
            return pb.SendMessageResponse(status=_status(pb.MASTER_PERSISTENCE_TIMEOUT, f"flush failed: {exc}"))
        done = [e for e in entries if e is not None]  # every message has its entry by now
        if len(done) > 1 and len(runs) == 1 and all(e.status.code == pb.OK for e in done):
            # a 5.x proxy stores a request's messages as one batch and answers it with one entry:
            # the first offset, the message ids comma-joined
            done = [pb.SendResultEntry(status=_status(pb.OK), message_id=",".join(e.message_id for e in done),
                                       transaction_id=done[0].transaction_id, offset=done[0].offset)]
        bad = [e.status for e in done if e.status.code != pb.OK]
        if not bad:
            status = _status(pb.OK)
        elif len(bad) < len(done):
            status = _status(pb.MULTIPLE_RESULTS, "some messages were refused")
        else:
            status = bad[0]
        return pb.SendMessageResponse(status=status, entries=done)

    async def EndTransaction(self, request: pb.EndTransactionRequest, context: Any) -> pb.EndTransactionResponse:
        ids = _parse_transaction_id(request.transaction_id)
        if ids is None:
            return pb.EndTransactionResponse(status=_status(
                pb.INVALID_TRANSACTION_ID, f"transaction id {request.transaction_id!r} is not one of this broker's"))
        if request.resolution not in (pb.COMMIT, pb.ROLLBACK):
            return pb.EndTransactionResponse(status=_status(pb.OK, "resolution unknown: will check back"))
        try:
            self.broker.transactions.finish(ids[0], ids[1], commit=request.resolution == pb.COMMIT)
            await self.broker.durable()
        except SendRejected as exc:
            return pb.EndTransactionResponse(status=_status(pb.INVALID_TRANSACTION_ID, exc.remark))
        return pb.EndTransactionResponse(status=_status(pb.OK))

    # -- offsets and pulls ------------------------------------------------------------

    def _readable(self, mq: pb.MessageQueue) -> tuple[pb.Status | None, TopicConfig | None]:
        cfg = self._topic(mq.topic.name, create=False)
        if cfg is None:
            return _status(pb.TOPIC_NOT_FOUND, f"topic {mq.topic.name!r} does not exist"), None
        if not 0 <= mq.id < cfg.readQueueNums:
            return _status(pb.BAD_REQUEST, f"queue {mq.id} of topic {mq.topic.name!r} is not readable "
                                           f"(0..{cfg.readQueueNums - 1})"), None
        return None, cfg

    async def QueryOffset(self, request: pb.QueryOffsetRequest, context: Any) -> pb.QueryOffsetResponse:
        mq = request.message_queue
        bad, _ = self._readable(mq)
        if bad is not None:
            return pb.QueryOffsetResponse(status=bad)
        store = self.broker.store
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            off = store.min_offset(mq.topic.name, mq.id)
        elif policy == pb.END:
            off = store.max_offset(mq.topic.name, mq.id)
        elif request.HasField("timestamp"):
            off = store.offset_by_time(mq.topic.name, mq.id, millis(request.timestamp))
        else:
            return pb.QueryOffsetResponse(status=_status(pb.BAD_REQUEST, "policy TIMESTAMP needs a timestamp"))
        return pb.QueryOffsetResponse(status=_status(pb.OK), offset=off)

    async def GetOffset(self, request: pb.GetOffsetRequest, context: Any) -> pb.GetOffsetResponse:
        mq = request.message_queue
        off = self.broker.offsets.query(mq.topic.name, request.group.name, mq.id)
        if off is None:
            return pb.GetOffsetResponse(status=_status(
                pb.OFFSET_NOT_FOUND, f"group {request.group.name!r} has no offset for {mq.topic.name}:{mq.id}"))
        return pb.GetOffsetResponse(status=_status(pb.OK), offset=off)

    async def UpdateOffset(self, request: pb.UpdateOffsetRequest, context: Any) -> pb.UpdateOffsetResponse:
        mq = request.message_queue
        if not request.group.name or not mq.topic.name or request.offset < 0:
            return pb.UpdateOffsetResponse(status=_status(pb.BAD_REQUEST, "group, topic and offset >= 0 are needed"))
        outcome = self.broker.groups.commit_offset(mq.topic.name, request.group.name, mq.id, request.offset,
                                            _peer_address(context))
        if outcome is not None:
            code, why = outcome
            return pb.UpdateOffsetResponse(status=_status(_CODES.get(code, pb.OK), why))
        await self.broker.durable()
        return pb.UpdateOffsetResponse(status=_status(pb.OK))

    def _filter(self, expr: pb.FilterExpression) -> tuple[pb.Status | None, str]:
        if expr.type == pb.SQL:
            return _status(pb.ILLEGAL_FILTER_EXPRESSION, "SQL92 filters are not supported by the embedded broker; "
                                                         "use a TAG expression"), ""
        return None, expr.expression or "*"

    async def PullMessage(self, request: pb.PullMessageRequest, context: Any) -> AsyncIterator[pb.PullMessageResponse]:
        mq = request.message_queue
        topic, queue, group = mq.topic.name, mq.id, request.group.name
        refused = self.broker.pulls.refusal(topic, queue, group)  # the same rules as a remoting pull
        bad = _status(_CODES.get(refused[0], pb.BAD_REQUEST), refused[1]) if refused is not None else None
        if bad is None:
            bad, sub = self._filter(request.filter_expression)
        if bad is not None:
            yield pb.PullMessageResponse(status=bad)
            return
        reset = self.broker.groups.take_pull_reset(topic, queue, group)
        if reset is not None:  # a server-side reset of the group: its next pull moves there
            yield pb.PullMessageResponse(status=_status(pb.ILLEGAL_OFFSET, f"the group's offset was reset to {reset}"))
            yield pb.PullMessageResponse(next_offset=reset)
            return
        pulls = self.broker.pulls
        count = request.batch_size or 32
        res = pulls.get(topic, queue, request.offset, count, sub)
        wait_ms = min(millis(request.long_polling_timeout), self.broker.config.max_suspend_ms)
        if res.status == "NO_NEW" and wait_ms > 0:
            await pulls.wait_for_messages(topic, (queue,), wait_ms / 1000.0)
            res = pulls.get(topic, queue, request.offset, count, sub)
        if res.status == "FOUND":
            yield pb.PullMessageResponse(status=_status(pb.OK))
            for block in res.records:
                for rec in iter_records(block):
                    yield pb.PullMessageResponse(message=record_to_message(rec))
        elif res.status in ("NO_NEW", "NO_QUEUE", "NO_MATCHED"):
            yield pb.PullMessageResponse(status=_status(pb.MESSAGE_NOT_FOUND, "no new message"))
        else:
            yield pb.PullMessageResponse(status=_status(
                pb.ILLEGAL_OFFSET, f"offset {request.offset} is outside [{res.min_offset}, {res.max_offset}]"))
        yield pb.PullMessageResponse(next_offset=res.next_offset)

    # -- POP consumers ----------------------------------------------------------------

    def _pop_group(self, group: str, topic: str, queues: int) -> _PopGroup:
        state = self._pop.get((group, topic))
        if state is None:
            state = self._pop[(group, topic)] = _PopGroup()
        store = self.broker.store
        for q in range(queues):
            if q not in state.next:
                committed = self.broker.offsets.query(topic, group, q)
                state.next[q] = committed if committed is not None else store.min_offset(topic, q)
        return state

    def _commit_pop(self, group: str, topic: str, state: _PopGroup, queue: int) -> None:
        pending = state.unacked.get(queue)
        off = min(pending) if pending else state.next[queue]
        if self.broker.offsets.query(topic, group, queue) != off:
            self.broker.offsets.commit(topic, group, queue, off)

    def _take(self, state: _PopGroup, entry: _Inflight, invisible_s: float) -> str:
        state.handles.pop(entry.handle, None)
        entry.handle = f"{entry.queue_id}:{entry.offset}:{secrets.token_hex(8)}"
        entry.deadline = time.monotonic() + invisible_s
        state.handles[entry.handle] = entry
        return entry.handle

    def _pop_once(self, group: str, topic: str, state: _PopGroup, queues: int, batch: int, sub: str,
                  invisible_s: float) -> list[pb.Message]:
        store = self.broker.store
        now = time.monotonic()
        out: list[pb.Message] = []

        def deliver(rec: MessageRecord, entry: _Inflight) -> None:
            msg = record_to_message(rec)
            sp = msg.system_properties
            sp.receipt_handle = self._take(state, entry, invisible_s)
            sp.delivery_attempt = entry.attempts
            set_millis(sp.invisible_duration, int(invisible_s * 1000))
            out.append(msg)

        # Messages whose invisibility lapsed come back first.
        for queue, pending in state.unacked.items():
            for entry in sorted(pending.values(), key=lambda e: e.offset):
                if len(out) >= batch:
                    return out
                if entry.deadline <= now:
                    res = store.get(topic, queue, entry.offset, 1, 1 << 30)
                    if res.status != "FOUND":  # deleted by retention meanwhile
                        del pending[entry.offset]
                        state.handles.pop(entry.handle, None)
                        continue
                    entry.attempts += 1
                    deliver(decode_record(res.records[0]), entry)
        matches = tag_filter(sub, exact=True)
        cfg = self.broker.config
        state.rotation += 1
        for k in range(queues):
            if len(out) >= batch:
                break
            queue = (state.rotation + k) % queues
            res = store.get(topic, queue, state.next[queue], batch - len(out), cfg.max_pull_bytes, matches)
            if res.status in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW"):
                state.next[queue] = res.next_offset
                continue
            for block in res.records:
                for rec in iter_records(block):
                    entry = _Inflight(queue, rec.queue_offset, 0.0, 1)
                    state.unacked.setdefault(queue, {})[rec.queue_offset] = entry
                    deliver(rec, entry)
            if res.next_offset != state.next[queue]:
                state.next[queue] = res.next_offset
                self._commit_pop(group, topic, state, queue)
        return out

    async def ReceiveMessage(self, request: pb.ReceiveMessageRequest,
                             context: Any) -> AsyncIterator[pb.ReceiveMessageResponse]:
        group, topic = request.group.name, request.message_queue.topic.name
        cfg = self._topic(topic, create=False)
        bad: pb.Status | None = None
        sub = "*"
        if not group:
            bad = _status(pb.ILLEGAL_CONSUMER_GROUP, "a consumer group is required")
        elif not self.broker.groups.knows(group):
            bad = _status(pb.CONSUMER_GROUP_NOT_FOUND, f"consumer group {group!r} does not exist")
        elif cfg is None:
            bad = _status(pb.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")
        else:
            bad, sub = self._filter(request.filter_expression)
        invisible_ms = millis(request.invisible_duration) if request.HasField("invisible_duration") else 30_000
        if bad is None and not 0 < invisible_ms <= _MAX_INVISIBLE_MS:
            bad = _status(pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration {invisible_ms} ms: 1 ms .. 12 h accepted")
        if bad is not None:
            yield pb.ReceiveMessageResponse(status=bad)
            return
        assert cfg is not None
        queues = cfg.readQueueNums
        state = self._pop_group(group, topic, queues)
        batch = max(1, min(request.batch_size or 32, self.broker.config.max_pull_messages))
        poll_ms = millis(request.long_polling_timeout) if request.HasField("long_polling_timeout") else 0
        deadline = time.monotonic() + min(poll_ms, self.broker.config.max_suspend_ms) / 1000.0
        while True:
            msgs = self._pop_once(group, topic, state, queues, batch, sub, invisible_ms / 1000.0)
            left = deadline - time.monotonic()
            if msgs or left <= 0:
                break
            lapse = min((e.deadline for p in state.unacked.values() for e in p.values()), default=None)
            wait = left if lapse is None else max(0.0, min(left, lapse - time.monotonic()))
            await self.broker.pulls.wait_for_messages(topic, range(queues), wait)
        if not msgs:
            yield pb.ReceiveMessageResponse(status=_status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        yield pb.ReceiveMessageResponse(status=_status(pb.OK))
        stamp = pb.ReceiveMessageResponse()
        set_millis(stamp.delivery_timestamp, int(time.time() * 1000))
        yield stamp
        for m in msgs:
            yield pb.ReceiveMessageResponse(message=m)

    def _entry(self, group: str, topic: str, handle: str) -> tuple[_PopGroup | None, _Inflight | None]:
        state = self._pop.get((group, topic))
        return state, (state.handles.get(handle) if state is not None else None)

    def _ack(self, group: str, topic: str, state: _PopGroup, entry: _Inflight) -> None:
        state.handles.pop(entry.handle, None)
        pending = state.unacked.get(entry.queue_id, {})
        pending.pop(entry.offset, None)
        self._commit_pop(group, topic, state, entry.queue_id)

    async def AckMessage(self, request: pb.AckMessageRequest, context: Any) -> pb.AckMessageResponse:
        group, topic = request.group.name, request.topic.name
        results = []
        for e in request.entries:
            state, entry = self._entry(group, topic, e.receipt_handle)
            if state is None or entry is None:
                st = _status(pb.INVALID_RECEIPT_HANDLE, "receipt handle unknown or expired (the message was "
                                                        "received again after its invisible duration)")
            else:
                self._ack(group, topic, state, entry)
                st = _status(pb.OK)
            results.append(pb.AckMessageResultEntry(message_id=e.message_id, receipt_handle=e.receipt_handle,
                                                    status=st))
        await self.broker.durable()
        bad = [r for r in results if r.status.code != pb.OK]
        status = _status(pb.OK) if not bad else bad[0].status if len(bad) == len(results) else _status(
            pb.MULTIPLE_RESULTS, "some receipt handles were refused")
        return pb.AckMessageResponse(status=status, entries=results)

    async def ChangeInvisibleDuration(self, request: pb.ChangeInvisibleDurationRequest,
                                      context: Any) -> pb.ChangeInvisibleDurationResponse:
        state, entry = self._entry(request.group.name, request.topic.name, request.receipt_handle)
        ms = millis(request.invisible_duration)
        if state is None or entry is None:
            return pb.ChangeInvisibleDurationResponse(status=_status(pb.INVALID_RECEIPT_HANDLE,
                                                                     "receipt handle unknown or expired"))
        if not 0 <= ms <= _MAX_INVISIBLE_MS:
            return pb.ChangeInvisibleDurationResponse(status=_status(
                pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration {ms} ms: 0 .. 12 h accepted"))
        handle = self._take(state, entry, ms / 1000.0)
        return pb.ChangeInvisibleDurationResponse(status=_status(pb.OK), receipt_handle=handle)

    async def ForwardMessageToDeadLetterQueue(
            self, request: pb.ForwardMessageToDeadLetterQueueRequest,
            context: Any) -> pb.ForwardMessageToDeadLetterQueueResponse:
        group, topic = request.group.name, request.topic.name
        state, entry = self._entry(group, topic, request.receipt_handle)
        if state is None or entry is None:
            return pb.ForwardMessageToDeadLetterQueueResponse(status=_status(pb.INVALID_RECEIPT_HANDLE,
                                                                             "receipt handle unknown or expired"))
        res = self.broker.store.get(topic, entry.queue_id, entry.offset, 1, 1 << 30)
        if res.status == "FOUND":
            rec = next(iter(iter_records(res.records[0])))
            dlq = self.broker.groups.dead_letter_topic_of(group)
            props = dict(rec.properties, RETRY_TOPIC=topic, ORIGIN_MESSAGE_ID=rec.msg_id)
            self.broker.sends.put_messages(dlq, 0, [(rec.body, encode_properties(props), rec.flag)],
                                     sys_flag=rec.sys_flag, born_ts=rec.born_timestamp,
                                     born_host=self.broker.pack_peer(rec.born_host))
        self._ack(group, topic, state, entry)
        await self.broker.durable()
        return pb.ForwardMessageToDeadLetterQueueResponse(status=_status(pb.OK))



class _AclInterceptor(grpc.aio.ServerInterceptor):
    """With ACL on, every call must carry valid MQv2-HMAC-SHA1 metadata; others are answered
    PERMISSION_DENIED with the reason (never a secret)."""

    def __init__(self, secrets_by_key: dict[str, str]) -> None:
        self._secrets = secrets_by_key

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        meta = {k.lower(): v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
        refused = verify_grpc_metadata(meta, self._secrets)
        if refused is None:
            return await continuation(details)
        log.warning("refused gRPC call %s: %s", details.method, refused)
        handler = await continuation(details)
        reason = f"{details.method}: {refused}"

        async def deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)

        async def deny_stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)

        if handler is None:
            return None
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(deny_stream, handler.request_deserializer,
                                                         handler.response_serializer) \
                if handler.response_streaming else \
                grpc.stream_unary_rpc_method_handler(deny_stream, handler.request_deserializer,
                                                     handler.response_serializer)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(deny, handler.request_deserializer, handler.response_serializer)


class _ParseGuard(grpc.aio.ServerInterceptor):
    """Requests are parsed here instead of by grpcio, so one that does not parse as the
    method's request message is refused with INVALID_ARGUMENT naming the method and the
    expected message (grpcio would answer UNKNOWN and log a traceback per bad request). A
    streamed request (Telemetry) that stops parsing ends the stream the same way."""

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        parse = handler.request_deserializer
        method = details.method

        descriptor = getattr(getattr(parse, "__self__", None), "DESCRIPTOR", None)
        expected = descriptor.full_name if descriptor is not None else "the method's request message"

        def reason(exc: Exception) -> str:
            return f"{method}: the request does not parse as {expected} ({exc})"

        if handler.request_streaming:
            inner = handler.stream_stream if handler.response_streaming else handler.stream_unary
            bad: list[str] = []

            async def parsed(raw_items: Any) -> Any:
                async for raw in raw_items:
                    try:
                        item = parse(raw)
                    except DecodeError as exc:
                        log.warning("%s", reason(exc))
                        bad.append(reason(exc))
                        return
                    yield item

            async def streamed_out(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                async for out in inner(parsed(request_iterator), context):
                    yield out
                if bad:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0])

            async def answered(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                result = await inner(parsed(request_iterator), context)
                if bad:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bad[0])
                return result

            streamed: Any = streamed_out if inspect.isasyncgenfunction(inner) else answered
            make = grpc.stream_stream_rpc_method_handler if handler.response_streaming \
                else grpc.stream_unary_rpc_method_handler
            return make(streamed, None, handler.response_serializer)

        inner = handler.unary_stream if handler.response_streaming else handler.unary_unary
        if inspect.isasyncgenfunction(inner):
            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                try:
                    request = parse(raw)
                except DecodeError as exc:
                    log.warning("%s", reason(exc))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason(exc))
                async for out in inner(request, context):
                    yield out
        else:
            async def unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:  # type: ignore[misc]
                try:
                    request = parse(raw)
                except DecodeError as exc:
                    log.warning("%s", reason(exc))
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason(exc))
                return await inner(request, context)
        make = grpc.unary_stream_rpc_method_handler if handler.response_streaming \
            else grpc.unary_unary_rpc_method_handler
        return make(unary, None, handler.response_serializer)


async def start_grpc_server(broker: Broker, host: str, port: int, max_message: int, *,
                            advertise_host: str | None = None,
                            tls: ServerTls | None = None) -> tuple[grpc.aio.Server, int]:
    """Serve :class:`MessagingService` for ``broker`` on ``host:port`` (0: ephemeral) on the
    running loop, over TLS only with ``tls``; routes name ``advertise_host`` (default ``host``)
    and the bound port. Returns the started server and its port."""
    interceptors: list[grpc.aio.ServerInterceptor] = [_ParseGuard()]
    if broker.config.acl:
        interceptors.append(_AclInterceptor(broker.config.acl))
    server = grpc.aio.server(interceptors=interceptors, options=[
        ("grpc.max_receive_message_length", max_message),
        ("grpc.max_send_message_length", max_message),
        ("grpc.so_reuseport", 0),
    ])
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(bind)
    else:
        key, chain, roots = tls.pem_files()
        bound = server.add_secure_port(bind, grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=roots, require_client_auth=roots is not None))
    if bound == 0:
        raise OSError(f"cannot bind the gRPC endpoint to {bind} (port in use?)")
    pb_grpc.add_MessagingServiceServicer_to_server(MessagingServicer(broker, advertise_host or host, bound), server)
    await server.start()
    return server, bound
