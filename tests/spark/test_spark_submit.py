"""spark-submit of examples/orders_pipeline.py to a standalone master + worker on loopback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pyspark
import pytest

from brokers import wait_until  # tests/ is on sys.path through conftest
from rocketmq_spark.codec import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_HOME = os.path.dirname(pyspark.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, deadline_s: float) -> bool:
    def listening() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    return wait_until(listening, deadline_s, 0.2)


@pytest.fixture()
def standalone(tmp_path) -> Iterator[str]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("a standalone Spark cluster needs Java")
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOG_DIR": str(tmp_path / "logs"), "SPARK_WORKER_DIR": str(tmp_path / "work")}
    port = _free_port()
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(_free_port())],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "master.log", "w"))
    procs = [master]
    try:
        assert _wait_port(port, 90), (tmp_path / "master.log").read_text()[-2000:]
        url = f"spark://127.0.0.1:{port}"
        worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                   "--webui-port", str(_free_port()), "--cores", "2", "--memory", "1g"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "worker.log", "w"))
        procs.append(worker)
        yield url
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def test_spark_submit_pipeline_on_standalone_cluster(standalone, broker, client, tmp_path) -> None:
    topic, group = "SUBMIT_ORDERS", "submit-etl"
    qs = client.message_queues(topic)
    for i in range(60):
        body = json.dumps({"orderId": i, "customer": f"c{i % 3}", "amount": 1.5}).encode()
        client.send_batch(qs[i % 4], [BatchEntry(body, encode_properties({"TAGS": "paid"}))])
    out = tmp_path / "out"
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    proc = subprocess.run(
        [os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", standalone,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.sql.shuffle.partitions=2",
         os.path.join(ROOT, "examples", "orders_pipeline.py"),
         "--namesrv", broker.namesrv_addr, "--topic", topic, "--group", group, "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = {}
    for line in proc.stdout.splitlines():  # the pipeline's df.show(): |customer|orders|amount|
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("c") and cells[1].isdigit():
            table[cells[0]] = (int(cells[1]), float(cells[2]))
    assert table == {"c0": (20, 30.0), "c1": (20, 30.0), "c2": (20, 30.0)}, proc.stdout[-2000:]
    deadline = time.monotonic() + 30
    while [client.query_consumer_offset(group, m) for m in qs] != [15] * 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [client.query_consumer_offset(group, m) for m in qs] == [15] * 4
