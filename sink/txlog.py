"""The durable record behind exactly-once writes.

Under ``<checkpointLocation>/rocketmq-sink/commits/<batchId>.json`` the driver's
``commit()`` records which transactions (half messages) make up batch ``batchId``, and where
each destination queue ended before any of them was committed (its *marks*), BEFORE ending
any of them. From then on the record is the truth:

- only the driver's commit of a recorded batch commits its transactions (END_TRANSACTION):
  a Java broker commits a half message again on every commit it is sent (it does not remember
  that the half was ended), so two committers, or one sending an END twice, store a row twice;
- ``<batchId>.progress`` counts how many of the record's transactions, in its order, are
  known to be committed (their ENDs were answered, or their messages were seen in the
  destination), ``<batchId>.ended`` that all are;
- a replayed ``batchId`` (Spark re-runs a batch whose sink commit it did not see finish) rolls
  back the replay's new transactions, and of the recorded ones past the progress mark it
  commits only those whose message is not in the destination queues past the marks (see
  :func:`~rocketmq_spark.sink.writer.commit_batch`): an END the first commit had in flight
  when it stopped either was applied (its message is there) or was not (it is sent now);
- a check-back (CHECK_TRANSACTION_STATE) for a half message is answered rollback when its
  batch is recorded without it (or a later batch is recorded while its own is not), and not
  at all otherwise (the broker asks again later; the driver's commit ends it). Answering
  commit from a check-back would race the driver's END for the same half, and a check-back
  can come for a half whose END was applied (a broker records ended halves in batches, and
  a broker restarted before recording one asks again);
- half messages carry the sink's identity (:attr:`TxLog.sink_id`, from the checkpoint
  location), so a writer of another query in the same producer group, which a broker
  may ask about them, does not answer from a record that is not theirs;
- a half message's id (UNIQ_KEY) is the same each time its row is written for the batch
  (sink, batch, partition, row number), so ids alone no longer tell a recorded half from
  another attempt's or a replay's: each task attempt tags its halves with a nonce, which the
  record keeps per partition (``nonces``), and a check-back of a half whose nonce is not the
  recorded one is rolled back. Halves are told apart by position (the whole :class:`Txn`)
  wherever the driver compares them;
- a recorded half its broker answers it does not hold (the broker lost its store: a second
  END of a half still in the commit log is applied, so it was not "ended before") and whose
  message is not in the destination past the marks is *lost*: listed in the record's
  ``lost``, the batch not ended. The driver holds no bodies; a replay (which prepares the
  batch's rows again, with the same ids) commits, for each lost one, its own half of the same
  id instead (its *twin*), once the row's checksum (``sums``, taken by the task: body, tag,
  keys, other properties) and topic match, and records it in place of the lost one
  (``twins``: its nonce) before ending it. A check-back of a half whose id is lost is left
  unanswered until then (it may be the twin to commit);
- with the marks, each broker's *store print* (``prints``): a message just below the highest
  of its queues' marks, by offset and store time. An END names its half by its position in
  the broker's commit log, and a broker that lost its store fills the same positions with
  other messages: a replay sends no END to a broker whose queue now holds another message at
  the print's offset (or less than the mark), whatever its offsets grew to since. Twins get
  marks and prints of their own, taken as they are put in place (``twinGens``, ``twinGen``):
  each half is told by those of the store it was recorded in.

Records written by earlier versions have no marks: their replays commit the transactions past
the progress mark without looking (the ENDs in flight when the first commit stopped may then be
applied twice), and their ``.checked`` lists (check-backs answered commit) are left out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import NamedTuple

from ..files import atomic_write
from ..model import MessageQueue, Txn
from ..offsets import Offsets

log = logging.getLogger(__name__)

__all__ = ["StorePrint", "Stores", "TxLog", "Txn"]

#: a broker's store as a batch's record knows it: a destination queue of the broker, an offset
#: below its mark, and the store time (epoch ms) of the message there (see the module docstring)
StorePrint = tuple[MessageQueue, int, int]


class Stores(NamedTuple):
    """What a recorded batch knows of the stores its halves were recorded in, to tell a store
    its broker lost since (see the module docstring): the record's own (the destination's
    marks, taken before any END, and its brokers' store prints), and each substitution's, for
    the twins it put in place of lost halves (``twin_gens``: the marks and prints of the
    twins' destination then; ``twin_gen``: each twin's id -> its substitution). A twin of a
    record written before substitutions were kept apart has none: (``merged`` marks, no prints)."""

    marks: dict[MessageQueue, int]
    prints: dict[str, StorePrint]
    twin_gens: tuple[tuple[dict[MessageQueue, int], dict[str, StorePrint]], ...]
    twin_gen: dict[str, int]
    merged: dict[MessageQueue, int]
    twin_ids: frozenset[str]

    @classmethod
    def by_marks(cls, marks: Mapping[MessageQueue, int]) -> Stores:
        """What marks alone tell (a batch write's commit, which keeps no record)."""
        return cls(dict(marks), {}, (), {}, dict(marks), frozenset())

    def of(self, t: Txn) -> tuple[dict[MessageQueue, int], dict[str, StorePrint], int | None]:
        """(marks, prints, substitution: None for the record's own) of the store ``t``'s half
        was recorded in."""
        g = self.twin_gen.get(t.msg_id)
        if g is not None:
            return (*self.twin_gens[g], g)
        if t.msg_id in self.twin_ids:
            return self.merged, {}, -1
        return self.marks, self.prints, None


#: what a batch leaves under the directory (pruned with its record); "checked", "ending" and
#: "lock" are what earlier versions left; "accept-lost" an operator's
_PRUNED = ("json", "ended", "progress", "checked", "ending", "lock", "accept-lost")


class TxLog:
    """Batch commit records under a checkpoint directory (local or mounted filesystem).

    ``checkpoint_location`` is a path or a ``file:`` URI; any other scheme is taken as a
    relative local path. ``keep``: how many batch ids back records are kept (see
    :meth:`record`). Files are replaced atomically (:func:`~rocketmq_spark.files.atomic_write`),
    so readers in other processes or threads (check-backs on executors) see a whole record
    or none. Only the driver writes here."""

    def __init__(self, checkpoint_location: str, keep: int = 200) -> None:
        path = checkpoint_location
        if path.startswith("file:"):
            path = path[5:]
            while path.startswith("//"):
                path = path[1:]
        self.dir = os.path.join(path, "rocketmq-sink", "commits")
        self.keep = keep
        #: this sink's identity in its half messages' tag: the same for every process given the
        #: same checkpoint location, different for another query's
        self.sink_id = hashlib.sha1(path.rstrip("/").encode()).hexdigest()[:12]

    def _path(self, batch_id: int) -> str:
        return os.path.join(self.dir, f"{batch_id}.json")

    def _load(self, batch_id: int) -> dict | None:
        try:
            with open(self._path(batch_id), "rb") as fh:
                obj = json.load(fh)
        except FileNotFoundError:
            return None
        if not isinstance(obj, dict):
            raise ValueError(f"{self._path(batch_id)}: not a batch record")
        return obj

    def read(self, batch_id: int) -> set[str] | None:
        """Message ids (UNIQ_KEY) recorded for the batch, or None when it is not recorded."""
        obj = self._load(batch_id)
        return None if obj is None else {str(m) for m in obj["msgIds"]}

    def record(self, batch_id: int, txns: list[Txn], marks: Mapping[MessageQueue, int] | None = None, *,
               sums: Mapping[str, str] | None = None, nonces: Mapping[int, str] | None = None,
               prints: Mapping[str, StorePrint] | None = None) -> list[Txn]:
        """Record (atomically, fsynced) that ``txns`` make up batch ``batch_id``, with ``marks``:
        each destination queue's max offset before any of them was committed (where their
        messages will be found); ``prints``: by broker, a message of its store below a mark
        (:data:`StorePrint`: a replay tells a replaced store by it); ``sums``: each row's
        checksum by message id, ``nonces``: the nonce of the task attempt whose halves are
        recorded, by partition (see the module docstring). Replaces any earlier record of the batch and deletes the
        records and marks of batch ids below ``batch_id - keep``. Returns ``txns`` in the
        record's order (:meth:`txns`, which :meth:`mark_progress` counts in). OSError when the
        directory cannot be written."""
        os.makedirs(self.dir, exist_ok=True)
        ordered = sorted(txns)
        rec: dict[str, object] = {"batchId": batch_id, "msgIds": sorted(t.msg_id for t in txns),
                                  "txns": ordered}  # each as its list (Txn is a tuple)
        if marks is not None:
            rec["marks"] = Offsets(dict(marks)).to_json()
        if prints:
            rec["prints"] = _prints_json(prints)
        if sums is not None:
            rec["sums"] = dict(sums)
        if nonces is not None:
            rec["nonces"] = {str(p): n for p, n in nonces.items()}
        self._write(batch_id, rec)
        self._prune(batch_id)
        return ordered

    def _write(self, batch_id: int, rec: dict) -> None:
        atomic_write(self._path(batch_id), json.dumps(rec).encode())

    def sums(self, batch_id: int) -> dict[str, str] | None:
        """Each recorded row's checksum by message id; None when the record has none (an
        earlier version's) or the batch is not recorded."""
        obj = self._load(batch_id)
        return None if obj is None or "sums" not in obj else {str(k): str(v) for k, v in obj["sums"].items()}

    def lost(self, batch_id: int) -> set[str]:
        """Message ids of the recorded halves their broker lost (see :meth:`mark_lost`)."""
        obj = self._load(batch_id)
        return set() if obj is None else {str(m) for m in obj.get("lost", ())}

    def mark_lost(self, batch_id: int, msg_ids: set[str]) -> None:
        """Add ``msg_ids`` to the batch's lost halves (atomically, fsynced): their broker holds
        them no more and their messages are not in the destination; a replay commits their twins
        instead (:meth:`substitute`)."""
        obj = self._load(batch_id)
        if obj is None:
            raise FileNotFoundError(self._path(batch_id))
        obj["lost"] = sorted(set(obj.get("lost", ())) | msg_ids)
        self._write(batch_id, obj)

    def substitute(self, batch_id: int, twins: Mapping[int, tuple[Txn, str]],
                   marks: Mapping[MessageQueue, int], prints: Mapping[str, StorePrint] | None = None) -> list[Txn]:
        """Put each twin (a replay's half of the same id, and its task's nonce) in place of the
        lost transaction at its index of the record (whose order :meth:`mark_progress` counts
        in), no longer lost; ``marks`` (the twins' destination queues' max offsets now) are
        merged into the record's, the lower of two kept per queue (a queue's offsets only grow
        in one store; a lower one now means its broker lost the store the record's was taken
        on; the scan for committed messages starts there). ``marks`` and ``prints`` (the twins'
        brokers' store prints, taken now) are also kept as this substitution's, by which its
        twins are told from a store lost after them; the record's own halves keep the record's
        marks and prints (:meth:`stores`). Atomic, fsynced, before any twin is ended. Returns
        the record's transactions."""
        obj = self._load(batch_id)
        if obj is None:
            raise FileNotFoundError(self._path(batch_id))
        txns = [Txn.from_list(t) for t in obj["txns"]]
        lost = set(obj.get("lost", ()))
        named = dict(obj.get("twins", {}))
        for i, (twin, nonce) in twins.items():
            txns[i] = twin
            lost.discard(twin.msg_id)
            named[twin.msg_id] = nonce
        merged = dict(Offsets.from_json(obj["marks"])) if "marks" in obj else {}
        if "marks" in obj and "recordMarks" not in obj:
            obj["recordMarks"] = obj["marks"]  # the record's own, before any twin's are merged in
        for mq, off in marks.items():
            merged[mq] = min(off, merged.get(mq, off))
        gens = list(obj.get("twinGens", []))
        gens.append({"marks": Offsets(dict(marks)).to_json(), "prints": _prints_json(prints or {})})
        gen_of = dict(obj.get("twinGen", {}))
        for twin, _ in twins.values():
            gen_of[twin.msg_id] = len(gens) - 1
        obj.update(txns=txns, lost=sorted(lost), twins=named, marks=Offsets(merged).to_json(), twinGens=gens,
                   twinGen=gen_of)
        self._write(batch_id, obj)
        return txns

    def accept_lost_path(self, batch_id: int) -> str:
        """The file an operator creates to end the batch without its lost halves that cannot be
        redone (see :meth:`lost_accepted`)."""
        return os.path.join(self.dir, f"{batch_id}.accept-lost")

    def lost_accepted(self, batch_id: int) -> bool:
        """Whether an operator accepted the loss of the batch's lost halves (the file
        :meth:`accept_lost_path` exists)."""
        return os.path.exists(self.accept_lost_path(batch_id))

    def marks(self, batch_id: int) -> Offsets | None:
        """The destination queues' max offsets recorded with the batch (see :meth:`record`);
        None when the batch is not recorded or its record has none (an earlier version's)."""
        obj = self._load(batch_id)
        if obj is None or "marks" not in obj:
            return None
        return Offsets.from_json(obj["marks"])

    def prints(self, batch_id: int) -> dict[str, StorePrint]:
        """The store prints recorded with the batch (see :meth:`record`), by broker; none when
        the batch is not recorded or its record has none (an earlier version's, or brokers
        whose destination queues were empty)."""
        return self.stores(batch_id).prints

    def stores(self, batch_id: int) -> Stores:
        """What the batch's record knows of the stores its halves are in (:class:`Stores`)."""
        obj = self._load(batch_id) or {}
        merged = dict(Offsets.from_json(obj["marks"])) if "marks" in obj else {}
        own = dict(Offsets.from_json(obj["recordMarks"])) if "recordMarks" in obj else merged
        gens = tuple((dict(Offsets.from_json(g["marks"])), _prints_of(g.get("prints")))
                     for g in obj.get("twinGens", []))
        return Stores(own, _prints_of(obj.get("prints")), gens,
                      {str(m): int(g) for m, g in obj.get("twinGen", {}).items()}, merged,
                      frozenset(str(m) for m in obj.get("twins", {})))

    def mark_progress(self, batch_id: int, ended: int) -> None:
        """The first ``ended`` transactions of the batch's record (in :meth:`txns` order) are
        committed. Not fsynced: a mark lost in a crash only makes a replay look at more of the
        record again, never at fewer."""
        atomic_write(os.path.join(self.dir, f"{batch_id}.progress"), str(ended).encode(), fsync=False)

    def progress(self, batch_id: int) -> int:
        """What :meth:`mark_progress` last wrote for the batch, 0 when nothing."""
        try:
            with open(os.path.join(self.dir, f"{batch_id}.progress"), "rb") as fh:
                return int(fh.read() or b"0")
        except (FileNotFoundError, ValueError):
            return 0

    def last_written(self, batch_id: int) -> float:
        """When the batch's record or progress mark was last written (epoch seconds, 0 when
        neither exists): a commit that stopped then may have had ENDs in flight until then."""
        when = 0.0
        for name in (f"{batch_id}.json", f"{batch_id}.progress"):
            try:
                when = max(when, os.stat(os.path.join(self.dir, name)).st_mtime)
            except FileNotFoundError:
                pass
        return when

    def mark_ended(self, batch_id: int) -> None:
        """Every transaction of the recorded batch is committed."""
        atomic_write(os.path.join(self.dir, f"{batch_id}.ended"), b"")

    def ended(self, batch_id: int) -> bool:
        """Whether :meth:`mark_ended` was written for the batch."""
        return os.path.exists(os.path.join(self.dir, f"{batch_id}.ended"))

    def txns(self, batch_id: int) -> list[Txn]:
        """The transactions recorded for the batch; FileNotFoundError when it is not recorded."""
        obj = self._load(batch_id)
        if obj is None:
            raise FileNotFoundError(self._path(batch_id))
        return [Txn.from_list(t) for t in obj["txns"]]

    def legacy_checked(self, batch_id: int) -> set[str]:
        """Message ids an earlier version's check-backs answered commit for (its ``.checked``
        list); a replay of a record without marks leaves them out, as that version did."""
        try:
            with open(os.path.join(self.dir, f"{batch_id}.checked")) as fh:
                return {ln.strip() for ln in fh if ln.strip()}
        except FileNotFoundError:
            return set()

    def latest(self) -> int | None:
        """The highest recorded batch id, None when none is."""
        try:
            ids = [int(n[:-5]) for n in os.listdir(self.dir) if n.endswith(".json") and n[:-5].isdigit()]
        except FileNotFoundError:
            return None
        return max(ids) if ids else None

    def decide(self, batch_id: int, msg_id: str, partition: int | None = None, nonce: str | None = None
               ) -> bool | None:
        """Check-back answer: False roll back, None no answer (the broker asks again); never
        commit (the driver's commit ends every recorded transaction, see the module docstring).

        A half message not in its batch's record is rolled back at any time (a failed task
        attempt's, or one a replay sent again); so is one whose id is recorded but whose task
        attempt (``partition``, ``nonce`` from its tag) is not the recorded one (ids repeat
        across attempts and replays), unless its id is lost and not yet replaced (it may be
        the twin the driver commits). One of a batch not recorded while a later batch is
        recorded is rolled back too (its batch was aborted or replaced)."""
        obj = self._load(batch_id)
        if obj is not None:
            if msg_id not in obj["msgIds"]:
                return False
            if msg_id in obj.get("lost", ()):
                return None  # first: a twin recorded before may have been lost again
            twins = obj.get("twins", {})
            if msg_id in twins:
                return None if nonce is None or nonce == twins[msg_id] else False
            nonces = obj.get("nonces")
            if nonce is None or partition is None or not nonces or str(partition) not in nonces:
                return None  # an earlier version's half or record: ids told them apart
            return None if nonces[str(partition)] == nonce else False
        latest = self.latest()
        if latest is not None and latest > batch_id:
            return False
        return None

    def _prune(self, newest: int) -> None:
        cutoff = newest - self.keep
        if cutoff <= 0:
            return
        for name in os.listdir(self.dir):
            stem, _, ext = name.partition(".")
            if ext in _PRUNED and stem.isdigit() and int(stem) < cutoff:
                try:
                    os.unlink(os.path.join(self.dir, name))
                except FileNotFoundError:
                    pass


def _prints_of(raw: object) -> dict[str, StorePrint]:
    out: dict[str, StorePrint] = {}
    for broker, (topic, key, off, at) in (raw if isinstance(raw, dict) else {}).items():
        out[str(broker)] = (MessageQueue.from_key(str(topic), str(key)), int(off), int(at))
    return out


def _prints_json(prints: Mapping[str, StorePrint]) -> dict[str, list]:
    return {b: [mq.topic, mq.key, int(off), int(at)] for b, (mq, off, at) in sorted(prints.items())}
