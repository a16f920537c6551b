"""The durable record behind exactly-once writes.

Under ``<checkpointLocation>/rocketmq-sink/commits/<batchId>.json`` the driver's
``commit()`` records which transactions (half messages) make up batch ``batchId``
BEFORE ending any of them. From then on the record is the truth:

- a replayed ``batchId`` (Spark re-runs a batch whose sink commit it did not see
  finish) rolls back the replay's new transactions and commits those recorded ones the
  first commit may not have ended: none once ``<batchId>.ended`` marks that it finished,
  else those past ``<batchId>.progress`` (how many of the record's transactions, in its
  order, had their ENDs answered). A Java broker commits a half message again on every
  END_TRANSACTION commit it gets (it does not remember that the half was ended), so a
  second commit is a duplicate: only the ENDs in flight when the first commit stopped
  (at most the writer's END window) can be sent twice;
- a check-back (CHECK_TRANSACTION_STATE) for a half message is answered commit if
  it is in its batch's record, rollback if the batch is recorded without it (or a
  later batch is recorded), and not at all while the batch is still undecided or
  once its ENDs were answered (the broker asks again later);
- a check-back answered commit and a replay's END would commit the half twice, so the
  two take turns on ``<batchId>.lock`` (an flock): the answer is written to
  ``<batchId>.checked`` before it is sent, unless ``<batchId>.ending`` says a replay
  has begun (then the replay ends it, and the check-back is not answered); a replay
  writes that mark, reads what check-backs committed, and leaves those out;
- half messages carry the sink's identity (:attr:`TxLog.sink_id`, from the checkpoint
  location), so a writer of another query in the same producer group, which a broker
  may ask about them, does not answer from a record that is not theirs.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..files import atomic_write
from ..model import Txn

log = logging.getLogger(__name__)

__all__ = ["TxLog", "Txn"]

#: what a batch leaves under the directory (pruned with its record)
_PRUNED = ("json", "ended", "progress", "checked", "ending", "lock")


class TxLog:
    """Batch commit records under a checkpoint directory (local or mounted filesystem).

    ``checkpoint_location`` is a path or a ``file:`` URI; any other scheme is taken as a
    relative local path. ``keep``: how many batch ids back records are kept (see
    :meth:`record`). Files are replaced atomically (:func:`~rocketmq_spark.files.atomic_write`),
    so readers in other processes or threads (check-backs on executors) see a whole record
    or none. The driver writes the records and marks; a check-back answered commit adds its
    message id to the batch's ``.checked`` list (:meth:`commit_by_check`).
    """

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

    def read(self, batch_id: int) -> set[str] | None:
        """Message ids (UNIQ_KEY) recorded for the batch, or None when it is not recorded."""
        try:
            with open(self._path(batch_id), "rb") as fh:
                obj = json.load(fh)
        except FileNotFoundError:
            return None
        return {str(m) for m in obj["msgIds"]}

    def record(self, batch_id: int, txns: list[Txn]) -> list[Txn]:
        """Record (atomically, fsynced) that ``txns`` make up batch ``batch_id``, replacing any
        earlier record of it, and delete the records, end and progress marks of batch ids below
        ``batch_id - keep``. Returns them in the record's order (:meth:`txns`, which
        :meth:`mark_progress` counts in). OSError when the directory cannot be written."""
        os.makedirs(self.dir, exist_ok=True)
        ordered = sorted(txns)
        body = json.dumps({"batchId": batch_id, "msgIds": sorted(t.msg_id for t in txns),
                           "txns": ordered}).encode()  # each as its list (Txn is a tuple)
        atomic_write(self._path(batch_id), body)
        self._prune(batch_id)
        return ordered

    def mark_progress(self, batch_id: int, ended: int) -> None:
        """The first ``ended`` transactions of the batch's record (in :meth:`txns` order) had
        their ENDs answered. Not fsynced: a mark lost in a crash only makes a replay send
        more ENDs again, never fewer."""
        atomic_write(os.path.join(self.dir, f"{batch_id}.progress"), str(ended).encode(), fsync=False)

    def progress(self, batch_id: int) -> int:
        """What :meth:`mark_progress` last wrote for the batch, 0 when nothing."""
        try:
            with open(os.path.join(self.dir, f"{batch_id}.progress"), "rb") as fh:
                return int(fh.read() or b"0")
        except (FileNotFoundError, ValueError):
            return 0

    def mark_ended(self, batch_id: int) -> None:
        """Every transaction of the recorded batch has been ended (the brokers answered)."""
        atomic_write(os.path.join(self.dir, f"{batch_id}.ended"), b"")

    def ended(self, batch_id: int) -> bool:
        """Whether :meth:`mark_ended` was written for the batch."""
        return os.path.exists(os.path.join(self.dir, f"{batch_id}.ended"))

    def txns(self, batch_id: int) -> list[Txn]:
        """The transactions recorded for the batch; FileNotFoundError when it is not recorded."""
        with open(self._path(batch_id), "rb") as fh:
            return [Txn.from_list(t) for t in json.load(fh)["txns"]]

    def latest(self) -> int | None:
        """The highest recorded batch id, None when none is."""
        try:
            ids = [int(n[:-5]) for n in os.listdir(self.dir) if n.endswith(".json") and n[:-5].isdigit()]
        except FileNotFoundError:
            return None
        return max(ids) if ids else None

    def decide(self, batch_id: int, msg_id: str) -> bool | None:
        """Check-back answer: True commit, False rollback, None no answer (the broker asks again).

        None while the batch is undecided, and for a message of the record once the batch is
        ended: its END was answered, but a broker records ended transactions in batches
        (transactionOpBatchInterval, 3 s) and may check one in between; answering commit again
        would store the message twice. None too once a replay of the batch has begun (it sends
        the END itself). A message not in the record is rolled back at any time."""
        recorded = self.read(batch_id)
        if recorded is not None:
            if msg_id not in recorded:
                return False
            return None if self.ended(batch_id) or not self.commit_by_check(batch_id, msg_id) else True
        latest = self.latest()
        if latest is not None and latest > batch_id:
            return False
        return None

    @contextmanager
    def _turn(self, batch_id: int) -> Iterator[None]:
        """Exclusive use of the batch's check-back marks among processes (flock)."""
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(os.path.join(self.dir, f"{batch_id}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def commit_by_check(self, batch_id: int, msg_id: str) -> bool:
        """Whether a check-back may answer commit for a recorded message: True once its id is
        written to ``<batch>.checked`` (a replay then leaves it out); False once a replay has
        begun (:meth:`begin_ending`: the replay commits it)."""
        with self._turn(batch_id):
            if os.path.exists(os.path.join(self.dir, f"{batch_id}.ending")):
                return False
            with open(os.path.join(self.dir, f"{batch_id}.checked"), "a") as fh:
                fh.write(msg_id + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            return True

    def begin_ending(self, batch_id: int) -> set[str]:
        """A replay of a recorded batch is about to end its transactions: from now on check-backs
        are not answered commit (:meth:`commit_by_check`); returns the message ids they already
        committed (not to be committed again)."""
        with self._turn(batch_id):
            atomic_write(os.path.join(self.dir, f"{batch_id}.ending"), b"")
            try:
                with open(os.path.join(self.dir, f"{batch_id}.checked")) as fh:
                    return {ln.strip() for ln in fh if ln.strip()}
            except FileNotFoundError:
                return set()

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
