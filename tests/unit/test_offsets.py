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
