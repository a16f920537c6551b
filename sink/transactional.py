"""The exactly-once sink's transactions, driver side: what tasks hand the driver
(:class:`TaskReport`: their half messages and each row's checksum), the commit of a batch's
transactions (:func:`commit_batch`: marks of the destination, the batch's record under the
checkpoint location (:mod:`.txlog`), then END_TRANSACTION commits, a replay committing only
what the destination does not show yet), the abort (:func:`abort_batch`), and the answer to a
broker's check-back (:func:`check_decision`). The tasks' half sends are
:meth:`.writer._Sender._send_half`.
"""

from __future__ import annotations

import functools
import logging
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from pyspark.sql.datasource import WriterCommitMessage

from ..client import BrokerClient
from ..errors import (
    DataLossError,
    NoPermissionError,
    OptionError,
    RequestNotSupportedError,
    RocketMQSparkError,
    SystemBusyError,
    TopicNotFoundError,
)
from ..model import MessageQueue
from .encode import TX_TAG
from .options import WriterOptions
from .tracing import open_trace
from .txlog import StorePrint, Stores, TxLog, Txn

log = logging.getLogger(__name__)

__all__ = ["BROKER_DOWN_S", "TaskReport", "abort_batch", "check_decision", "commit_batch", "committed_ids",
           "commit_once", "describe", "destination_marks", "riding_out", "row_sum", "store_prints", "sum_difference"]


@dataclass
class TaskReport(WriterCommitMessage):
    """What a task hands the driver (Spark's commit message): its partition id, the rows it
    sent, and in exactly-once mode its half messages (:meth:`Txn.to_list` form), which the
    driver commits or rolls back, each row's checksum by message id (:func:`row_sum`) and the
    nonce its half messages' tag carries (which attempt of the task sent them)."""

    partition: int
    rows: int
    txns: list[list[Any]] = field(default_factory=list)
    sums: dict[str, str] = field(default_factory=dict)
    nonce: str = ""


#: what each letter of a row checksum (:func:`row_sum`) covers, for the error that names a difference
_SUM_PARTS = {"b": "body", "t": "tag", "k": "keys",
              "p": "properties (messageGroup, deliveryTimestamp or the properties column)"}


def row_sum(body: bytes, tag: str = "", keys: str = "", props: str = "") -> str:
    """A short checksum of an exactly-once row as written (the body before compression; the
    tag, keys and the other properties it sets, each as the message carries it): a letter
    and 8 hex digits (CRC-32) per part set, so a replay's row of the same message id can be
    told the same, and a difference named (:data:`_SUM_PARTS`)."""
    out = f"b{zlib.crc32(body):08x}"
    if tag or keys or props:  # (a body-only row's half message is sent without the loop's cost)
        for letter, part in (("t", tag), ("k", keys), ("p", props)):
            if part:
                out += f"{letter}{zlib.crc32(part.encode()):08x}"
    return out


