"""Apache Kafka, the peer Spark users measure streaming sources against: one KRaft node from
Maven Central on loopback, and the jars of Spark's own Kafka source (``spark-sql-kafka-0-10``).

    jars, version = connector_jars()        # for spark.jars; version may differ from pyspark's
    with Kafka(workdir) as k:               # formats the log directory, starts kafka.Kafka
        k.bootstrap                         # "127.0.0.1:<port>"

Both are fetched by Maven into the cache the real RocketMQ broker uses (``tests/real_rocketmq``:
``$ROCKETMQ_SPARK_CACHE`` or ``~/.cache/rocketmq-spark``), never into the repository.

Facts this relies on (checked here against Kafka 4.1.1 and Spark 4.3.0):
- a KRaft node needs its log directory formatted first (``kafka.tools.StorageTool format``
  with a cluster id and the same properties file); a static ``controller.quorum.voters``
  makes a one-node quorum without ``--standalone``;
- Maven Central served here has no ``spark-sql-kafka-0-10_2.13`` for Spark 4.3.0; the 4.2.0
  connector loads in Spark 4.3.0 and reads and writes correctly (the counts are checked by
  every scenario), so the newest served version is used and named in the results;
- of the connector's runtime dependencies only those pyspark does not ship go on spark.jars
  (hadoop-client, scala-library, slf4j, lz4 and snappy are Spark's own).
"""

from __future__ import annotations

import base64
import os
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path
from types import ModuleType

from ._brokers import tests_on_path

__all__ = ["KAFKA_VERSION", "Kafka", "connector_jars"]

KAFKA_VERSION = "4.1.1"
#: the Kafka source is tried at pyspark's own version first, then at these (newest first)
CONNECTOR_FALLBACKS = ("4.2.0",)
_START_TIMEOUT_S = 90.0


def _real_rocketmq() -> ModuleType:
    """tests/real_rocketmq.py: its Maven fetch and cache."""
    tests_on_path()
    import real_rocketmq

    return real_rocketmq


def kafka_jars() -> Path:
    """The directory of Kafka's broker jars (``kafka_2.13`` and its runtime dependencies)."""
    rr = _real_rocketmq()
    return Path(rr.maven_jars(f"kafka-{KAFKA_VERSION}",
                              rr.pom_of(f"kafka-{KAFKA_VERSION}", [("org.apache.kafka", "kafka_2.13", KAFKA_VERSION)]),
                              f"Apache Kafka {KAFKA_VERSION}"))


def _base(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients`` (the artifact, without its version)."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar)


def connector_jars() -> tuple[list[str], str]:
    """(jars for ``spark.jars``, the connector version used): pyspark's own version when Maven
    Central serves it, else the newest of CONNECTOR_FALLBACKS; jars pyspark ships are left out."""
    import pyspark

    rr = _real_rocketmq()
    shipped = {_base(j) for j in os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))}
    errors = []
    for version in (pyspark.__version__, *CONNECTOR_FALLBACKS):
        name = f"spark-sql-kafka-0-10_2.13-{version}"
        try:
            lib = Path(rr.maven_jars(name, rr.pom_of(name, [("org.apache.spark", "spark-sql-kafka-0-10_2.13",
                                                             version)]), f"Spark's Kafka source {version}"))
        except RuntimeError as exc:
            errors.append(f"{version}: {str(exc).splitlines()[-1][:300]}")
            continue
        return sorted(str(lib / j) for j in os.listdir(lib) if j.endswith(".jar") and _base(j) not in shipped), version
    raise RuntimeError("no spark-sql-kafka-0-10_2.13 could be fetched: " + "; ".join(errors))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Kafka:
    """One Kafka node (broker and controller) in ``workdir`` on two free loopback ports."""

    def __init__(self, workdir: str | Path, *, heap: str = "1g", partitions: int = 8) -> None:
        self.workdir = Path(workdir)
        self.heap = heap
        self.partitions = partitions
        self.bootstrap = ""
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = self.workdir / "kafka.out"

    def __enter__(self) -> Kafka:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _java(self, heap: str, *args: str) -> list[str]:
        return ["java", f"-Xmx{heap}", "-cp", f"{kafka_jars()}/*", *args]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        port, ctl = _free_port(), _free_port()
        while ctl == port:
            ctl = _free_port()
        props = self.workdir / "server.properties"
        props.write_text("\n".join([
            "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@127.0.0.1:{ctl}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{ctl}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}", "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT", f"log.dirs={self.workdir / 'data'}",
            f"num.partitions={self.partitions}", "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
            "group.initial.rebalance.delay.ms=0", ""]))
        cluster_id = _cluster_id()
        cmd = self._java("256m", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props))
        fmt = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        if fmt.returncode != 0:
            raise RuntimeError(f"formatting Kafka's log directory failed: {(fmt.stdout + fmt.stderr)[-2000:]}")
        with open(self._log, "wb") as log:
            self.proc = subprocess.Popen(self._java(self.heap, "kafka.Kafka", str(props)), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {self.proc.returncode} at start: {self.output()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"Kafka did not listen on {self.bootstrap} within {_START_TIMEOUT_S:.0f}s: "
                           f"{self.output()[-3000:]}")

    def output(self) -> str:
        try:
            return self._log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace_s: float = 20.0) -> None:
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _cluster_id() -> str:
    """A random KRaft cluster id (a UUID, URL-safe base64) that does not start with "-": the
    storage tool would take such an id for an option ("argument --cluster-id/-t: expected one
    argument"), one run in 64; Kafka's own Uuid.randomUuid() draws again for the same reason."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text
