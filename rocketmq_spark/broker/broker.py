"""The broker: topics, send, pull (long polling), offsets and clients, as operations both
transports call (``put_messages``, ``pull_refusal``, ``commit_offset`` ...) and as the remoting
request handlers over them. Transactions are :mod:`.transactions`, delayed delivery
:mod:`.delayed`, durability :mod:`.flusher`, the settings :mod:`.config`, the storage
:mod:`.store`.

Runs on one asyncio event loop. Disk writes happen on the loop (page cache); fsync runs in an
executor through :class:`~.flusher.Flusher`, which groups concurrent sync-flush sends into one
fsync.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..codec import (
    MAX_PROPERTIES_BYTES,
    PropertyKey,
    SysFlag,
    TransactionType,
    decode_batch,
    decode_properties,
    decode_record,
    encode_properties,
    join_properties,
    offset_msg_id,
    pack_host,
    property_of,
)
from ..codec.batch_kernels import offset_msg_ids, parse_batch
from ..codec.properties import BROKER_PROPERTY_KEYS, needs_parsing
from ..errors import ProtocolError
from ..names import AUTO_CREATE_TOPIC, RETRY_PREFIX, dead_letter_topic, group_problem, retry_topic, topic_problem
from ..remoting.acl import verify_request
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import PROTOCOL_VERSION, SERIALIZE_JSON, RemotingCommand, send_success_frame, success_frame
from ..remoting.route import loads_lenient
from .config import BrokerConfig
from .connection import Connection, HandlerResult
from .delayed import SCHEDULE_QUEUE, SCHEDULE_TOPIC, TIMER_OUT_MS, Delayed, DelayedDelivery, delivery_due_ms
from .errors import SendRejected
from .flusher import Flusher
from .state import (
    HALF_TOPIC,
    OP_TOPIC,
    SYSTEM_TOPICS,
    ClientRegistry,
    ConsumerOffsets,
    SubscriptionGroups,
    TopicConfig,
    TopicConfigs,
)
from .store import GetResult, MessageStore, NewMessage, Stored, tag_filter
from .transactions import Transactions

log = logging.getLogger(__name__)

__all__ = ["Accepted", "Broker"]

#: the region a broker names in MSG_REGION (Java's default regionId)
REGION = "DefaultRegion"

# SEND_MESSAGE_V2's one-letter header keys.
_V2_KEYS = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch",
    "n": "brokerName",
}


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


#: A record stores its properties' length as an int16: longer properties are refused.
_MAX_PROPS_CHARS = MAX_PROPERTIES_BYTES // 3  # fewer characters cannot exceed it in UTF-8


def _props_too_long(props: str) -> bool:
    """Whether ``props`` exceed what a record's int16 length holds (short enough in any
    encoding: no encode)."""
    return len(props) > _MAX_PROPS_CHARS and len(props.encode()) > MAX_PROPERTIES_BYTES


def _check_props_size(props: str) -> None:
    if _props_too_long(props):
        size = len(props.encode())
        raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"message properties of {size} bytes exceed the "
                                                         f"maximum of {MAX_PROPERTIES_BYTES} bytes")


def _write_queue(queue_id: int, cfg: TopicConfig) -> int:
    """A send's queue id as Java brokers take it (AbstractSendMessageProcessor.msgCheck): one
    below the topic's queue count (the larger of its write and read queues) is kept, a negative
    one means any writable queue; SendRejected for a larger one (INVALID_PARAMETER) or a
    negative one when the topic has no writable queue (SYSTEM_ERROR)."""
    if 0 <= queue_id < cfg.writeQueueNums:
        return queue_id
    if queue_id >= max(cfg.writeQueueNums, cfg.readQueueNums):
        raise SendRejected(ResponseCode.INVALID_PARAMETER,
                           f"request queueId[{queue_id}] is illegal: topic {cfg.topicName} has "
                           f"{cfg.writeQueueNums} write and {cfg.readQueueNums} read queues")
    if queue_id >= 0:
        return queue_id
    if cfg.writeQueueNums <= 0:
        raise SendRejected(ResponseCode.SYSTEM_ERROR, f"topic {cfg.topicName} has no write queues")
    return int(time.time() * 1000) % cfg.writeQueueNums


def _int(ext: dict[str, str], key: str, default: int | None = None) -> int:
    raw = ext.get(key)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"missing header field {key}")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"header field {key}={raw!r} is not an integer") from None


@dataclass(slots=True)
class Accepted:
    """What :meth:`Broker.put_messages` stored: the queue it chose and where each landed."""

    queue_id: int
    messages: list[NewMessage]
    stored: list[Stored]
    prepared: bool

    def first_uniq_key(self) -> str:
        """The first message's client id (UNIQ_KEY), "" without one: a single send's answer."""
        return property_of(self.messages[0].properties, PropertyKey.UNIQ_KEY) or ""


#: the properties a half message gets from the broker (a send carrying one is merged as a map)
_HALF_KEYS = (f"{PropertyKey.REAL_TOPIC}\x01", f"{PropertyKey.REAL_QID}\x01", f"{PropertyKey.TRANSACTION_ID}\x01")
_REAL_TOPIC_ITEM, _REAL_QID_ITEM, _TX_ID_ITEM = _HALF_KEYS
_PGROUP_ITEM = f"{PropertyKey.PGROUP}\x01"


_END = int(RequestCode.END_TRANSACTION)
_SEND_V2 = int(RequestCode.SEND_MESSAGE_V2)
_SEND = int(RequestCode.SEND_MESSAGE)
#: the sysFlag a prepared send carries when it says nothing else (the writer's halves)
_PREPARED_FLAG = str(int(TransactionType.PREPARED))


def _run_kind(req: RemotingCommand) -> str | None:
    """What :meth:`Broker.dispatch_many` stores together: "end" (END_TRANSACTION), "prepared"
    (a single prepared send), None (anything else)."""
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


@dataclass(slots=True)
class _Put:
    """A send checked and its records built, not stored yet (see :meth:`Broker._store_puts`)."""

    queue_id: int
    messages: list[NewMessage]
    dues: list[int | None]  # each message's delivery time when delayed
    groups: list[str]  # a prepared send's producer group per message
    prepared: bool


#: the values of a topic's ``message.type`` attribute (Java's TopicMessageType; NORMAL when unset)
TOPIC_MESSAGE_TYPES = frozenset({"UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED"})


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


def message_type(properties: dict[str, str], sys_flag: int = 0) -> str:
    """A message's TopicMessageType from its properties, as a 5.x proxy tells it."""
    if properties.get(PropertyKey.TRAN_MSG) == "true" or (
            sys_flag & SysFlag.TRANSACTION_MASK) == TransactionType.PREPARED:
        return "TRANSACTION"
    if any(k in properties for k in (PropertyKey.DELAY, PropertyKey.TIMER_DELIVER_MS, PropertyKey.TIMER_DELAY_SEC,
                                     PropertyKey.TIMER_DELAY_MS)):
        return "DELAY"
    return "FIFO" if PropertyKey.SHARDING_KEY in properties else "NORMAL"