def sum_difference(recorded: str, replayed: str) -> list[str]:
    """The parts (:data:`_SUM_PARTS` names) in which two :func:`row_sum` checksums differ."""
    def split(s: str) -> dict[str, str]:
        return {s[i]: s[i + 1:i + 9] for i in range(0, len(s), 9)}

    a, b = split(recorded), split(replayed)
    return [_SUM_PARTS.get(k, k) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def check_decision(txlog: TxLog, properties: dict[str, str], msg_id: str) -> bool | None:
    """The fate of a half message a broker asks about (a check-back), never a commit (only
    the driver commits, see :meth:`TxLog.decide`): roll back (False) when its batch is
    recorded without it, None while its batch is not recorded yet or is recorded with it
    (the broker asks again) or when it is not this sink's (the tag names another checkpoint
    location, or none)."""
    fields = properties.get(TX_TAG, "").split(":")
    try:
        batch_id = int(fields[0])
    except ValueError:
        return None  # not one of ours
    if len(fields) > 3 and fields[3] != txlog.sink_id:
        return None  # another query's (same producer group, another checkpoint location): its writers answer
    if batch_id < 0:
        # a batch write's (df.write): its driver ends its transactions without a record, so the
        # stream records that may share the checkpoint location say nothing of it
        return None
    try:
        partition: int | None = int(fields[1])
    except (IndexError, ValueError):
        partition = None
    # an earlier version's tag has no nonce: its ids were the task attempt's own
    return txlog.decide(batch_id, msg_id, partition, fields[4] if len(fields) > 4 and fields[4] else None)


def _txns(messages: list[Any]) -> list[Txn]:
    out: list[Txn] = []
    for m in messages:
        if isinstance(m, TaskReport):
            out.extend(Txn.from_list(t) for t in m.txns)
    return out


class _Rows(NamedTuple):
    """What the tasks reported of their rows beside their transactions (see TaskReport)."""

    sums: dict[str, str]  # message id -> row checksum
    nonces: dict[int, str]  # partition -> the nonce of the attempt whose halves these are
    reports: tuple[TaskReport, ...] = ()

    def nonce_by_id(self) -> dict[str, str]:
        """Message id -> the nonce of the task attempt that wrote that row (built once per
        replay that has twins to choose, not scanned per row)."""
        return {m: r.nonce for r in self.reports for m in r.sums}


def _rows(messages: list[Any]) -> _Rows:
    sums: dict[str, str] = {}
    nonces: dict[int, str] = {}
    reports = tuple(m for m in messages if isinstance(m, TaskReport))
    for m in reports:
        sums.update(getattr(m, "sums", None) or {})  # a report pickled by an earlier version has none
        if getattr(m, "nonce", ""):
            nonces[m.partition] = m.nonce
    return _Rows(sums, nonces, reports)


#: how long a broker may still apply an END it received before its sender stopped (in its
#: sockets and END thread pool, then its consume queues): the destination queues are looked at
#: only this long after the last END of a stopped commit went out (seconds)
_SETTLE_S = 3.0
#: how many rounds in a row one commit may send ENDs that a fault stops without any applied
#: (seen answered, or in the destination when it looks after the round) before the batch fails (a
#: replay goes on from there); a round that got some applied starts the count again, so a slow
#: broker is waited for as long as it keeps applying them ...
_END_ROUNDS = 3
#: ... but not past this long after the commit's first fault (seconds): then the batch fails with
#: the last fault, and a restarted query's replay commits the rest
_END_PATIENCE_S = 600.0
#: ENDs in flight (over all brokers of the batch): at first, and the least after a broker answered
#: SYSTEM_BUSY (each such round quarters it: Apache RocketMQ refuses an END that waited 3 s in its
#: queue, so a broker applying few a second needs few in flight)
_END_WINDOW = 256
_END_WINDOW_MIN = 16
#: messages asked per pull while looking at the destination queues (brokers cap it lower)
_SCAN_PULL = 1024


#: destinations already warned about (see destination_marks): once per driver process
_UNMARKED: set[tuple[str, str]] = set()


def destination_marks(client: BrokerClient, txns: Sequence[Txn]) -> dict[MessageQueue, int] | None:
    """The max offset of every queue the committed messages of ``txns`` can land in (each
    (broker, topic) pair's readable queues), asked before any is committed: where a later look
    for them starts. None when the destination cannot be read back (a 5.x proxy over gRPC serves
    no offsets; a write-only topic): replays of the batch then commit without looking."""
    pairs = {(t.broker, t.topic) for t in txns}
    try:
        queues = [q for topic in sorted({t for _, t in pairs}) for q in client.message_queues(topic)
                  if (q.broker, q.topic) in pairs]
        return client.max_offsets(queues)
    except (RequestNotSupportedError, NoPermissionError, TopicNotFoundError) as exc:
        if pairs <= _UNMARKED:
            return None
        _UNMARKED.update(pairs)
        log.warning("exactly-once: the destination queues of %s cannot be read back (%s); a replay of an "
                    "interrupted commit will commit its ENDs in flight without looking (a row may be stored twice)",
                    sorted(pairs), exc)
        return None


def store_prints(client: BrokerClient, marks: Mapping[MessageQueue, int]) -> dict[str, StorePrint]:
    """Each broker's store print (see :mod:`.txlog`): the store time of the message just below
    the highest of its queues' ``marks``. None for a broker whose queues were all empty, or
    whose message cannot be read (a broker that refuses the pull, e.g. ACL without Sub on the
    consumer group ``rocketmq-spark``: warned once and not asked again by this process; a
    replay then knows its store changed only by offsets below the marks). A broker that does
    not answer is waited for as the marks are (:func:`riding_out`)."""
    top: dict[str, MessageQueue] = {}
    for mq in sorted(marks):
        if marks[mq] > 0 and (mq.broker, mq.topic) not in _UNPRINTED and \
                (mq.broker not in top or marks[mq] > marks[top[mq.broker]]):
            top[mq.broker] = mq
    out: dict[str, StorePrint] = {}
    for broker, mq in sorted(top.items()):
        at = riding_out(functools.partial(_stored_at_now, client, mq, marks[mq] - 1), "reading the destination's "
                        "message at a mark")
        if at is not None:
            out[broker] = (mq, marks[mq] - 1, at)
    return out


#: brokers and topics whose messages the driver may not read (see store_prints): warned once
_UNPRINTED: set[tuple[str, str]] = set()


def _stored_at(client: BrokerClient, mq: MessageQueue, offset: int) -> int | None:
    """The store time of the message at ``offset`` of ``mq``; None when there is none there.
    Raises the client's errors."""
    res = client.pull(mq, offset, 1)
    return client.store_time_in(res, offset) if res.status == "FOUND" else None


def _stored_at_now(client: BrokerClient, mq: MessageQueue, offset: int) -> int | None:
    """:func:`_stored_at`; the errors :func:`riding_out` waits out raised; None when the broker
    refuses the read or its answer does not decode (warned once per broker and topic)."""
    try:
        return _stored_at(client, mq, offset)
    except RocketMQSparkError as exc:
        if exc.retriable:  # (a lost connection is)
            raise
        if (mq.broker, mq.topic) not in _UNPRINTED:
            _UNPRINTED.add((mq.broker, mq.topic))
            log.warning("exactly-once: the destination's message at %s offset %d cannot be read (%s): a lost "
                        "store on %s is told by its offsets alone", mq, offset, exc, mq.broker)
        return None


def committed_ids(client: BrokerClient, marks: Mapping[MessageQueue, int], pairs: set[tuple[str, str]]
                  ) -> set[str]:
    """The message ids (UNIQ_KEY) stored past ``marks`` in the queues of the (broker, topic)
    ``pairs`` (the whole of a queue the marks lack): what a batch's committed transactions put
    there. Raises the client's errors;
    DataLossError when retention deleted messages past a mark (they can no longer be looked at)."""
    queues = {mq for mq in marks if (mq.broker, mq.topic) in pairs}
    for topic in sorted({t for _, t in pairs}):  # a queue added since the marks: looked at whole
        queues.update(q for q in client.message_queues(topic, refresh=True) if (q.broker, q.topic) in pairs)
    ends = client.offset_ranges(sorted(queues)) if queues else {}
    seen: set[str] = set()
    for mq in sorted(queues):
        lo, end = ends[mq]
        at = marks.get(mq, lo)
        while at < end:
            res = client.pull(mq, at, _SCAN_PULL)
            if res.status == "OFFSET_ILLEGAL" and res.next_offset > at:
                raise DataLossError(f"{mq}: offsets [{at}, {res.next_offset}) were deleted before the commit of "
                                    "an exactly-once batch could look at them")
            if res.status != "FOUND" or res.next_offset <= at:
                break
            ids = client.rows(mq, [res], end, ["messageId"]).column(0).to_pylist()
            seen.update(i for i in ids if i)
            at = res.next_offset
    return seen


#: how long the driver's commit (or abort) of an exactly-once batch waits for a broker that
#: cannot be reached (refused, reset, gone from the routes: a restart) before the batch fails
#: (seconds; the reader's brokerDownTimeoutMs default)
BROKER_DOWN_S = 30.0
_T = TypeVar("_T")


def riding_out(fn: Callable[[], _T], what: str) -> _T:
    """``fn()``, called again while it fails for want of a broker or name server
    (ConnectionFailedError) or on a retriable answer (a busy broker), after the client's own
    retries, for up to :data:`BROKER_DOWN_S` from the first failure, then its error. Only for
    calls that may be repeated: reads, route lookups, rollbacks."""
    deadline: float | None = None
    pause = 0.2
    while True:
        try:
            return fn()
        except RocketMQSparkError as exc:
            if not exc.retriable:  # a lost connection is (ConnectionFailedError), and a busy broker
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + BROKER_DOWN_S
                log.warning("%s failed (%s); asking again for up to %.0fs", what, exc, BROKER_DOWN_S)
            if now >= deadline:
                raise
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, 2.0)


