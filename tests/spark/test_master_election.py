"""Automatic master election on Apache RocketMQ (issue 32): one broker group, ``broker-a``, of two
brokers in controller mode under a name server that runs the controller (three JVMs, 256 MB heaps).
Neither broker has a fixed role: the controller made one of them the master. The master is
SIGKILLed while a producer sends and a streaming query reads; the controller elects the other
broker, which registers as brokerId 0 at its own address, and the producer, a client that knew only
the old master, and the same query go on against it with no restart. A checker counts every id the
producer was told is stored (every member of the sync state set had it: ``allAckInSyncStateSet``):
none lost, none read more often than the store holds it (a send retried after a timeout may be
stored twice), and the group's offsets end on the new master at the queues' ends. The killed
broker, started again, follows the new master as a slave."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_master_slave import _backlog, _check, _paced_query, _Producer, _stored
from test_offset_reset import _wait_for
from test_reset_states import _Sink  # every body a foreachBatch query wrote, counted

from brokers import skip_or_fail, wait_until
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, parse_offset_msg_id
from rocketmq_spark.model import MessageQueue

pytestmark = [pytest.mark.spark, pytest.mark.integration]

GROUP = "broker-a"


@pytest.fixture(scope="module")
def elected(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from real_rocketmq import NEWEST, RealCluster, java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    cluster = RealCluster(provision(NEWEST), tmp_path_factory.mktemp("elect"), groups=(GROUP,), slaves=(GROUP,),
                          controller=True)
    cluster.start()
    try:
        cluster.wait_in_sync(GROUP)  # else the controller has no one to elect, and the master acks alone
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(300)  # a master killed, another elected, the old one started again, on a busy machine
def test_a_query_and_a_producer_go_on_against_the_master_the_controller_elects(spark, elected,
                                                                               tmp_path: Path) -> None:
    cl = elected
    topic, group = "ELECT_READ", "g_elect_read"
    cl.create_topic(topic, queues=2)
    old = cl.master_of(GROUP)
    assert old is not None, "the name server lists no master of broker-a"
    new = 1 - old
    old_addr, new_addr = cl.addr(GROUP, old), cl.addr(GROUP, new)
    c = RemotingClient(cl.namesrv_addr)
    backlog = _backlog(c, topic, GROUP, 200)  # each message acked once both members have it
    producer = _Producer(cl.namesrv_addr, topic)
    sink = _Sink()
    q = None
    try:
        producer.start()
        q = _paced_query(spark, cl.namesrv_addr, topic, group, sink, str(tmp_path / "ck"))
        _wait_for(q, lambda: len(backlog & set(sink.counts())) >= 40, "the first batches")
        cl.kill(GROUP, old)
        killed = time.monotonic()
        assert len(backlog & set(sink.counts())) < len(backlog), "the backlog was read before the master died"
        assert wait_until(lambda: c.cluster_members().get(GROUP, {}).get(0) == new_addr, 30, 0.1), (
            f"the other broker was not elected: the name server lists {c.cluster_members()}, "
            f"the controller says {cl._replica_text(GROUP)}")
        elected_s = time.monotonic() - killed
        master_id, master_addr, _ = cl.replica_info(GROUP)
        assert master_addr == new_addr, (master_id, master_addr)
        # a client that knew the old master, asked for no route: its next send finds the new one
        started = time.monotonic()
        sent = c.send_batch(MessageQueue(topic, GROUP, 0), [BatchEntry(b"after-election")])
        took = time.monotonic() - started
        backlog.add("after-election")
        stored_by, _ = parse_offset_msg_id(sent[0].msg_id)  # the id names the broker that stored it
        assert c.broker_addr(GROUP) == new_addr == stored_by, (
            f"the send took {took:.1f}s and was stored by {stored_by}; the client sends to "
            f"{c.broker_addr(GROUP)}, the new master is {new_addr}")
        # the same producer and query, no restart: new ids are stored on the new master and read
        at_election = set(producer.acked)
        assert wait_until(lambda: len(producer.acked - at_election) >= 20, 30), (
            f"the producer did not go on against the new master ({producer.failures} failed sends)")
        since = producer.acked - at_election
        _wait_for(q, lambda: (backlog | since) <= set(sink.counts()),
                  lambda: f"reads from the new master: {len((backlog | since) - set(sink.counts()))} unread "
                          f"(elected {elected_s:.1f}s after the kill)", timeout_s=60)
        producer.stop()
        everything = producer.acked | backlog
        _wait_for(q, lambda: everything <= set(sink.counts()),
                  lambda: f"all acknowledged ids: {len(everything - set(sink.counts()))} unread", timeout_s=60)
        # the group's offsets on the new master: the queues' ends (the ones the old master held
        # are written there again)
        fresh = RemotingClient(cl.namesrv_addr)
        try:
            qs = sorted(fresh.message_queues(topic, refresh=True))
            assert fresh.read_addr(GROUP, topic) == new_addr
            _wait_for(q, lambda: fresh.query_consumer_offsets(group, qs) == fresh.max_offsets(qs),
                      lambda: f"the group's offsets {fresh.query_consumer_offsets(group, qs)} against the queues' "
                              f"ends {fresh.max_offsets(qs)} on {new_addr}", timeout_s=60)
        finally:
            fresh.close()
        lost, dups, strange = _check(sink, everything, producer.unsure, _stored(c, topic))
        assert not lost and not dups and not strange, (
            f"{len(lost)} lost (e.g. {sorted(lost.items())[:5]}, as (id, copies stored)), "
            f"{len(dups)} read more often than stored "
            f"(e.g. {sorted(dups.items())[:5]}, as (reads, copies)), "
            f"{len(strange)} never sent (e.g. {sorted(strange)[:5]})")
        assert q.isActive and q.exception() is None
    finally:
        producer.done.set()
        if q is not None:
            q.stop()
    try:
        # the killed broker, started again with its store, keeps its controller id and follows
        cl.start_member(GROUP, old)
        assert wait_until(lambda: c.cluster_members().get(GROUP, {}).get(0) == new_addr
                          and old_addr in c.cluster_members().get(GROUP, {}).values(), 30), c.cluster_members()
        members = c.cluster_members()[GROUP]
        assert members[0] == new_addr and {i for i, a in members.items() if a == old_addr} - {0}, members
        assert cl.replica_info(GROUP)[1] == new_addr
    finally:
        c.close()
