"""The exactly-once batch record: what a check-back is answered at each stage of a batch."""

from __future__ import annotations

import pyarrow as pa
import pytest

from rocketmq_spark.errors import RequestTimeoutError
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
    from rocketmq_spark.sink.writer import TX_TAG, check_decision

    log = TxLog(str(tmp_path))
    log.record(3, [])
    assert check_decision(log, {TX_TAG: "-1:0:0"}, "ID-W") is None
    assert check_decision(log, {TX_TAG: "2:0:0"}, "ID-S") is False  # an older stream batch: rolled back
    assert check_decision(log, {"other": "x"}, "ID-X") is None  # not one of ours


def test_a_check_back_for_another_sinks_half_message_is_not_answered(tmp_path) -> None:
    # two queries in one producer group: a broker may ask either about the other's half messages
    from rocketmq_spark.sink.writer import TX_TAG, check_decision

    ours, theirs = TxLog(str(tmp_path / "q1")), TxLog(str(tmp_path / "q2"))
    assert ours.sink_id != theirs.sink_id and ours.sink_id == TxLog(str(tmp_path / "q1") + "/").sink_id
    ours.record(7, [])  # a later batch recorded: an older one of ours is rolled back ...
    assert check_decision(ours, {TX_TAG: f"2:0:0:{ours.sink_id}"}, "ID-S") is False
    assert check_decision(ours, {TX_TAG: f"2:0:0:{theirs.sink_id}"}, "ID-T") is None  # ... not theirs


class FakeBroker:
    """A broker as the commit sees it, without sockets: each committed half message becomes a
    message in queue 0 of its topic; ``lose_after`` makes an END past that many applied but its
    answer lost (a timeout), once."""

    def __init__(self) -> None:
        self.stored: dict[MessageQueue, list[str]] = {}
        self.ends: list[list[str]] = []
        self.lose_after: int | None = None

    def apply(self, txns) -> None:  # noqa: ANN001
        for t in txns:
            self.stored.setdefault(MessageQueue(t.topic, t.broker, 0), []).append(t.msg_id)

    def message_queues(self, topic: str, **_: object) -> list[MessageQueue]:
        return [mq for mq in self.stored if mq.topic == topic] or [MessageQueue(topic, "broker-a", 0)]

    def max_offsets(self, mqs) -> dict:  # noqa: ANN001
        return {mq: len(self.stored.get(mq, [])) for mq in mqs}

    def offset_ranges(self, mqs) -> dict:  # noqa: ANN001
        return {mq: (0, len(self.stored.get(mq, []))) for mq in mqs}

    def pull(self, mq: MessageQueue, at: int, n: int) -> PullResult:
        ids = self.stored.get(mq, [])[at:at + n]
        return PullResult("FOUND" if ids else "NO_NEW_MSG", at + len(ids), 0, len(self.stored.get(mq, [])),
                          messages=tuple(ids))

    def rows(self, mq, results, end, columns):  # noqa: ANN001
        return pa.RecordBatch.from_pydict({"messageId": [m for r in results for m in r.messages]})

    def end_transactions(self, txns, *, commit, producer_group, on_progress=None, retry_failed=True):  # noqa: ANN001
        txns = list(txns)
        self.ends.append([t.msg_id for t in txns])
        if commit and self.lose_after is not None and len(txns) > self.lose_after:
            k, self.lose_after = self.lose_after, None
            self.apply(txns[:k + 1])  # the END at k was applied, its answer lost
            if on_progress is not None and k:
                on_progress(k)
            raise RequestTimeoutError("127.0.0.1:10911", "commit of transactions", "no response within 10s")
        if commit:
            self.apply(txns)
        if on_progress is not None and txns:
            on_progress(len(txns))

    def close(self) -> None:
        pass


@pytest.fixture()
def fake(monkeypatch, tmp_path):  # noqa: ANN201
    import rocketmq_spark.sink.writer as writer
    from rocketmq_spark.sink.options import WriterOptions

    broker = FakeBroker()
    monkeypatch.setattr(writer, "connect", lambda *a, **k: broker)
    monkeypatch.setattr(writer, "_SETTLE_S", 0.0)
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