def _wait_answering(client: BrokerClient, queues: Sequence[MessageQueue]) -> None:
    """Until the brokers of ``queues`` answer a request again and are in the routes (up to
    :data:`BROKER_DOWN_S` each; the client's error when they are not), then :data:`_SETTLE_S`
    for ENDs they received before. Both: a restarting broker answers reads at its old address
    before it has registered, but an END goes to the address a route gives (seen in the fault
    suite: three rounds spent within that gap failed the batch while the broker came back)."""
    if queues:
        riding_out(lambda: client.max_offsets(list(queues)), "reading the destination's offsets")
        for broker, topic in sorted({(mq.broker, mq.topic) for mq in queues}):
            riding_out(functools.partial(client.broker_addr, broker, topic), f"finding broker {broker} in the routes")
    time.sleep(_SETTLE_S)


def _end_recorded(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, record: list[Txn],
                  done: int, marks: Mapping[MessageQueue, int] | None, *, look_first: bool,
                  skip: frozenset[int] = frozenset()) -> list[int]:
    """:func:`commit_once` of a recorded batch (with the store prints its record keeps), its
    progress marked in ``txlog``; the indices of the record it found lost."""
    return commit_once(client, opts, record, done, marks, look_first=look_first, what=f"batch {batch_id}",
                       on_progress=lambda n: txlog.mark_progress(batch_id, n), skip=skip,
                       stores=txlog.stores(batch_id))


