"""The exactly-once batch record: what a check-back is answered at each stage of a batch."""

from __future__ import annotations

import json
import logging
import zlib

import pyarrow as pa
import pytest

from rocketmq_spark.client.routes import NameServers
from rocketmq_spark.errors import ConnectionFailedError, DataLossError, RequestTimeoutError, SystemBusyError
from rocketmq_spark.model import MessageQueue, PullResult, Txn
from rocketmq_spark.sink.txlog import TxLog


def test_check_back_answers_follow_the_record(tmp_path) -> None:
    log = TxLog(str(tmp_path))
    a = Txn("broker-a", "T", 0, 100, "ID-A")
    assert log.decide(3, "ID-A") is None  # undecided: no answer, the broker asks again
    log.record(3, [a])
    # a recorded message is committed by the driver alone (a check-back's commit could race its
    # END, or come for a half whose END was applied); one left out of the record is rolled back
    assert (log.decide(3, "ID-A"), log.decide(3, "ID-B")) == (None, False)
    assert log.decide(2, "ID-OLD") is False  # an older batch never recorded: a later one is
    assert not log.ended(3)
    log.mark_ended(3)
    assert log.ended(3) and log.decide(3, "ID-A") is None and log.decide(3, "ID-B") is False
    assert log.read(3) == {"ID-A"} and log.txns(3) == [a] and log.marks(3) is None


def test_old_records_and_their_end_marks_are_pruned(tmp_path) -> None:
    log = TxLog(str(tmp_path), keep=2)
    for batch in range(6):
        log.record(batch, [])
        log.mark_ended(batch)
    assert log.read(0) is None and not log.ended(0)
    assert log.read(5) == set() and log.ended(5)


def test_a_batch_writes_check_back_is_left_to_its_driver(tmp_path) -> None:
    # df.write tags its half messages batch -1 and its driver ends them without a record: stream
    # records in the same checkpoint location (latest 3 > -1) used to roll them back
    from rocketmq_spark.sink.transactional import TX_TAG, check_decision

    log = TxLog(str(tmp_path))
    log.record(3, [])
    assert check_decision(log, {TX_TAG: "-1:0:0"}, "ID-W") is None
    assert check_decision(log, {TX_TAG: "2:0:0"}, "ID-S") is False  # an older stream batch: rolled back
    assert check_decision(log, {"other": "x"}, "ID-X") is None  # not one of ours


def test_a_check_back_for_another_sinks_half_message_is_not_answered(tmp_path) -> None:
    # two queries in one producer group: a broker may ask either about the other's half messages
    from rocketmq_spark.sink.transactional import TX_TAG, check_decision

    ours, theirs = TxLog(str(tmp_path / "q1")), TxLog(str(tmp_path / "q2"))
    assert ours.sink_id != theirs.sink_id and ours.sink_id == TxLog(str(tmp_path / "q1") + "/").sink_id
    ours.record(7, [])  # a later batch recorded: an older one of ours is rolled back ...
    assert check_decision(ours, {TX_TAG: f"2:0:0:{ours.sink_id}"}, "ID-S") is False
    assert check_decision(ours, {TX_TAG: f"2:0:0:{theirs.sink_id}"}, "ID-T") is None  # ... not theirs


