"""Driver.read_up_to: where a query stands, from its listener's progress and its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rocketmq_spark.model import MessageQueue

from .driver import Driver

pytestmark = pytest.mark.faults

B0 = MessageQueue("FaultsA", "broker-b", 0)


def _driver(tmp_path: Path) -> Driver:
    return Driver(tmp_path, {}, lambda kind, detail: None)


def _end(offset: int) -> str:
    return json.dumps({"FaultsA": {"broker-b:0": offset}})


def _progress(d: Driver, batch: int, offset: int) -> None:
    (d.progress_dir / "alo.json").write_text(json.dumps({"batch": batch, "end": _end(offset), "t": 0.0}))


def _checkpoint(d: Driver, batch: int, offset: int, committed: bool = True) -> None:
    """As Spark writes them: the offset log's version, batch metadata and the source's end; the
    commit log's entry once the batch is done."""
    ckpt = d.out_dir / "checkpoints" / "alo"
    (ckpt / "offsets").mkdir(parents=True, exist_ok=True)
    (ckpt / "commits").mkdir(parents=True, exist_ok=True)
    (ckpt / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{_end(offset)}')
    if committed:
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_a_batch_committed_after_the_last_progress_counts(tmp_path: Path) -> None:
    """busy4: the driver died between batch 4's commit and its progress; the next driver had
    nothing new and ran no batch, so only the checkpoint says the query reached 1110."""
    d = _driver(tmp_path)
    _progress(d, 3, 1080)
    _checkpoint(d, 3, 1080)
    _checkpoint(d, 4, 1110)
    assert d.read_up_to("alo") == {B0: 1110}


def test_a_batch_planned_but_not_committed_does_not_count(tmp_path: Path) -> None:
    d = _driver(tmp_path)
    _progress(d, 3, 1080)
    _checkpoint(d, 3, 1080)
    _checkpoint(d, 4, 1110, committed=False)
    assert d.read_up_to("alo") == {B0: 1080}
    assert d.last_committed("alo") == (3, _end(1080))


def test_progress_ahead_of_what_the_checkpoint_shows_counts(tmp_path: Path) -> None:
    d = _driver(tmp_path)
    _checkpoint(d, 2, 900)
    _progress(d, 3, 1080)
    assert d.read_up_to("alo") == {B0: 1080}


def test_nothing_yet(tmp_path: Path) -> None:
    d = _driver(tmp_path)
    assert d.read_up_to("alo") == {}
    assert d.last_committed("alo") is None
