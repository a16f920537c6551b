"""A broker behind the fault proxy: it binds 127.0.0.2:P and advertises 127.0.0.1:P, where
the proxy listens, so every client that learns the broker from the name server goes through
the proxy. Run on the embedded broker (``advertise_host``) and on Apache RocketMQ (5.5.0,
``real_rocketmq.VERSION``: ``bindAddress`` 127.0.0.2, ``brokerIP1`` 127.0.0.1)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from brokers import settles_at, skip_or_fail, wait_until
from real_rocketmq import RealRocketMQ, java_available, provision
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import RequestTimeoutError
from rocketmq_spark.model import MessageQueue

from .proxy import FaultProxy

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@dataclass
class Proxied:
    """A broker reachable only through ``proxy`` (its name server is reached directly)."""

    kind: str
    namesrv_addr: str
    broker_name: str
    proxy: FaultProxy


@contextlib.contextmanager
def _embedded() -> Iterator[Proxied]:
    # the proxy first, on a port free on 127.0.0.1; the broker then binds that port on 127.0.0.2
    with FaultProxy(target=("127.0.0.2", 0)) as proxy, \
            EmbeddedBroker(host="127.0.0.2", advertise_host="127.0.0.1", broker_port=proxy.port,
                           grpc_port=None) as mq:
        assert mq.broker_addr == proxy.address
        yield Proxied("embedded", mq.namesrv_addr, mq.broker_name, proxy)


@contextlib.contextmanager
def _real(workdir: Path) -> Iterator[Proxied]:
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(), workdir, proxy=False, broker_bind="127.0.0.2")
    rmq.assign_ports()
    with FaultProxy(target=("127.0.0.2", rmq.broker_port), listen=("127.0.0.1", rmq.broker_port)) as proxy:
        rmq.start()
        try:
            assert rmq.broker_addr == proxy.address
            yield Proxied("real", rmq.namesrv_addr, rmq.broker_name, proxy)
        finally:
            rmq.stop(grace_s=5)


@pytest.fixture(scope="module", params=["embedded", pytest.param("real", marks=pytest.mark.slow)])
def proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    with (_embedded() if request.param == "embedded" else _real(tmp_path_factory.mktemp("real-proxied"))) as p:
        yield p


@pytest.fixture()
def proxy(proxied: Proxied) -> Iterator[FaultProxy]:
    try:
        yield proxied.proxy
    finally:
        proxied.proxy.heal()


def _client(proxied: Proxied, **config: float) -> RemotingClient:
    return RemotingClient(proxied.namesrv_addr, ClientConfig(**config))  # type: ignore[arg-type]


def _read_all(client: RemotingClient, mq: MessageQueue, group: str) -> list[bytes]:
    bodies: list[bytes] = []
    offset = 0
    while True:
        res = client.pull(mq, offset, 32, group=group)
        if res.status != "FOUND":
            return bodies
        bodies += [r.body for r in decode_records(res.body)]
        offset = res.next_offset


def test_clients_read_and_write_through_the_proxy(proxied: Proxied, proxy: FaultProxy) -> None:
    client = _client(proxied)
    try:
        assert client.cluster_brokers() == {proxied.broker_name: proxy.address}
        topic = f"FaultsThrough_{proxied.kind}"
        client.create_topic(topic, queues=1)
        mq = MessageQueue(topic, proxied.broker_name, 0)
        before = proxy.stats()
        sent = [b"m%04d" % i for i in range(200)]
        for i in range(0, len(sent), 50):
            client.send_batch(mq, [BatchEntry(b) for b in sent[i:i + 50]])
        assert settles_at(client, topic, len(sent), queues=[mq]) == len(sent)
        assert _read_all(client, mq, "faults_through") == sent
        after = proxy.stats()
        # every send and pull went through the proxy, as whole messages each way
        assert after.bytes_up - before.bytes_up > sum(map(len, sent))
        assert after.bytes_down - before.bytes_down > sum(map(len, sent))
    finally:
        client.close()


def test_a_blackholed_broker_times_requests_out_naming_the_proxy_then_heals(proxied: Proxied,
                                                                           proxy: FaultProxy) -> None:
    client = _client(proxied, request_timeout_s=1.0, retries=1)
    try:
        topic = f"FaultsBlackhole_{proxied.kind}"
        client.create_topic(topic, queues=1)
        mq = MessageQueue(topic, proxied.broker_name, 0)
        client.send_batch(mq, [BatchEntry(b"before")])
        proxy.blackhole()
        with pytest.raises(RequestTimeoutError) as failed:
            client.max_offset(mq)
        assert failed.value.address == proxy.address and proxy.address in str(failed.value)
        proxy.heal()

        def works() -> bool:
            try:
                return client.max_offset(mq) == 1
            except RequestTimeoutError:
                raise
            except Exception:  # the held request's connection was reset by the heal: a new one comes
                return False

        assert wait_until(works, 15)
        client.send_batch(mq, [BatchEntry(b"after")])
        assert settles_at(client, topic, 2, queues=[mq]) == 2
        assert _read_all(client, mq, "faults_blackhole") == [b"before", b"after"]
    finally:
        client.close()


def test_reset_connections_are_reopened_by_the_client(proxied: Proxied, proxy: FaultProxy) -> None:
    client = _client(proxied)
    try:
        topic = f"FaultsReset_{proxied.kind}"
        client.create_topic(topic, queues=1)
        mq = MessageQueue(topic, proxied.broker_name, 0)
        client.send_batch(mq, [BatchEntry(b"one")])
        assert proxy.reset_all() >= 1
        client.send_batch(mq, [BatchEntry(b"two")])  # bounded retries on a fresh connection
        assert settles_at(client, topic, 2, queues=[mq]) == 2
        assert _read_all(client, mq, "faults_reset") == [b"one", b"two"]
        assert proxy.stats().resets >= 1
    finally:
        client.close()


def test_an_exactly_once_commit_waits_for_a_broker_that_refuses_for_a_while(proxied: Proxied, proxy: FaultProxy,
                                                                             tmp_path: Path, caplog) -> None:
    """A broker restarting while the driver commits an exactly-once batch (the fault suite's
    wipe-broker-now on Apache RocketMQ, whose restart takes seconds: the query failed with
    ConnectionFailedError on the destination's max offsets, about a second after the broker
    went away). The commit waits for it (up to 30 s) and every row lands once."""
    import threading

    import pyarrow as pa

    from rocketmq_spark.sink.options import WriterOptions
    from rocketmq_spark.sink.writer import _txns, commit_batch, write_rows

    client = _client(proxied)
    try:
        topic = f"FaultsEosRefused_{proxied.kind}"
        client.create_topic(topic, queues=1)
        opts = WriterOptions.parse({"namesrvAddr": proxied.namesrv_addr, "topic": topic,
                                    "delivery": "exactly-once", "checkpointLocation": str(tmp_path / "ck")})
        rows = [b"eos-%d" % i for i in range(20)]
        txns = _txns([write_rows(opts, iter([pa.RecordBatch.from_pydict({"body": rows})]), 0)])
        proxy.refuse()
        proxy.reset_all()
        healed = threading.Timer(6.0, proxy.heal)
        healed.start()
        try:
            commit_batch(opts, txns, 0)  # before: ConnectionFailedError reading the destination's offsets
        finally:
            healed.cancel()
            healed.join()
        assert "reading the destination's offsets failed" in caplog.text, "the commit never met the refusal"
        mq = MessageQueue(topic, proxied.broker_name, 0)
        assert wait_until(lambda: len(_read_all(client, mq, "faults_eos_refused")) >= len(rows), 30)
        assert sorted(_read_all(client, mq, "faults_eos_refused")) == sorted(rows)
    finally:
        client.close()


def test_a_producer_start_goes_on_past_a_broker_that_refuses_and_heartbeats_it_once_back(
        proxied: Proxied, proxy: FaultProxy, caplog: pytest.LogCaptureFixture) -> None:
    """An exactly-once writer task starts its producer with a heartbeat to every broker of the
    topic; one broker refusing connections (the fault suite's refuse fault) failed every task
    then, and the query. It is logged and left out now, and heartbeated by the next start once
    it answers."""
    client = _client(proxied, retries=1, retry_budget_s=2.0)
    try:
        topic = f"FaultsHeartbeat_{proxied.kind}"
        client.create_topic(topic, queues=1)
        proxy.refuse()
        proxy.reset_all()
        client.start_producer("faults_heartbeat", [topic])  # before: ConnectionFailedError (heartbeat)
        assert f"producer heartbeat of group faults_heartbeat to {proxy.address} failed" in caplog.text
        assert proxy.address not in client._producer_addrs
        proxy.heal()
        client.start_producer("faults_heartbeat", [topic])
        assert proxy.address in client._producer_addrs
    finally:
        client.close()


def test_the_checker_reads_a_broker_past_the_proxy_while_the_proxy_refuses(proxied: Proxied,
                                                                            proxy: FaultProxy) -> None:
    # wipe-broker-now reads what the broker holds with the proxy refusing: every request must go
    # to the broker's own address, though the routes (and the client's master tracking) name the
    # proxy's (each of the fault suite's wipe-broker-now failed so: connection refused at the proxy)
    from .checker import read_topic

    client = _client(proxied)
    topic = f"FaultsDirect_{proxied.kind}"
    try:
        client.create_topic(topic, queues=2)
        mqs = [MessageQueue(topic, proxied.broker_name, q) for q in (0, 1)]
        for mq in mqs:
            client.send_batch(mq, [BatchEntry(b"d%d-%d" % (mq.queue_id, i)) for i in range(20)])
        assert settles_at(client, topic, 40, queues=mqs) == 40
    finally:
        client.close()
    direct = {proxied.broker_name: "{}:{}".format(*proxy.target)}  # where the broker listens
    proxy.refuse()
    proxy.reset_all()
    copies = read_topic(proxied.namesrv_addr, topic, brokers=[proxied.broker_name], direct=direct)
    assert len(copies) == 40