def _replaced_stores(client: BrokerClient, marks: Mapping[MessageQueue, int], pairs: set[tuple[str, str]],
                     prints: Mapping[str, StorePrint], now: Mapping[MessageQueue, int]) -> dict[str, str]:
    """The brokers among ``pairs`` that lost the store the marks were taken on, each with what
    says so: a destination queue whose max offset is now below its mark (a queue's offsets
    only grow in one store), or at or below the offset of the broker's store print
    (``prints``), or whose message there was stored at another time (a new store grown past
    the marks). An END sent there by position could end another half message that now sits
    where the recorded one was. ``now``: the max offsets of the queues of ``marks`` and
    ``prints`` (:func:`_off_replaced_stores` reads them once for every generation)."""
    queues = sorted(mq for mq in marks if (mq.broker, mq.topic) in pairs)
    out: dict[str, str] = {}
    for mq in queues:
        if now[mq] < marks[mq] and mq.broker not in out:
            out[mq.broker] = f"{mq} holds up to offset {now[mq]}, below its mark {marks[mq]}"
    for broker, (mq, off, at) in sorted(prints.items()):
        if broker in out or (broker, mq.topic) not in pairs:
            continue
        top = now[mq]
        if top <= off:
            out[broker] = f"{mq} holds up to offset {top}, not the message at {off} its store print names"
            continue
        held = riding_out(functools.partial(_stored_at_now, client, mq, off), "reading the destination's message")
        if held is not None and held != at:
            out[broker] = (f"{mq} offset {off} holds a message stored at {held} (epoch ms), not the one stored at "
                           f"{at} when the batch was recorded")
    return out