class FakeBroker:
    """A broker as the commit sees it, without sockets: each committed half message becomes a
    message in queue 0 of its topic; ``lose_after`` makes an END past that many applied but its
    answer lost (a timeout), once; :meth:`lose_store` takes its store away (its messages, and the
    half messages named), as a wiped disk does."""

    def __init__(self) -> None:
        self.stored: dict[MessageQueue, list[str]] = {}
        self.ends: list[list[str]] = []
        self.ended: list[tuple[Txn, bool]] = []  # every END sent: the transaction, commit or not
        self.lose_after: int | None = None
        self.gone: set[Txn] = set()  # half messages the broker no longer holds
        #: route lookups (an END starts with one) that find no route for the broker: it is
        #: restarting and has not registered yet, though it answers reads at its old address
        self.unrouted = 0
        #: per END call, in turn: how many it applies and answers before the broker refuses the
        #: next with SYSTEM_BUSY (flow control); ``windows`` the ENDs in flight each call allowed
        self.busy: list[int] = []
        self.busy_error = "busy"  # or "reset": a dropped connection instead of SYSTEM_BUSY
        self.windows: list[int] = []
        #: (k, after): the next commit's END k is refused as the store is lost, those at the
        #: indices ``after`` (past k) answered as applied just before (see :meth:`end_transactions`)
        self.wiped_at: tuple[int, set[int]] | None = None
        self.eras: dict[str, int] = {}  # how many times each broker's store was lost (see store_time_in)
        self.refill: list[str] | None = None  # what the store lost by ``wiped_at`` holds at once
        self._pulled_from = ""

    def lose_store(self, halves, broker: str | None = None) -> None:  # noqa: ANN001
        """Every broker's store lost, or ``broker``'s only."""
        self.stored = {mq: [] if broker in (None, mq.broker) else ids for mq, ids in self.stored.items()}
        self.gone |= set(halves)
        for b in {mq.broker for mq in self.stored} | {"broker-a"}:
            if broker in (None, b):
                self.eras[b] = self.eras.get(b, 0) + 1

    @property
    def era(self) -> int:
        return self.eras.get("broker-a", 0)

    def store_time_in(self, res: PullResult, offset: int) -> int | None:
        # a message's store time: its offset in the store that holds it (stores told by era, the
        # broker's of the last pull)
        start = res.next_offset - len(res.messages)
        era = self.eras.get(self._pulled_from, 0)
        return era * 10**6 + offset if res.status == "FOUND" and start <= offset < res.next_offset else None

    def apply(self, txns) -> None:  # noqa: ANN001
        for t in txns:
            self.stored.setdefault(MessageQueue(t.topic, t.broker, 0), []).append(t.msg_id)

    def message_queues(self, topic: str, **_: object) -> list[MessageQueue]:
        return [mq for mq in self.stored if mq.topic == topic] or [MessageQueue(topic, "broker-a", 0)]

    def max_offsets(self, mqs) -> dict:  # noqa: ANN001
        return {mq: len(self.stored.get(mq, [])) for mq in mqs}

    def max_offset(self, mq: MessageQueue) -> int:
        return len(self.stored.get(mq, []))

    def offset_ranges(self, mqs) -> dict:  # noqa: ANN001
        return {mq: (0, len(self.stored.get(mq, []))) for mq in mqs}

    def pull(self, mq: MessageQueue, at: int, n: int) -> PullResult:
        self._pulled_from = mq.broker
        ids = self.stored.get(mq, [])[at:at + n]
        return PullResult("FOUND" if ids else "NO_NEW_MSG", at + len(ids), 0, len(self.stored.get(mq, [])),
                          messages=tuple(ids))

    def rows(self, mq, results, end, columns):  # noqa: ANN001
        return pa.RecordBatch.from_pydict({"messageId": [m for r in results for m in r.messages]})

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        if self.unrouted:
            self.unrouted -= 1
            raise ConnectionFailedError(broker, "routing", "it is in no route the name servers give now")
        return "127.0.0.1:10911"

    def end_transactions(self, txns, *, commit, producer_group, window=256, on_progress=None,  # noqa: ANN001
                         retry_failed=True, on_applied=None):
        txns = list(txns)
        if txns:
            self.broker_addr(txns[0].broker, txns[0].topic)
        self.ends.append([t.msg_id for t in txns])
        self.windows.append(window)
        applied = on_applied or (lambda i: None)
        if self.wiped_at is not None and commit:
            # ENDs before k applied; k refused as the store goes; those in ``after`` (in flight
            # past k) were answered as applied just before it went; then the store is lost
            (k, after), self.wiped_at = self.wiped_at, None
            self.ended += [(t, commit) for t in txns]
            self.apply(txns[:k] + [txns[i] for i in sorted(after)])
            for i in [*range(k), *sorted(after)]:
                applied(i)
            if on_progress is not None and k:
                on_progress(k)
            self.lose_store(txns)
            if self.refill is not None:  # the new store already holds other messages
                self.stored[MessageQueue(txns[0].topic, txns[0].broker, 0)] = list(self.refill)
            raise ConnectionFailedError("127.0.0.1:10911", "commit of transactions", "connection reset")
        if self.busy and commit:
            k = self.busy.pop(0)
            self.ended += [(t, commit) for t in txns[:k + 1]]
            self.apply(txns[:k])
            for i in range(k):
                applied(i)
            if on_progress is not None and k:
                on_progress(k)
            if self.busy_error == "reset":
                raise ConnectionFailedError("127.0.0.1:10911", "commit of transactions", "connection reset")
            raise SystemBusyError("[TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while",
                                  address="127.0.0.1:10911", operation="commit of transactions")
        self.ended += [(t, commit) for t in txns]
        gone = [t for t in txns if t in self.gone]
        if gone:  # as the clients: the others ended, the prefix applied reported up to the first gone one
            if commit:
                self.apply([t for t in txns if t not in self.gone])
                for i, t in enumerate(txns):
                    if t not in self.gone:
                        applied(i)
            first = txns.index(gone[0])
            if on_progress is not None and first:
                on_progress(first)
            return gone
        if commit and self.lose_after is not None and len(txns) > self.lose_after:
            k, self.lose_after = self.lose_after, None
            self.apply(txns[:k + 1])  # the END at k was applied, its answer lost
            for i in range(k):
                applied(i)
            if on_progress is not None and k:
                on_progress(k)
            raise RequestTimeoutError("127.0.0.1:10911", "commit of transactions", "no response within 10s")
        if commit:
            self.apply(txns)
            for i in range(len(txns)):
                applied(i)
        if on_progress is not None and txns:
            on_progress(len(txns))
        return []

    def close(self) -> None:
        pass


@pytest.fixture()
def fake(monkeypatch, tmp_path):  # noqa: ANN201
    import rocketmq_spark.sink.options as sink_options
    import rocketmq_spark.sink.transactional as transactional
    import rocketmq_spark.sink.writer as writer
    from rocketmq_spark.sink.options import WriterOptions

    broker = FakeBroker()
    # the tasks' clients and the driver's commit: every writer client comes from WriterOptions.connect
    monkeypatch.setattr(sink_options, "connect", lambda *a, **k: broker)
    monkeypatch.setattr(transactional, "_SETTLE_S", 0.0)
    opts = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "T", "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    return broker, opts, writer


def _txns(n: int) -> list[Txn]:
    return [Txn("broker-a", "T", i, 100 * i, f"ID-{i}") for i in range(n)]


def test_a_first_commit_records_the_destination_marks_then_commits_each_once(fake, tmp_path) -> None:
    broker, opts, writer = fake
    broker.apply([Txn("broker-a", "T", 0, 0, "OTHER")])  # a message of another producer: mark 1
    writer.commit_batch(opts, _txns(3), 9)
    log = TxLog(str(tmp_path))
    assert log.marks(9) == {MessageQueue("T", "broker-a", 0): 1} and log.ended(9) and log.progress(9) == 3
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == ["OTHER", "ID-0", "ID-1", "ID-2"]


def test_a_replay_commits_only_the_transactions_the_destination_lacks(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns = _txns(6)
    log = TxLog(str(tmp_path))
    log.record(9, txns, {MessageQueue("T", "broker-a", 0): 0})
    broker.apply(txns[:4])  # the first commit's driver died with ID-0..3 applied ...
    log.mark_progress(9, 2)  # ... and only the first two answered and marked
    writer.commit_batch(opts, txns + [Txn("broker-a", "T", 9, 900, "REPLAY-9")], 9)
    assert broker.ends == [["ID-4", "ID-5"], ["REPLAY-9"]]  # the replay's own half rolled back
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(6)]
    assert log.ended(9) and log.progress(9) == 6


def test_an_end_whose_answer_was_lost_is_looked_up_not_sent_again(fake, tmp_path) -> None:
    broker, opts, writer = fake
    broker.lose_after = 3  # ENDs of ID-0..3 applied, ID-3's answer lost
    writer.commit_batch(opts, _txns(6), 4)
    assert broker.ends == [[f"ID-{i}" for i in range(6)], ["ID-4", "ID-5"]]
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(6)]  # each once
    assert TxLog(str(tmp_path)).ended(4)


def test_a_commit_waits_for_a_restarting_broker_to_be_routed_not_only_to_answer(fake, tmp_path, monkeypatch) -> None:
    # a broker killed during the commit: at its old address it answers reads again before it is
    # back in the routes, where an END's address comes from; the commit's rounds wait for both
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    broker, opts, writer = fake
    broker.unrouted = 8  # more lookups than the commit makes rounds
    writer.commit_batch(opts, _txns(4), 5)
    assert broker.unrouted == 0
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(4)]  # each once
    assert TxLog(str(tmp_path)).ended(5)


