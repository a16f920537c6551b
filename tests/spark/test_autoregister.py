"""format("rocketmq") with no register() call: Spark finds the installed pyspark_rocketmq module.

Spark scans sys.path for top-level ``pyspark_*`` modules. An editable install exposes
packages through an import hook that this scan cannot see, so the test takes the built wheel
installed into a directory (the ``installed_copy`` fixture) and runs a plain SparkSession with
it on PYTHONPATH, as a user's installation would be.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rocketmq_spark.codec import BatchEntry

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

SCRIPT = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
from pyspark.sql import SparkSession
import rocketmq_spark
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
n = (spark.read.format("rocketmq").option("namesrvAddr", sys.argv[1]).option("topic", sys.argv[2])
     .load().count())
print("COUNT", n, rocketmq_spark.__file__)
spark.stop()
"""


def test_installed_package_registers_rocketmq_without_register(broker, client, tmp_path, installed_copy) -> None:
    q = client.message_queues("AUTO_REG")[0]
    client.send_batch(q, [BatchEntry(b"a"), BatchEntry(b"b"), BatchEntry(b"c")])
    site = installed_copy
    assert (site / "pyspark_rocketmq" / "__init__.py").exists()
    env = {**os.environ, "PYTHONPATH": str(site), "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, "-c", SCRIPT, broker.namesrv_addr, "AUTO_REG"], capture_output=True,
                         text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("COUNT"))
    _, count, path = line.split(" ", 2)
    assert count == "3"
    assert path.startswith(str(site))  # the installed copy, not the working tree
