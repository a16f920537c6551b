"""The benchmark suite's smoke run: ``python -m benchmarks --quick`` writes every suite's
table, JSON and PNG. It checks that results are written and well formed, never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = ("broker", "client_decode", "cluster", "spark_io", "scale", "peers", "latency")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.spark]


@pytest.mark.timeout(600)
def test_quick_run_writes_every_table_json_and_plot(tmp_path: str) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--results-dir", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=580, check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert f"{len(SUITES)} of {len(SUITES)} suites done" in out.stdout
    for name in SUITES:
        path = os.path.join(tmp_path, f"{name}-quick.json")
        with open(path) as f:
            doc = json.load(f)
        assert doc["benchmark"] == name
        assert doc["quick"] is True
        with open(os.path.join(tmp_path, f"{name}-quick.png"), "rb") as f:
            assert f.read(8) == PNG_MAGIC, f"{name}-quick.png is not a PNG"
    # the headline figures the notes quote are in the JSON
    with open(os.path.join(tmp_path, "spark_io-quick.json")) as f:
        spark_io = json.load(f)
    assert spark_io["ratios_rocketmq_to_synthetic"]["100B"] > 0
    assert {r["scenario"] for r in spark_io["sink"]} >= {"write at-least-once (Spark)", "write exactly-once (Spark)"}
    with open(os.path.join(tmp_path, "scale-quick.json")) as f:
        scale = json.load(f)
    assert [r["queues"] for r in scale["planning"]] == [8, 64, 512, 4096]
    assert len(scale["memory"]) == 2
    with open(os.path.join(tmp_path, "peers-quick.json")) as f:
        peers = json.load(f)
    sides = {(r["scenario"], r["side"].split(":")[0]) for r in peers["results"]}
    assert ("send", "official Producer.send") in sides and ("receive", "ours") in sides
    with open(os.path.join(tmp_path, "client_decode-quick.json")) as f:
        decode = json.load(f)
    assert decode["end_to_end"]["socket_mb_s"] > 0
    with open(os.path.join(tmp_path, "latency-quick.json")) as f:
        latency = json.load(f)
    rows = {r["source"]: r for r in latency["rows"]}
    assert set(rows) == {"floor", "embedded"}, rows
    for r in rows.values():
        assert r["received"] == r["sent"] > 0
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p99"] <= r["latency_ms"]["max"]
        assert r["batches"] > 0 and set(r["duration_ms"]) >= {"triggerExecution", "addBatch", "walCommit"}
    assert latency["targets"]["trigger_ratio_embedded_to_floor"]["value"] > 0
    assert latency["targets"]["p99_ms_embedded"]["value"] > 0
    assert set(latency["skipped"]) == {"real", "kafka"}