def commit_once(client: BrokerClient, opts: WriterOptions, record: list[Txn], done: int,
                marks: Mapping[MessageQueue, int] | None, *, look_first: bool, what: str,
                on_progress: Callable[[int], None] | None = None, skip: frozenset[int] = frozenset(),
                stores: Stores | None = None) -> list[int]:
    """Commit the transactions of ``record`` from index ``done`` on, each once, but those at
    the indices in ``skip``; return the indices of those found lost.

    With ``marks``, a transaction whose END may have been applied is committed only if its
    message is not in the destination past the marks: before the first round when
    ``look_first`` (a replay: the commit before it may have had ENDs in flight), and after any
    round a fault stopped (an END whose answer was lost may have been applied). Then, too, no
    END goes to a broker whose store changed since the half was recorded (:func:`_replaced_stores`,
    with what ``stores`` knows of the store each half is in; without it, the marks alone). A
    transaction whose broker holds no half message for it (gone, see the client's
    ``end_transactions``) was committed before if its message is in the destination past the
    marks, and is lost otherwise (returned; the caller decides). Without marks (the destination
    cannot be read back) a failed END is retried alone, as ever, and a gone half cannot be told
    from one ended before: it is taken as committed, with a warning.
    ``on_progress(n)``: the first ``n`` of ``record`` are committed (never past a skipped, gone
    or lost one; ``what`` names them in logs)."""
    pending = [i for i in range(done, len(record)) if i not in skip]
    ending = _Ending(record, on_progress, limit=min((i for i in skip if i >= done), default=len(record)))
    if marks is None:
        _end_unlooked(client, opts, record, pending, ending, what)
        return []
    pairs = {(t.broker, t.topic) for t in record}
    window, fruitless, sent = _END_WINDOW, 0, 0  # sent: how many the last round set out to end
    fault: RocketMQSparkError | None = None  # what stopped the last round (None: this is the first)
    first_fault = 0.0
    while True:
        if look_first or fault is not None:
            pending = _not_seen(client, record, pending, marks, pairs, what, done)
            # a fault may have been the broker losing its store: the next round's ENDs would
            # go by position into the new one
            pending = _off_replaced_stores(client, record, pending, pairs, ending, what,
                                           stores or Stores.by_marks(marks))
        if not pending:
            break
        if fault is not None:
            # applied: answered, or found in the destination (an END whose answer the fault
            # stopped, or one the client had not reported yet)
            fruitless = 0 if len(pending) < sent else fruitless + 1
            if fruitless >= _END_ROUNDS or time.monotonic() - first_fault > _END_PATIENCE_S:
                raise fault
        sent = len(pending)
        stopped = _end_round(client, opts, record, pending, ending, window)
        if stopped is None:
            break
        answered, fault = stopped
        first_fault = first_fault or time.monotonic()
        if isinstance(fault, SystemBusyError):
            window = max(_END_WINDOW_MIN, window // 4)
        log.warning("%s: committing its transactions from %d stopped after %d answered (%s); looking at the "
                    "destination before sending the rest again (%d in flight)", what, pending[0], answered, fault,
                    window)
        # past the prefix answered, ENDs answered as applied are done too: a destination whose
        # broker lost its store since would not show their messages, and sending them again
        # would find their halves gone and count rows it delivered as lost
        pending = [i for i in pending[answered:] if i not in ending.applied]
        _wait_answering(client, sorted(mq for mq in marks if (mq.broker, mq.topic) in pairs))
    if not ending.gone:
        return []
    # a half gone from its broker: its message is in the destination (committed before), or it
    # went with the broker's store before its END was applied
    seen = riding_out(lambda: committed_ids(client, marks, pairs), f"{what}: looking its messages up in the "
                       "destination")
    lost = sorted(i for i in ending.gone if record[i].msg_id not in seen)
    log.warning("%s: the brokers hold no half message for %d of its transactions: %d of them committed before "
                "(seen in the destination), %d lost", what, len(ending.gone), len(ending.gone) - len(lost), len(lost))
    return lost


class _Ending:
    """What one :func:`commit_once` learns as it goes: the indices of its record found gone
    (no half message on their broker), those whose END was answered as applied, and how far
    its progress may be marked (never past a skipped or gone one)."""

    def __init__(self, record: list[Txn], on_progress: Callable[[int], None] | None, limit: int) -> None:
        self.where = {t: i for i, t in enumerate(record)}
        self.on_progress = on_progress
        self.limit = limit
        self.gone: set[int] = set()
        self.applied: set[int] = set()

    def mark(self, n: int) -> None:
        """The first ``n`` of the record are committed."""
        if self.on_progress is not None:
            self.on_progress(min(n, self.limit))

    def note_gone(self, halves: Sequence[Txn]) -> None:
        """These transactions of the record have no half message on their broker."""
        for t in halves:
            i = self.where[t]
            self.gone.add(i)
            self.limit = min(self.limit, i)


def _end_unlooked(client: BrokerClient, opts: WriterOptions, record: list[Txn], pending: list[int],
                  ending: _Ending, what: str) -> None:
    """Commit ``pending`` when the destination cannot be read back: a failed END retried alone,
    a gone half taken as committed (with a warning)."""
    halves = client.end_transactions([record[i] for i in pending], commit=True, producer_group=opts.producer_group,
                                     on_progress=lambda n: ending.mark(pending[n - 1] + 1)) or []
    if halves:
        log.warning("%s: the brokers hold no half message for %d of its transactions (first %s on %s): ended "
                    "before, or lost with the broker's store; the destination cannot be read back to tell, so "
                    "they are taken as committed", what, len(halves), halves[0].msg_id, halves[0].broker)


def _not_seen(client: BrokerClient, record: list[Txn], pending: list[int], marks: Mapping[MessageQueue, int],
              pairs: set[tuple[str, str]], what: str, done: int) -> list[int]:
    """``pending`` but those whose message is in the destination past the marks (committed)."""
    seen = riding_out(lambda: committed_ids(client, marks, pairs), f"{what}: looking its messages up "
                       "in the destination")
    already = [i for i in pending if record[i].msg_id in seen]
    pending = [i for i in pending if record[i].msg_id not in seen]
    log.info("%s: %d of its transactions past %d are committed already (seen in the destination), "
             "%d to commit", what, len(already), done, len(pending))
    return pending


def _off_replaced_stores(client: BrokerClient, record: list[Txn], pending: list[int], pairs: set[tuple[str, str]],
                         ending: _Ending, what: str, stores: Stores) -> list[int]:
    """``pending`` but those on a broker whose store changed since their halves were recorded
    (noted gone: an END by position could end another half there). Each is told by the marks
    and prints of the store it was recorded in (``stores``: the record's own halves by the
    record's, a twin by its substitution's)."""
    kinds: dict[int | None, tuple[dict[MessageQueue, int], dict[str, StorePrint]]] = {}
    gen_of: dict[int, int | None] = {}
    for i in pending:
        marks, prints, gen_of[i] = stores.of(record[i])
        kinds.setdefault(gen_of[i], (marks, prints))
    # every generation's queues read at once (their marks differ, their offsets now do not)
    queues = sorted({mq for marks, prints in kinds.values() for mq in [*marks, *(p[0] for p in prints.values())]
                     if (mq.broker, mq.topic) in pairs})
    now = riding_out(lambda: client.max_offsets(queues), "reading the destination's offsets") if queues else {}
    replaced = {gen: _replaced_stores(client, marks, pairs, prints, now) for gen, (marks, prints) in kinds.items()}
    stale = [i for i in pending if record[i].broker in replaced[gen_of[i]]]
    if stale:
        why = sorted({replaced[gen_of[i]][record[i].broker] for i in stale})
        log.warning("%s: %d of its transactions are on brokers whose store changed since they were recorded "
                    "(%s): not ended there (an END by position could end another half)",
                    what, len(stale), "; ".join(why))
        ending.note_gone([record[i] for i in stale])
        gone = set(stale)
        pending = [i for i in pending if i not in gone]
    return pending


def _end_round(client: BrokerClient, opts: WriterOptions, record: list[Txn], pending: list[int], ending: _Ending,
               window: int) -> tuple[int, RocketMQSparkError] | None:
    """Send the ENDs of ``pending`` once, ``window`` in flight (no retry of a failed one): None
    when they are all answered; how many were answered before a retriable fault stopped the
    round, and that fault (one that is not retriable is raised)."""
    answered = 0

    def progress(n: int) -> None:
        nonlocal answered
        answered = n
        # every transaction of the record before pending[n - 1] is committed: seen, or answered
        ending.mark(pending[n - 1] + 1)

    try:
        ending.note_gone(client.end_transactions([record[i] for i in pending], commit=True,
                                                 producer_group=opts.producer_group, window=window,
                                                 on_progress=progress, retry_failed=False,
                                                 on_applied=lambda k: ending.applied.add(pending[k])) or [])
        return None
    except RocketMQSparkError as exc:
        if not exc.retriable:
            raise
        return answered, exc


def describe(txns: Sequence[Txn]) -> str:
    """``<n> on <broker> topic <topic>, ...``: where lost transactions were to be committed."""
    pairs: dict[tuple[str, str], int] = {}
    for t in txns:
        pairs[(t.broker, t.topic)] = pairs.get((t.broker, t.topic), 0) + 1
    return ", ".join(f"{n} on broker {b} topic {tp}" for (b, tp), n in sorted(pairs.items()))


def _lost_error(batch_id: int, record: Sequence[Txn], lost: Sequence[Txn]) -> DataLossError:
    return DataLossError(
        f"exactly-once batch {batch_id}: the brokers hold no prepared (half) message for {len(lost)} of the batch's "
        f"{len(record)} rows ({describe(lost)}), and their messages are not in the destination: the broker lost "
        "them (its store wiped or replaced?) after the tasks sent them and before this commit. The other rows "
        f"are committed; these are not, and the driver holds no bodies to send them again. The batch is not "
        f"marked committed: restart the query; its replay of batch {batch_id} writes the rows again and commits "
        "the lost ones from it, once each")


#: why a lost row has no twin when the replay had one, but its broker lost that too: the row
#: is still in the source, so a later replay can write it (failOnDataLoss=false does not drop it)
LOST_AGAIN = "lost again while this replay committed it"


def _lost_again_error(batch_id: int, again: Sequence[str]) -> DataLossError:
    return DataLossError(
        f"exactly-once batch {batch_id}: the brokers lost the prepared messages of {len(again)} rows again while "
        f"this replay committed them in place of lost ones (first {sorted(again)[0]}): their stores were lost "
        f"once more. The batch is not marked committed: restart the query; its next replay of batch {batch_id} "
        "writes them again, once each (failOnDataLoss=false ends a batch only without rows its source lost)")


def _unmatched_error(batch_id: int, txlog: TxLog, unmatched: Mapping[str, str]) -> DataLossError:
    first = "; ".join(f"{m}: {why}" for m, why in sorted(unmatched.items())[:3])
    more = f" (and {len(unmatched) - 3} more)" if len(unmatched) > 3 else ""
    return DataLossError(
        f"exactly-once batch {batch_id}: {len(unmatched)} rows whose prepared messages their broker lost cannot be "
        f"committed from this replay of the batch: {first}{more}. A replay's row stands in for a lost one only when "
        "it has the same message id (partition and row number) and the same topic and checksum: the query must "
        "write the same rows in the same order on a re-run (deterministic), and its source must still hold them "
        "(a broker that lost its store loses the source rows it held too). The batch is not marked committed. To "
        f"end it without these rows (they stay lost), create the file {txlog.accept_lost_path(batch_id)} and "
        "restart the query, or write with failOnDataLoss=false")


def _row_number(msg_id: str) -> str:
    """The row number in its task a writer's deterministic message id ends with (hex)."""
    try:
        return str(int(msg_id[22:], 16) - 1)
    except ValueError:
        return "?"


def _substitute_twins(client: BrokerClient, txlog: TxLog, batch_id: int, record: list[Txn], replay: Sequence[Txn],
                      rows: _Rows) -> tuple[list[Txn], dict[str, str]]:
    """Put the replay's twin of each lost transaction of the record in its place (recorded
    before any END, with its destination's marks, see :meth:`TxLog.substitute`); returns the
    record and, by message id, why a lost one has no twin."""
    lost = txlog.lost(batch_id)
    if not lost:
        return record, {}
    sums = txlog.sums(batch_id)
    by_id = {t.msg_id: t for t in replay}
    nonces = rows.nonce_by_id()
    twins: dict[int, tuple[Txn, str]] = {}
    unmatched: dict[str, str] = {}
    for i, t in enumerate(record):
        if t.msg_id not in lost:
            continue
        twin = by_id.get(t.msg_id)
        if twin == t:  # this replay's own twin, lost again: a later replay's half may stand in for it
            continue
        if sums is None:
            unmatched[t.msg_id] = "the batch was recorded by an earlier version, without row checksums"
        elif twin is None:
            unmatched[t.msg_id] = (f"the replay wrote no row of this id (row {_row_number(t.msg_id)} of its task): "
                                   "fewer rows in its partition")
        elif twin.topic != t.topic:
            unmatched[t.msg_id] = f"the replay's row of this id goes to topic {twin.topic!r}, not {t.topic!r}"
        else:
            differ = sum_difference(sums.get(t.msg_id, ""), rows.sums.get(t.msg_id, ""))
            if differ:
                unmatched[t.msg_id] = f"the replay's row of this id differs in its {', '.join(differ)}"
            else:
                twins[i] = (twin, nonces.get(t.msg_id, ""))
    if twins:
        chosen = [tw for tw, _ in twins.values()]
        fresh = riding_out(lambda: destination_marks(client, chosen), f"batch {batch_id}: reading the "
                            "destination's offsets") or {}
        record = txlog.substitute(batch_id, twins, fresh, store_prints(client, fresh))
        log.warning("batch %d: %d rows its brokers lost are committed from the replay's rows of the same ids "
                    "(checksums equal): %s", batch_id, len(twins), describe(chosen))
    return record, unmatched


def commit_batch(opts: WriterOptions, txns: list[Txn], batch_id: int, rows: _Rows | None = None) -> None:
    """Record the batch (once), then commit its transactions, each once.

    First time: the destination queues' max offsets are taken (:func:`destination_marks`) and
    ``txns`` recorded with them, the brokers' store prints (:func:`store_prints`) and the
    tasks' ``rows`` (checksums, nonces) under the checkpoint (:class:`TxLog`), then committed in the
    record's order with the progress marked as their ENDs are answered, and the batch marked
    ended. A replay of a recorded batch rolls back the ``txns`` not in the record and commits
    the recorded ones past the marked progress whose messages are not in the destination past
    the marks (an END the first commit had in flight was applied, or is sent now), waiting
    first until :data:`_SETTLE_S` after the first commit's last write; none once the batch was
    marked ended. A fault part-way (a lost answer) is handled the same way within the commit
    (:func:`_end_recorded`). A broker that cannot be reached (a restart) is waited for up to
    :data:`BROKER_DOWN_S` at each step.

    Recorded transactions whose broker lost their half messages (:func:`commit_once`) are
    listed as lost in the record; a replay commits, in place of each, its own transaction of
    the same message id when the row's topic and checksum match (:func:`_substitute_twins`).
    Raises DataLossError while lost ones remain (the batch not marked ended; the rest
    committed), unless an operator accepted their loss (:meth:`TxLog.lost_accepted`);
    OptionError without a checkpointLocation, OSError when the
    record cannot be written, the client's errors when ENDs still fail (the batch is then not
    marked ended; its replay goes on from the progress mark)."""
    if not opts.checkpoint_location:
        raise OptionError("checkpointLocation", None, "delivery=exactly-once needs a checkpointLocation")
    rows = rows if rows is not None else _Rows({}, {})
    txlog = TxLog(opts.checkpoint_location)
    client = opts.connect()
    first = False
    try:
        if txlog.read(batch_id) is None:
            _commit_first(client, opts, txlog, batch_id, txns, rows)
            first = True  # (a replay's ends are not traced)
            unmatched: dict[str, str] = {}
        else:
            unmatched = _commit_replay(client, opts, txlog, batch_id, txns, rows)
        if unmatched:  # lost message id -> why the replay has no twin for it
            accepted = txlog.lost_accepted(batch_id)
            if not accepted and opts.fail_on_data_loss:
                raise _unmatched_error(batch_id, txlog, unmatched)
            again = [m for m, why in unmatched.items() if why == LOST_AGAIN]
            if not accepted and again:  # their source rows are still there: the next replay writes them
                raise _lost_again_error(batch_id, again)
            log.error("batch %d: ended without %d rows its brokers lost, as %s (first: %s)", batch_id,
                      len(unmatched), f"{txlog.accept_lost_path(batch_id)} says" if accepted else
                      "failOnDataLoss=false allows", next(iter(sorted(unmatched.items()))))
        txlog.mark_ended(batch_id)
        if first:
            traced_ends(opts, client, txns, commit=True)
    finally:
        client.close()


def _commit_first(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, txns: list[Txn],
                  rows: _Rows) -> None:
    """The first commit of a batch: the destination's marks taken, the batch recorded with them
    and the tasks' ``rows``, then its transactions committed; DataLossError (the lost ones
    marked in the record) when a broker lost half messages."""
    taken = riding_out(lambda: destination_marks(client, txns), f"batch {batch_id}: reading the "
                        "destination's offsets") if txns else {}
    prints = store_prints(client, taken) if taken else {}
    record = txlog.record(batch_id, txns, taken, sums=rows.sums, nonces=rows.nonces, prints=prints)
    lost = _end_recorded(client, opts, txlog, batch_id, record, 0, taken, look_first=False)
    if lost:
        txlog.mark_lost(batch_id, {record[i].msg_id for i in lost})
        raise _lost_error(batch_id, record, [record[i] for i in lost])


def _commit_replay(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, txns: list[Txn],
                   rows: _Rows) -> dict[str, str]:
    """A replay of a recorded batch: the recorded transactions committed from the marked
    progress (none once the batch was marked ended), then the replay's own rolled back but the
    twins that stand in for lost ones. Returns, by message id, why a lost one has no twin."""
    record = txlog.txns(batch_id)
    unmatched: dict[str, str] = {}
    if txlog.ended(batch_id):
        log.info("batch %d was already recorded and committed: rolling back the transactions of its replay",
                 batch_id)
    elif txlog.marks(batch_id) is None:  # an earlier version's record: its check-backs' commits are left out
        done = txlog.progress(batch_id)
        checked = txlog.legacy_checked(batch_id)
        record = record[:done] + [t for t in record[done:] if t.msg_id not in checked]
        _end_recorded(client, opts, txlog, batch_id, record, done, None, look_first=True)
    else:
        record, unmatched = _commit_recorded(client, opts, txlog, batch_id, record, txns, rows)
    kept = set(record)
    # halves are told apart by position: a replay's carry the recorded ids again
    _roll_back(client, opts, [t for t in txns if t not in kept],
               f"batch {batch_id}: rolling back its replay's transactions")
    return unmatched


def _commit_recorded(client: BrokerClient, opts: WriterOptions, txlog: TxLog, batch_id: int, record: list[Txn],
                     txns: list[Txn], rows: _Rows) -> tuple[list[Txn], dict[str, str]]:
    """Commit a recorded batch (with marks) from its marked progress, once :data:`_SETTLE_S`
    passed since the first commit's last write, the replay's twins in place of lost ones
    (:func:`_substitute_twins`); the record as committed and, by message id, why a lost one
    has no twin."""
    wait = txlog.last_written(batch_id) + _SETTLE_S - time.time()
    if wait > 0:
        time.sleep(wait)
    unmatched: dict[str, str] = {}
    # at most twice: a half found lost by this commit is replaced from the replay at once
    for _ in range(2):
        record, unmatched = _substitute_twins(client, txlog, batch_id, record, txns, rows)
        lost_ids = txlog.lost(batch_id)
        skip = frozenset(i for i, t in enumerate(record) if t.msg_id in lost_ids)
        done = txlog.progress(batch_id)
        log.info("batch %d was already recorded; %d of its %d transactions are known committed: "
                 "committing the rest once each (%d lost are left out), then rolling back the "
                 "replay's", batch_id, done, len(record), len(skip))
        found = _end_recorded(client, opts, txlog, batch_id, record, done,
                              txlog.marks(batch_id), look_first=True, skip=skip)
        if not found:
            break
        txlog.mark_lost(batch_id, {record[i].msg_id for i in found})
    unmatched = {m: unmatched.get(m, LOST_AGAIN) for m in txlog.lost(batch_id)}
    return record, unmatched


def abort_batch(opts: WriterOptions, txns: list[Txn], batch_id: int | None) -> None:
    """Roll back ``txns``, except those recorded for ``batch_id`` under the checkpoint (a
    recorded batch is committed, never aborted); all of them without a checkpointLocation or
    a batch id. A rollback that fails is left to the brokers' check-backs (see :func:`_roll_back`)."""
    log_ = TxLog(opts.checkpoint_location) if opts.checkpoint_location and batch_id is not None else None
    recorded = set(log_.txns(batch_id)) if log_ is not None and batch_id is not None and \
        log_.read(batch_id) is not None else set()
    client = opts.connect()
    # by position: a replay's halves carry the recorded ids again
    todo = [t for t in txns if t not in recorded]
    try:
        _roll_back(client, opts, todo, f"batch {batch_id}: rolling back its transactions")
    finally:
        client.close()


#: how long the driver waits for its EndTransaction records to be sent, once the batch is done
_ENDS_FLUSH_S = 1.0


def traced_ends(opts: WriterOptions, client: BrokerClient, txns: Sequence[Txn], *, commit: bool) -> None:
    """traceEnabled: EndTransaction records of ``txns``, sent (waited for a second at most;
    called once the batch is done, so the wait holds up nothing it decides); never raises
    (tracing never fails a batch)."""
    if opts.trace_topic is None or not txns:
        return
    try:
        trace = open_trace(opts)
        if trace is not None:
            trace.ended(client, txns, commit=commit)
            trace.flush(_ENDS_FLUSH_S)
    except Exception as exc:
        log.warning("message trace: the EndTransaction records of %d transactions were not made: %s", len(txns), exc)


def _roll_back(client: BrokerClient, opts: WriterOptions, txns: list[Txn], what: str) -> None:
    """Roll back ``txns``, riding out an unreachable broker (:func:`_riding_out`). One that
    still fails, or that the broker refuses, is logged and left to the brokers: they ask
    about a half message until it is ended, and a check-back rolls back any half its batch
    record does not name (a batch write's are discarded after the broker's last check). A
    rollback sent by position to a broker that lost its store can hit other bytes there
    (Apache RocketMQ answered one with IllegalArgumentException "newLimit < 0"), and failed
    the query though nothing was left to undo."""
    try:
        riding_out(lambda: client.end_transactions(txns, commit=False, producer_group=opts.producer_group), what)
    except RocketMQSparkError as exc:
        log.warning("%s failed (%s): the brokers roll those half messages back when they ask about them", what, exc)
        return
    traced_ends(opts, client, txns, commit=False)
