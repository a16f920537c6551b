"""The fault-injection suite's short, bounded run on each broker (issue 29): a producer with a
send log -> topic A on two brokers -> three Spark streaming queries (Parquet, topic B
exactly-once, topic C at-least-once) while faults of every kind are injected on a fixed seed;
then the checker reads everything back. Lost must be 0 everywhere, duplicates 0 in Parquet and
topic B, order kept where promised; topic C's duplicates are reported.

A failure prints the table and the command that replays the schedule
(``python -m tests.faults run ...``, see tests/faults/__main__.py for the long version).
The partition fault needs root (a network namespace): without it the run goes on without
that fault and the test then skips saying why (under CI=true it fails instead).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from brokers import skip_or_fail
from real_rocketmq import java_available

from .suite import DEFAULT_FAULTS, SuiteConfig, run_suite

pytestmark = [pytest.mark.faults, pytest.mark.integration, pytest.mark.spark, pytest.mark.reliability,
              pytest.mark.slow]

#: fixed seeds: a failure replays with the printed command. The schedule runs every kind once
#: in a seeded order, then kinds at random, for MINUTES.
SEEDS = {"embedded": 2911, "real": 2912}
MINUTES = 1.5
#: (kind real is the suite's Apache RocketMQ release, real_rocketmq.VERSION: 5.5.0 unless
#: ROCKETMQ_SPARK_REAL_VERSION says otherwise; ``--release`` of ``python -m tests.faults`` picks another)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["embedded", "real"])
def test_nothing_is_lost_or_duplicated_under_faults(kind: str, tmp_path: Path, soak: bool) -> None:
    if kind == "real":
        missing = java_available()
        if missing:
            skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    # hold faults shorter than the reader's brokerDownTimeoutMs (30 s) and the name server's
    # broker timeout (120 s): these faults must be ridden out, not fail the query
    cfg = SuiteConfig(broker=kind, seed=SEEDS[kind], minutes=MINUTES * (6 if soak else 1), faults=DEFAULT_FAULTS,
                      out=tmp_path, rate=100, hold_s=(2.0, 6.0), gap_s=(1.0, 3.0), concurrency=2)
    print(f"fault suite on {kind}: seed {cfg.seed}; replay: {cfg.command()}")
    result = run_suite(cfg)
    print(result.table)
    assert result.doc["drained"], result.table
    injected = result.doc["faults_injected"]
    assert sum(injected.values()) >= 8, f"too few faults landed:\n{result.table}"
    outputs = result.outputs
    assert set(outputs) == {"topic A (source)", "parquet", "topic B (exactly-once)", "topic C (at-least-once)"}
    for name, r in outputs.items():
        assert r.lost == [], f"{name}: lost {len(r.lost)}\n{result.table}"
        assert r.unexpected == [] and r.garbled == 0, f"{name}\n{result.table}"
    for name in ("topic A (source)", "parquet", "topic B (exactly-once)"):
        assert outputs[name].duplicated == {}, f"{name}: duplicates\n{result.table}"
    assert outputs["topic A (source)"].reordered == [] and outputs["topic C (at-least-once)"].reordered == [], \
        result.table
    # the pipeline had work under the faults: at least half of what the producer's rate gives in
    # the time it was allowed to send (a wipe-broker pauses it until the queries caught up,
    # which takes longer on a loaded machine)
    floor = max(1000, int(0.5 * cfg.rate * result.doc["producer_active_s"]))
    assert outputs["topic A (source)"].distinct >= floor, \
        f"topic A holds {outputs['topic A (source)'].distinct} distinct ids, fewer than the floor {floor} " \
        f"(half of {cfg.rate:g} msgs/s for the {result.doc['producer_active_s']:g} s the producer sent)\n" \
        f"{result.table}"
    assert result.ok, result.table
    if result.skipped:
        skip_or_fail("; ".join(f"fault {k} not run: {why}" for k, why in result.skipped.items()))
