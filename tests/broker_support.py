"""Starting the broker CLI as a separate process (for kill tests)."""

from __future__ import annotations

import json
import subprocess
import sys


def start_broker_process(data_dir: str, *extra: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """``rocketmq-spark broker`` on ephemeral ports; returns the process and its addresses."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocketmq_spark.cli", "broker", "--data-dir", data_dir,
         "--namesrv-port", "0", "--broker-port", "0", "--grpc-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # first line: JSON with the addresses
    if not line:
        proc.kill()
        raise AssertionError("broker process exited before printing its addresses")
    return proc, json.loads(line)
