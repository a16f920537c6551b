"""The broker's remoting request handlers (the classic protocol every RocketMQ client speaks),
beside :mod:`.grpc_service` (the 5.x protocol): each reads a request's header fields, calls the
broker's operations (:mod:`.send`, :mod:`.pull`, :mod:`.groups`, :mod:`.transactions`, the
topics of :class:`~.broker.Broker`) and answers as a Java broker answers.

Requests that arrive together are dispatched together (:meth:`RemotingService.dispatch_many`):
runs of END_TRANSACTIONs and of single prepared sends (what the exactly-once writer pipelines)
are stored in one write per run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from ..codec import (
    PropertyKey,
    SysFlag,
    TransactionType,
    decode_batch,
    decode_record,
    encode_properties,
    join_properties,
    offset_msg_id,
)
from ..codec.batch_kernels import offset_msg_ids
from ..errors import ProtocolError
from ..names import group_problem, topic_problem
from ..remoting.acl import verify_request
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import PROTOCOL_VERSION, SERIALIZE_JSON, RemotingCommand, send_success_frame, success_frame
from ..remoting.route import loads_lenient
from .broker import Broker
from .connection import Connection, HandlerResult
from .consumequeue import CQ_ENTRY
from .errors import SendRejected
from .send import REGION, Accepted, Put, SendHeader
from .state import TopicConfig

log = logging.getLogger(__name__)

__all__ = ["RemotingService"]

_END = int(RequestCode.END_TRANSACTION)
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND = int(RequestCode.SEND_MESSAGE)
_SEND_BATCH = int(RequestCode.SEND_BATCH_MESSAGE)
#: the sysFlag a prepared send carries when it says nothing else (the writer's halves)
_PREPARED_FLAG = str(int(TransactionType.PREPARED))

#: a send's header fields: (topic, queueId, sysFlag, flag, bornTimestamp, reconsumeTimes,
#: maxReconsumeTimes, producerGroup, properties, batch) by SEND_MESSAGE's names and by the
#: letters SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE use for them
_LONG_KEYS = ("topic", "queueId", "sysFlag", "flag", "bornTimestamp", "reconsumeTimes", "maxReconsumeTimes",
              "producerGroup", "properties", "batch")
_SHORT_KEYS = ("b", "e", "f", "h", "g", "j", "l", "a", "i", "m")

#: QUERY_MESSAGE's cap on the messages answered (Java's messageStoreConfig maxMsgsNumBatch), and
#: its number for a query by message id (defaultQueryMaxNum; the request says which by the
#: ``_UNIQUE_KEY_QUERY`` field, MixAll.UNIQUE_MSG_QUERY_FLAG)
_QUERY_MAX_NUM = 64
_QUERY_MAX_NUM_UNIQUE = 32
_UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"

#: the values of a topic's ``message.type`` attribute (Java's TopicMessageType; NORMAL when unset)
TOPIC_MESSAGE_TYPES = frozenset({"UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"})


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _int(ext: dict[str, str], key: str, default: int | None = None) -> int:
    """An integer header field ("" or missing: ``default``, ValueError without one)."""
    raw = ext.get(key)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"missing header field {key}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"header field {key}={raw!r} is not an integer") from None


def _send_header(req: RemotingCommand) -> SendHeader:
    """A send request's header fields, read once; ValueError names a malformed one."""
    ext = req.ext_fields
    short = req.code != _SEND
    topic, queue, sys_flag, flag, born, reconsume, most, group, props, batch = _SHORT_KEYS if short else _LONG_KEYS
    is_batch = req.code == _SEND_BATCH or _truthy(ext.get(batch))
    return SendHeader(
        topic=ext.get(topic, ""), queue_id=_int(ext, queue, -1), sys_flag=_int(ext, sys_flag, 0),
        flag=0 if is_batch else _int(ext, flag, 0),  # a batch's messages carry their own
        born_ts=_int(ext, born) if ext.get(born) else int(time.time() * 1000), reconsume=_int(ext, reconsume, 0),
        max_reconsume=_int(ext, most) if ext.get(most) else None, producer_group=ext.get(group, ""),
        properties=ext.get(props, ""), batch=is_batch)


def _run_kind(req: RemotingCommand) -> str | None:
    """What :meth:`RemotingService.dispatch_many` stores together: "end" (END_TRANSACTION),
    "prepared" (a single prepared send), None (anything else)."""
    code = req.code
    if code == _END:
        return "end"
    if code == _SEND_V2:
        ext = req.ext_fields
        flag, batch = ext.get("f", ""), ext.get("m")
    elif code == _SEND:
        ext = req.ext_fields
        flag, batch = ext.get("sysFlag", ""), ext.get("batch")
    else:
        return None
    # isascii: "²" is a digit to isdigit and not to int() (one such send failed the whole read)
    if (flag == _PREPARED_FLAG or flag.isascii() and flag.isdigit()
            and int(flag) & SysFlag.TRANSACTION_MASK == TransactionType.PREPARED) \
            and (batch == "false" or not _truthy(batch)):
        return "prepared"
    return None


