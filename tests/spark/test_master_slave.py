"""Master/slave on Apache RocketMQ (issue 32): a real cluster of two broker groups, ``broker-a`` with
a slave (brokerId 1, slaveReadEnable), ``broker-b`` without. When broker-a's master is killed
mid-stream the query reads on from the slave and commits the group's offsets there, as the Java
consumer does; when the master returns, reads and commits move back to it. A checker counts every
id the producer was told is stored: none lost, none read more often than the store holds it (a send
retried after a timeout may be stored twice), and the group's offsets on the masters are exact at
the end. A batch write while the master is down lands on broker-b. The cluster is the session's
``real_cluster`` (conftest.py), which test_cluster.py shares."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from test_offset_reset import _wait_for
from test_reset_states import _Sink  # every body a foreachBatch query wrote, counted

from brokers import settles_at, wait_until
from readback import stored_records
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.errors import RocketMQSparkError
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration]


class _Producer(threading.Thread):
    """Sends unique ids ``p0, p1, ...`` round-robin over the topic's writable queues until
    stopped; a send that fails is tried on the next queue (the Java producer skips the broker
    that failed on its retry). ``acked``: the ids a broker said it stored; ``unsure``: ids
    whose send failed (a broker may have stored one all the same)."""

    def __init__(self, namesrv: str, topic: str, pause_s: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.client = RemotingClient(namesrv)
        self.topic, self.pause_s = topic, pause_s
        self.acked: set[str] = set()
        self.unsure: set[str] = set()
        self.failures = 0
        self.done = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.done.is_set():
            msg = f"p{i}"
            for attempt in range(4):
                try:
                    queues = self.client.message_queues(self.topic, writable=True, refresh=attempt > 0)
                    self.client.send_batch(queues[(i + attempt) % len(queues)], [BatchEntry(msg.encode())])
                    self.acked.add(msg)
                    break
                except RocketMQSparkError:
                    self.failures += 1
                    self.unsure.add(msg)
            i += 1
            time.sleep(self.pause_s)

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        self.client.close()


def _backlog(client: RemotingClient, topic: str, broker: str, n: int) -> set[str]:
    """``a0 .. a<n-1>`` sent round-robin to queues 0 and 1 of ``broker``: a backlog a query
    reading 40 per trigger (:func:`_paced_query`) is still reading when a master dies."""
    queues = [MessageQueue(topic, broker, i) for i in range(2)]
    for i in range(n):
        client.send_batch(queues[i % 2], [BatchEntry(f"a{i}".encode())])
    return {f"a{i}" for i in range(n)}


def _paced_query(spark, namesrv: str, topic: str, group: str, sink: _Sink, checkpoint: str):  # noqa: ANN001, ANN202
    """A query of ``group`` from the earliest offsets into ``sink``, 40 messages per trigger at
    most, every 300 ms, riding out a broker down for up to 120 s."""
    return (spark.readStream.format("rocketmq").option("namesrvAddr", namesrv).option("topic", topic)
            .option("consumerGroup", group).option("startingOffsets", "earliest")
            .option("maxMessagesPerTrigger", "40").option("brokerDownTimeoutMs", "120000").load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
            .trigger(processingTime="300 milliseconds").start())


def _stored(client: RemotingClient, topic: str) -> Counter[str]:
    """How many copies of each body the topic's queues hold, read from the masters. A send the
    client tried again after a timeout may be stored twice (the Java producer's retries do the
    same): the query must read each copy, and no more."""
    return Counter(rec.payload().decode() for _, rec in stored_records(client, client.message_queues(topic,
                                                                                                       refresh=True)))


def _check(sink: _Sink, acked: set[str], unsure: set[str],
           stored: Counter[str]) -> tuple[dict[str, int], dict[str, tuple[int, int]], set[str]]:
    """(lost: acked and never read, as {id: copies stored}; read more often than stored, as
    {id: (reads, copies)}; read but neither acked nor unsure)."""
    rows = sink.counts()
    lost = {m: stored[m] for m in acked - set(rows)}
    dups = {m: (n, stored[m]) for m, n in rows.items() if n > max(1, stored[m])}
    strange = {m for m in rows if m not in acked and m not in unsure}
    return lost, dups, strange


@pytest.mark.timeout(480)  # a master killed and started again, the query catching up on a busy machine
def test_a_query_reads_on_from_the_slave_when_the_master_dies_and_moves_back(spark, real_cluster,
                                                                             tmp_path: Path) -> None:
    cl = real_cluster
    topic, group = "HA_READ", "g_ha_read"
    cl.create_topic(topic, queues=2)  # on the slave too
    cl.create_group(group)
    c = RemotingClient(cl.namesrv_addr)
    # a SYNC_MASTER: each message of the backlog is on the slave once acknowledged
    backlog = _backlog(c, topic, "broker-a", 240)
    producer = _Producer(cl.namesrv_addr, topic)
    sink = _Sink()
    q = None
    try:
        producer.start()
        q = _paced_query(spark, cl.namesrv_addr, topic, group, sink, str(tmp_path / "ck"))
        _wait_for(q, lambda: len(backlog & set(sink.counts())) >= 40, "the first batches")
        cl.kill("broker-a")
        read_at_kill = len(backlog & set(sink.counts()))
        assert read_at_kill < len(backlog), "the backlog was read before the master died: nothing read from the slave"
        # only the slave holds broker-a's messages now: the rest of the backlog comes from it
        _wait_for(q, lambda: backlog <= set(sink.counts()),
                  lambda: f"the backlog from the slave: {len(backlog - set(sink.counts()))} of it unread",
                  timeout_s=120)
        assert cl.member("broker-a").pid("broker") is None, "the master came back by itself"
        sent_while_down = len(producer.acked)
        assert wait_until(lambda: len(producer.acked) > sent_while_down + 20, 30), \
            f"the producer stopped while broker-a's master is down ({producer.failures} failed sends)"
        cl.start_member("broker-a")
        after = len(producer.acked)
        assert wait_until(lambda: any(m.broker == "broker-a" for m in c.message_queues(topic, writable=True,
                                                                                          refresh=True)), 30)
        assert wait_until(lambda: len(producer.acked) > after + 30, 60), "the producer after the master's return"
        producer.stop()
        everything = producer.acked | backlog
        _wait_for(q, lambda: everything <= set(sink.counts()),
                  lambda: f"all acknowledged ids: {len(everything - set(sink.counts()))} unread", timeout_s=120)
        # the group's offsets on each master: every queue's end (the ones written to the slave
        # while the master was down are written to the master again)
        queues = sorted(c.message_queues(topic, refresh=True))
        fresh = RemotingClient(cl.namesrv_addr)
        try:
            _wait_for(q, lambda: fresh.query_consumer_offsets(group, queues) == fresh.max_offsets(queues),
                      lambda: f"the group's offsets {fresh.query_consumer_offsets(group, queues)} "
                              f"against the queues' ends {fresh.max_offsets(queues)}", timeout_s=60)
            assert {fresh.read_addr(m.broker, topic) for m in queues} == {cl.addr("broker-a"), cl.addr("broker-b")}
        finally:
            fresh.close()
        lost, dups, strange = _check(sink, everything, producer.unsure, _stored(c, topic))
        rows = sink.counts()
        assert not lost and not dups and not strange, (
            f"{len(lost)} lost (e.g. {sorted(lost.items())[:5]}, as (id, copies stored)), "
            f"{len(dups)} read more often than stored "
            f"(e.g. {sorted(dups.items())[:5]}, as (reads, copies)), "
            f"{len(strange)} never sent (e.g. {sorted(strange)[:5]})")
        assert sum(rows.values()) >= len(everything)
    finally:
        producer.done.set()
        if q is not None:
            q.stop()
        c.close()
        if cl.member("broker-a").pid("broker") is None:
            cl.start_member("broker-a")


def test_a_batch_write_lands_on_the_other_group_while_a_master_is_down(spark, real_cluster) -> None:
    cl = real_cluster
    topic = "HA_WRITE"
    cl.create_topic(topic, queues=2)
    c = RemotingClient(cl.namesrv_addr)
    try:
        cl.kill("broker-a")
        assert wait_until(lambda: "broker-a" not in c.cluster_brokers(), 30), "the name server still lists the master"
        rows = [(f"w{i}",) for i in range(200)]
        spark.createDataFrame(rows, "body STRING").write.mode("append").format("rocketmq") \
            .option("namesrvAddr", cl.namesrv_addr).option("topic", topic).save()
        queues = c.message_queues(topic, refresh=True)  # broker-a's read from its slave
        assert settles_at(c, topic, 200, queues=queues) == 200
        ends = c.max_offsets(queues)
        assert sum(n for m, n in ends.items() if m.broker == "broker-b") == 200, ends
        assert sum(n for m, n in ends.items() if m.broker == "broker-a") == 0, ends
        got = (spark.read.format("rocketmq").option("namesrvAddr", cl.namesrv_addr).option("topic", topic).load()
               .selectExpr("CAST(body AS STRING) AS body").collect())
        assert sorted(r.body for r in got) == sorted(r[0] for r in rows)
    finally:
        c.close()
        if cl.member("broker-a").pid("broker") is None:
            cl.start_member("broker-a")
