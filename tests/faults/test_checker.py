"""The fault suite's checker on made-up outputs (every count it reports, each able to fail), its
send log, and its Parquet reader against what Spark itself reads from a file sink."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .checker import Copy, check_output, committed_parquet_files, read_parquet, reordered
from .workload import SendLog, body_of, id_of

pytestmark = pytest.mark.faults


def _log(acked: dict[int, str], unknown: set[int] = frozenset(), failed: set[int] = frozenset()) -> SendLog:  # type: ignore[assignment]
    return SendLog(acked=dict(acked), unknown=set(unknown), failed=set(failed))


def _copies(queue: str, ids: list[int | None], stored_ms: int | None = None) -> list[Copy]:
    return [Copy(queue, off, i, stored_ms) for off, i in enumerate(ids)]


def test_bodies_carry_their_id() -> None:
    assert id_of(body_of(42, 100)) == 42 and len(body_of(42, 100)) == 100
    assert id_of(body_of(7, 3)) == 7  # never shorter than the id
    assert id_of(b"hello") is None and id_of(None) is None and id_of("0000000012..") == 12


def test_reordered_names_what_comes_after_a_greater_one() -> None:
    assert reordered([1, 2, 3]) == []
    assert reordered([1, 3, 2, 4, 0]) == [2, 0]
    assert reordered([]) == []


def test_a_complete_output_has_nothing_to_report() -> None:
    log = _log({i: "broker-a:0" for i in range(10)})
    r = check_output("out", log, _copies("broker-a:0", list(range(10))), order="queue")
    assert (r.lost, r.duplicated, r.reordered, r.unexpected, r.garbled) == ([], {}, [], [], 0)
    assert (r.read, r.distinct) == (10, 10)


def test_lost_duplicated_unexpected_and_garbled_are_counted() -> None:
    log = _log({i: "broker-a:0" for i in range(10)}, unknown={10, 11, 12}, failed={13})
    found = [0, 1, 2, 2, 2, 4, 5, 6, 7, 8, 10, 11, 11, 13, 99, None]  # 3 and 9 missing
    r = check_output("out", log, _copies("broker-a:0", found))
    assert r.lost == [3, 9]
    assert r.duplicated == {2: 2, 11: 1} and r.duplicates == 3  # an unknown-outcome id twice is a duplicate
    assert r.unknown_found == 2  # 10 once, 11 twice; 12 absent: neither lost nor anything else
    assert r.unexpected == [13, 99]  # a failed send found anyway, an id never sent
    assert r.garbled == 1
    assert r.reordered is None  # no order asked for
    s = r.summary()
    assert (s["lost"], s["duplicated"], s["unexpected"], s["lost_ids"]) == (2, 3, 2, [3, 9])


def test_wiped_copies_are_not_lost_but_count_for_duplicates() -> None:
    log = _log({i: "broker-a:0" for i in range(6)})
    wiped = _copies("broker-a:0", [0, 1, 2])
    r = check_output("out", log, _copies("broker-a:0", [2, 3, 4, 5]), wiped=wiped)
    assert r.lost == [] and r.wiped == 3
    assert r.duplicated == {2: 1}  # read before the wipe and again after it


def test_a_row_written_again_after_a_store_wiped_at_once_took_it_is_a_rewrite_not_a_duplicate() -> None:
    # wipe-broker-now cuts the clients off as a commit has ENDs in flight: one applied whose answer
    # was lost, then lost with the store, is written again by the replay; once more after the
    # wipe is allowed, twice more (or twice now), or a copy stored before the wipe, is not
    log = _log({i: "broker-a:0" for i in range(8)})
    wiped = _copies("broker-a:0", [0, 1, 2, 3, 6, 7], stored_ms=900)
    # the wipe at 1,000 ms; 6 and 7 were written twice before it, one copy on each broker
    now = (_copies("broker-b:0", [0, 1, 1, 2, 4, 5], stored_ms=1500) + _copies("broker-b:1", [5], stored_ms=1500)
           + _copies("broker-b:2", [6], stored_ms=950) + _copies("broker-b:3", [7]))
    excused = dict.fromkeys([0, 1, 2, 3, 6, 7], 1000)
    r = check_output("out", log, now, wiped=wiped + _copies("broker-a:1", [2]), rewrite_excused=excused)
    assert r.rewritten == [0] and r.duplicated == {1: 2, 2: 2, 5: 1, 6: 1, 7: 1}
    assert r.summary()["rewritten"] == 1 and r.summary()["rewritten_ids"] == [0]
    # without the excuse (the wipe waited for the queries), every second copy is a duplicate
    assert check_output("out", log, now, wiped=wiped).duplicated == {0: 1, 1: 2, 2: 1, 5: 1, 6: 1, 7: 1}


def test_losses_the_brokers_caused_are_told_apart() -> None:
    log = _log({i: "broker-a:0" for i in range(5)})
    r = check_output("out", log, _copies("broker-a:0", [0, 1]), broker_lost={3, 4})
    assert r.lost == [2, 3, 4] and r.lost_by_broker == [3, 4]


def test_source_order_is_checked_per_queue_over_acked_ids() -> None:
    log = _log({0: "a:0", 1: "a:1", 2: "a:0", 3: "a:1", 4: "a:0"}, unknown={5})
    copies = [Copy("a:0", 0, 0), Copy("a:0", 1, 4), Copy("a:0", 2, 2), Copy("a:0", 3, 5),
              Copy("a:1", 0, 1), Copy("a:1", 1, 3)]
    r = check_output("A", log, copies, order="queue")
    assert r.reordered == [2]  # 2 after 4 in queue a:0; the unknown 5 is not judged


def test_group_order_follows_first_copies_in_each_destination_queue() -> None:
    # source: group a:0 holds ids 0, 2, 4 in that order; group a:1 holds 3 then 1 (a send whose
    # answer timed out stored after a later one: the source's order, not the ids', is promised)
    source = {0: ("a:0", (0, 0)), 2: ("a:0", (0, 1)), 4: ("a:0", (1, 0)), 3: ("a:1", (0, 0)), 1: ("a:1", (0, 1))}
    log = _log({i: q for i, (q, _) in source.items()})
    # c:0 gets group a:0 in order with a replay (2 again, 0 again: later copies are duplicates,
    # not disorder), group a:1 out of order; c:1 gets nothing of theirs but a duplicate
    c0 = _copies("c:0", [0, 2, 0, 2, 4, 1, 3])
    c1 = _copies("c:1", [4])
    r = check_output("C", log, c0 + c1, source=source, order="group")
    assert r.reordered == [3]  # id 4, at offset 0 after a wipe of its broker, still comes after 2
    assert r.duplicated == {0: 1, 2: 1, 4: 1}
    assert r.groups_split == 0  # 4 in c:1 is not a first copy
    r2 = check_output("C", log, _copies("c:0", [0, 3, 1]) + _copies("c:1", [2, 4]), source=source, order="group")
    assert r2.reordered == [] and r2.groups_split == 1  # group a:0 first seen in both queues, a:1 in one


def test_the_send_log_reads_outcomes_and_skips_a_torn_line(tmp_path: Path) -> None:
    p = tmp_path / "sends.jsonl"
    lines = [{"first": 0, "n": 3, "queue": "broker-a:0", "status": "acked", "offset": 7},
             {"first": 3, "n": 2, "queue": "broker-b:1", "status": "unknown"},
             {"first": 5, "n": 2, "queue": "broker-b:1", "status": "failed"}]
    p.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"first": 7, "n"')
    log = SendLog.load(p)
    assert log.acked == {0: "broker-a:0", 1: "broker-a:0", 2: "broker-a:0"}
    assert log.acked_offsets == {0: 7, 1: 8, 2: 9}
    assert (log.unknown, log.failed, log.bad_lines) == ({3, 4}, {5, 6}, 1)


def _entry(path: str, action: str = "add") -> str:
    return json.dumps({"path": f"file://{path}", "size": 1, "isDir": False, "modificationTime": 0,
                       "blockReplication": 1, "blockSize": 1, "action": action})


def test_committed_files_come_from_the_last_compaction_and_the_batches_after_it(tmp_path: Path) -> None:
    meta = tmp_path / "_spark_metadata"
    meta.mkdir()
    (meta / "0").write_text("v1\n" + _entry("/d/old") + "\n")  # compacted into 1.compact
    (meta / "1.compact").write_text("v1\n" + _entry("/d/a") + "\n" + _entry("/d/b") + "\n")
    (meta / "2").write_text("v1\n" + _entry("/d/c%20d") + "\n" + _entry("/d/b", "delete") + "\n")
    (meta / ".2.crc").write_text("x")
    (meta / "3.tmp").write_text("v1\n" + _entry("/d/uncommitted") + "\n")
    assert committed_parquet_files(str(tmp_path)) == ["/d/a", "/d/c d"]
    (meta / "4").write_text("v1\n" + _entry("/d/e") + "\n")  # 3 missing: the log is broken
    with pytest.raises(RuntimeError, match="batch 3 is missing"):
        committed_parquet_files(str(tmp_path))
    assert committed_parquet_files(str(tmp_path / "nothing-here")) == []


@pytest.mark.spark
def test_parquet_is_read_as_spark_reads_a_file_sink(spark: Any, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    for b in range(5):
        (inp / f"part-{b}.json").write_text("".join(
            json.dumps({"id": b * 10 + i, "broker": "broker-a", "queueId": b % 2, "queueOffset": i}) + "\n"
            for i in range(10)))
    key = "spark.sql.streaming.fileSink.log.compactInterval"
    before = spark.conf.get(key)
    spark.conf.set(key, "2")  # five batches: 0, 1.compact, 2, 3.compact, 4
    try:
        q = (spark.readStream.schema("id BIGINT, broker STRING, queueId INT, queueOffset BIGINT")
             .option("maxFilesPerTrigger", 1).json(str(inp))
             .writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination()
    finally:
        spark.conf.set(key, before)
    assert {"1.compact", "3.compact", "4"} <= set(os.listdir(out / "_spark_metadata"))
    # a file a killed task left behind: in the directory, not in the log
    pq.write_table(pa.table({"id": [999], "broker": ["x"], "queueId": [0], "queueOffset": [0]}),
                   out / "part-stray.parquet")
    ours = sorted(c.id for c in read_parquet(str(out)) if c.id is not None)
    theirs = sorted(r.id for r in spark.read.parquet(str(out)).select("id").collect())
    assert ours == theirs == list(range(50))
