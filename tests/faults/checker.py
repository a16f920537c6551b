"""The fault suite's checker: reads every output back and counts, against the send log, the
messages lost, duplicated and (where order is promised) reordered.

Independent of the pipeline's code on purpose: topics are read with a plain
:class:`~rocketmq_spark.client.RemotingClient` pull loop over every queue of every broker, from
its min to its max offset; Parquet is read with pyarrow from exactly the files the file sink's
``_spark_metadata`` log lists as committed (what ``spark.read.parquet`` reads there, checked
against Spark in test_checker.py), never from the directory listing.

Per output (and for topic A itself, the source as the brokers hold it):

- ``lost``: acked ids not found (copies read from a broker just before its store was wiped on
  purpose count as found: ``wiped``); ``lost_by_broker`` is the part of them absent from
  topic A too (the brokers lost them), the rest the pipeline lost. A wipe made before every
  query had read the broker (``wipe-broker-now``) takes what they had not read: such ids are
  ``lost_with_store``, reported, not ``lost``. Ids whose send had an unknown outcome are never
  lost.
- ``duplicated``: copies beyond the first, of any id (an unknown-outcome id present once is fine).
- ``reordered``: where order is promised (topic A per queue: the broker keeps a queue's order;
  topic C per message group = source queue, first copies in each destination queue, in the
  order topic A holds them), the ids found after a later one of their sequence. None where
  nothing is promised.
- ``unexpected``: ids never sent as acked or unknown (refused sends found anyway, or bodies
  that carry no id).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from readback import stored_records
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.model import MessageQueue

from .workload import SendLog, id_of, queue_key

__all__ = ["Copy", "OutputReport", "check_output", "committed_parquet_files", "read_parquet", "read_topic",
           "reordered", "settled_max_offsets"]


@dataclass(frozen=True)
class Copy:
    """One message found in an output: its id (None: a body with no id), the queue it was found
    in (``broker:queueId``; for Parquet, the source queue the row names), its offset there, and
    for a topic the time its broker stored it (epoch ms; None for Parquet rows)."""

    queue: str
    offset: int
    id: int | None
    stored_ms: int | None = None


@dataclass
class OutputReport:
    name: str
    #: copies read, and distinct ids among them
    read: int = 0
    distinct: int = 0
    #: acked ids absent (but those a wipe took before the queries read them)
    lost: list[int] = field(default_factory=list)
    #: of ``lost``, those absent from topic A too: the brokers lost them (acked, then gone)
    lost_by_broker: list[int] = field(default_factory=list)
    #: acked ids absent that a store wiped on purpose took before every query had read them
    #: (a broker that loses its disk loses what nobody read yet): reported, allowed
    lost_with_store: list[int] = field(default_factory=list)
    #: id -> copies beyond the first
    duplicated: dict[int, int] = field(default_factory=dict)
    #: ids a store wiped at once (``wipe-broker-now``) held, written once more after it: the
    #: replay of a batch whose commit the wipe cut short finds neither the row's half nor its
    #: message (an END applied as the clients were cut off, its answer lost with the connection;
    #: or a commit that failed on the store loss, replayed by the restarted driver), so it writes
    #: the row again (the store the copy was in is gone): reported, allowed. Only when the copy
    #: read now was stored after the wipe: one stored before it is a duplicate
    rewritten: list[int] = field(default_factory=list)
    reordered: list[int] | None = None
    unexpected: list[int] = field(default_factory=list)
    #: copies with no id in their body
    garbled: int = 0
    #: unknown-outcome ids found (once or more)
    unknown_found: int = 0
    #: copies read from a broker's store just before it was wiped on purpose
    wiped: int = 0
    #: message groups found in more than one destination queue (writers remap groups when a
    #: broker leaves the routes; order is only checked within a queue)
    groups_split: int = 0

    @property
    def duplicates(self) -> int:
        return sum(self.duplicated.values())

    def summary(self) -> dict[str, Any]:
        """Counts and up to 20 example ids of each anomaly (the JSON report)."""
        d = asdict(self)
        for key in ("lost", "lost_by_broker", "lost_with_store", "unexpected", "rewritten"):
            d[key] = len(getattr(self, key))
            d[f"{key}_ids"] = sorted(getattr(self, key))[:20]
        d["duplicated"] = self.duplicates
        d["duplicated_ids"] = sorted(self.duplicated)[:20]
        d["reordered"] = None if self.reordered is None else len(self.reordered)
        d["reordered_ids"] = None if self.reordered is None else sorted(self.reordered)[:20]
        return d


def reordered(seq: Iterable[int]) -> list[int]:
    """The elements of ``seq`` that come after a greater one (in a sorted sequence: none)."""
    out, top = [], None
    for x in seq:
        if top is not None and x < top:
            out.append(x)
        else:
            top = x
    return out


def check_output(name: str, log: SendLog, copies: Sequence[Copy], *, wiped: Sequence[Copy] = (),
                 source: dict[int, tuple[str, tuple[int, int]]] | None = None, broker_lost: set[int] | None = None,
                 excused: set[int] | None = None, order: str | None = None,
                 rewrite_excused: dict[int, int] | None = None) -> OutputReport:
    """Counts for one output. ``copies``: what it holds now; ``wiped``: what it held on a
    broker whose store was then wiped on purpose. ``source``: for ``order="group"``, id -> its
    queue in topic A (its message group) and its place there: (how many times that broker's
    store had been wiped when it was stored, its offset), since offsets start again at 0 after
    a wipe; not the id, as sends whose answer timed out may be stored after later ones.
    ``broker_lost``: ids the brokers lost (acked, absent from topic A); ``excused``: ids a
    wipe took before every query had read them (counted in ``lost_with_store``, not ``lost``);
    ``rewrite_excused``: ids the store of such a wipe held in this output -> when it was wiped
    (epoch ms): one copy more of one, the copy now read once and stored after that time, is
    counted in ``rewritten``, not ``duplicated`` (the replay wrote it again once the store was
    gone; a copy stored before the wipe was written twice while both were there). ``order``: None,
    ``"queue"`` (acked ids grow with offsets in each queue: the source topic, written by one
    producer thread per queue that waits for each answer) or ``"group"`` (per destination queue
    and source queue, first copies come in the source's order)."""
    r = OutputReport(name, read=len(copies), wiped=len(wiped))
    now: Counter[int | None] = Counter(c.id for c in copies)
    counts = now + Counter(c.id for c in wiped)
    r.garbled = counts.pop(None, 0)
    ids: set[int] = {i for i in counts if i is not None}
    r.distinct = len(ids)
    absent = set(log.acked) - ids
    r.lost_with_store = sorted(absent & (excused or set()))
    r.lost = sorted(absent - (excused or set()))
    r.lost_by_broker = sorted(set(r.lost) & (broker_lost or set()))
    r.duplicated = {i: n - 1 for i, n in counts.items() if i is not None and n > 1}
    if rewrite_excused:
        stored = {c.id: c.stored_ms for c in copies if c.id in rewrite_excused}  # read where an id has one copy
        r.rewritten = sorted(i for i, n in r.duplicated.items() if n == 1 and i in rewrite_excused and now[i] == 1
                             and (stored[i] or 0) >= rewrite_excused[i])
        for i in r.rewritten:
            del r.duplicated[i]
    r.unknown_found = len(ids & log.unknown)
    r.unexpected = sorted(i for i in ids if i not in log.acked and i not in log.unknown)
    if order == "queue":
        r.reordered = []
        for _, seq in sorted(_by_queue(copies).items()):
            r.reordered += reordered(c.id for c in seq if c.id in log.acked)
    elif order == "group":
        assert source is not None, "order='group' needs the source queue and place of each id"
        r.reordered = []
        seen: set[int] = set()
        group_queues: dict[str, set[str]] = defaultdict(set)
        for dest, seq in sorted(_by_queue(copies).items()):
            firsts: dict[str, list[tuple[tuple[int, int], int]]] = defaultdict(list)  # group -> (place, id)
            for c in seq:
                if c.id is None or c.id in seen or c.id not in source:
                    continue
                seen.add(c.id)
                group, place = source[c.id]
                firsts[group].append((place, c.id))
                group_queues[group].add(dest)
            for pairs in firsts.values():
                top: tuple[int, int] | None = None
                for place, i in pairs:
                    if top is not None and place < top:
                        r.reordered.append(i)
                    else:
                        top = place
        r.groups_split = sum(1 for qs in group_queues.values() if len(qs) > 1)
    return r


def _by_queue(copies: Iterable[Copy]) -> dict[str, list[Copy]]:
    out: dict[str, list[Copy]] = defaultdict(list)
    for c in copies:
        out[c.queue].append(c)
    for seq in out.values():
        seq.sort(key=lambda c: c.offset)
    return out


# -- reading topics --------------------------------------------------------------------------


def _client(namesrv: str) -> RemotingClient:
    return RemotingClient(namesrv, ClientConfig(request_timeout_s=10.0, retries=5))


def settled_max_offsets(namesrv: str, *topics: str, quiet_s: float = 2.0, timeout_s: float = 60.0
                        ) -> dict[MessageQueue, int]:
    """Every queue's max offset (of each of ``topics``) once they stopped moving for ``quiet_s``
    (Apache RocketMQ makes a committed transactional message readable a moment after answering
    its END). The topics are watched together: one quiet period for all of them."""
    c = _client(namesrv)

    def ends() -> dict[MessageQueue, int]:
        return c.max_offsets([mq for topic in topics for mq in c.message_queues(topic, refresh=True)])

    try:
        deadline = time.monotonic() + timeout_s
        last = ends()
        while True:
            time.sleep(quiet_s)
            now = ends()
            if now == last or time.monotonic() > deadline:
                return now
            last = now
    finally:
        c.close()


def _pin(c: Any, direct: dict[str, str]) -> None:
    """Every request of ``c`` for a broker named in ``direct`` goes to that address, whatever a
    route lookup says. (Writing the client's address table is not enough: the client follows a
    route that names another master address, and the routes name the fault proxy.)"""
    names = c.names
    master, read = names.broker_addr, names.read_addr
    names.broker_addr = lambda broker, topic=None: direct.get(broker) or master(broker, topic)
    names.read_addr = lambda broker, topic=None, *a: direct.get(broker) or read(broker, topic, *a)


def read_topic(namesrv: str, topic: str, *, brokers: Sequence[str] | None = None,
               direct: dict[str, str] | None = None) -> list[Copy]:
    """Every message of every queue of ``topic`` (of ``brokers`` only, when given), from each
    queue's min offset to its max offset. ``direct``: broker name -> the address to reach it
    at instead of the one the routes give (past the fault proxy, which may be refusing)."""
    c = _client(namesrv)
    out: list[Copy] = []
    try:
        mqs = sorted(c.message_queues(topic, refresh=True))
        if brokers is not None and not any(mq.broker in brokers for mq in mqs):
            # a snapshot of nothing would count what the broker holds as lost with it
            raise RuntimeError(f"the routes list no queue of {topic} on {', '.join(brokers)}")
        if direct:
            _pin(c, direct)
        wanted = [mq for mq in mqs if brokers is None or mq.broker in brokers]
        out = [Copy(queue_key(mq), rec.queue_offset, id_of(rec.payload()), rec.store_timestamp)
               for mq, rec in stored_records(c, wanted)]
    finally:
        c.close()
    return out


# -- reading Parquet -------------------------------------------------------------------------

_LOG_FILE = re.compile(r"^(\d+)(\.compact)?$")


def committed_parquet_files(path: str) -> list[str]:
    """The data files the file sink's metadata log (``<path>/_spark_metadata``) lists as
    committed: the newest compacted file, plus the batch files after it, each a ``v1`` line
    then one JSON entry per file (``action`` add, or delete)."""
    log_dir = os.path.join(path, "_spark_metadata")
    if not os.path.isdir(log_dir):
        return []
    batches: dict[int, str] = {}
    for name in os.listdir(log_dir):
        m = _LOG_FILE.match(name)
        if m:
            batches[int(m.group(1))] = name
    if not batches:
        return []
    last = max(batches)
    compacts = [b for b, name in batches.items() if name.endswith(".compact")]
    start = max(compacts) if compacts else 0
    files: dict[str, bool] = {}
    for b in range(start, last + 1):
        name = batches.get(b)
        if name is None:
            raise RuntimeError(f"{log_dir}: batch {b} is missing between {start} and {last}")
        with open(os.path.join(log_dir, name), encoding="utf-8") as f:
            version = f.readline().strip()
            if version != "v1":
                raise RuntimeError(f"{log_dir}/{name}: unknown version {version!r}")
            for line in f:
                if not line.strip():
                    continue
                entry = json.loads(line)
                if entry.get("isDir"):
                    continue
                p = entry["path"]
                files[p] = entry.get("action", "add") != "delete"
    return sorted(_local_path(p) for p, keep in files.items() if keep)


def _local_path(uri: str) -> str:
    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("file", "") else uri


def read_parquet(path: str) -> list[Copy]:
    """The rows of every committed file (``id``, ``broker``, ``queueId``, ``queueOffset``)."""
    import pyarrow.parquet as pq

    out: list[Copy] = []
    for f in committed_parquet_files(path):
        t = pq.read_table(f, columns=["id", "broker", "queueId", "queueOffset"])
        cols = t.to_pydict()
        for i, b, q, o in zip(cols["id"], cols["broker"], cols["queueId"], cols["queueOffset"]):
            out.append(Copy(f"{b}:{q}", o, i))
    return out
