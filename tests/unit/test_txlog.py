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