def _alter_attributes(current: dict[str, str], spec: str) -> dict[str, str]:
    """Apply UPDATE_AND_CREATE_TOPIC's ``attributes`` (``+key=value,-key``) to ``current``."""
    for item in filter(None, (i.strip() for i in spec.split(","))):
        op, key, value = item[0], *item[1:].partition("=")[::2]
        if op == "+" and key and value:
            if key == "message.type" and value not in TOPIC_MESSAGE_TYPES:
                raise ValueError(f"message.type {value!r}: one of {', '.join(sorted(TOPIC_MESSAGE_TYPES))} is accepted")
            current[key] = value
        elif op == "-" and key and not value:
            current.pop(key, None)
        else:
            raise ValueError(f"attribute {item!r}: '+key=value' or '-key' is accepted")
    return current


def _queue_table(broker_name: str, topic: str, items: dict[int, str]) -> bytes:
    """``{"offsetTable": {MessageQueue: value}}`` as fastjson writes it (MessageQueue objects as
    map keys), so Java tools read it; ``items``: queue id -> the value's JSON."""
    name, t = json.dumps(broker_name), json.dumps(topic)
    body = ",".join(f'{{"brokerName":{name},"queueId":{q},"topic":{t}}}:{v}' for q, v in items.items())
    return ('{"offsetTable":{' + body + "}}").encode()


