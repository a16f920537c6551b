"""Outages: the broker process goes away mid-stream (SIGKILL) and comes back on the same ports and
data directory. A query rides out an outage shorter than brokerDownTimeoutMs and ends with every
message exactly once; an outage longer than that fails the query with an error that names the
broker's address and the operation that could not be done."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from brokers import wait_for  # tests/ is on sys.path through conftest
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability, pytest.mark.slow]

MESSAGES = 24_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """The CLI broker in its own process on fixed ports, so a restart keeps its addresses."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.ns_port, self.broker_port = _free_port(), _free_port()
        self.namesrv = f"127.0.0.1:{self.ns_port}"
        self.broker_addr = f"127.0.0.1:{self.broker_port}"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rocketmq_spark.cli", "broker", "--data-dir", self.data_dir,
             "--namesrv-port", str(self.ns_port), "--broker-port", str(self.broker_port), "--grpc-port", "-1"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            raise AssertionError("the broker process exited before printing its addresses")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)


@pytest.fixture()
def broker_proc(tmp_path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(str(tmp_path / "broker-data"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _produce(namesrv: str, topic: str, n: int) -> None:
    c = RemotingClient(namesrv)
    try:
        c.create_topic(topic, 4)
        qs = c.message_queues(topic, refresh=True)
        for first in range(0, n, 500):
            c.send_batch(qs[(first // 500) % 4], [BatchEntry(b"m-%06d" % i, encode_properties({"TAGS": "o"}))
                                                  for i in range(first, min(n, first + 500))])
    finally:
        c.close()


def _start_query(spark, b: BrokerProcess, topic: str, group: str, out: str, ck: str, down_ms: int):  # type: ignore[no-untyped-def]
    return (spark.readStream.format("rocketmq").option("namesrvAddr", b.namesrv).option("topic", topic)
            .option("consumerGroup", group).option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "1500").option("brokerDownTimeoutMs", str(down_ms)).load()
            .selectExpr("CAST(body AS STRING) AS body", "queueId", "queueOffset")
            .writeStream.format("parquet").option("path", out).option("checkpointLocation", ck)
            .trigger(processingTime="200 milliseconds").start())


def _rows_done(q) -> int:  # type: ignore[no-untyped-def]
    return sum(int(p.get("numInputRows", 0)) for p in q.recentProgress)


def test_a_10s_broker_outage_mid_stream_loses_nothing(spark, broker_proc: BrokerProcess, tmp_path) -> None:
    topic, group = "OUTAGE_T", "g_outage"
    _produce(broker_proc.namesrv, topic, MESSAGES)
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    # Spark hands a batch's end offsets to the source only when it plans the next batch; the
    # listener commits each finished batch at once, so the group ends at the topic's end
    committer = RocketMQOffsetCommitter(broker_proc.namesrv, group, topics=[topic])
    spark.streams.addListener(committer)
    q = _start_query(spark, broker_proc, topic, group, out, ck, down_ms=60_000)
    try:
        wait_for(lambda: _rows_done(q) >= 3000, "the first batches", 120, 0.2)
        assert _rows_done(q) < MESSAGES, "the query finished before the outage: make batches smaller"
        broker_proc.kill()
        t_down = time.monotonic()
        time.sleep(10)  # the outage itself (the scenario), not a wait for a result
        assert q.isActive, f"the query died during a 10 s outage: {q.exception()}"
        broker_proc.start()
        outage_s = time.monotonic() - t_down
        c = RemotingClient(broker_proc.namesrv, ClientConfig(retries=3))
        try:
            qs = c.message_queues(topic, refresh=True)
            ends = c.max_offsets(qs)
            assert sum(ends.values()) == MESSAGES, "the broker lost messages across its restart"

            got: dict = {}

            def caught_up() -> bool:
                assert q.isActive, f"the query failed after the broker came back: {q.exception()}"
                got.update(c.query_consumer_offsets(group, qs))
                return all(got[mq] == ends[mq] for mq in qs)

            wait_for(caught_up, lambda: f"the group's broker offsets {got} to reach the topic's end {ends} "
                                        f"(rows done {_rows_done(q)})", 180, 0.2)
        finally:
            c.close()
    finally:
        q.stop()
        spark.streams.removeListener(committer)
    rows = spark.read.parquet(out)
    bodies = [r.body for r in rows.select("body").collect()]
    assert len(bodies) == MESSAGES, f"{len(bodies)} rows after a {outage_s:.0f}s outage, expected {MESSAGES}"
    assert sorted(bodies) == [f"m-{i:06d}" for i in range(MESSAGES)]


def test_an_outage_longer_than_the_budget_fails_naming_the_broker_and_operation(spark, broker_proc: BrokerProcess,
                                                                                  tmp_path) -> None:
    topic, group = "OUTAGE_LONG", "g_outage_long"
    _produce(broker_proc.namesrv, topic, MESSAGES)
    q = _start_query(spark, broker_proc, topic, group, str(tmp_path / "out"), str(tmp_path / "ck"), down_ms=3000)
    try:
        wait_for(lambda: _rows_done(q) >= 1500, "the first batch", 120, 0.2)
        broker_proc.kill()
        wait_for(lambda: not q.isActive, "the query to fail once brokerDownTimeoutMs (3 s) has passed", 120, 0.2)
        err = str(q.exception())
    finally:
        q.stop()
    assert broker_proc.broker_addr in err or broker_proc.namesrv in err, err
    assert "unavailable" in err or "unreachable" in err, err
    assert "brokerDownTimeoutMs" in err, err
    # the operation: a read task's pull ("reading offset N of [a, b)") or the planner's calls,
    # depending on which of them meets the outage first
    assert any(op in err for op in ("reading offset", "pull of", "topic stats of", "max offset", "route",
                                    "query offset of group")), err
