"""The broker's send path, whatever the transport: a send is checked once (:meth:`Sends.check`,
one set of rules for every request and every fast path), then encoded as the records it stores
(:meth:`Sends.records`, or the two shortcuts that give the same bytes: :meth:`Sends.plain_half`
and :meth:`Sends.put_batch`), then stored (:meth:`Sends.store`).

The checks, in the order Java brokers make them (``AbstractSendMessageProcessor.msgCheck`` and
``SendMessageProcessor``): a send to a group's retry topic (no batches; the group must exist;
past its reconsume times it goes to the group's dead-letter topic), the topic's name, the topic
itself (created when auto-creation is on), its write permission, the queue id; then, per
message, the body's and the properties' size.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..codec import (
    MAX_PROPERTIES_BYTES,
    PropertyKey,
    SysFlag,
    TransactionType,
    decode_properties,
    encode_properties,
    join_properties,
    property_of,
)
from ..codec.batch_kernels import parse_batch
from ..codec.properties import BROKER_PROPERTY_KEYS, needs_parsing
from ..names import RETRY_PREFIX, topic_problem
from ..remoting.codes import ResponseCode
from .config import BrokerConfig
from .delayed import SCHEDULE_QUEUE, SCHEDULE_TOPIC, TIMER_OUT_MS, Delayed, DelayedDelivery, delivery_due_ms
from .errors import SendRejected
from .groups import ConsumerGroups
from .state import HALF_TOPIC, TopicConfig, TopicConfigs
from .store import MessageStore, NewMessage, Stored
from .transactions import Transactions

__all__ = ["REGION", "Accepted", "CheckedSend", "SendHeader", "Sends", "UniqIds", "message_type"]

#: the region a broker names in MSG_REGION (Java's default regionId)
REGION = "DefaultRegion"

#: A record stores its properties' length as an int16: longer properties are refused.
_MAX_PROPS_CHARS = MAX_PROPERTIES_BYTES // 3  # fewer characters cannot exceed it in UTF-8

#: the properties a half message gets from the broker (a send carrying one is merged as a map)
_HALF_KEYS = (f"{PropertyKey.REAL_TOPIC}\x01", f"{PropertyKey.REAL_QID}\x01", f"{PropertyKey.TRANSACTION_ID}\x01")
_REAL_TOPIC_ITEM, _REAL_QID_ITEM, _TX_ID_ITEM = _HALF_KEYS
_PGROUP_ITEM = f"{PropertyKey.PGROUP}\x01"
_UNIQ_ITEM = f"{PropertyKey.UNIQ_KEY}\x01"


def _props_too_long(props: str) -> bool:
    """Whether ``props`` exceed what a record's int16 length holds (short enough in any
    encoding: no encode)."""
    return len(props) > _MAX_PROPS_CHARS and len(props.encode()) > MAX_PROPERTIES_BYTES


def _check_props_size(props: str) -> None:
    if _props_too_long(props):
        size = len(props.encode())
        raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"message properties of {size} bytes exceed the "
                                                         f"maximum of {MAX_PROPERTIES_BYTES} bytes")


@functools.lru_cache(maxsize=4096)
def _topic_problem(topic: str) -> str | None:
    return topic_problem(topic)  # a writer sends thousands a second to the same few topics


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


@dataclass(slots=True)
class SendHeader:
    """A send's header fields, read once by the transport (the remoting service reads them from
    SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE)."""

    topic: str
    queue_id: int
    sys_flag: int
    flag: int
    born_ts: int
    reconsume: int
    #: the retries a group allows (maxReconsumeTimes); None: the group's retryMaxTimes
    max_reconsume: int | None
    producer_group: str
    #: a single message's properties, or the batch's own (appended to each of its messages)
    properties: str
    batch: bool

    @property
    def prepared(self) -> bool:
        return self.sys_flag & SysFlag.TRANSACTION_MASK == TransactionType.PREPARED


@dataclass(slots=True)
class CheckedSend:
    """A send the broker takes (:meth:`Sends.check`): where its messages go."""

    header: SendHeader
    #: the header's topic, or the group's dead-letter topic for a retry past its reconsume times
    topic: str
    #: the write queue chosen (a dead letter goes to queue 0)
    queue_id: int
    #: sent to a retry topic past the group's reconsume times: stored in its dead-letter topic,
    #: delivered at once
    dead: bool


@dataclass(slots=True)
class Accepted:
    """What :meth:`Sends.store` stored: the queue it chose and where each landed."""

    queue_id: int
    messages: list[NewMessage]
    stored: list[Stored]
    prepared: bool

    def first_uniq_key(self) -> str:
        """The first message's client id (UNIQ_KEY), "" without one: a single send's answer."""
        return property_of(self.messages[0].properties, PropertyKey.UNIQ_KEY) or ""


@dataclass(slots=True)
class Put:
    """A send checked and its records built, not stored yet (see :meth:`Sends.store`)."""

    queue_id: int
    messages: list[NewMessage]
    dues: list[int | None]  # each message's delivery time when delayed
    groups: list[str]  # a prepared send's producer group per message
    prepared: bool


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


class Sends:
    """Checks, encodes and stores sends for one broker (every transport's send path)."""

    def __init__(self, config: BrokerConfig, store: MessageStore, topics: TopicConfigs,
                 create_topic: Callable[[str], bool], groups: ConsumerGroups, transactions: Transactions,
                 delayed: DelayedDelivery, store_host: bytes) -> None:
        self.config = config
        self.store = store
        self.topics = topics
        self._create_topic = create_topic
        self.groups = groups
        self.transactions = transactions
        self.delayed = delayed
        self.msg_id_prefix = store_host.hex().upper()
        self._uniq_ids = UniqIds(store_host[:-4])
        #: what a Java broker sets on every message it stores (overwriting a producer's values)
        self._broker_props = dict(zip(BROKER_PROPERTY_KEYS, (REGION, config.cluster, "true"), strict=True))
        self._broker_suffix = encode_properties(self._broker_props)
        self._broker_suffix_bytes = self._broker_suffix.encode()

    # -- the check ------------------------------------------------------------------

    def check(self, h: SendHeader) -> CheckedSend:
        """The send a request asks for, checked (see the module's docstring for the rules):
        SendRejected with the response code when refused."""
        topic, queue_id, dead = h.topic, h.queue_id, False
        if topic.startswith(RETRY_PREFIX):
            if h.batch:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"batch request does not support retry group {topic}")
            group = topic[len(RETRY_PREFIX):]
            if not self.groups.knows(group):
                raise SendRejected(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}")
            most = h.max_reconsume
            if most is None:
                most = int(self.groups.config_of(group).get("retryMaxTimes", 16))
            if h.reconsume > most:
                topic, queue_id, dead = self.groups.dead_letter_topic_of(group), 0, True
            else:  # created as a send-back creates it (the group's retryQueueNums)
                self.groups.retry_topic_of(group)
        return CheckedSend(h, topic, self.target(topic, queue_id), dead)

    def target(self, topic: str, queue_id: int) -> int:
        """The write queue a send to ``topic`` goes to: the topic's name valid, the topic there
        (created when auto-creation is on) and writable, the queue id one it takes."""
        problem = _topic_problem(topic)
        if problem:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"topic {topic!r}: {problem}")
        cfg = self.topics.get(topic)
        if cfg is None:
            if not self._create_topic(topic):
                raise SendRejected(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
            cfg = self.topics.get(topic)
            assert cfg is not None
        if not cfg.perm & 2:
            raise SendRejected(ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending is forbidden")
        return _write_queue(queue_id, cfg)

    def _check_body(self, body: bytes) -> None:
        if len(body) > self.config.max_message_size:
            raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, f"message body of {len(body)} bytes exceeds the "
                                                             f"maximum of {self.config.max_message_size} bytes")

    # -- encoding -------------------------------------------------------------------

    def single_properties(self, send: CheckedSend) -> str:
        """A single message's properties as stored: with a client id (UNIQ_KEY) when it came
        without one (as a 5.x broker gives one), delivered at once when it is a dead letter
        (the last DELAY counts)."""
        props = send.header.properties
        if _UNIQ_ITEM not in props:
            props = join_properties(props, f"{_UNIQ_ITEM}{self._uniq_ids.next()}\x02")
        if send.dead:
            props = join_properties(props, f"{PropertyKey.DELAY}\x010\x02")
        return props

    def records(self, send: CheckedSend, raw: list[tuple[bytes, str, int]], born_host: bytes) -> Put:
        """The records a checked send stores (``raw``: body, properties, flag of each message)."""
        h = send.header
        return self._records(send.topic, send.queue_id, raw, sys_flag=h.sys_flag, born_ts=h.born_ts,
                             born_host=born_host, reconsume=h.reconsume, producer_group=h.producer_group)

    def _records(self, topic: str, queue_id: int, raw: list[tuple[bytes, str, int]], *, sys_flag: int,
                 born_ts: int, born_host: bytes, reconsume: int, producer_group: str) -> Put:
        tx_type = sys_flag & SysFlag.TRANSACTION_MASK
        may_delay = tx_type in (TransactionType.NOT_TYPE, TransactionType.COMMIT)
        now_ms = int(time.time() * 1000)
        messages: list[NewMessage] = []
        dues: list[int | None] = []
        groups: list[str] = []  # the producer group of each half message (a prepared send)
        for body, props_s, msg_flag in raw:
            self._check_body(body)
            plain = not needs_parsing(props_s)
            if tx_type != TransactionType.PREPARED and plain:
                # The common case: the broker's properties are appended, no need to parse them all.
                props_s = join_properties(props_s, self._broker_suffix)
                _check_props_size(props_s)
                messages.append(NewMessage(topic, queue_id, body, props_s, msg_flag, sys_flag, born_ts, born_host,
                                           reconsume))
                dues.append(None)
            elif tx_type == TransactionType.PREPARED and plain and not any(k in props_s for k in _HALF_KEYS):
                props_s, group, _ = self._half_properties(props_s, topic, queue_id, producer_group)
                _check_props_size(props_s)
                messages.append(NewMessage(HALF_TOPIC, 0, body, props_s, msg_flag, sys_flag, born_ts, born_host,
                                           reconsume))
                dues.append(None)
                groups.append(group)
            else:
                message, due, half_group = self._parsed_record(topic, queue_id, body, props_s, msg_flag, sys_flag,
                                                               born_ts, born_host, reconsume, producer_group,
                                                               now_ms if may_delay else None)
                messages.append(message)
                dues.append(due)
                if half_group is not None:
                    groups.append(half_group)
        return Put(queue_id, messages, dues, groups, tx_type == TransactionType.PREPARED)

    def _parsed_record(self, topic: str, queue_id: int, body: bytes, props_s: str, msg_flag: int, sys_flag: int,
                       born_ts: int, born_host: bytes, reconsume: int, producer_group: str, now_ms: int | None
                       ) -> tuple[NewMessage, int | None, str | None]:
        """A message whose properties are read as a map: a delayed one (``now_ms`` given: it may
        be delayed) goes to the schedule queue, a prepared one to the half topic. -> (the
        record, its due time when delayed, its producer group when prepared)."""
        props = decode_properties(props_s)
        props.update(self._broker_props)
        m_topic, m_queue = topic, queue_id
        due: int | None = None
        if now_ms is not None:
            try:
                due, by_level = delivery_due_ms(props, now_ms, self.config.max_delay_ms)
            except ValueError as exc:
                raise SendRejected(ResponseCode.MESSAGE_ILLEGAL, str(exc)) from None
            if due is not None:
                if by_level:  # a delay level wins; Java brokers drop the timer properties then
                    for key in (PropertyKey.TIMER_DELIVER_MS, PropertyKey.TIMER_DELAY_SEC, PropertyKey.TIMER_DELAY_MS):
                        props.pop(key, None)
                props[PropertyKey.REAL_TOPIC] = topic
                props[PropertyKey.REAL_QID] = str(queue_id)
                props[TIMER_OUT_MS] = str(due)
                m_topic, m_queue = SCHEDULE_TOPIC, SCHEDULE_QUEUE
        group = None
        if sys_flag & SysFlag.TRANSACTION_MASK == TransactionType.PREPARED:
            props[PropertyKey.REAL_TOPIC] = topic
            props[PropertyKey.REAL_QID] = str(queue_id)
            group = props.setdefault(PropertyKey.PGROUP, producer_group)
            if PropertyKey.UNIQ_KEY in props:  # Java brokers store the transaction id with the half
                props.setdefault(PropertyKey.TRANSACTION_ID, props[PropertyKey.UNIQ_KEY])
            m_topic, m_queue = HALF_TOPIC, 0
        props_s = encode_properties(props)
        _check_props_size(props_s)
        return (NewMessage(m_topic, m_queue, body, props_s, msg_flag, sys_flag, born_ts, born_host, reconsume),
                due, group)

    def plain_half(self, send: CheckedSend, body: bytes, born_host: bytes) -> tuple[NewMessage, str, str] | None:
        """A single half message with a client id and no properties of its own to merge, built
        as :meth:`records` builds it without the map (thousands a second from a writer) ->
        (the record, its producer group, its UNIQ_KEY); None: :meth:`records` builds it (or
        refuses it)."""
        h = send.header
        props_s = h.properties
        if send.dead or not h.prepared or h.batch or _UNIQ_ITEM not in props_s or needs_parsing(props_s) \
                or _REAL_TOPIC_ITEM in props_s or _REAL_QID_ITEM in props_s or _TX_ID_ITEM in props_s \
                or len(body) > self.config.max_message_size:
            return None
        props_s, group, uniq = self._half_properties(props_s, send.topic, send.queue_id, h.producer_group)
        if uniq is None or _props_too_long(props_s):
            return None
        return (NewMessage(HALF_TOPIC, 0, body, props_s, h.flag, h.sys_flag, h.born_ts, born_host, h.reconsume),
                group, uniq)

    def _half_properties(self, props_s: str, topic: str, queue_id: int, producer_group: str
                         ) -> tuple[str, str, str | None]:
        """A half message's properties when it has none of its own to merge (the caller
        checked: nothing to parse, none of the half's keys): the broker's and the half's
        appended to its own, no map built (what the map would end with). -> (the properties,
        its producer group, its UNIQ_KEY)."""
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

    def put_batch(self, send: CheckedSend, body: bytes, born_host: bytes) -> tuple[int, np.ndarray] | None:
        """A batch of plain messages (no delay, timer or transaction) stored in one vectorised
        pass (:meth:`MessageStore.put_batch`), the same bytes :meth:`records` would give ->
        (the first queue offset, each message's commit log position); None: :meth:`records`
        takes it."""
        h = send.header
        if h.prepared or not body:
            return None
        # the batch's own properties (a message group's key) go after each message's, as Java
        # brokers append them; ones that need parsing per message take the per-message path
        extra = h.properties
        if extra and (not extra.isascii() or needs_parsing(extra)):
            return None
        layout = parse_batch(body, self.config.max_message_size)
        if layout is None:
            return None
        done = self.store.put_batch(
            send.topic, send.queue_id, layout, sys_flag=h.sys_flag, born_ts=h.born_ts, born_host=born_host,
            reconsume=h.reconsume,
            suffix=join_properties(extra, self._broker_suffix).encode() if extra else self._broker_suffix_bytes)
        if done is None:
            return None
        first, positions, _ = done
        return first, positions

    # -- storing --------------------------------------------------------------------

    def store_puts(self, puts: list[Put]) -> list[Accepted]:
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

    def put_messages(self, topic: str, queue_id: int, raw: list[tuple[bytes, str, int]], *, sys_flag: int,
                     born_ts: int, born_host: bytes, reconsume: int = 0, producer_group: str = "") -> Accepted:
        """Store messages sent to one queue of ``topic`` (``raw``: body as sent, properties
        string, flag): the send of the gRPC service, a send-back and the like, where no retry
        topic rules apply (see :meth:`check`). Raises :class:`SendRejected` with the remoting
        response code when refused (:meth:`target`: an out-of-range ``queue_id`` is refused, a
        negative one means any writable queue).

        A message whose DELAY / TIMER_* properties put its due time in the future is stored in
        the schedule queue instead (see :class:`.DelayedDelivery`); the stored position is then
        that of the schedule-queue entry (as Java brokers answer) and the client message id
        (UNIQ_KEY) is the one delivered later. A prepared (transactional) message goes to the
        half topic and is tracked until END_TRANSACTION.
        """
        queue_id = self.target(topic, queue_id)
        return self.store_puts([self._records(topic, queue_id, raw, sys_flag=sys_flag, born_ts=born_ts,
                                              born_host=born_host, reconsume=reconsume,
                                              producer_group=producer_group)])[0]
