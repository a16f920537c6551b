"""Through Spark Connect, as a new user tries it: the server from pyspark's own sbin
(``start-connect-server.sh``; pyspark ships the spark-connect jar), a client that connects with
``SparkSession.builder.remote("sc://...")`` and registers the source with
``spark.dataSource.register(RocketMQDataSource)``, then a batch read, a batch write and an
AvailableNow stream into the memory sink, and the group's offsets on the broker afterwards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from brokers import wait_until
from real_rocketmq import _free_port
from rocketmq_spark.codec import BatchEntry, decode_records, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
CLIENT = Path(__file__).with_name("connect_client.py")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server (local[2]) on loopback; its Python workers run this interpreter,
    which imports rocketmq_spark."""
    work = tmp_path_factory.mktemp("connect")
    port = _free_port()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(work), "SPARK_PID_DIR": str(work)}
    log = work / "server.log"
    # --wait: in the foreground, so the server is this process's child and ends with its group
    cmd = [str(SPARK_HOME / "sbin" / "start-connect-server.sh"), "--wait", "--master", "local[2]",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2"]
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work,
                                  start_new_session=True)
    try:
        up = wait_until(lambda: _listening(port) or server.poll() is not None, timeout_s=120, every_s=0.3)
        assert up and server.poll() is None, log.read_text()[-3000:]
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)  # the script's shell and the JVM it started
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(10)


def test_batch_read_write_and_available_now_stream_through_spark_connect(connect_url, broker, client, tmp_path) -> None:
    src, dst, group = "CONNECT_SRC", "CONNECT_DST", "g_connect"  # topics are created on first use
    qs = client.message_queues(src)
    for i in range(20):
        client.send_batch(qs[i % 4], [BatchEntry(b"c-%d" % i, encode_properties({"TAGS": f"t{i % 2}"}))])
    run = subprocess.run([sys.executable, str(CLIENT), connect_url, broker.namesrv_addr, src, dst, group,
                          str(tmp_path / "ck")], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])

    assert got["session"] == "pyspark.sql.connect.session"
    assert got["batch"] == sorted([f"c-{i}", i % 4, i // 4, f"t{i % 2}"] for i in range(20))

    written = [rec for q in client.message_queues(dst) for rec in decode_records(client.pull(q, 0, 32).body)]
    assert sorted((r.payload(), r.tags) for r in written) == sorted((b"w-%d" % i, "connect") for i in range(6))

    assert got["stream_error"] is None
    assert got["stream_batches"] == [8, 8, 4]
    assert got["stream_bodies"] == sorted(f"c-{i}" for i in range(20))
    committed = {q.key: client.query_consumer_offset(group, q) for q in qs}
    assert committed == got["stream_last_end"] == {q.key: 5 for q in qs}

    [warning] = got["register_warnings"]
    assert "pyspark's own DataSource registration" in warning
