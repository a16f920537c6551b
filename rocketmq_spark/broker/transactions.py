"""Transactional messages: a prepared send is stored in the half topic and stays open (invisible
to consumers) until END_TRANSACTION commits it (a visible copy in its real queue) or rolls it
back; either way an op marker records the end. Producers of transactions open past the timeout
are asked (CHECK_TRANSACTION_STATE); a restart recovers the open ones from the store."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..codec import (
    PropertyKey,
    RecordParts,
    SysFlag,
    TransactionType,
    decode_record,
    encode_record,
    join_properties,
    offset_msg_id,
    property_of,
    split_record,
    tag_hash,
)
from ..errors import ProtocolError
from ..remoting.codes import RequestCode, ResponseCode
from .config import BrokerConfig
from .errors import SendRejected
from .state import HALF_TOPIC, OP_TOPIC, ClientRegistry, ConsumerOffsets
from .store import MessageStore, NewMessage, Stored

log = logging.getLogger(__name__)

__all__ = ["Transactions"]

TX_GROUP = "CID_RMQ_SYS_TRANS"
#: the most commit-log bytes read at once for the half messages of a run of ENDs
_SPAN_MAX = 4 * 1024 * 1024


@dataclass(slots=True)
class Pending:
    """An open transaction: a half message not yet committed or rolled back."""

    half_offset: int
    commit_log_offset: int
    size: int
    producer_group: str
    store_ts: int
    checks: int = 0
    last_check: float = 0.0



class Transactions:
    """The broker's open transactions (by half-queue offset) and what ends or checks them."""

    def __init__(self, store: MessageStore, offsets: ConsumerOffsets, clients: ClientRegistry, config: BrokerConfig,
                 *, addr: str, pack_peer: Callable[[str], bytes]) -> None:
        self.store = store
        self.offsets = offsets
        self.clients = clients
        self.config = config
        self.addr = addr
        self.pack_peer = pack_peer
        self.pending: dict[int, Pending] = {}

    def opened(self, stored: list[Stored], producer_groups: list[str]) -> None:
        """Half messages just stored (with their PGROUP): open until ended."""
        for s, group in zip(stored, producer_groups, strict=True):
            self.pending[s.queue_offset] = Pending(s.queue_offset, s.physical_offset, s.size, group,
                                                   s.store_timestamp)

    def load(self) -> None:
        """Rebuild open transactions: half messages since the saved progress minus ended ones."""
        start = self.offsets.query(HALF_TOPIC, TX_GROUP, 0)
        for rec in self.store.unfinished((HALF_TOPIC, 0), (OP_TOPIC, 0), start):
            self.pending[rec.queue_offset] = Pending(
                rec.queue_offset, rec.physical_offset, rec.total_size,
                rec.properties.get(PropertyKey.PGROUP, ""), rec.store_timestamp)
        if self.pending:
            log.info("recovered %d open transactions", len(self.pending))

    def save_progress(self) -> None:
        half = self.store.find_queue(HALF_TOPIC, 0)
        if half is None:
            return
        progress = min(self.pending) if self.pending else half.max_offset
        if self.offsets.query(HALF_TOPIC, TX_GROUP, 0) != progress:
            self.offsets.commit(HALF_TOPIC, TX_GROUP, 0, progress)

    def finish(self, commit_log_offset: int, half_offset: int, *, commit: bool) -> None:
        """End the transaction of the half message at ``commit_log_offset`` (its half queue
        offset ``half_offset`` is a hint): commit makes a visible copy, both record an op marker.

        As on Java brokers (EndTransactionProcessor), an END for a half message that was already
        ended is applied again as long as the half is still in the commit log: a second commit
        stores a second copy. Raises :class:`SendRejected` when there is no half message there."""
        (refused,) = self.finish_many([(commit_log_offset, half_offset, commit)])
        if refused is not None:
            raise refused

    def finish_many(self, ends: list[tuple[int, int, bool]]) -> list[SendRejected | None]:
        """:meth:`finish` for each ``(commitLogOffset, half offset, commit)`` in order, every
        copy and op marker stored in one write; per end None, or the refusal (no half message
        at that position)."""
        out: list[SendRejected | None] = []
        # per END that stores: (half record, the copy's topic and queue and tag hash, or None
        # for a rollback; the op marker's body), and the half as read
        items: list[tuple[bytes | None, str, int, int, bytes]] = []
        recs: list[tuple[RecordParts, int]] = []
        checked = False  # an END of a checked-back half: its copy says how often (the general path)
        ended: list[int] = []
        now_ms = int(time.time() * 1000)
        found: list[Pending | None] = []
        for pos, half_offset, _ in ends:
            pending = self.pending.get(half_offset)
            if pending is None or pending.commit_log_offset != pos:
                pending = next((p for p in self.pending.values() if p.commit_log_offset == pos), None)
            found.append(pending)
        span, span_start = self._read_span(found)
        for (pos, half_offset, commit), pending in zip(ends, found):
            raw: bytes | None = None
            if pending is not None and span_start <= pos and pos + pending.size <= span_start + len(span):
                at = pos - span_start
                raw = span[at:at + pending.size]
                if int.from_bytes(raw[:4], "big", signed=True) != pending.size:
                    raw = None  # not the record it should be: read as record_at reads it
            if raw is None:
                raw = self.store.record_at(pos, pending.size if pending is not None else None)
            try:
                rec = split_record(raw) if raw is not None else None
            except ProtocolError:
                rec = None
            if rec is None or rec.topic != HALF_TOPIC or (pending is None and 0 <= half_offset != rec.queue_offset):
                out.append(SendRejected(ResponseCode.SYSTEM_ERROR, "Find prepared transaction message failed: "
                                                                   f"no half message at commitLogOffset {pos}"))
                continue
            if pending is None:
                log.info("END_TRANSACTION (%s) for the already ended half message at %d: applied again",
                         "commit" if commit else "rollback", pos)
            else:
                ended.append(pending.half_offset)
            marker = str(rec.queue_offset).encode()
            checks = pending.checks if pending is not None else 0
            if commit:
                props = rec.properties
                checked = checked or checks > 0
                items.append((raw, property_of(props, PropertyKey.REAL_TOPIC) or rec.topic,
                              int(property_of(props, PropertyKey.REAL_QID) or "0"),
                              tag_hash(props) if "TAGS\x01" in props else 0, marker))
            else:
                items.append((None, "", 0, 0, marker))
            recs.append((rec, checks))
            out.append(None)
        if items:
            if checked:
                messages: list[NewMessage] = []
                for (raw, _, _, _, marker), (rec, checks) in zip(items, recs):
                    if raw is not None:
                        messages.append(self.committed_copy(rec, checks))
                    messages.append(self._op_marker(marker, now_ms))
                self.store.put(messages)
            else:  # the usual run: each copy as its half holds it
                self.store.put_copies(items, self._op_marker(b"", now_ms))
        for half in ended:  # once stored (progress is saved by housekeeping)
            self.pending.pop(half, None)
        return out

    def _op_marker(self, body: bytes, now_ms: int) -> NewMessage:
        """The op marker that records the end of the half message at the half-queue offset ``body``."""
        return NewMessage(OP_TOPIC, 0, body, "TAGS\x01d\x02", born_timestamp=now_ms, born_host=self.store.store_host)

    def _read_span(self, found: list[Pending | None]) -> tuple[bytes, int]:
        """The commit-log bytes from the first to the end of the last of the open half messages
        ``found`` (a run of ENDs names halves stored together: one read instead of one each),
        with where they start; nothing when they lie too far apart."""
        known = [p for p in found if p is not None]
        if len(known) < 2:
            return b"", 0
        lo = min(p.commit_log_offset for p in known)
        hi = max(p.commit_log_offset + p.size for p in known)
        if hi - lo > min(_SPAN_MAX, 4 * sum(p.size for p in known)):
            return b"", 0
        return self.store.read_record(lo, hi - lo), lo

    def committed_copy(self, rec: RecordParts, checks: int = 0) -> NewMessage:
        """The visible copy of a half message. As on Java brokers it keeps REAL_TOPIC/REAL_QID,
        TRAN_MSG, PGROUP and __transactionId__, and TRANSACTION_CHECK_TIMES once checked back."""
        props = rec.properties
        if checks:
            props = join_properties(props, f"{PropertyKey.CHECK_TIMES}\x01{checks}\x02")  # the last one counts
        topic = property_of(props, PropertyKey.REAL_TOPIC) or rec.topic
        queue_id = int(property_of(props, PropertyKey.REAL_QID) or "0")
        sys_flag = (rec.sys_flag & ~SysFlag.TRANSACTION_MASK) | TransactionType.COMMIT
        return NewMessage(topic, queue_id, rec.body, props, rec.flag, sys_flag, rec.born_timestamp, rec.born_host,
                          rec.reconsume_times, rec.physical_offset)

    def check(self) -> None:
        """Ask the producers of transactions open longer than the timeout (CHECK_TRANSACTION_STATE,
        at most every check interval); roll back one unresolved after the maximum of checks. At
        most ``transaction_checks_per_round`` of either per call, the oldest first."""
        if not self.pending:
            return
        now = time.time()
        cfg = self.config
        budget = cfg.transaction_checks_per_round or len(self.pending)
        for p in list(self.pending.values()):  # in half-queue order: the oldest first
            if budget <= 0:
                break
            age_ms = now * 1000 - p.store_ts
            if age_ms < cfg.transaction_timeout_ms:
                break  # the later halves were stored later still
            if p.checks and (now - p.last_check) * 1000 < cfg.transaction_check_interval_ms:
                continue
            if p.checks >= cfg.transaction_max_checks:
                budget -= 1
                log.warning("transaction of group %s at half offset %d unresolved after %d checks; "
                            "rolling it back", p.producer_group, p.half_offset, p.checks)
                self.store.put([self._op_marker(str(p.half_offset).encode(), int(now * 1000))])
                del self.pending[p.half_offset]
                continue
            producers = self.clients.producers(p.producer_group)
            if not producers:
                continue  # nobody to ask yet; try again on the next round
            raw = self.store.record_at(p.commit_log_offset)
            if raw is None:
                continue
            rec = decode_record(raw)
            # The check carries the message as the producer sent it (real topic and queue).
            body = encode_record(
                topic=rec.properties.get(PropertyKey.REAL_TOPIC, rec.topic),
                queue_id=int(rec.properties.get(PropertyKey.REAL_QID, "0")), queue_offset=p.half_offset, body=rec.body,
                properties=rec.properties, flag=rec.flag, sys_flag=rec.sys_flag,
                physical_offset=rec.physical_offset, born_timestamp=rec.born_timestamp,
                born_host=rec.born_host, store_timestamp=rec.store_timestamp, store_host=rec.store_host,
            )
            uniq = rec.properties.get(PropertyKey.UNIQ_KEY, "")
            fields = {
                "tranStateTableOffset": str(p.half_offset),
                "commitLogOffset": str(p.commit_log_offset),
                "msgId": uniq,
                "transactionId": rec.properties.get(PropertyKey.TRANSACTION_ID, uniq),
                "offsetMsgId": offset_msg_id(self.addr, p.commit_log_offset),
            }
            budget -= 1
            p.checks += 1
            p.last_check = now
            producers[p.checks % len(producers)].push(RequestCode.CHECK_TRANSACTION_STATE, fields, body)