class UniqIds:
    """Client message ids (UNIQ_KEY) in the layout Java's MessageClientIDSetter gives them, hex of:
    IPv4 address (4 bytes), pid (2), a per-process random (4), milliseconds since the start of
    the month (4), a counter (2). A 5.x broker gives a single send that arrives without one
    an id of its own (its SendMessageProcessor), so the embedded broker does too."""

    def __init__(self, ip: bytes) -> None:
        self._fixed = (ip[-4:] + (os.getpid() & 0xFFFF).to_bytes(2, "big") + os.urandom(4)).hex().upper()
        self._count = 0
        self._month_start_ms = 0
        self._next_month_ms = 0

    def next(self) -> str:
        now = int(time.time() * 1000)
        if now >= self._next_month_ms:
            t = time.localtime(now / 1000)
            start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
            nxt = time.mktime((t.tm_year + t.tm_mon // 12, t.tm_mon % 12 + 1, 1, 0, 0, 0, 0, 0, -1))
            self._month_start_ms, self._next_month_ms = int(start * 1000), int(nxt * 1000)
        self._count = (self._count + 1) & 0xFFFF
        return f"{self._fixed}{(now - self._month_start_ms) & 0xFFFFFFFF:08X}{self._count:04X}"


class Broker:
    """Request handlers of one broker over a :class:`MessageStore`."""

    def __init__(self, config: BrokerConfig, advertised_addr: str) -> None:
        self.config = config
        self.addr = advertised_addr
        #: when this broker (its store) started: GET_BROKER_RUNTIME_INFO's bootTimestamp
        self.boot_ms = int(time.time() * 1000)
        self._store_host = pack_host(advertised_addr)[0]
        self._msg_id_prefix = self._store_host.hex().upper()
        self._uniq_ids = UniqIds(self._store_host[:-4])
        #: what a Java broker sets on every message it stores (overwriting a producer's values)
        self._broker_props = dict(zip(BROKER_PROPERTY_KEYS, (REGION, config.cluster, "true"), strict=True))
        self._broker_suffix = encode_properties(self._broker_props)
        self._broker_suffix_bytes = self._broker_suffix.encode()
        self._peer_cache: dict[str, bytes] = {}
        root = config.data_dir
        self.store = MessageStore(os.path.join(root, "store"), self._store_host, config.store_config())
        self.topics = TopicConfigs(os.path.join(root, "config"))
        self.offsets = ConsumerOffsets(os.path.join(root, "config"))
        self.groups = SubscriptionGroups(os.path.join(root, "config"), self.offsets)
        self.clients = ClientRegistry()
        self.on_topics_changed: list[Callable[[], None]] = []
        self.flusher: Flusher | None = None
        self._pull_waiters: dict[tuple[str, int], list[asyncio.Future[None]]] = {}
        self.store.listeners.append(self._on_new_messages)
        self.transactions = Transactions(self.store, self.offsets, self.clients, config, addr=advertised_addr,
                                         pack_peer=self.pack_peer)
        #: open transactions by half-queue offset
        self.pending_tx = self.transactions.pending
        self.delayed = DelayedDelivery(self.store, self.offsets, pack_peer=self.pack_peer)
        #: delayed messages not delivered yet, by schedule-queue offset
        self.pending_delay = self.delayed.pending
        self._tasks: list[asyncio.Task[None]] = []
        if config.auto_create_topics and AUTO_CREATE_TOPIC not in self.topics:
            self.topics.put(TopicConfig(AUTO_CREATE_TOPIC, 8, 8, 7))
        self.transactions.load()
        self.delayed.load()
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
            RequestCode.VIEW_MESSAGE_BY_ID: self.view_message_by_id,
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

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.config
        self.flusher = Flusher(self.store, self.offsets, sync=cfg.flush == "sync",
                               interval_s=cfg.flush_interval_ms / 1000.0)
        self.flusher.start()
        self._tasks.append(asyncio.ensure_future(self._housekeeping()))
        self._tasks.append(asyncio.ensure_future(self.delayed.run()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for waiters in self._pull_waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.cancel()
        if self.flusher:
            await self.flusher.stop()
        self.store.close()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self.transactions.check()
                # Recovery starts its scan of half messages here; saving it once a second
                # (not per END_TRANSACTION: min() over the open ones) only makes that scan longer.
                self.transactions.save_progress()
                if self.config.retention_hours > 0:
                    self.store.delete_expired(int(self.config.retention_hours * 3600_000))
            except Exception:
                log.exception("broker housekeeping failed")

    def on_close(self, conn: Connection) -> None:
        changed = self.clients.drop(conn)
        for group in changed:
            self._notify_consumers_changed(group)

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
        if not self.config.acl:  # nothing refused: the run as it came
            try:
                return (self._end_transactions(conn, reqs, encoded=True) if kind == "end"
                        else self._prepared_sends(conn, reqs))
            except Exception as exc:  # a handler bug must not take the connection down
                log.exception("%s: %d requests (code %d) failed", conn.peer, len(reqs), reqs[0].code)
                return [req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
                        for req in reqs]
        out: list[HandlerResult] = [None] * len(reqs)
        admitted: list[int] = []
        for k, req in enumerate(reqs):
            refused = self._refused(conn, req)
            if refused is not None:
                out[k] = refused
            else:
                admitted.append(k)
        try:
            batch = [reqs[k] for k in admitted]
            results = (self._end_transactions(conn, batch, encoded=True) if kind == "end"
                       else self._prepared_sends(conn, batch))
        except Exception as exc:  # a handler bug must not take the connection down
            log.exception("%s: %d requests (code %d) failed", conn.peer, len(admitted), reqs[0].code)
            results = [reqs[k].response_to(ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}")
                       for k in admitted]
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

    # -- topics ---------------------------------------------------------------------

    def topic_table(self) -> dict[str, tuple[int, int, int]]:
        return {t.topicName: (t.readQueueNums, t.writeQueueNums, t.perm) for t in self.topics
                if t.topicName not in (HALF_TOPIC, OP_TOPIC)}

    def create_topic(self, topic: str, queue_nums: int | None = None, perm: int = 6) -> bool:
        """Auto-create ``topic`` (route miss or first send). False when not allowed."""
        if topic in self.topics:
            return True
        if not self.config.auto_create_topics or topic_problem(topic) or topic in SYSTEM_TOPICS:
            return False
        n = queue_nums or self.config.default_queue_nums
        self.topics.put(TopicConfig(topic, n, n, perm))
        log.info("auto-created topic %s with %d queues", topic, n)
        self._topics_changed()
        return True

    def _topics_changed(self) -> None:
        for fn in self.on_topics_changed:
            fn()

    def update_and_create_topic(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
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
        old = self.topics.get(topic)
        try:
            attributes = _alter_attributes(dict(old.attributes) if old else {}, ext.get("attributes", ""))
        except ValueError as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"topic {topic!r}: {exc}")
        if attributes.get("message.type") == "MIXED" and not self.config.mixed_message_type:
            return req.response_to(ResponseCode.INVALID_PARAMETER, remark="MIXED message type is not supported.")
        cfg = TopicConfig(topic, read, write, _int(ext, "perm", 6),
                          ext.get("topicFilterType", "SINGLE_TAG"), _int(ext, "topicSysFlag", 0),
                          _truthy(ext.get("order")), attributes)
        self.topics.put(cfg)
        self._topics_changed()
        return req.response_to()

    def get_all_topic_config(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        return req.response_to(body=json.dumps(self.topics.to_json()).encode())

    def get_broker_runtime_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_BROKER_RUNTIME_INFO (28, mqadmin brokerStatus): a KVTable ``{"table": {...}}`` of
        strings; clients read bootTimestamp (a restart changes it)."""
        table = {"bootTimestamp": str(self.boot_ms), "brokerActive": "true",
                 "brokerVersion": str(PROTOCOL_VERSION), "brokerVersionDesc": "rocketmq-spark embedded broker"}
        return req.response_to(body=json.dumps({"table": table}).encode())

    def get_all_consumer_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_ALL_CONSUMER_OFFSET (43): ``{"offsetTable": {"topic@group": {"queueId": offset}}}``."""
        table = {k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self.offsets.table.items())}
        return req.response_to(body=json.dumps({"offsetTable": table}).encode())

    # -- send -----------------------------------------------------------------------

    def send_message(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        """SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE (see :meth:`put_messages`)."""
        ext = req.ext_fields
        if req.code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
            ext = {_V2_KEYS.get(k, k): v for k, v in ext.items()}
        batch = req.code == RequestCode.SEND_BATCH_MESSAGE or _truthy(ext.get("batch"))
        if batch:
            fast = self._send_batch_fast(conn, req, ext)
            if fast is not None:
                return fast
        try:
            put = self._send_put(conn, req, ext, batch)
            acc = self._store_puts([put])[0]
        except SendRejected as exc:
            return req.response_to(exc.code, remark=exc.remark)
        return self._send_answer(req, acc, batch)

    def _send_put(self, conn: Connection, req: RemotingCommand, ext: dict[str, str], batch: bool) -> _Put:
        """A send request (``ext``: its fields by their long names) checked and its records
        built; SendRejected when refused. A send to a group's retry topic past the
        reconsume times it allows goes to the group's dead-letter topic (as Java brokers do)."""
        topic, queue_id = ext.get("topic", ""), _int(ext, "queueId", -1)
        dead = False
        if topic.startswith(RETRY_PREFIX):
            if batch:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"batch request does not support retry group {topic}")
            group = topic[len(RETRY_PREFIX):]
            if not self.knows_group(group):
                raise SendRejected(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
            most = _int(ext, "maxReconsumeTimes", int(self.groups.table[group].get("retryMaxTimes", 16)))
            if _int(ext, "reconsumeTimes", 0) > most:
                topic, queue_id, dead = self.dead_letter_topic_of(group), 0, True
            else:  # created as a send-back creates it (the group's retryQueueNums)
                self.retry_topic_of(group)
        if batch:
            try:
                entries = decode_batch(req.body)
            except Exception as exc:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"malformed batch body: {exc}") from None
            if not entries:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            # Java brokers append the batch's own properties to each of its messages
            extra = ext.get("properties", "")
            raw = [(e.body, join_properties(e.properties, extra), e.flag) for e in entries]
        else:
            props_s = ext.get("properties", "")
            if "UNIQ_KEY\x01" not in props_s:  # as a 5.x broker does for a single send
                props_s = join_properties(props_s, f"UNIQ_KEY\x01{self._uniq_ids.next()}\x02")
            if dead:  # delivered at once (the last DELAY counts)
                props_s = join_properties(props_s, f"{PropertyKey.DELAY}\x010\x02")
            raw = [(req.body, props_s, _int(ext, "flag", 0))]
        return self._prepare_put(
            topic, queue_id, raw, sys_flag=_int(ext, "sysFlag", 0),
            born_ts=_int(ext, "bornTimestamp", int(time.time() * 1000)), born_host=self.pack_peer(conn.peer),
            reconsume=_int(ext, "reconsumeTimes", 0), producer_group=ext.get("producerGroup", ""))

    def _send_answer(self, req: RemotingCommand, acc: Accepted, batch: bool, *, encoded: bool = False
                     ) -> HandlerResult:
        prefix = self._msg_id_prefix
        # 5.x brokers answer a single send's UNIQ_KEY as its transactionId
        return self._sent(req, ",".join(f"{prefix}{s.physical_offset:016X}" for s in acc.stored), acc.queue_id,
                          acc.stored[0].queue_offset, acc.first_uniq_key() if acc.prepared or not batch else None,
                          encoded=encoded)

    def _prepared_sends(self, conn: Connection, reqs: list[RemotingCommand]) -> list[HandlerResult]:
        """Single prepared sends that arrived together (a writer's pipelined half messages):
        each checked as :meth:`send_message` does, all stored in one write."""
        out: list[HandlerResult] = [None] * len(reqs)
        # per send to store, in order: (request index, the half when it took the short path
        # (queue id, message, producer group, UNIQ_KEY), else its put)
        halves: list[tuple[int, tuple[int, NewMessage, str, str] | None, _Put | None]] = []
        general = False
        born_host = self.pack_peer(conn.peer)
        configs: dict[str, TopicConfig] = {}
        max_size = self.config.max_message_size
        for k, req in enumerate(reqs):
            half = self._plain_half(req, born_host, configs, max_size) if req.code == _SEND_V2 else None
            if half is not None:
                halves.append((k, half, None))
                continue
            ext = {_V2_KEYS.get(key, key): v for key, v in req.ext_fields.items()}
            try:
                halves.append((k, None, self._send_put(conn, req, ext, False)))
                general = True
            except SendRejected as exc:
                out[k] = req.response_to(exc.code, remark=exc.remark)
            except ValueError as exc:  # malformed header fields, as dispatch answers them
                out[k] = req.response_to(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        if not general:  # the usual run: one message, no delay each
            plain = [h for _, h, _ in halves]
            stored = self.store.put([h[1] for h in plain])  # type: ignore[index]
            self.transactions.opened(stored, [h[2] for h in plain])  # type: ignore[index]
            direct = self.config.flush != "sync"
            prefix = self._msg_id_prefix
            for (k, h, _), st in zip(halves, stored):
                req = reqs[k]
                queue_id, message, _, uniq = h  # type: ignore[misc]
                frame = (send_success_frame(req.opaque, f"{prefix}{st.physical_offset:016X}", queue_id,
                                            st.queue_offset, REGION, uniq)
                         if direct and req.serialize_type == SERIALIZE_JSON else None)
                out[k] = frame if frame is not None else self._send_answer(
                    req, Accepted(queue_id, [message], [st], True), False, encoded=True)
            return out
        puts = [p if h is None else _Put(h[0], [h[1]], [None], [h[2]], True) for _, h, p in halves]
        for (k, _, _), acc in zip(halves, self._store_puts(puts)):  # type: ignore[arg-type]
            out[k] = self._send_answer(reqs[k], acc, False, encoded=True)
        return out

    def _plain_half(self, req: RemotingCommand, born_host: bytes, configs: dict[str, TopicConfig], max_size: int
                    ) -> tuple[int, NewMessage, str, str] | None:
        """A SEND_MESSAGE_V2 half message with a UNIQ_KEY and no properties of its own to
        merge, to a topic that takes it: its record built as :meth:`_prepare_put` builds it
        (read straight from the short header fields, the topic looked up once per run in
        ``configs``) -> (queue id, message, producer group, UNIQ_KEY); None: anything else
        (:meth:`_send_put` then checks, builds or refuses it). A writer sends thousands a
        second: the fields are read inline, as ``_int`` reads them."""
        ext = req.ext_fields
        props_s = ext.get("i", "")
        if "UNIQ_KEY\x01" not in props_s or needs_parsing(props_s) or _REAL_TOPIC_ITEM in props_s or \
                _REAL_QID_ITEM in props_s or _TX_ID_ITEM in props_s:
            return None
        topic = ext.get("b", "")
        body = req.body
        if topic.startswith(RETRY_PREFIX) or len(body) > max_size:
            return None
        cfg = configs.get(topic)
        if cfg is None:
            if topic_problem(topic):
                return None
            cfg = self.topics.get(topic)
            if cfg is None or not cfg.perm & 2:
                return None
            configs[topic] = cfg
        # the fields in the order the general path reads them ("" or missing: the default)
        raw = ext.get("e")
        try:
            queue_id = _write_queue(int(raw) if raw else -1, cfg)
            raw = ext.get("h")
            msg_flag = int(raw) if raw else 0
            raw = ext.get("f")
            sys_flag = int(raw) if raw else 0
            raw = ext.get("g")
            born_ts = int(raw) if raw else int(time.time() * 1000)
            raw = ext.get("j")
            reconsume = int(raw) if raw else 0
        except (ValueError, SendRejected):
            return None  # the general path answers it
        props_s, group, uniq = self._half_properties(props_s, topic, queue_id, ext.get("a", ""))
        if uniq is None or _props_too_long(props_s):
            return None  # the general path answers it (see _check_props_size)
        return queue_id, NewMessage(HALF_TOPIC, 0, body, props_s, msg_flag, sys_flag, born_ts, born_host,
                                    reconsume), group, uniq

    def _half_properties(self, props_s: str, topic: str, queue_id: int, producer_group: str
                         ) -> tuple[str, str, str | None]:
        """A half message's properties when it has none of its own to merge (the caller
        checked: nothing to parse, none of the half's keys): the broker's and the half's
        appended to its own, no map built (what the general path's map ends with). -> (the
        properties, its producer group, its UNIQ_KEY)."""
        group = property_of(props_s, PropertyKey.PGROUP)
        uniq = property_of(props_s, PropertyKey.UNIQ_KEY)
        extra = f"{_REAL_TOPIC_ITEM}{topic}\x02{_REAL_QID_ITEM}{queue_id}\x02"
        if group is None:
            group = producer_group
            extra = f"{extra}{_PGROUP_ITEM}{group}\x02"
        if uniq is not None:  # Java brokers store the transaction id with the half
            extra = f"{extra}{_TX_ID_ITEM}{uniq}\x02"
        # join_properties(join_properties(props_s, suffix), extra): the broker's suffix ends with \x02
        if props_s and not props_s.endswith("\x02"):
            props_s += "\x02"
        return f"{props_s}{self._broker_suffix}{extra}", group, uniq

    def _plain_half_message(self, topic: str, queue_id: int, body: bytes, props_s: str, msg_flag: int, sys_flag: int,
                            born_ts: int, born_host: bytes, reconsume: int, producer_group: str
                            ) -> tuple[NewMessage, str, str | None]:
        """A half message without properties of its own to merge (see :meth:`_half_properties`)
        -> (the message, its producer group, its UNIQ_KEY). SendRejected when the properties
        grow too long."""
        props_s, group, uniq = self._half_properties(props_s, topic, queue_id, producer_group)
        _check_props_size(props_s)
        return (NewMessage(topic=HALF_TOPIC, queue_id=0, body=body, properties=props_s, flag=msg_flag,
                           sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume),
                group, uniq)

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

    def _success(self, req: RemotingCommand, ext_fields: dict[str, str] | None, encoded: bool) -> HandlerResult:
        """The SUCCESS answer to ``req``: with ``encoded``, a JSON request and asynchronous
        flushing, the frame itself (thousands of answers a second, no command built);
        otherwise the command, after the flush when flushing is synchronous."""
        if encoded and req.serialize_type == SERIALIZE_JSON and self.config.flush != "sync":
            frame = success_frame(req.opaque, ext_fields)
            if frame is not None:
                return frame
        return self._when_durable(req.response_to(ResponseCode.SUCCESS, ext_fields=ext_fields))

    def _send_batch_fast(self, conn: Connection, req: RemotingCommand, ext: dict[str, str]) -> HandlerResult | None:
        """A batch of plain messages (no delay, timer or transaction) stored in one vectorised
        pass (:meth:`MessageStore.put_batch`); None: take the per-message path."""
        sys_flag = _int(ext, "sysFlag", 0)
        if sys_flag & SysFlag.TRANSACTION_MASK == TransactionType.PREPARED or not req.body:
            return None
        # the batch's own properties (a message group's key) go after each message's, as Java
        # brokers append them; ones that need parsing per message take the per-message path
        extra = ext.get("properties", "")
        if extra and (not extra.isascii() or needs_parsing(extra)):
            return None
        topic = ext.get("topic", "")
        cfg = self.topics.get(topic)
        if cfg is None or not cfg.perm & 2 or topic_problem(topic):
            return None
        layout = parse_batch(req.body, self.config.max_message_size)
        if layout is None:
            return None
        try:
            queue_id = _write_queue(_int(ext, "queueId", -1), cfg)
        except SendRejected:
            return None  # the per-message path answers it
        done = self.store.put_batch(
            topic, queue_id, layout, sys_flag=sys_flag,
            born_ts=_int(ext, "bornTimestamp", int(time.time() * 1000)), born_host=self.pack_peer(conn.peer),
            reconsume=_int(ext, "reconsumeTimes", 0),
            suffix=join_properties(extra, self._broker_suffix).encode() if extra else self._broker_suffix_bytes)
        if done is None:
            return None
        first, positions, _ = done
        return self._sent(req, offset_msg_ids(self._msg_id_prefix, positions), queue_id, first)

    def put_messages(self, topic: str, queue_id: int, raw: list[tuple[bytes, str, int]], *, sys_flag: int,
                     born_ts: int, born_host: bytes, reconsume: int = 0, producer_group: str = "") -> Accepted:
        """Store messages a producer sent to one queue of ``topic`` (``raw``: body as sent,
        properties string, flag); the send path of every transport. Raises
        :class:`SendRejected` with the remoting response code when refused.

        An out-of-range ``queue_id`` is mapped onto the writable queues. A message whose
        DELAY / TIMER_* properties put its due time in the future is stored in the schedule
        queue instead (see :class:`.DelayedDelivery`); the stored position is then that of the
        schedule-queue entry (as Java brokers answer) and the client message id (UNIQ_KEY)
        is the one delivered later. A prepared (transactional) message goes to the half
        topic and is tracked until END_TRANSACTION.
        """
        return self._store_puts([self._prepare_put(topic, queue_id, raw, sys_flag=sys_flag, born_ts=born_ts,
                                                   born_host=born_host, reconsume=reconsume,
                                                   producer_group=producer_group)])[0]

    def _prepare_put(self, topic: str, queue_id: int, raw: list[tuple[bytes, str, int]], *, sys_flag: int,
                     born_ts: int, born_host: bytes, reconsume: int, producer_group: str) -> _Put:
        """:meth:`put_messages` up to the store: checked, and the records to write built."""
        problem = topic_problem(topic)
        if problem:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
        cfg = self.topics.get(topic)
        if cfg is None:
            if not self.create_topic(topic, None):
                raise SendRejected(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
            cfg = self.topics.get(topic)
            assert cfg is not None
        if not cfg.perm & 2:
            raise SendRejected(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending is forbidden")
        queue_id = _write_queue(queue_id, cfg)
        max_size = self.config.max_message_size
        tx_type = sys_flag & SysFlag.TRANSACTION_MASK
        may_delay = tx_type in (TransactionType.NOT_TYPE, TransactionType.COMMIT)
        now_ms = int(time.time() * 1000)
        messages: list[NewMessage] = []
        dues: list[int | None] = []
        groups: list[str] = []  # the producer group of each half message (a prepared send)
        for body, props_s, msg_flag in raw:
            if len(body) > max_size:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL,
                                   f"message body of {len(body)} bytes exceeds the maximum of {max_size} bytes")
            if tx_type != TransactionType.PREPARED and not needs_parsing(props_s):
                # The common case: the broker's properties are appended, no need to parse them all.
                props_s = join_properties(props_s, self._broker_suffix)
                _check_props_size(props_s)
                messages.append(NewMessage(
                    topic=topic, queue_id=queue_id, body=body, properties=props_s, flag=msg_flag,
                    sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume,
                ))
                dues.append(None)
                continue
            if tx_type == TransactionType.PREPARED and not needs_parsing(props_s) and \
                    not any(k in props_s for k in _HALF_KEYS):
                half, group, _ = self._plain_half_message(topic, queue_id, body, props_s, msg_flag, sys_flag, born_ts,
                                                          born_host, reconsume, producer_group)
                messages.append(half)
                dues.append(None)
                groups.append(group)
                continue
            props = decode_properties(props_s)
            props.update(self._broker_props)
            m_topic, m_queue = topic, queue_id
            due: int | None = None
            by_level = False
            if may_delay:
                try:
                    due, by_level = delivery_due_ms(props, now_ms, self.config.max_delay_ms)
                except ValueError as exc:
                    raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
            if due is not None:
                if by_level:
                    # a delay level wins; Java brokers drop the timer properties then
                    for key in (PropertyKey.TIMER_DELIVER_MS, PropertyKey.TIMER_DELAY_SEC,
                                PropertyKey.TIMER_DELAY_MS):
                        props.pop(key, None)
                props[PropertyKey.REAL_TOPIC] = topic
                props[PropertyKey.REAL_QID] = str(queue_id)
                props[TIMER_OUT_MS] = str(due)
                m_topic, m_queue = SCHEDULE_TOPIC, SCHEDULE_QUEUE
            dues.append(due)
            if tx_type == TransactionType.PREPARED:
                props[PropertyKey.REAL_TOPIC] = topic
                props[PropertyKey.REAL_QID] = str(queue_id)
                groups.append(props.setdefault(PropertyKey.PGROUP, producer_group))
                if PropertyKey.UNIQ_KEY in props:  # Java brokers store the transaction id with the half
                    props.setdefault(PropertyKey.TRANSACTION_ID, props[PropertyKey.UNIQ_KEY])
                m_topic, m_queue = HALF_TOPIC, 0
            props_s = encode_properties(props)
            _check_props_size(props_s)
            messages.append(NewMessage(
                topic=m_topic, queue_id=m_queue, body=body, properties=props_s,
                flag=msg_flag, sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
                reconsume_times=reconsume,
            ))
        return _Put(queue_id, messages, dues, groups, tx_type == TransactionType.PREPARED)

    def _store_puts(self, puts: list[_Put]) -> list[Accepted]:
        """Write the records of ``puts`` (one store write for all), then schedule the delayed
        ones and open the transactions of the prepared ones."""
        stored = self.store.put([m for p in puts for m in p.messages])
        out: list[Accepted] = []
        at = 0
        for p in puts:
            mine = stored[at:at + len(p.messages)]
            at += len(p.messages)
            for due, st in zip(p.dues, mine):
                if due is not None:
                    self.delayed.add(Delayed(st.queue_offset, due, st.physical_offset, st.size))
            if p.prepared:
                self.transactions.opened(mine, p.groups)
            out.append(Accepted(p.queue_id, p.messages, mine, p.prepared))
        return out

    async def durable(self) -> None:
        """With ``flush=sync``: return once everything stored so far is fsynced (raises
        when the flush failed). With async flushing: at once."""
        if self.config.flush == "sync" and self.flusher is not None:
            await self.flusher.wait_durable(self.store.commitlog.write_pos)

    def _when_durable(self, resp: RemotingCommand) -> HandlerResult:
        """``resp`` at once, or with ``flush=sync`` once everything stored so far is on disk
        (answered FLUSH_DISK_TIMEOUT when the flush failed)."""
        if self.config.flush == "sync" and self.flusher is not None:
            return self._after_flush(resp, self.store.commitlog.write_pos)
        return resp

    async def _after_flush(self, resp: RemotingCommand, pos: int) -> RemotingCommand:
        assert self.flusher is not None
        try:
            await self.flusher.wait_durable(pos)
        except Exception as exc:
            resp.code = ResponseCode.FLUSH_DISK_TIMEOUT
            resp.remark = f"flush to disk failed: {exc}"
        return resp

    def pack_peer(self, peer: str) -> bytes:
        """A peer address (``host:port``) packed as records store hosts (cached)."""
        packed = self._peer_cache.get(peer)
        if packed is None:
            try:
                packed = pack_host(peer)[0]
            except ValueError:
                packed = b"\x7f\x00\x00\x01\x00\x00\x00\x00"
            if len(self._peer_cache) > 4096:
                self._peer_cache.clear()
            self._peer_cache[peer] = packed
        return packed

    # -- pull -----------------------------------------------------------------------

    def pull_message(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        ext = req.ext_fields
        topic = ext.get("topic", "")
        queue_id = _int(ext, "queueId")
        _int(ext, "queueOffset")  # validated here, used by _pull_once
        group = ext.get("consumerGroup", "")
        refused = self.pull_refusal(topic, queue_id, group)
        if refused is not None:
            return req.response_to(refused[0], remark=refused[1])
        reset = self.take_pull_reset(topic, queue_id, group)
        if reset is not None:  # the group's offset was reset: its next pull of the queue moves there
            return req.response_to(ResponseCode.PULL_OFFSET_MOVED, {
                "suggestWhichBrokerId": "0", "nextBeginOffset": str(reset),
                "minOffset": str(self.store.min_offset(topic, queue_id)),
                "maxOffset": str(self.store.max_offset(topic, queue_id))}, remark="OFFSET_RESET")
        if ext.get("expressionType", "TAG").upper() not in ("TAG", ""):
            return req.response_to(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                   remark="only TAG subscriptions are supported by the embedded broker")
        sys_flag = _int(ext, "sysFlag", 0)
        if sys_flag & 0x1:
            commit = _int(ext, "commitOffset", -1)
            group = ext.get("consumerGroup", "")
            if commit >= 0 and group:
                self.offsets.commit(topic, group, queue_id, commit, conn.peer)
        result = self._pull_once(req)
        if result.code == ResponseCode.PULL_NOT_FOUND and sys_flag & 0x2:
            timeout = min(_int(ext, "suspendTimeoutMillis", 15_000), self.config.max_suspend_ms)
            if timeout > 0:
                return self._suspend(conn, req, timeout / 1000.0)
        return result

    def pull_refusal(self, topic: str, queue_id: int, group: str) -> tuple[int, str] | None:
        """Why a pull of ``topic``'s queue by ``group`` is refused, as (response code, remark),
        or None: the topic must exist and be readable, the queue be one of its read queues, and
        the group be known (created here when auto-creation is on, as a Java broker does on a
        pull). Every transport's pull asks it."""
        cfg = self.topics.get(topic)
        if cfg is None:
            return ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!"
        if not cfg.perm & 4:
            return ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling is forbidden"
        if not 0 <= queue_id < cfg.readQueueNums:
            return (ResponseCode.SYSTEM_ERROR, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                                               f"topicConfig.readQueueNums:[{cfg.readQueueNums}]")
        if group and not self.knows_group(group):
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group [{group}] does not exist"
        return None

    def take_pull_reset(self, topic: str, queue_id: int, group: str) -> int | None:
        """The offset ``group``'s offset of the queue was reset to (server-side reset), handed to
        this pull and forgotten; None when there is none."""
        if not group or not self.config.server_side_reset:
            return None
        return self.offsets.take_reset(topic, group, queue_id)

    def commit_offset(self, topic: str, group: str, queue_id: int, offset: int,
                      client: str = "") -> tuple[int, str] | None:
        """Store ``group``'s next offset of the queue (every transport's offset update). Refused,
        as (code, remark), for a group the broker does not know (an update never creates one);
        ignored, answered (SUCCESS, why), for a queue with a server-side reset its consumers
        have not pulled yet (Java alike). A negative offset (some clients' "nothing consumed
        yet") is accepted and ignored."""
        if group not in self.groups:
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"Group {group} not exist!"
        if self.config.server_side_reset and self.offsets.is_reset(topic, group, queue_id):
            return ResponseCode.SUCCESS, "Offset has been previously reset"
        if offset >= 0:
            self.offsets.commit(topic, group, queue_id, offset, client)
        return None

    def _pull_once(self, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        topic = ext["topic"]
        queue_id = int(ext["queueId"])
        offset = int(ext["queueOffset"])
        max_nums = max(1, min(_int(ext, "maxMsgNums", 32), self.config.max_pull_messages))
        res: GetResult = self.store.get(
            topic, queue_id, offset, max_nums, self.config.max_pull_bytes,
            tag_filter(ext.get("subscription", "*")),
        )
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

    async def _suspend(self, conn: Connection, req: RemotingCommand, timeout_s: float) -> RemotingCommand:
        await self.wait_for_messages(req.ext_fields["topic"], (int(req.ext_fields["queueId"]),), timeout_s)
        return self._pull_once(req)

    async def wait_for_messages(self, topic: str, queue_ids: Iterable[int], timeout_s: float) -> None:
        """Return when any of the queues gets new messages, or after ``timeout_s`` (long polling)."""
        keys = [(topic, q) for q in queue_ids]
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._pull_waiters.setdefault(key, []).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                lst = self._pull_waiters.get(key)
                if lst and fut in lst:
                    lst.remove(fut)

    def _on_new_messages(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._pull_waiters.get((topic, queue_id))
        if not waiters:
            return
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- offsets --------------------------------------------------------------------

    def query_consumer_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """The group's committed offset. With none, as 5.x brokers answer: 0 when the queue
        starts at 0 and its first message is still in memory (a young queue: a new group
        reads it from the start, whatever its consume-from-where), else QUERY_NOT_FOUND;
        always QUERY_NOT_FOUND when the request says ``setZeroIfNotFound=false``."""
        ext = req.ext_fields
        topic, queue_id = ext.get("topic", ""), _int(ext, "queueId")
        off = self.offsets.query(topic, ext.get("consumerGroup", ""), queue_id)
        if off is not None:
            return req.response_to(ext_fields={"offset": str(off)})
        if str(ext.get("setZeroIfNotFound", "")).lower() == "false":
            return req.response_to(ResponseCode.QUERY_NOT_FOUND,
                                   remark="Not found, do not set to zero, maybe this group boot first")
        if self.store.min_offset(topic, queue_id) <= 0 and self.store.in_memory(topic, queue_id, 0):
            return req.response_to(ext_fields={"offset": "0"})
        return req.response_to(ResponseCode.QUERY_NOT_FOUND, remark="Not found, maybe this group consumer boot first")

    def update_consumer_offset(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        ext = req.ext_fields
        topic = ext.get("topic", "")
        group = ext.get("consumerGroup", "")
        if not topic or not group:
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark="UPDATE_CONSUMER_OFFSET needs topic and consumerGroup")
        outcome = self.commit_offset(topic, group, _int(ext, "queueId"), _int(ext, "commitOffset"), conn.peer)
        if outcome is not None:
            return req.response_to(outcome[0], remark=outcome[1])
        resp = req.response_to()
        return self._when_durable(resp)

    def search_offset_by_timestamp(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.store.offset_by_time(ext.get("topic", ""), _int(ext, "queueId"), _int(ext, "timestamp"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_max_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.store.max_offset(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_min_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        off = self.store.min_offset(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"offset": str(off)})

    def get_topic_stats_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """Every queue's min/max offset and last store time in one answer (mqadmin topicStatus;
        readers planning many queues use it instead of two requests per queue). The body is a
        TopicStatsTable as fastjson writes it: MessageQueue objects as map keys."""
        topic = req.ext_fields.get("topic", "")
        cfg = self.topics.get(topic)
        if cfg is None:
            return req.response_to(ResponseCode.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        name, t = json.dumps(self.config.broker_name), json.dumps(topic)
        items = []
        for q in range(max(cfg.readQueueNums, cfg.writeQueueNums)):
            lo, hi = self.store.min_offset(topic, q), self.store.max_offset(topic, q)
            ts = self.store.store_time(topic, q, hi - 1) if hi > lo else 0
            items.append(f'{{"brokerName":{name},"queueId":{q},"topic":{t}}}:{{"lastUpdateTimestamp":{ts},'
                         f'"maxOffset":{hi},"minOffset":{lo}}}')
        return req.response_to(body=('{"offsetTable":{' + ",".join(items) + "}}").encode())

    def get_earliest_msg_storetime(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        ts = self.store.earliest_store_time(ext.get("topic", ""), _int(ext, "queueId"))
        return req.response_to(ext_fields={"timestamp": str(ts)})

    def view_message_by_id(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        pos = _int(req.ext_fields, "offset")
        rec = self.store.record_at(pos)
        if rec is None:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"no message at commit log offset {pos}")
        return req.response_to(body=rec)

    def reset_offset(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """INVOKE_BROKER_TO_RESET_OFFSET: set a group's offsets to the first message at/after a time."""
        ext = req.ext_fields
        topic = ext.get("topic", "")
        group = ext.get("group", "")
        ts = _int(ext, "timestamp")
        cfg = self.topics.get(topic)
        if cfg is None:
            return req.response_to(ResponseCode.TOPIC_NOT_EXIST, remark=f"topic[{topic}] not exist")
        server_side = self.config.server_side_reset
        if server_side and group not in self.groups:
            return req.response_to(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, remark=f"Group {group} does not exist")
        table: dict[int, int] = {}
        for q in range(cfg.readQueueNums):
            off = self.store.max_offset(topic, q) if ts < 0 else self.store.offset_by_time(topic, q, ts)
            table[q] = off
            if server_side:
                self.offsets.reset(topic, group, q, off)
            else:
                self.offsets.commit(topic, group, q, off, conn.peer)
        # fastjson writes MessageQueue keys as objects; mimic it so Java tools can read it.
        items = ",".join(
            f'{{"brokerName":{json.dumps(self.config.broker_name)},"queueId":{q},"topic":{json.dumps(topic)}}}:{off}'
            for q, off in table.items()
        )
        body = ('{"offsetTable":{' + items + "}}").encode()
        for consumer, _ in self.clients.consumers(group) if not server_side else ():
            consumer.push(RequestCode.RESET_CONSUMER_CLIENT_OFFSET,
                          {"topic": topic, "group": group, "timestamp": str(ts), "isForce": "true"}, body)
        return req.response_to(body=body)

    # -- clients --------------------------------------------------------------------

    def heart_beat(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        try:
            body = loads_lenient(req.body) if req.body else {}
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except Exception as exc:
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"malformed heartbeat body: {exc}")
        changed = self.clients.heartbeat(conn, body, req.language, req.version)
        for c in body.get("consumerDataSet") or []:
            group = c.get("groupName") if isinstance(c, dict) else None
            if isinstance(group, str) and group:
                self.knows_group(group)
                if not topic_problem(retry_topic(group)):
                    # Clustering consumers look up their retry topic's route; brokers create it.
                    self.retry_topic_of(group)
        for group in changed:
            self._notify_consumers_changed(group)
        return req.response_to()

    def knows_group(self, group: str) -> bool:
        """Whether consumer group ``group`` exists, creating it when auto-creation is on (what
        a pull or consumer heartbeat does on a Java broker)."""
        if group in self.groups:
            return True
        if not self.config.auto_create_groups:
            return False
        self.groups.put(group)
        return True

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
        self.groups.put(group, cfg)
        return req.response_to()

    def unregister_client(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        ext = req.ext_fields
        changed = self.clients.unregister(conn, ext.get("producerGroup"), ext.get("consumerGroup"))
        for group in changed:
            self._notify_consumers_changed(group)
        return req.response_to()

    def get_consumer_list_by_group(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        group = req.ext_fields.get("consumerGroup", "")
        ids = self.clients.consumer_ids(group)
        if not ids:  # as Java brokers answer a group with no online consumer
            return req.response_to(ResponseCode.SYSTEM_ERROR, remark=f"no consumer for this group, {group}")
        return req.response_to(body=json.dumps({"consumerIdList": ids}).encode())

    def get_consumer_connection_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (mqadmin consumerConnection): the group's online clients
        and what their heartbeats said (ConsumerConnection, as a Java broker answers it)."""
        group = req.ext_fields.get("consumerGroup", "")
        consumers = self.clients.consumers(group)
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
        target = next((c for c, ch in self.clients.consumers(group) if ch.client_id == client_id), None)
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

    def _notify_consumers_changed(self, group: str) -> None:
        for consumer, _ in self.clients.consumers(group):
            consumer.push(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})

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

    # -- transactions ---------------------------------------------------------------

    def retry_topic_of(self, group: str) -> str:
        """The group's retry topic, created (with the group's retryQueueNums) if need be."""
        topic = retry_topic(group)
        if topic not in self.topics:
            n = max(1, int(self.groups.table.get(group, {}).get("retryQueueNums", 1)))
            self.topics.put(TopicConfig(topic, n, n, 6))
            self._topics_changed()
        return topic

    def dead_letter_topic_of(self, group: str) -> str:
        """The group's dead-letter topic (one queue, readable: 5.x brokers create it so),
        created if need be."""
        topic = dead_letter_topic(group)
        if topic not in self.topics:
            self.topics.put(TopicConfig(topic, 1, 1, 6))
            self._topics_changed()
        return topic

    def consumer_send_msg_back(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        """CONSUMER_SEND_MSG_BACK (36): a consumer gives back a message it could not process
        (``offset``: where it is in the commit log). As Java brokers do: the message is stored
        again in the group's retry topic, delayed by ``delayLevel`` (0: 3 + its reconsume
        times), with RETRY_TOPIC (its first topic) and ORIGIN_MESSAGE_ID (its first message
        id) kept and its reconsume times one more; once those reach ``maxReconsumeTimes`` (the
        group's retryMaxTimes when absent), or with a negative delay level, it goes to the
        group's dead-letter topic instead, at once."""
        ext = req.ext_fields
        group = ext.get("group", "")
        if group_problem(group) or not self.knows_group(group):
            return req.response_to(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                   remark=f"subscription group not exist, {group}")
        cfg = self.groups.table[group]
        if int(cfg.get("retryQueueNums", 1)) <= 0:
            return req.response_to()  # the group keeps no retries (as Java brokers answer)
        pos = _int(ext, "offset", -1)
        raw = self.store.record_at(pos) if pos >= 0 else None
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
        delay = _int(ext, "delayLevel", 0)
        most = _int(ext, "maxReconsumeTimes", int(cfg.get("retryMaxTimes", 16)))
        if rec.reconsume_times >= most or delay < 0:
            topic, queue_id = self.dead_letter_topic_of(group), 0
            props[PropertyKey.DELAY] = "0"
        else:
            topic = self.retry_topic_of(group)
            queue_id = random.randrange(self.topics.get(topic).writeQueueNums)  # type: ignore[union-attr]
            props[PropertyKey.DELAY] = str(delay or 3 + rec.reconsume_times)
        try:
            self.put_messages(topic, queue_id, [(rec.body, encode_properties(props), rec.flag)], sys_flag=rec.sys_flag,
                              born_ts=rec.born_timestamp, born_host=self.pack_peer(rec.born_host),
                              reconsume=rec.reconsume_times + 1)
        except SendRejected as exc:
            return req.response_to(exc.code, remark=exc.remark)
        return self._when_durable(req.response_to())

    def end_transaction(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        return self._end_transactions(conn, [req])[0]

    def _end_transactions(self, conn: Connection, reqs: list[RemotingCommand], *, encoded: bool = False
                          ) -> list[HandlerResult]:
        """END_TRANSACTION requests, in order; those that arrived together (a driver's
        pipelined commits) are stored in one write (:meth:`Transactions.finish_many`);
        ``encoded``: see :meth:`_success`."""
        out: list[HandlerResult] = [None] * len(reqs)
        ends: list[tuple[int, int, int, bool]] = []  # (request index, commitLogOffset, half offset, commit)
        commit_kind, rollback_kind = TransactionType.COMMIT, TransactionType.ROLLBACK
        for k, req in enumerate(reqs):
            ext = req.ext_fields
            # the usual END (three integers, an end it knows) read inline; anything else as _int reads it
            try:
                kind = int(ext["commitOrRollback"])
                pos = int(ext["commitLogOffset"])
                raw = ext.get("tranStateTableOffset")
                half = int(raw) if raw else -1
            except (KeyError, TypeError, ValueError):
                pass
            else:
                if kind == commit_kind or kind == rollback_kind:
                    ends.append((k, pos, half, kind == commit_kind))
                    continue
            try:
                kind = _int(ext, "commitOrRollback")  # required: a missing one is answered as malformed
                if kind == TransactionType.NOT_TYPE:
                    continue  # the producer does not know yet (no answer, as Java's broker); the check-back asks again
                if kind not in (TransactionType.COMMIT, TransactionType.ROLLBACK):
                    out[k] = req.response_to(ResponseCode.SYSTEM_ERROR,
                                             remark=f"commitOrRollback={kind}: 0, 8 or 12 are accepted")
                    continue
                ends.append((k, _int(ext, "commitLogOffset"), _int(ext, "tranStateTableOffset", -1),
                             kind == TransactionType.COMMIT))
            except ValueError as exc:  # malformed header fields, as dispatch answers them
                out[k] = req.response_to(ResponseCode.SYSTEM_ERROR, remark=str(exc))
        refusals = self.transactions.finish_many([(pos, half, commit) for _, pos, half, commit in ends])
        for (k, _, _, _), refused in zip(ends, refusals):
            out[k] = (reqs[k].response_to(refused.code, remark=refused.remark) if refused is not None
                      else self._success(reqs[k], None, encoded))
        return out

    # -- admin helpers (tests, CLI) -------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.addr,
            "topics": sorted(self.topic_table()),
            "commitLog": [self.store.commitlog.min_pos, self.store.commitlog.write_pos],
        }