def test_a_busy_broker_is_waited_for_while_it_applies_ends_with_fewer_in_flight(fake, tmp_path, monkeypatch) -> None:
    # Apache RocketMQ refuses an END that waited 3 s in its queue (SYSTEM_BUSY): a commit that
    # still gets some applied each round goes on, past the three rounds a fault-stopped commit is
    # allowed, with a quarter as many in flight after each refusal
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    broker, opts, writer = fake
    broker.busy = [3, 2, 1, 1, 1]
    writer.commit_batch(opts, _txns(12), 6)
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(12)]  # each once
    assert broker.windows == [256, 64, 16, 16, 16, 16]
    assert TxLog(str(tmp_path)).ended(6) and TxLog(str(tmp_path)).progress(6) == 12


def test_a_commit_fails_after_three_rounds_in_a_row_got_nothing_applied(fake, tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    broker, opts, writer = fake
    broker.busy = [2, 0, 0, 0]
    with pytest.raises(SystemBusyError, match="broker busy"):
        writer.commit_batch(opts, _txns(5), 7)
    assert len(broker.ends) == 4 and broker.stored[MessageQueue("T", "broker-a", 0)] == ["ID-0", "ID-1"]
    assert TxLog(str(tmp_path)).progress(7) == 2 and not TxLog(str(tmp_path)).ended(7)


def test_rounds_that_got_nothing_applied_are_counted_in_a_row_only(fake, tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    broker, opts, writer = fake
    broker.busy = [0, 0, 2, 0, 0, 3]  # two empty rounds, progress, two empty rounds, the rest
    writer.commit_batch(opts, _txns(5), 8)
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(5)]
    assert TxLog(str(tmp_path)).ended(8)


def test_a_dropped_connection_does_not_shrink_the_ends_in_flight(fake, tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    broker, opts, writer = fake
    broker.busy, broker.busy_error = [2], "reset"
    writer.commit_batch(opts, _txns(4), 9)
    assert broker.windows == [256, 256]
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(4)]


def test_a_commit_still_applying_ends_gives_up_after_its_patience(fake, tmp_path, monkeypatch) -> None:
    # progress every round, but past _END_PATIENCE_S from the first fault: the batch fails (a
    # restarted query's replay commits the rest), it does not hang on a crawling broker
    import rocketmq_spark.sink.transactional as transactional

    monkeypatch.setattr(transactional.time, "sleep", lambda s: None)
    monkeypatch.setattr(transactional, "_END_PATIENCE_S", -1.0)
    broker, opts, writer = fake
    broker.busy = [1, 1, 1, 1]
    with pytest.raises(SystemBusyError):
        writer.commit_batch(opts, _txns(6), 10)
    assert len(broker.ends) == 1 and TxLog(str(tmp_path)).progress(10) == 1


def test_a_replay_of_an_earlier_versions_record_leaves_out_what_its_check_backs_committed(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns = _txns(5)
    log = TxLog(str(tmp_path))
    log.record(9, txns)  # no marks: written by an earlier version
    log.mark_progress(9, 2)
    with open(tmp_path / "rocketmq-sink" / "commits" / "9.checked", "w") as fh:
        fh.write("ID-3\n")  # that version's check-back committed ID-3
    writer.commit_batch(opts, txns, 9)
    assert broker.ends[0] == ["ID-2", "ID-4"]
    assert log.ended(9) and log.decide(9, "ID-2") is None


def test_a_batch_write_commits_each_half_once_when_an_answer_is_lost(fake) -> None:
    broker, opts, writer = fake
    broker.lose_after = 2
    report = writer.TaskReport(0, 5, [t.to_list() for t in _txns(5)])
    writer.RocketMQBatchWriter(opts).commit([report])
    assert broker.stored[MessageQueue("T", "broker-a", 0)] == [f"ID-{i}" for i in range(5)]  # each once
    assert broker.ends[1] == ["ID-3", "ID-4"]  # the rest, after looking


# -- a destination broker that lost its store between the tasks' sends and the driver's ENDs ------


MQ = MessageQueue("T", "broker-a", 0)


def _sum(body: bytes) -> str:
    """A body-only row's checksum as the writer's row_sum writes it (a letter, CRC-32 in hex)."""
    return f"b{zlib.crc32(body):08x}"


def _report(partition: int, txns: list[Txn], nonce: str, sums: dict[str, str] | None = None):  # noqa: ANN202
    from rocketmq_spark.sink.writer import TaskReport

    report = TaskReport(partition, len(txns), [t.to_list() for t in txns])
    # set after: what the task reports beside its transactions (an earlier version's report has neither)
    report.sums = sums if sums is not None else {t.msg_id: _sum(t.msg_id.encode()) for t in txns}
    report.nonce = nonce
    return report


def _replayed(txns: list[Txn]) -> list[Txn]:
    """The replay's halves of the same rows: the same ids (deterministic), other positions."""
    return [t._replace(queue_offset=t.queue_offset + 1000, commit_log_offset=t.commit_log_offset + 100_000)
            for t in txns]


def _lost_in_first_commit(fake, tmp_path):  # noqa: ANN001, ANN202
    """Batch 9 of six rows (partition 0): the store holding halves ID-2..4 is lost before the
    driver's commit (its queue comes back empty, as in wipe-broker-now); -> the first commit's error."""
    broker, opts, writer = fake
    txns = _txns(6)
    broker.lose_store(txns[2:5])
    with pytest.raises(DataLossError) as err:
        writer.RocketMQStreamWriter(opts).commit([_report(0, txns, "n1")], 9)
    return txns, err.value


def test_a_half_its_broker_lost_fails_the_batch_instead_of_being_taken_as_ended(fake, tmp_path) -> None:
    broker, _, _ = fake
    txns, err = _lost_in_first_commit(fake, tmp_path)
    msg = str(err)
    assert "batch 9" in msg and "3 of the batch's 6 rows" in msg and "broker broker-a topic T" in msg, msg
    assert "restart the query" in msg and "lost" in msg, msg
    log = TxLog(str(tmp_path))
    # the rest committed, each once; the batch not ended, the lost ones remembered, the progress
    # before the first of them
    assert broker.stored[MQ] == ["ID-0", "ID-1", "ID-5"]
    assert not log.ended(9) and log.lost(9) == {"ID-2", "ID-3", "ID-4"} and log.progress(9) == 2


def test_ends_answered_as_applied_past_a_fault_are_not_taken_for_lost_when_the_store_goes(fake, tmp_path) -> None:
    # the fault suite's wipe-broker-now: a store lost mid-commit with ENDs in flight; those answered
    # as applied past the first refused one were delivered (and went with the store). Sent again
    # they found no half and were counted lost, and the replay wrote their rows a second time
    broker, opts, writer = fake
    broker.wiped_at = (2, {4, 5})
    with pytest.raises(DataLossError, match="no prepared .half. message for 2 of the batch's 6 rows") as err:
        writer.commit_batch(opts, _txns(6), 9)
    assert TxLog(str(tmp_path)).lost(9) == {"ID-2", "ID-3"}, err.value
    assert broker.ends == [[f"ID-{i}" for i in range(6)], ["ID-2", "ID-3"]]  # 4 and 5 not sent again


def test_a_replay_commits_its_twins_of_the_lost_rows_and_rolls_back_the_rest(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns, _ = _lost_in_first_commit(fake, tmp_path)
    replay = _replayed(txns)
    broker.ended.clear()
    writer.RocketMQStreamWriter(opts).commit([_report(0, replay, "n2")], 9)
    log = TxLog(str(tmp_path))
    assert sorted(broker.stored[MQ]) == [f"ID-{i}" for i in range(6)]  # every row once
    committed = {t for t, commit in broker.ended if commit}
    rolled_back = {t for t, commit in broker.ended if not commit}
    assert committed == set(replay[2:5])  # the twins of the lost ones, none of the originals again
    assert rolled_back == set(replay[:2] + replay[5:])  # by position: the replay's ids are the recorded ones
    assert log.ended(9) and log.lost(9) == set() and log.txns(9) == txns[:2] + replay[2:5] + txns[5:]
    # check-backs: the chosen twin and the recorded halves are the driver's; another attempt's not
    assert log.decide(9, "ID-3", 0, "n2") is None and log.decide(9, "ID-3", 0, "n1") is False
    assert log.decide(9, "ID-0", 0, "n1") is None and log.decide(9, "ID-0", 0, "n2") is False
    # the store is lost again, twins and all: the next replay's half of ID-3 waits for its driver
    log.mark_lost(9, {"ID-3"})
    assert log.decide(9, "ID-3", 0, "n3") is None


def test_a_twin_that_differs_or_is_missing_fails_the_replay_naming_why(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns, _ = _lost_in_first_commit(fake, tmp_path)
    replay = _replayed(txns)
    sums = {t.msg_id: _sum(t.msg_id.encode()) for t in replay}
    sums["ID-3"] = _sum(b"another body")  # a non-deterministic query: row 3 is not what it was
    without_4 = [t for t in replay if t.msg_id != "ID-4"]
    sums.pop("ID-4")
    log = TxLog(str(tmp_path))
    # before the replay's commit, a check-back of a half whose id is lost waits: it may be the twin
    assert log.decide(9, "ID-3", 0, "n2") is None and log.decide(9, "ID-1", 0, "n2") is False
    with pytest.raises(DataLossError) as err:
        writer.RocketMQStreamWriter(opts).commit([_report(0, without_4, "n2", sums)], 9)
    msg = str(err.value)
    assert "ID-3: the replay's row of this id differs in its body" in msg, msg
    assert "ID-4: the replay wrote no row of this id" in msg, msg
    assert "deterministic" in msg and log.accept_lost_path(9) in msg, msg
    assert sorted(broker.stored[MQ]) == ["ID-0", "ID-1", "ID-2", "ID-5"]  # row 2's twin matched
    assert not log.ended(9) and log.lost(9) == {"ID-3", "ID-4"}
    assert {t for t, commit in broker.ended if not commit} >= {replay[3]}  # the differing twin rolled back
    # the operator accepts the loss: the next replay ends the batch without them
    open(log.accept_lost_path(9), "w").close()
    writer.RocketMQStreamWriter(opts).commit([_report(0, without_4, "n3", sums)], 9)
    assert log.ended(9) and sorted(broker.stored[MQ]) == ["ID-0", "ID-1", "ID-2", "ID-5"]


def test_with_fail_on_data_loss_false_a_replay_ends_the_batch_without_rows_it_cannot_write_again(
        fake, tmp_path, caplog) -> None:
    """The broker that lost the halves held their source rows too (the fault suite's
    wipe-broker-now): the replay has no twin for them. failOnDataLoss=false ends the batch
    without them, logged, as the reader skips what its broker lost; the twins it has are
    committed."""
    import dataclasses

    broker, opts, writer = fake
    txns, _ = _lost_in_first_commit(fake, tmp_path)  # the first commit fails either way: a replay may redo them
    replay = [t for t in _replayed(txns) if t.msg_id != "ID-4"]  # row 4's source went with the store
    lenient = dataclasses.replace(opts, fail_on_data_loss=False)
    writer.RocketMQStreamWriter(lenient).commit([_report(0, replay, "n2")], 9)
    log = TxLog(str(tmp_path))
    assert log.ended(9) and sorted(broker.stored[MQ]) == ["ID-0", "ID-1", "ID-2", "ID-3", "ID-5"]
    assert "ended without 1 rows its brokers lost, as failOnDataLoss=false allows" in caplog.text


def test_with_fail_on_data_loss_false_rows_whose_twins_were_lost_too_wait_for_the_next_replay(
        fake, tmp_path) -> None:
    """The fault suite's wipe-broker-now, seed 4602: the store was lost again while a replay
    committed its twins, taking them too. Their source rows are still there: failOnDataLoss=false
    used to end the batch without them (50 rows lost); the batch now waits for the next replay."""
    import dataclasses

    broker, opts, writer = fake
    txns, _ = _lost_in_first_commit(fake, tmp_path)
    replay = _replayed(txns)
    broker.gone.add(replay[3])  # the twin of ID-3 goes with a store lost again
    lenient = dataclasses.replace(opts, fail_on_data_loss=False)
    with pytest.raises(DataLossError, match="lost the prepared messages of 1 rows again") as err:
        writer.RocketMQStreamWriter(lenient).commit([_report(0, replay, "n2")], 9)
    assert "ID-3" in str(err.value) and "restart the query" in str(err.value)
    # the twin found gone was not put in place of itself and sent a second END
    assert [t for t, commit in broker.ended if commit].count(replay[3]) == 1
    log = TxLog(str(tmp_path))
    assert not log.ended(9) and log.lost(9) == {"ID-3"}
    # the next replay has a twin of ID-3 that stays: the batch ends, every row once
    again = [t._replace(queue_offset=t.queue_offset + 2000, commit_log_offset=t.commit_log_offset + 200_000)
             for t in txns]
    writer.RocketMQStreamWriter(lenient).commit([_report(0, again, "n3")], 9)
    assert log.ended(9) and sorted(broker.stored[MQ]).count("ID-3") == 1


def test_fail_on_data_loss_is_an_exactly_once_option() -> None:
    from rocketmq_spark.errors import OptionError
    from rocketmq_spark.sink.options import WriterOptions

    base = {"namesrvAddr": "127.0.0.1:9876", "topic": "T"}
    assert WriterOptions.parse({**base, "delivery": "exactly-once", "checkpointLocation": "/tmp/x",
                                "failOnDataLoss": "false"}).fail_on_data_loss is False
    assert WriterOptions.parse({**base, "delivery": "exactly-once", "checkpointLocation": "/tmp/x"}).fail_on_data_loss
    with pytest.raises(OptionError, match="failOnDataLoss.*only delivery=exactly-once takes it"):
        WriterOptions.parse({**base, "failOnDataLoss": "false"})
    with pytest.raises(OptionError, match="failOnDataLoss"):
        WriterOptions.parse({**base, "delivery": "exactly-once", "checkpointLocation": "/tmp/x",
                             "failOnDataLoss": "maybe"})


def test_a_record_without_checksums_reports_its_lost_rows_as_not_redoable(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns = _txns(4)
    log = TxLog(str(tmp_path))
    log.record(9, txns, {MQ: 0})  # an earlier version's record: marks, no checksums nor nonces
    broker.lose_store(txns[1:2])
    replay = [t._replace(msg_id=f"NEW-{i}", queue_offset=t.queue_offset + 1000) for i, t in enumerate(txns)]
    with pytest.raises(DataLossError) as err:
        writer.commit_batch(opts, replay, 9)
    msg = str(err.value)
    assert "ID-1: the batch was recorded by an earlier version, without row checksums" in msg, msg
    assert broker.stored[MQ] == ["ID-0", "ID-2", "ID-3"] and not log.ended(9) and log.lost(9) == {"ID-1"}
    assert {t for t, commit in broker.ended if not commit} == set(replay)  # none of the replay's kept


def test_a_replay_sends_no_end_to_a_broker_whose_store_changed_since_the_record(fake, tmp_path) -> None:
    # recorded on the old store (marks at 5); the broker comes back empty: an END by position
    # would end whatever half now sits there. The replay ends nothing there and commits its twins.
    broker, opts, writer = fake
    txns = _txns(3)
    broker.stored[MQ] = [f"OLD-{i}" for i in range(5)]
    log = TxLog(str(tmp_path))
    log.record(9, txns, {MQ: 5})
    path = tmp_path / "rocketmq-sink" / "commits" / "9.json"  # with each row's checksum, as record(sums=) keeps it
    path.write_text(json.dumps({**json.loads(path.read_text()), "sums": {t.msg_id: _sum(t.msg_id.encode())
                                                                           for t in txns}}))
    broker.lose_store([])  # the halves' positions may hold other halves now: the broker would take the ENDs
    replay = _replayed(txns)
    writer.RocketMQStreamWriter(opts).commit([_report(0, replay, "n2")], 9)
    assert not any(t in txns for t, _ in broker.ended), broker.ended
    assert sorted(broker.stored[MQ]) == ["ID-0", "ID-1", "ID-2"] and log.ended(9)
    assert log.marks(9) == {MQ: 0}  # the twins' marks, taken on the new store


def _recorded_on(broker: FakeBroker, tmp_path, txns: list[Txn], marks: dict) -> TxLog:  # noqa: ANN001
    """Batch 9 recorded as a first commit records it (marks, store prints, checksums), not ended."""
    from rocketmq_spark.sink.transactional import store_prints

    log = TxLog(str(tmp_path))
    log.record(9, txns, marks, sums={t.msg_id: _sum(t.msg_id.encode()) for t in txns},
               prints=store_prints(broker, marks))
    return log


def test_a_replay_tells_a_new_store_grown_past_the_marks_by_its_store_print(fake, tmp_path) -> None:
    # the broker lost its store after the record and the new one already holds more than the
    # marks: offsets alone cannot tell, and an END by position would end whatever half sits
    # there now (the fault suite, seed 4601: Apache RocketMQ answered with exceptions)
    broker, opts, writer = fake
    txns = _txns(3)
    broker.stored[MQ] = [f"OLD-{i}" for i in range(5)]
    log = _recorded_on(broker, tmp_path, txns, {MQ: 5})
    assert log.prints(9) == {"broker-a": (MQ, 4, 4)}
    broker.lose_store([])  # the old halves' positions hold other records: an END would be taken
    broker.stored[MQ] = [f"NEW-{i}" for i in range(8)]
    writer.RocketMQStreamWriter(opts).commit([_report(0, _replayed(txns), "n2")], 9)
    assert not any(t in txns for t, _ in broker.ended), broker.ended
    assert broker.stored[MQ][8:] == ["ID-0", "ID-1", "ID-2"] and log.ended(9)
    stores = log.stores(9)  # the record's halves keep theirs; the twins' store's are their own
    assert stores.prints == {"broker-a": (MQ, 4, 4)} and stores.marks == {MQ: 5}
    assert stores.twin_gens == (({MQ: 8}, {"broker-a": (MQ, 7, 10**6 + 7)}),)
    assert set(stores.twin_gen) == {"ID-0", "ID-1", "ID-2"}


def test_a_print_taken_for_twins_does_not_vouch_for_older_halves_of_their_broker(fake, tmp_path) -> None:
    # two brokers: broker-b's halves were found lost by an earlier commit; broker-a's store was
    # lost after that commit and has grown past its marks since. The replay's twins of
    # broker-b's rows go to broker-a, and their print is taken on broker-a's new store: that must
    # not let the record's own halves on broker-a be ended there by position
    broker, opts, writer = fake
    mqb = MessageQueue("T", "broker-b", 0)
    on_a = [Txn("broker-a", "T", i, 100 * i, f"ID-{i}") for i in range(2)]
    on_b = [Txn("broker-b", "T", i, 100 * i, f"ID-{i + 2}") for i in range(2)]
    broker.stored[MQ] = [f"OLD-{i}" for i in range(5)]
    broker.stored[mqb] = [f"OLD-B-{i}" for i in range(3)]
    log = _recorded_on(broker, tmp_path, on_a + on_b, {MQ: 5, mqb: 3})
    log.mark_lost(9, {t.msg_id for t in on_b})
    broker.lose_store([], broker="broker-a")
    broker.stored[MQ] = [f"NEW-{i}" for i in range(8)]
    twins = [t._replace(broker="broker-a", queue_offset=t.queue_offset + 1000) for t in on_b]
    replay = _replayed(on_a) + twins
    writer.RocketMQStreamWriter(opts).commit([_report(0, replay, "n2")], 9)
    assert not any(t in on_a for t, _ in broker.ended), broker.ended  # no END into broker-a's new store
    assert sorted(broker.stored[MQ][8:]) == ["ID-0", "ID-1", "ID-2", "ID-3"] and log.ended(9)


def test_a_replay_ends_the_recorded_halves_of_a_store_that_only_grew(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns = _txns(3)
    broker.stored[MQ] = [f"OLD-{i}" for i in range(5)]
    log = _recorded_on(broker, tmp_path, txns, {MQ: 5})
    broker.stored[MQ] += ["OTHER-0", "OTHER-1"]  # another writer's messages meanwhile; the same store
    writer.RocketMQStreamWriter(opts).commit([_report(0, _replayed(txns), "n2")], 9)
    assert [t for t, commit in broker.ended if commit] == txns
    assert broker.stored[MQ][7:] == ["ID-0", "ID-1", "ID-2"] and log.ended(9)


def test_twins_are_told_by_their_own_destinations_marks_not_by_other_topics_of_the_record(fake, tmp_path) -> None:
    # one broker, two destination topics: T1's ENDs were applied, then the store was lost with
    # T2's halves. The replay's twins go to T2 only: T1's queue, below the record's mark now,
    # says nothing of the store they were recorded in (a replay used to take them for gone, and
    # every replay after it failed with "lost again")
    broker, opts, writer = fake
    q1, q2 = MessageQueue("T1", "broker-a", 0), MessageQueue("T2", "broker-a", 0)
    t1 = [Txn("broker-a", "T1", i, 100 * i, f"ID-{i}") for i in range(2)]
    t2 = [Txn("broker-a", "T2", i + 2, 100 * (i + 2), f"ID-{i + 2}") for i in range(2)]
    broker.stored[q1] = ["OLD-0", "OLD-1", "OLD-2"]
    broker.stored[q2] = ["OLD-3", "OLD-4", "OLD-5"]
    log = _recorded_on(broker, tmp_path, t1 + t2, {q1: 3, q2: 3})
    broker.apply(t1)
    log.mark_progress(9, 2)
    broker.lose_store(t2)
    log.mark_lost(9, {t.msg_id for t in t2})
    replay = _replayed(t1 + t2)
    writer.RocketMQStreamWriter(opts).commit([_report(0, replay, "n2")], 9)
    assert log.ended(9) and broker.stored[q2] == ["ID-2", "ID-3"]


def test_a_commit_stopped_by_a_lost_store_sends_no_end_into_the_new_one(fake, tmp_path) -> None:
    # wipe-broker-now during the first commit: the connection is reset, and by the next round the
    # broker is back with a new store that already holds more than the marks
    broker, opts, writer = fake
    broker.stored[MQ] = [f"OLD-{i}" for i in range(5)]
    broker.wiped_at = (2, set())
    broker.refill = [f"NEW-{i}" for i in range(8)]
    with pytest.raises(DataLossError, match="for 4 of the batch's 6 rows"):
        writer.commit_batch(opts, _txns(6), 9)
    assert len(broker.ends) == 1, broker.ends  # the four left were not sent again, by position
    assert TxLog(str(tmp_path)).lost(9) == {f"ID-{i}" for i in range(2, 6)}


def test_a_store_print_past_the_queues_end_means_another_store() -> None:
    # a new store shorter than the print's offset: nothing is read there, and that says as much
    from rocketmq_spark.sink.transactional import _replaced_stores

    broker = FakeBroker()
    broker.stored[MQ] = ["NEW-0", "NEW-1"]
    now = broker.max_offsets([MQ])  # what the caller reads, once for every generation
    out = _replaced_stores(broker, {MQ: 2}, {("broker-a", "T")}, {"broker-a": (MQ, 4, 4)}, now)  # type: ignore[arg-type]
    assert "broker-a" in out and "the message at 4" in out["broker-a"]
    assert _replaced_stores(broker, {MQ: 2}, {("broker-a", "T")}, {"broker-a": (MQ, 1, 1)}, now) == {}  # type: ignore


def test_an_earlier_versions_twins_are_told_by_the_merged_marks(tmp_path) -> None:
    log = TxLog(str(tmp_path))
    txns = _txns(2)
    log.record(9, txns, {MQ: 5})
    path = tmp_path / "rocketmq-sink" / "commits" / "9.json"
    older = {**json.loads(path.read_text()), "twins": {"ID-1": "n2"}, "marks": {"T": {"broker-a:0": 3}}}
    path.write_text(json.dumps(older))  # a substitution as the previous version wrote it
    stores = log.stores(9)
    assert stores.of(txns[0]) == ({MQ: 3}, {}, None) and stores.of(txns[1]) == ({MQ: 3}, {}, -1)


def test_a_first_commit_records_each_brokers_store_print(fake, tmp_path) -> None:
    broker, opts, writer = fake
    txns = _txns(2)
    broker.stored[MQ] = ["OLD-0", "OLD-1"]
    broker.stored[MessageQueue("T", "broker-a", 1)] = []  # an empty queue: no print there
    writer.RocketMQStreamWriter(opts).commit([_report(0, txns, "n1")], 4)
    log = TxLog(str(tmp_path))
    assert log.ended(4) and log.prints(4) == {"broker-a": (MQ, 1, 1)}


def test_a_retried_tasks_halves_share_ids_and_are_told_apart_by_position_and_nonce(fake, tmp_path) -> None:
    from rocketmq_spark.sink.transactional import TX_TAG, check_decision

    broker, opts, writer = fake
    first_attempt = _txns(3)
    second = _replayed(first_attempt)  # attempt 1 of the task: the same ids, other positions
    log = TxLog(str(tmp_path))
    log.record(9, second, {MQ: 0})
    # a replay's abort must roll back its own halves, not keep them for their recorded ids
    writer.abort_batch(opts, first_attempt + second, 9)
    assert [t for t, _ in broker.ended] == first_attempt
    log.record(9, second, {MQ: 0}, nonces={0: "n-second"})
    tag = f"9:0:0:{log.sink_id}:n-first"
    assert check_decision(log, {TX_TAG: tag}, "ID-1") is False  # the first attempt's stray
    assert check_decision(log, {TX_TAG: tag.replace("n-first", "n-second")}, "ID-1") is None
    assert check_decision(log, {TX_TAG: f"9:0:0:{log.sink_id}"}, "ID-1") is None  # an earlier version's tag


def test_a_streaming_tasks_message_ids_repeat_across_attempts_and_replays(tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.options as sink_options
    import rocketmq_spark.sink.writer as writer
    from rocketmq_spark.sink.options import WriterOptions

    monkeypatch.setattr(sink_options, "connect", lambda *a, **k: object())
    opts = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "T", "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    a, b = writer._Sender(opts, 9), writer._Sender(opts, 9)  # two attempts (or a replay) of one task
    assert [a._uniq() for _ in range(3)] == [b._uniq() for _ in range(3)] and a.nonce != b.nonce
    assert writer._Sender(opts, 10)._uniq() != writer._Sender(opts, 9)._uniq()  # another batch's
    assert f":{a.nonce}\x02" in a._half_suffix


def test_row_checksums_name_the_parts_that_differ() -> None:
    from rocketmq_spark.sink.transactional import row_sum, sum_difference

    one = row_sum(b"body", "tag", "k1 k2", "__SHARDINGKEY\x01g\x02")
    assert sum_difference(one, one) == []
    assert sum_difference(one, row_sum(b"body", "tag", "k1", "__SHARDINGKEY\x01g\x02")) == ["keys"]
    assert sum_difference(one, row_sum(b"Body", "", "k1 k2", "__SHARDINGKEY\x01g\x02")) == ["body", "tag"]


@pytest.mark.parametrize(("retry_failed", "remark"), [
    (False, "Find prepared transaction message failed: no half message at commitLogOffset 100"),
    (True, "Find prepared transaction message failed"),
    (False, "The producer group wrong"),  # Apache RocketMQ: another record at that position (a new store)
    (False, "The transaction state table offset wrong"),
    # Apache RocketMQ 5.5.0, a plain message at that position of a new store (fault suite, seed 4601)
    (False, 'java.lang.NullPointerException: Cannot invoke "String.equals(Object)" because "pgroupRead" is null, '
            "org.apache.rocketmq.broker.processor.EndTransactionProcessor.checkPrepareMessage"),
    # ... and the middle of a record there: a size read from it
    (False, "java.lang.IllegalArgumentException: newLimit < 0: (-1476395008 < 0), "
            "java.base/java.nio.Buffer.createLimitException(Buffer.java:395)"),
])
def test_the_remoting_client_reports_a_half_its_broker_does_not_hold_as_gone(retry_failed: bool, remark: str) -> None:
    # "Find prepared transaction message failed" used to be taken as "ended before"; brokers apply
    # a second END of a half still in their commit log, so it means the half is gone (a lost store)
    from rocketmq_spark.client import ClientConfig, RemotingClient
    from rocketmq_spark.client.connection import Reply
    from rocketmq_spark.remoting.codes import ResponseCode
    from rocketmq_spark.remoting.frame import RemotingCommand

    nothing_there = (ResponseCode.SYSTEM_ERROR, remark)

    class Conn:
        def send_many(self, reqs):  # noqa: ANN001, ANN202
            out = []
            for r in reqs:
                code, remark = nothing_there if r.ext_fields["msgId"] == "ID-1" else (ResponseCode.SUCCESS, None)
                reply = Reply()
                reply.set_result(RemotingCommand(code, remark=remark))
                out.append(reply)
            return out

    c = RemotingClient.__new__(RemotingClient)
    c.config = ClientConfig()
    c.names = NameServers(["127.0.0.1:9876"], c.config, lambda addr, what: Conn())  # type: ignore[arg-type,return-value]
    c.names.broker_addrs["broker-a"] = "127.0.0.1:10911"
    c.broker_addr = lambda broker, topic=None: "127.0.0.1:10911"  # type: ignore[method-assign]
    c._conn = lambda addr, what: Conn()  # type: ignore[method-assign]
    c.invoke = lambda addr, req, what: RemotingCommand(ResponseCode.SUCCESS)  # type: ignore[method-assign]
    txns = _txns(4)
    progress: list[int] = []
    applied: list[int] = []
    gone = c.end_transactions(txns, commit=True, on_progress=progress.append, retry_failed=retry_failed,
                              on_applied=applied.append)
    assert gone == [txns[1]] and progress == [1]  # applied: ID-0 only before it (ID-2, ID-3 answered too)
    assert applied == [0, 2, 3]  # each END answered as applied, past the gone one too


def test_the_grpc_client_reports_an_invalid_transaction_id_as_gone() -> None:
    # the embedded broker's gRPC service answers INVALID_TRANSACTION_ID for a half it does not
    # hold; it used to be taken as "ended before"
    from concurrent.futures import Future
    from types import SimpleNamespace

    from rocketmq_spark.client import ClientConfig, GrpcClient
    from rocketmq_spark.proto import pb

    def answer(req, timeout, metadata):  # noqa: ANN001, ANN202
        fut: Future = Future()
        code = pb.INVALID_TRANSACTION_ID if req.message_id == "ID-1" else pb.OK
        fut.set_result(pb.EndTransactionResponse(status=pb.Status(code=code)))
        return fut

    c = GrpcClient.__new__(GrpcClient)
    c.config, c._broker_endpoints = ClientConfig(), {"broker-a": "127.0.0.1:8081"}
    c.broker_addr = lambda broker, topic=None: "127.0.0.1:8081"  # type: ignore[method-assign]
    c.stub = lambda addr: SimpleNamespace(EndTransaction=SimpleNamespace(future=answer))  # type: ignore[method-assign]
    c.metadata = lambda: ()  # type: ignore[method-assign]
    txns = [t._replace(transaction_id=f"TX-{i}") for i, t in enumerate(_txns(4))]
    progress: list[int] = []
    applied: list[int] = []
    gone = c.end_transactions(txns, commit=True, on_progress=progress.append, retry_failed=False,
                              on_applied=applied.append)
    assert gone == [txns[1]] and progress == [1] and applied == [0, 2, 3]


class _HalfClient:
    """Takes a task's half messages without a broker: each stored at the next position."""

    class config:
        request_timeout_s = 5

    compresses_bodies = True

    def __init__(self) -> None:
        self.at = 0

    def message_queues(self, topic: str, **_: object) -> list[MessageQueue]:
        return [MessageQueue(topic, "broker-a", 0)]

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        return "127.0.0.1:10911"

    def start_producer(self, *a: object) -> None:
        pass

    def send_request(self, mq, entries, **kw):  # noqa: ANN001, ANN003, ANN201
        return entries

    def _answer(self):  # noqa: ANN202
        from concurrent.futures import Future

        fut: Future = Future()
        fut.set_result(None)
        return fut

    def send_async_many(self, reqs):  # noqa: ANN001, ANN201
        return [self._answer() for _ in reqs]

    def send_async(self, mq, req):  # noqa: ANN001, ANN201
        return self._answer()

    def check_sent(self, *a: object) -> None:
        pass

    def half_transaction(self, mq: MessageQueue, answer: object, msg_id: str) -> Txn:
        self.at += 1
        return Txn(mq.broker, mq.topic, self.at, 100 * self.at, msg_id)

    def close(self) -> None:
        pass


def test_a_task_reports_the_same_ids_and_checksums_for_the_same_rows_each_time(tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.options as sink_options
    import rocketmq_spark.sink.transactional as transactional
    import rocketmq_spark.sink.writer as writer
    from rocketmq_spark.sink.options import WriterOptions

    monkeypatch.setattr(sink_options, "connect", lambda *a, **k: _HalfClient())
    opts = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "T", "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})

    def rows(keys: str) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"body": [b"b0", b"b1"], "tag": ["t", None], "keys": [keys, None],
                                           "properties": [[("k", "v")], None]},
                                          schema=pa.schema([("body", pa.binary()), ("tag", pa.string()),
                                                            ("keys", pa.string()),
                                                            ("properties", pa.map_(pa.string(), pa.string()))]))

    first, again = writer.write_rows(opts, iter([rows("K")]), 9), writer.write_rows(opts, iter([rows("K")]), 9)
    assert first.sums == again.sums and len(first.sums) == 2 and first.nonce != again.nonce
    assert [t[4] for t in first.txns] == [t[4] for t in again.txns]  # the message ids
    other = writer.write_rows(opts, iter([rows("OTHER")]), 9)
    ids = [t[4] for t in first.txns]
    assert transactional.sum_difference(first.sums[ids[0]], other.sums[ids[0]]) == ["keys"]
    assert first.sums[ids[1]] == other.sums[ids[1]]
    # a row with a body only is summed alike on the fast path (only bodies in the batch)
    bodies = writer.write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": [b"b0", b"b1"]})]), 9)
    assert bodies.sums[ids[1]] == first.sums[ids[1]] == writer.row_sum(b"b1")


def test_a_rollback_the_broker_refuses_is_left_to_its_check_backs(fake, tmp_path, caplog) -> None:
    """Apache RocketMQ answered an abort's rollback, sent by position to a broker that had lost
    its store, with SYSTEM_ERROR (IllegalArgumentException "newLimit < 0"): the query failed
    though nothing was left to undo. A rollback that fails is logged; check-backs roll back
    any half no record names."""
    from rocketmq_spark.errors import BrokerError

    broker, opts, writer = fake

    def refuse(txns, *, commit, **kw):  # noqa: ANN001, ANN003, ANN202
        raise BrokerError(1, "java.lang.IllegalArgumentException: newLimit < 0", address="127.0.0.1:10911",
                          operation="rollback of transaction X")

    broker.end_transactions = refuse
    writer.abort_batch(opts, _txns(3), 4)  # before: BrokerError, the query failed
    assert "batch 4: rolling back its transactions failed" in caplog.text
    assert "roll those half messages back when they ask about them" in caplog.text


def test_a_store_prints_read_rides_out_a_busy_broker_and_a_refused_one_is_asked_once(caplog) -> None:
    import rocketmq_spark.sink.transactional as transactional
    from rocketmq_spark.errors import NoPermissionError, SystemBusyError

    class Refusing(FakeBroker):
        def __init__(self, errors: list[Exception]) -> None:
            super().__init__()
            self.errors, self.pulls = errors, 0

        def pull(self, mq: MessageQueue, at: int, n: int) -> PullResult:
            self.pulls += 1
            if self.errors:
                raise self.errors.pop(0)
            return super().pull(mq, at, n)

    busy = Refusing([SystemBusyError(2, "[TIMEOUT_CLEAN_QUEUE]broker busy", address="127.0.0.1:10911",
                                     operation="pull")])
    busy.stored[MQ] = ["OLD-0", "OLD-1"]
    assert transactional.store_prints(busy, {MQ: 2}) == {"broker-a": (MQ, 1, 1)} and busy.pulls == 2

    transactional._UNPRINTED.discard(("broker-a", "T"))
    refused = Refusing([NoPermissionError(16, "no permission to pull T", address="127.0.0.1:10911", operation="pull")])
    refused.stored[MQ] = ["OLD-0", "OLD-1"]
    try:
        with caplog.at_level(logging.WARNING, logger=transactional.__name__):
            assert transactional.store_prints(refused, {MQ: 2}) == {}
            assert transactional.store_prints(refused, {MQ: 2}) == {}  # not asked again
        assert refused.pulls == 1 and "told by its offsets alone" in caplog.text
    finally:
        transactional._UNPRINTED.discard(("broker-a", "T"))


def test_riding_out_waits_out_a_busy_broker_and_a_lost_connection_but_not_a_refusal() -> None:
    from rocketmq_spark.errors import NoPermissionError
    from rocketmq_spark.sink.transactional import riding_out

    faults: list[Exception] = [SystemBusyError(2, "[TIMEOUT_CLEAN_QUEUE]broker busy", address="127.0.0.1:10911",
                                               operation="max offset"),
                               ConnectionFailedError("127.0.0.1:10911", "max offset", "connection reset")]
    calls = []

    def read() -> int:
        calls.append(1)
        if faults:
            raise faults.pop(0)
        return 7

    assert riding_out(read, "reading the destination's offsets") == 7 and len(calls) == 3
    refusal = NoPermissionError(16, "no permission", address="127.0.0.1:10911", operation="max offset")

    def refused() -> int:
        calls.append(1)
        raise refusal

    with pytest.raises(NoPermissionError):
        riding_out(refused, "reading the destination's offsets")
    assert len(calls) == 4  # asked once: a refusal is not waited out
