"""Driving the npm client ali-ons (tests/integration/alions/roundtrip.js) from tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from rocketmq_spark.codec import SysFlag

ALIONS_DIR = Path(__file__).resolve().parent / "integration" / "alions"
ROUNDTRIP_JS = ALIONS_DIR / "roundtrip.js"

#: ali-ons compresses bodies of at least this many bytes (compressMsgBodyOverHowmuch).
ALIONS_COMPRESS_THRESHOLD = 4 * 1024
SYS_FLAG_COMPRESSED = int(SysFlag.COMPRESSED)

NODE_TIMEOUT_S = 60
CONSUME_TIMEOUT_MS = 30_000

#: Keep ali-ons quick: short long-poll suspension (so close() does not wait on
#: parked pulls of empty queues) and frequent rebalances / name-server polls.
NODE_ENV = {
    "ALIONS_SUSPEND_MS": "1000",
    "ALIONS_PULL_TIMEOUT_MS": "5000",
    "ALIONS_REBALANCE_MS": "1000",
    "ALIONS_POLL_NAMESRV_MS": "1000",
    "ALIONS_CLOSE_TIMEOUT_MS": "10000",
}


# -- helpers ------------------------------------------------------------------------


def ensure_alions() -> Path:
    """node + installed ali-ons; skip when node/npm are not available."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if p is None)
        pytest.skip(f"ali-ons interop tests need node and npm on PATH ({missing} not found)")
    if not (ALIONS_DIR / "node_modules" / "ali-ons").is_dir():
        try:
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=ALIONS_DIR, check=True,
                           capture_output=True, text=True, timeout=300)
        except subprocess.CalledProcessError as exc:
            pytest.fail(f"`npm ci` in {ALIONS_DIR} failed (exit {exc.returncode}):\n{exc.stderr}", pytrace=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"`npm ci` in {ALIONS_DIR} did not finish in {exc.timeout}s:\n{exc.stderr!r}",
                        pytrace=False)
    return ALIONS_DIR


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def _node(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node is not None
    env = {**os.environ, **NODE_ENV}
    try:
        return subprocess.run([node, str(ROUNDTRIP_JS), *args], check=False, cwd=ALIONS_DIR, input=stdin,
                              capture_output=True, text=True, timeout=NODE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        pytest.fail(f"node roundtrip.js {' '.join(args)} did not finish in {NODE_TIMEOUT_S}s; stderr:\n{err}",
                    pytrace=False)


def alions_produce(namesrv: str, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    proc = _node([namesrv, topic, "produce"], stdin=json.dumps(messages))
    assert proc.returncode == 0, f"ali-ons produce failed (exit {proc.returncode}); stderr:\n{proc.stderr}"
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert len(results) == len(messages), f"{len(results)} send results for {len(messages)} messages:\n" \
                                          f"{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in results:
        assert r["status"] == "SEND_OK", f"send result {r}; stderr:\n{proc.stderr}"
    return results


def alions_consume(namesrv: str, topic: str, group: str, count: int) -> list[dict[str, Any]]:
    proc = _node([namesrv, topic, "consume", group, str(count), str(CONSUME_TIMEOUT_MS)])
    assert proc.returncode == 0, f"ali-ons consume failed (exit {proc.returncode}); stderr:\n{proc.stderr}"
    got = json.loads(proc.stdout)
    assert len(got) == count, f"ali-ons consumed {len(got)} of {count}; stderr:\n{proc.stderr}"
    return got