class RemotingService:
    """The remoting request handlers of one :class:`~.broker.Broker`."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.config = broker.config
        self.handlers: dict[int, Callable[[Connection, RemotingCommand], HandlerResult]] = {
            RequestCode.SEND_MESSAGE: self.send_message,
            RequestCode.SEND_MESSAGE_V2: self.send_message,
            RequestCode.SEND_BATCH_MESSAGE: self.send_message,
            RequestCode.PULL_MESSAGE: self.pull_message,
            RequestCode.LITE_PULL_MESSAGE: self.pull_message,
            RequestCode.QUERY_CONSUMER_OFFSET: self.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self.update_consumer_offset,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self.update_and_create_topic,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_and_create_subscription_group,
            RequestCode.GET_ALL_TOPIC_CONFIG: self.get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self.get_all_consumer_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset_by_timestamp,
            RequestCode.GET_MAX_OFFSET: self.get_max_offset,
            RequestCode.GET_BROKER_RUNTIME_INFO: self.get_broker_runtime_info,
            RequestCode.GET_MIN_OFFSET: self.get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self.get_earliest_msg_storetime,
            RequestCode.GET_TOPIC_STATS_INFO: self.get_topic_stats_info,
            RequestCode.QUERY_CONSUME_QUEUE: self.query_consume_queue,
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
            RequestCode.QUERY_MESSAGE: self.query_message,
            RequestCode.HEART_BEAT: self.heart_beat,
            RequestCode.UNREGISTER_CLIENT: self.unregister_client,
            RequestCode.END_TRANSACTION: self.end_transaction,
            RequestCode.CONSUMER_SEND_MSG_BACK: self.consumer_send_msg_back,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self.get_consumer_list_by_group,
            RequestCode.GET_CONSUMER_CONNECTION_LIST: self.get_consumer_connection_list,
            RequestCode.GET_CONSUMER_RUNNING_INFO: self.get_consumer_running_info,
            RequestCode.INVOKE_BROKER_TO_RESET_OFFSET: self.reset_offset,
            RequestCode.LOCK_BATCH_MQ: self.lock_batch_mq,
            RequestCode.UNLOCK_BATCH_MQ: self.unlock_batch_mq,
        }

    # -- dispatch -------------------------------------------------------------------

    def dispatch_many(self, conn: Connection, reqs: list[RemotingCommand]) -> list[HandlerResult]:
        """Requests that arrived together, one result each: runs of END_TRANSACTIONs and of
        single prepared sends (what the exactly-once writer pipelines) are stored in one
        write per run; the rest go through :meth:`dispatch` one by one."""
        out: list[HandlerResult] = []
        kinds = [_run_kind(r) for r in reqs]
        i, n = 0, len(reqs)
        while i < n:
            kind = kinds[i]
            j = i + 1
            while kind is not None and j < n and kinds[j] == kind:
                j += 1
            if j - i == 1:
                out.append(self._dispatch_one(conn, reqs[i]))
            else:
                out.extend(self._run(conn, kind, reqs[i:j]))
            i = j
        return out

    def _run(self, conn: Connection, kind: str | None, reqs: list[RemotingCommand]) -> list[HandlerResult]:
        out: list[HandlerResult] = [None] * len(reqs)
        admitted: list[int] = []
        for k, req in enumerate(reqs):  # nothing is refused without ACL: the run as it came
            refused = self._refused(conn, req) if self.config.acl else None
            if refused is not None:
                out[k] = refused
            else:
                admitted.append(k)
        batch = [reqs[k] for k in admitted] if len(admitted) < len(reqs) else reqs
        try:
            results = (self._end_transactions(conn, batch, encoded=True) if kind == "end"
                       else self._prepared_sends(conn, batch))
        except Exception as exc:  # a handler bug must not take the connection down
            log.exception("%s: %d requests (code %d) failed", conn.peer, len(admitted), reqs[0].code)
            results = [req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
                       for req in batch]
        for k, result in zip(admitted, results, strict=True):
            out[k] = result
        return out

    def _dispatch_one(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        try:
            return self.dispatch(conn, req)
        except Exception as exc:  # a handler bug must not take the connection down
            log.exception("%s: request code %d failed", conn.peer, req.code)
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")

    def _refused(self, conn: Connection, req: RemotingCommand) -> RemotingCommand | None:
        """The NO_PERMISSION answer when ACL is on and ``req`` is not signed as it requires."""
        if self.config.acl:
            refused = verify_request(req, self.config.acl)
            if refused is not None:
                # The connection stays open: a bad request is answered, not punished.
                log.warning("refused request code %d from %s: %s", req.code, conn.peer, refused)
                return req.response_to(ResponseCode.NO_PERMISSION, remark=refused)
        return None

    def dispatch(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        refused = self._refused(conn, req)
        if refused is not None:
            return refused
        handler = self.handlers.get(req.code)
        if handler is None:
            return req.response_to(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"request code {req.code} is not supported by this broker",
            )
        try:
            return handler(conn, req)
        except ValueError as exc:  # malformed header fields: answer, keep the connection
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=str(exc))

    # -- answers --------------------------------------------------------------------

    def _when_durable(self, resp: RemotingCommand) -> HandlerResult:
        """``resp`` at once, or with ``flush=sync`` once everything stored so far is on disk
        (answered FLUSH_DISK_TIMEOUT when the flush failed)."""
        b = self.broker
        if self.config.flush == "sync" and b.flusher is not None:
            return self._after_flush(resp, b.store.commitlog.write_pos)
        return resp

    async def _after_flush(self, resp: RemotingCommand, pos: int) -> RemotingCommand:
        assert self.broker.flusher is not None
        try:
            await self.broker.flusher.wait_durable(pos)
        except Exception as exc:
            resp.code = ResponseCode.FLUSH_DISK_TIMEOUT
            resp.remark = f"flush to disk failed: {exc}"
        return resp

    def _success(self, req: RemotingCommand, ext_fields: dict[str, str] | None, encoded: bool) -> HandlerResult:
        """The SUCCESS answer to ``req``: with ``encoded``, a JSON request and asynchronous
        flushing, the frame itself (thousands of answers a second, no command built);
        otherwise the command, after the flush when flushing is synchronous."""
        if encoded and req.serialize_type == SERIALIZE_JSON and self.config.flush != "sync":
            frame = success_frame(req.opaque, ext_fields)
            if frame is not None:
                return frame
        return self._when_durable(req.response_to(ResponseCode.SUCCESS, ext_fields=ext_fields))

    def _sent(self, req: RemotingCommand, msg_ids: str, queue_id: int, first_offset: int,
              transaction_id: str | None = None, *, encoded: bool = False) -> HandlerResult:
        """The SUCCESS answer to a send (after the flush when flushing is synchronous);
        ``encoded``: as the frame when it can be written directly (see :meth:`_success`)."""
        resp_ext = {
            "msgId": msg_ids,
            "queueId": str(queue_id),
            "queueOffset": str(first_offset),
            "MSG_REGION": REGION,
            "TRACE_ON": "true",
        }
        if transaction_id is not None:
            resp_ext["transactionId"] = transaction_id
        return self._success(req, resp_ext, encoded)

    def _send_answer(self, req: RemotingCommand, acc: Accepted, batch: bool, *, encoded: bool = False
                     ) -> HandlerResult:
        prefix = self.broker.sends.msg_id_prefix
        # 5.x brokers answer a single send's UNIQ_KEY as its transactionId
        return self._sent(req, ",".join(f"{prefix}{s.physical_offset:016X}" for s in acc.stored), acc.queue_id,
                          acc.stored[0].queue_offset, acc.first_uniq_key() if acc.prepared or not batch else None,
                          encoded=encoded)

    # -- send -----------------------------------------------------------------------

    def send_message(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        """SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE: checked (:meth:`.Sends.check`),
        then stored: a batch of plain messages in one vectorised pass, anything else as the
        records :meth:`.Sends.records` builds."""
        sends = self.broker.sends
        h = _send_header(req)
        born_host = self.broker.pack_peer(conn.peer)
        try:
            send = sends.check(h)
            if h.batch:
                done = sends.put_batch(send, req.body, born_host)
                if done is not None:
                    first, positions = done
                    return self._sent(req, offset_msg_ids(sends.msg_id_prefix, positions), send.queue_id, first)
                raw = self._batch_messages(req.body, h.properties)
            else:
                raw = [(req.body, sends.single_properties(send), h.flag)]
            acc = sends.store_puts([sends.records(send, raw, born_host)])[0]
        except SendRejected as exc:
            return req.response_to(exc.code, remark=exc.remark)
        return self._send_answer(req, acc, h.batch)

    @staticmethod
    def _batch_messages(body: bytes, extra: str) -> list[tuple[bytes, str, int]]:
        """A batch's messages (body, properties, flag), the batch's own properties appended to
        each one's (as Java brokers do)."""
        try:
            entries = decode_batch(body)
        except Exception as exc:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"malformed batch body: {exc}") from None
        if not entries:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        return [(e.body, join_properties(e.properties, extra), e.flag) for e in entries]

    def _prepared_sends(self, conn: Connection, reqs: list[RemotingCommand]) -> list[HandlerResult]:
        """Single prepared sends that arrived together (a writer's pipelined half messages):
        each checked as :meth:`send_message` checks it, all stored in one write."""
        sends = self.broker.sends
        out: list[HandlerResult] = [None] * len(reqs)
        # per send to store, in order: (request index, the half when it needs no map (queue id,
        # record, producer group, UNIQ_KEY), else its put)
        halves: list[tuple[int, tuple[int, Any, str, str] | None, Put | None]] = []
        general = False
        born_host = self.broker.pack_peer(conn.peer)
        for k, req in enumerate(reqs):
            try:
                h = _send_header(req)
                send = sends.check(h)
                plain = sends.plain_half(send, req.body, born_host)
                if plain is not None:
                    halves.append((k, (send.queue_id, *plain), None))
                    continue
                halves.append((k, None, sends.records(send, [(req.body, sends.single_properties(send), h.flag)],
                                                      born_host)))
                general = True
            except SendRejected as exc:
                out[k] = req.response_to(exc.code, remark=exc.remark)
            except ValueError as exc:  # malformed header fields, as dispatch answers them
                out[k] = req.response_to(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        if general:
            puts = [p if h is None else Put(h[0], [h[1]], [None], [h[2]], True) for _, h, p in halves]
            for (k, _, _), acc in zip(halves, sends.store_puts(puts)):  # type: ignore[arg-type]
                out[k] = self._send_answer(reqs[k], acc, False, encoded=True)
            return out
        # the usual run: one half message each, none delayed, answered as frames when flushing is asynchronous
        runs = [h for _, h, _ in halves]
        stored = self.broker.store.put([h[1] for h in runs])  # type: ignore[index]
        self.broker.transactions.opened(stored, [h[2] for h in runs])  # type: ignore[index]
        direct = self.config.flush != "sync"
        prefix = sends.msg_id_prefix
        for (k, half, _), st in zip(halves, stored):
            req = reqs[k]
            queue_id, message, _, uniq = half  # type: ignore[misc]
            frame = (send_success_frame(req.opaque, f"{prefix}{st.physical_offset:016X}", queue_id,
                                        st.queue_offset, REGION, uniq)
                     if direct and req.serialize_type == SERIALIZE_JSON else None)
            out[k] = frame if frame is not None else self._send_answer(
                req, Accepted(queue_id, [message], [st], True), False, encoded=True)
        return out

    # -- transactions ---------------------------------------------------------------

    def end_transaction(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        return self._end_transactions(conn, [req])[0]

    def _end_transactions(self, conn: Connection, reqs: list[RemotingCommand], *, encoded: bool = False
                          ) -> list[HandlerResult]:
        """END_TRANSACTION requests, in order; those that arrived together (a driver's
        pipelined commits) are stored in one write (:meth:`.Transactions.finish_many`);
        ``encoded``: see :meth:`_success`. An end whose kind is NOT_TYPE (the producer does not
        know yet) gets no answer, as on Java brokers: the check-back asks again."""
        out: list[HandlerResult] = [None] * len(reqs)
        ends: list[tuple[int, int, int, bool]] = []  # (request index, commitLogOffset, half offset, commit)
        for k, req in enumerate(reqs):
            ext = req.ext_fields
            try:
                kind = _int(ext, "commitOrRollback")  # required: a missing one is answered as malformed
                if kind == TransactionType.NOT_TYPE:
                    continue
                if kind not in (TransactionType.COMMIT, TransactionType.ROLLBACK):
                    out[k] = req.response_to(ResponseCode.SYSTEM_ERROR,
                                             remark=f"commitOrRollback={kind}: 0, 8 or 12 are accepted")
                    continue
                ends.append((k, _int(ext, "commitLogOffset"), _int(ext, "tranStateTableOffset", -1),
                             kind == TransactionType.COMMIT))
            except ValueError as exc:  # malformed header fields, as dispatch answers them
                out[k] = req.response_to(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        refusals = self.broker.transactions.finish_many([(pos, half, commit) for _, pos, half, commit in ends])
        for (k, _, _, _), refused in zip(ends, refusals):
            out[k] = (reqs[k].response_to(refused.code, remark=refused.remark) if refused is not None
                      else self._success(reqs[k], None, encoded))
        return out

    # -- pull -----------------------------------------------------------------------

    def pull_message(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        b = self.broker
        ext = req.ext_fields
        topic = ext.get("topic", "")
        queue_id = _int(ext, "queueId")
        _int(ext, "queueOffset")  # validated here, used by _pull_once
        group = ext.get("consumerGroup", "")
        refused = b.pulls.refusal(topic, queue_id, group)
        if refused is not None:
            return req.response_to(refused[0], remark=refused[1])
        reset = b.groups.take_pull_reset(topic, queue_id, group)
        if reset is not None:  # the group's offset was reset: its next pull of the queue moves there
            return req.response_to(ResponseCode.PULL_OFFSET_MOVED, {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(reset),
                "minOffset": str(b.store.min_offset(topic, queue_id)),
                "maxOffset": str(b.store.max_offset(topic, queue_id))}, remark="OFFSET_RESET")
        kind = ext.get("expressionType") or "TAG"
        if kind.upper() != "TAG":
            refused = b.pulls.filter_refusal(kind, ext.get("subscription", ""))
            if refused is not None:
                return req.response_to(refused[0], remark=refused[1])
        sys_flag = _int(ext, "sysFlag", 0)
        if sys_flag & 0x1:
            commit = _int(ext, "commitOffset", -1)
            if commit >= 0 and group:
                b.offsets.commit(topic, group, queue_id, commit, conn.peer)
        result = self._pull_once(req)
        if result.code == ResponseCode.PULL_NOT_FOUND and sys_flag & 0x2:
            timeout = min(_int(ext, "suspendTimeoutMillis", 15_000), self.config.max_suspend_ms)
            if timeout > 0:
                return self._suspend(req, timeout / 1000.0)
        return result

    def _pull_once(self, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        offset = int(ext["queueOffset"])
        res = self.broker.pulls.get(ext["topic"], int(ext["queueId"]), offset, _int(ext, "maxMsgNums", 32),
                                    ext.get("subscription", "*"), ext.get("expressionType") or "TAG")
        fields = {
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": str(res.next_offset),
            "minOffset": str(res.min_offset),
            "maxOffset": str(res.max_offset),
        }
        if res.status == "FOUND":
            return req.response_to(ResponseCode.SUCCESS, fields, b"".join(res.records), "FOUND")
        if res.status in ("NO_NEW", "NO_QUEUE"):
            return req.response_to(ResponseCode.PULL_NOT_FOUND, fields, remark="No new message")
        if res.status == "NO_MATCHED":
            return req.response_to(ResponseCode.PULL_RETRY_IMMEDIATELY, fields,
                                   remark="no matched message in the scanned range")
        # OFFSET_TOO_SMALL / OFFSET_OVERFLOW: tell the consumer where the queue really is.
        return req.response_to(ResponseCode.PULL_OFFSET_MOVED, fields,
                               remark=f"offset {offset} is outside [{res.min_offset}, {res.max_offset}]")

    async def _suspend(self, req: RemotingCommand, timeout_s: float) -> RemotingCommand:
        await self.broker.pulls.wait_for_messages(req.ext_fields["topic"], (int(req.ext_fields["queueId"]),),
                                                  timeout_s)
        return self._pull_once(req)

    # -- offsets --------------------------------------------------------------------

    def query_consumer_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """The group's committed offset. With none, as 5.x brokers answer: 0 when the queue
        starts at 0 and its first message is still in memory (a young queue: a new group
        reads it from the start, whatever its consume-from-where), else QUERY_NOT_FOUND;
        always QUERY_NOT_FOUND when the request says ``setZeroIfNotFound=false``."""
        b = self.broker
        ext = req.ext_fields
        topic, queue_id = ext.get("topic", ""), _int(ext, "queueId")
        off = b.offsets.query(topic, ext.get("consumerGroup", ""), queue_id)
        if off is not None:
            return req.response_to(ext_fields={"offset": str(off)})
        if str(ext.get("setZeroIfNotFound", "")).lower() == "false":
            return req.response_to(ResponseCode.QUERY_NOT_FOUND,
                                   remark="Not found, do not set to zero, maybe this group boot first")
        if b.store.min_offset(topic, queue_id) <= 0 and b.store.in_memory(topic, queue_id, 0):
            return req.response_to(ext_fields={"offset": "0"})
        return req.response_to(ResponseCode.QUERY_NOT_FOUND, remark="Not found, maybe this group consumer boot first")

    def update_consumer_offset(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        ext = req.ext_fields
        topic = ext.get("topic", "")
        group = ext.get("consumerGroup", "")
        if not topic or not group:
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark="UPDATE_CONSUMER_OFFSET needs topic and consumerGroup")
        outcome = self.broker.groups.commit_offset(topic, group, _int(ext, "queueId"), _int(ext, "commitOffset"),
                                                   conn.peer)
        if outcome is not None:
            return req.response_to(outcome[0], remark=outcome[1])
        return self._when_durable(req.response_to())

    def search_offset_by_timestamp(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.broker.store.offset_by_time(ext.get("topic", ""), _int(ext, "queueId"), _int(ext, "timestamp"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_max_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.broker.store.max_offset(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_min_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.broker.store.min_offset(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_all_consumer_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_ALL_CONSUMER_OFFSET (43): ``{"offsetTable": {"topic@group": {"queueId": offset}}}``."""
        table = {k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self.broker.offsets.table.items())}
        return req.response_to(body=json.dumps({"offsetTable": table}).encode())

    def reset_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET: set a group's offsets to the first message at/after a time."""
        b = self.broker
        ext = req.ext_fields
        topic = ext.get("topic", "")
        group = ext.get("group", "")
        ts = _int(ext, "timestamp")
        cfg = b.topics.get(topic)
        if cfg is None:
            return req.response_to(ResponseCode.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        if self.config.server_side_reset and group not in b.groups.table:
            return req.response_to(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, remark=f"Group {group} does not exist")
        table = b.groups.reset_by_time(topic, group, ts, cfg.readQueueNums, conn.peer)
        body = _queue_table(self.config.broker_name, topic, {q: str(off) for q, off in table.items()})
        b.groups.notify_reset(topic, group, ts, body)
        return req.response_to(body=body)

    # -- topics and the broker ------------------------------------------------------

    def update_and_create_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        b = self.broker
        ext = req.ext_fields
        topic = ext.get("topic", "")
        problem = topic_problem(topic)
        if problem:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"topic {topic!r}: {problem}")
        read = _int(ext, "readQueueNums", self.config.default_queue_nums)
        write = _int(ext, "writeQueueNums", read)
        if not (0 < read <= 1024 and 0 < write <= 1024):
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark=f"queue numbers read={read} write={write}: 1..1024 are accepted")
        old = b.topics.get(topic)
        try:
            attributes = _alter_attributes(dict(old.attributes) if old else {}, ext.get("attributes", ""))
        except ValueError as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"topic {topic!r}: {exc}")
        if attributes.get("message.type") == "MIXED" and not self.config.mixed_message_type:
            return req.response_to(ResponseCode.INVALID_PARAMETER, remark="MIXED message type is not supported.")
        b.put_topic(TopicConfig(topic, read, write, _int(ext, "perm", 6), ext.get("topicFilterType", "SINGLE_TAG"),
                                _int(ext, "topicSysFlag", 0), _truthy(ext.get("order")), attributes))
        return req.response_to()

    def get_all_topic_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response_to(body=json.dumps(self.broker.topics.to_json()).encode())

    def get_broker_runtime_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (28, mqadmin brokerStatus): a KVTable ``{"table": {...}}`` of
        strings; clients read bootTimestamp (a restart changes it)."""
        table = {"bootTimestamp": str(self.broker.boot_ms), "brokerActive": "true",
                 "brokerVersion": str(PROTOCOL_VERSION), "brokerVersionDesc": "rocketmq-spark embedded broker"}
        return req.response_to(body=json.dumps({"table": table}).encode())

    def get_topic_stats_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """Every queue's min/max offset and last store time in one answer (mqadmin topicStatus;
        readers planning many queues use it instead of two requests per queue): a
        TopicStatsTable as fastjson writes it."""
        store = self.broker.store
        topic = req.ext_fields.get("topic", "")
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            return req.response_to(ResponseCode.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        items = {}
        for q in range(max(cfg.readQueueNums, cfg.writeQueueNums)):
            lo, hi = store.min_offset(topic, q), store.max_offset(topic, q)
            ts = store.store_time(topic, q, hi - 1) if hi > lo else 0
            items[q] = f'{{"lastUpdateTimestamp":{ts},"maxOffset":{hi},"minOffset":{lo}}}'
        return req.response_to(body=_queue_table(self.config.broker_name, topic, items))

    def query_consume_queue(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """QUERY_CONSUME_QUEUE (mqadmin queryCq): up to ``count`` consume-queue entries from
        ``index`` (each message's commit-log position, stored size and tag hash), from one
        consume-queue file as a Java broker answers, in its QueryConsumeQueueResponseBody form
        (fastjson: fields sorted, nulls left out). No entry at ``index``: SUCCESS without a body,
        as a Java broker answers."""
        ext = req.ext_fields
        topic, qid = ext.get("topic", ""), _int(ext, "queueId")
        cq = self.broker.store.find_queue(topic, qid)
        if cq is None:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"{qid}@{topic} is not exist!")
        index, count = _int(ext, "index"), _int(ext, "count")
        raw = cq.read(index, count) if index >= cq.min_offset and count > 0 else b""
        if not raw:
            return req.response_to(remark=f"Index {index} of {qid}@{topic} is not exist!")
        entries = ",".join(f'{{"eval":false,"physicOffset":{pos},"physicSize":{size},"tagsCode":{tag}}}'
                           for pos, size, tag, _ts in CQ_ENTRY.iter_unpack(raw))
        body = f'{{"maxQueueIndex":{cq.max_offset},"minQueueIndex":{cq.min_offset},"queueData":[{entries}]}}'
        return req.response_to(body=body.encode())

    def get_earliest_msg_storetime(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        ts = self.broker.store.earliest_store_time(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"timestamp": str(ts)})

    def view_message_by_id(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        pos = _int(req.ext_fields, "offset")
        rec = self.broker.store.record_at(pos)
        if rec is None:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"no message at commit log offset {pos}")
        return req.response_to(body=rec)

    def query_message(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """QUERY_MESSAGE (12; mqadmin queryMsgByKey and queryMsgTraceById, the Java client's
        queryMessage): the newest ``maxNum`` messages of ``topic`` stored from
        ``beginTimestamp`` to ``endTimestamp`` (ms, both included) whose KEYS hold ``key`` or
        whose UNIQ_KEY is ``key`` (with 5.5's ``indexType`` T: whose TAGS are ``key``;
        :class:`.KeyIndex`), their records end to end as stored, in commit-log order. ``maxNum``
        is capped at 64 (Java's maxMsgsNumBatch) and is 32 (its defaultQueryMaxNum) when
        ``_UNIQUE_KEY_QUERY`` is true (a query by message id, of index type U in 5.5). 5.5's
        ``lastKey`` (paging of its RocksDB index) is ignored, as its file index ignores it. None
        found: QUERY_NOT_FOUND, as a Java broker answers (whose remark blames the time range
        whatever the cause)."""
        ext = req.ext_fields
        topic, key = ext.get("topic"), ext.get("key")
        if topic is None or key is None:
            raise ValueError(f"missing header field {'topic' if topic is None else 'key'}")
        unique = (ext.get(_UNIQUE_KEY_QUERY) or "").lower() == "true"  # as Java's Boolean.parseBoolean
        max_num = min(_QUERY_MAX_NUM_UNIQUE if unique else _int(ext, "maxNum"), _QUERY_MAX_NUM)
        begin, end = _int(ext, "beginTimestamp"), _int(ext, "endTimestamp")
        store = self.broker.store
        found = self.broker.key_index.query(topic, key, max_num, begin, end,
                                            by_tag=not unique and ext.get("indexType") == "T")
        records = [rec for pos, size in found if (rec := store.record_at(pos, size)) is not None]
        if not records:
            return req.response_to(ResponseCode.QUERY_NOT_FOUND,
                                   ext_fields={"indexLastUpdateTimestamp": "0", "indexLastUpdatePhyoffset": "0"},
                                   remark="can not find message, maybe time range not correct")
        # the index is up to date: every message stored so far is in it
        return req.response_to(ext_fields={"indexLastUpdateTimestamp": str(store.last_store_timestamp),
                                           "indexLastUpdatePhyoffset": str(store.commitlog.write_pos)},
                               body=b"".join(records))

    # -- groups and their clients ---------------------------------------------------

    def heart_beat(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        try:
            body = loads_lenient(req.body) if req.body else {}
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except Exception as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"malformed heartbeat body: {exc}")
        self.broker.groups.heartbeat(conn, body, req.language, req.version)
        return req.response_to()

    def update_and_create_subscription_group(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200): body = the group's SubscriptionGroupConfig."""
        try:
            cfg = loads_lenient(req.body) if req.body else None
        except ProtocolError as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"bad subscription group config: {exc}")
        group = cfg.get("groupName") if isinstance(cfg, dict) else None
        if not isinstance(cfg, dict) or not isinstance(group, str):
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark="the body is not a SubscriptionGroupConfig object with a groupName")
        problem = group_problem(group)
        if problem:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"group {group!r}: {problem}")
        self.broker.groups.table.put(group, cfg)
        return req.response_to()

    def unregister_client(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        self.broker.groups.unregister(conn, ext.get("producerGroup"), ext.get("consumerGroup"))
        return req.response_to()

    def get_consumer_list_by_group(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = req.ext_fields.get("consumerGroup", "")
        ids = self.broker.clients.consumer_ids(group)
        if not ids:  # as Java brokers answer a group with no online consumer
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return req.response_to(body=json.dumps({"consumerIdList": ids}).encode())

    def get_consumer_connection_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (mqadmin consumerConnection): the group's online clients
        and what their heartbeats said (ConsumerConnection, as a Java broker answers it)."""
        group = req.ext_fields.get("consumerGroup", "")
        consumers = self.broker.clients.consumers(group)
        if not consumers:
            return req.response_to(ResponseCode.CONSUMER_NOT_ONLINE, remark=f"the consumer group[{group}] not online")
        first = consumers[0][1].consumer_groups[group]
        subs: dict[str, Any] = {}
        conns = []
        for c, ch in consumers:
            data = ch.consumer_groups[group]
            for sub in data.get("subscriptionDataSet") or []:
                if isinstance(sub, dict) and sub.get("topic"):
                    subs[str(sub["topic"])] = sub
            conns.append({"clientId": ch.client_id, "clientAddr": c.peer, "language": ch.language,
                          "version": ch.version})
        body = {"connectionSet": conns, "subscriptionTable": subs,
                "consumeType": first.get("consumeType", "CONSUME_ACTIVELY"),
                "messageModel": first.get("messageModel", "CLUSTERING"),
                "consumeFromWhere": first.get("consumeFromWhere", "CONSUME_FROM_LAST_OFFSET")}
        return req.response_to(body=json.dumps(body).encode())

    def get_consumer_running_info(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        """GET_CONSUMER_RUNNING_INFO (mqadmin consumerStatus): asked of the client itself over
        its connection, its answer passed back (as a Java broker's Broker2Client does); a client
        that is not online is answered at once."""
        ext = req.ext_fields
        group, client_id = ext.get("consumerGroup", ""), ext.get("clientId", "")
        target = next((c for c, ch in self.broker.clients.consumers(group) if ch.client_id == client_id), None)
        if target is None:
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark=f"The Consumer <{client_id}> not online")
        if not isinstance(target, Connection):  # a gRPC client's session: the 5.x protocol has no such request
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark=f"the consumer {client_id} is a gRPC client: no running info over gRPC")
        return self._ask_consumer(target, req)

    @staticmethod
    async def _ask_consumer(target: Connection, req: RemotingCommand) -> RemotingCommand:
        try:
            answer = await target.call(RequestCode.GET_CONSUMER_RUNNING_INFO, dict(req.ext_fields), 5.0)
        except (TimeoutError, ConnectionError) as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"the consumer "
                                   f"{req.ext_fields.get('clientId', '')} did not answer: {exc or 'timeout'}")
        return req.response_to(answer.code, remark=answer.remark, body=answer.body)

    def lock_batch_mq(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        # Orderly consumers lock their queues; one embedded broker grants every request.
        try:
            body = loads_lenient(req.body) if req.body else {}
            mqs = body.get("mqSet", []) if isinstance(body, dict) else []
        except Exception:
            mqs = []
        return req.response_to(body=json.dumps({"lockOKMQSet": mqs}).encode())

    def unlock_batch_mq(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response_to()

    def consumer_send_msg_back(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        """CONSUMER_SEND_MSG_BACK (36): a consumer gives back a message it could not process
        (``offset``: where it is in the commit log). As Java brokers do: the message is stored
        again where :meth:`.ConsumerGroups.given_back_to` says (the group's retry topic, or its
        dead-letter topic), with RETRY_TOPIC (its first topic) and ORIGIN_MESSAGE_ID (its first
        message id) kept and its reconsume times one more."""
        b = self.broker
        ext = req.ext_fields
        group = ext.get("group", "")
        if group_problem(group) or not b.groups.knows(group):
            return req.response_to(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                   remark=f"subscription group not exist, {group}")
        if int(b.groups.config_of(group).get("retryQueueNums", 1)) <= 0:
            return req.response_to()  # the group keeps no retries (as Java brokers answer)
        pos = _int(ext, "offset", -1)
        raw = b.store.record_at(pos) if pos >= 0 else None
        try:
            rec = decode_record(raw) if raw is not None else None
        except ProtocolError:
            rec = None
        if rec is None:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"look message by offset failed, {pos}")
        props = dict(rec.properties)
        props.setdefault(PropertyKey.RETRY_TOPIC, rec.topic)
        if not props.get(PropertyKey.ORIGIN_MESSAGE_ID, "").strip():
            props[PropertyKey.ORIGIN_MESSAGE_ID] = offset_msg_id(rec.store_host, rec.physical_offset)
        most = _int(ext, "maxReconsumeTimes") if ext.get("maxReconsumeTimes") else None
        topic, queue_id, delay = b.groups.given_back_to(group, rec.reconsume_times, _int(ext, "delayLevel", 0), most)
        props[PropertyKey.DELAY] = str(delay)
        try:
            b.sends.put_messages(topic, queue_id, [(rec.body, encode_properties(props), rec.flag)],
                                 sys_flag=rec.sys_flag, born_ts=rec.born_timestamp,
                                 born_host=b.pack_peer(rec.born_host), reconsume=rec.reconsume_times + 1)
        except SendRejected as exc:
            return req.response_to(exc.code, remark=exc.remark)
        return self._when_durable(req.response_to())
