"""The offsets JSON form: one value object for the checkpoint, the options, the committer and the CLI."""

from __future__ import annotations

import pickle

import pytest

from rocketmq_spark.model import MessageQueue
from rocketmq_spark.offsets import Offsets, OffsetsFormatError


def test_canonical_order_and_round_trip() -> None:
    offs = Offsets({MessageQueue("t", "broker-b", 1): 5, MessageQueue("t", "broker-a", 10): 1,
                    MessageQueue("a", "broker-a", 0): 3, MessageQueue("t", "broker-a", 2): 7})
    assert offs.dumps() == '{"a": {"broker-a:0": 3}, "t": {"broker-a:2": 7, "broker-a:10": 1, "broker-b:1": 5}}'
    assert Offsets.from_json(offs.dumps()) == offs == Offsets.from_json(offs.to_json())
    assert pickle.loads(pickle.dumps(offs)) == offs and offs.topics == ["a", "t"]


@pytest.mark.parametrize("text, key, words", [
    ("{not json", None, "not JSON"),
    ("[1]", None, "not an object"),
    ('{"t": [1]}', "", "topic 't' maps to a list"),
    ('{"t": {"broker-a": 1}}', "broker-a", "not 'broker:queueId'"),
    ('{"t": {"broker-a:-1": 1}}', "broker-a:-1", "not 'broker:queueId'"),
    ('{"t": {"broker-a:\\u0661": 1}}', "broker-a:\u0661", "not 'broker:queueId'"),  # an Arabic-Indic 1
    ('{"t": {"broker-a:0": true}}', "broker-a:0", "an integer >= 0"),
    ('{"t": {"broker-a:0": -1}}', "broker-a:0", "an integer >= 0"),
])
def test_what_is_not_the_form_is_refused_naming_the_entry(text: str, key: str | None, words: str) -> None:
    with pytest.raises(OffsetsFormatError, match=words) as err:
        Offsets.from_json(text)
    assert err.value.queue_key == key


def test_options_take_earliest_and_latest() -> None:
    got = Offsets.from_json('{"t": {"broker-a:0": -2, "broker-a:1": -1}}', special=True)
    assert list(got.values()) == [-2, -1]
    with pytest.raises(OffsetsFormatError, match=">= -2"):
        Offsets.from_json('{"t": {"broker-a:0": -3}}', special=True)


def test_batch_end_marks_round_trip_and_leave_the_ends_and_resets_as_they_were() -> None:
    from rocketmq_spark.offsets import batch_end_json, marks_of, split_batch_end

    a0, b1 = MessageQueue("t", "broker-a", 0), MessageQueue("t", "broker-b", 1)
    js = batch_end_json({a0: 10, b1: 4}, {a0: 0}, {a0: (9, 1718000000123)})
    assert js["@marks"] == {"t": {"broker-a:0": [9, 1718000000123]}}
    assert split_batch_end(js) == (Offsets({a0: 10, b1: 4}), Offsets({a0: 0}))
    assert marks_of(js) == {a0: (9, 1718000000123)}
    only_marks = batch_end_json({a0: 10}, {}, {a0: (9, 1)})
    assert split_batch_end(only_marks) == (Offsets({a0: 10}), Offsets())  # the committer reads these
    assert marks_of(Offsets({a0: 10}).dumps()) == {}
    with pytest.raises(OffsetsFormatError, match=r"mark \[9\] of queue 'broker-a:0'"):
        marks_of({"t": {"broker-a:0": 10}, "@marks": {"t": {"broker-a:0": [9]}}})
