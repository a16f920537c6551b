"""The exactly-once batch record: what a check-back is answered at each stage of a batch."""

from __future__ import annotations

from rocketmq_spark.model import Txn
from rocketmq_spark.sink.txlog import TxLog


def test_check_back_answers_follow_the_record(tmp_path) -> None:
    log = TxLog(str(tmp_path))
    a = Txn("broker-a", "T", 0, 100, "ID-A")
    assert log.decide(3, "ID-A") is None  # undecided: no answer, the broker asks again
    log.record(3, [a])
    assert (log.decide(3, "ID-A"), log.decide(3, "ID-B")) == (True, False)  # in the record or not
    assert log.decide(2, "ID-OLD") is False  # an older batch never recorded: a later one is
    assert not log.ended(3)
    log.mark_ended(3)
    # once its ENDs were answered a check of a recorded message is not answered: the broker may not
    # have recorded the END yet (op messages go out in batches) and a second commit would store the
    # message twice; a stray half message (a dead task attempt's) is still rolled back at once
    assert log.ended(3) and log.decide(3, "ID-A") is None and log.decide(3, "ID-B") is False
    assert log.read(3) == {"ID-A"} and log.txns(3) == [a]


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


def test_a_check_back_commit_and_a_replay_take_turns(tmp_path) -> None:
    log = TxLog(str(tmp_path))
    a, b = Txn("broker-a", "T", 0, 100, "ID-A"), Txn("broker-a", "T", 1, 200, "ID-B")
    log.record(4, [a, b])
    assert log.decide(4, "ID-A") is True  # the driver died before ending it: a check-back commits it
    assert log.begin_ending(4) == {"ID-A"}  # the replay leaves that one out ...
    assert log.decide(4, "ID-B") is None  # ... and, once begun, sends every other END itself
    assert log.begin_ending(4) == {"ID-A"}  # a second replay (the first died too) sees the same


def test_a_check_back_for_another_sinks_half_message_is_not_answered(tmp_path) -> None:
    # two queries in one producer group: a broker may ask either about the other's half messages
    from rocketmq_spark.sink.writer import TX_TAG, check_decision

    ours, theirs = TxLog(str(tmp_path / "q1")), TxLog(str(tmp_path / "q2"))
    assert ours.sink_id != theirs.sink_id and ours.sink_id == TxLog(str(tmp_path / "q1") + "/").sink_id
    ours.record(7, [])  # a later batch recorded: an older one of ours is rolled back ...
    assert check_decision(ours, {TX_TAG: f"2:0:0:{ours.sink_id}"}, "ID-S") is False
    assert check_decision(ours, {TX_TAG: f"2:0:0:{theirs.sink_id}"}, "ID-T") is None  # ... not theirs


def test_a_replay_does_not_commit_again_what_check_backs_committed(tmp_path, monkeypatch) -> None:
    import rocketmq_spark.sink.writer as writer
    from rocketmq_spark.sink.options import WriterOptions

    ended: list[tuple[list[str], bool]] = []

    class Client:
        def end_transactions(self, txns, *, commit, producer_group, on_progress=None):  # noqa: ANN001
            ended.append(([t.msg_id for t in txns], commit))
            if on_progress is not None:
                on_progress(len(txns))

        def close(self) -> None:
            pass

    monkeypatch.setattr(writer, "connect", lambda *a, **k: Client())
    opts = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "T", "delivery": "exactly-once",
                                "checkpointLocation": str(tmp_path)})
    txns = [Txn("broker-a", "T", 0, 100 * i, f"ID-{i}") for i in range(5)]
    log = TxLog(str(tmp_path))
    log.record(9, txns)
    log.mark_progress(9, 2)  # the first commit's driver died with ID-0 and ID-1 ended
    assert log.decide(9, "ID-3") is True  # then a check-back committed ID-3
    writer.commit_batch(opts, txns, 9)
    assert ended[0] == (["ID-2", "ID-4"], True)
    assert log.ended(9) and log.decide(9, "ID-2") is None
