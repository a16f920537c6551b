"""A name server restarted under running clients (the fault suite's restart-namesrv): until the
brokers register again it lists no broker and answers every route lookup "no route". That is a
name server not ready, not a topic that does not exist: a client that knows the route keeps
it (as the Java client does), a new one waits (ConnectionFailedError, which writer tasks and the
exactly-once commit ride out for 30 s) instead of failing with TopicNotFoundError. A topic a
name server with brokers does not know still fails at once."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from brokers import wait_until
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.errors import ConnectionFailedError, TopicNotFoundError

from .cluster import _CliProcess

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_restarted_name_server_that_lists_no_broker_is_not_ready_not_a_missing_topic(tmp_path: Path) -> None:
    ns_port, broker_port = _free_port(), _free_port()
    ns = f"127.0.0.1:{ns_port}"
    namesrv, broker = _CliProcess("namesrv", tmp_path), _CliProcess("broker", tmp_path)
    config = ClientConfig(request_timeout_s=2.0, connect_timeout_s=1.0, retries=1)
    known = new = None
    try:
        namesrv.start(["namesrv", "--host", "127.0.0.1", "--port", str(ns_port), "--no-auto-create"])
        # the broker registers at start, then only every 20 s: the restarted name server stays
        # empty long enough to be asked
        broker.start(["broker", "--host", "127.0.0.1", "--broker-port", str(broker_port), "--namesrv", ns,
                      "--broker-name", "broker-a", "--grpc-port", "-1", "--data-dir", str(tmp_path / "store"),
                      "--register-interval-ms", "20000", "--no-auto-create"])
        known = RemotingClient(ns, config)
        assert wait_until(lambda: bool(known.cluster_brokers()), 20)
        known.create_topic("NsT", 2, broker_addr=f"127.0.0.1:{broker_port}")
        assert wait_until(lambda: _has_route(known, "NsT"), 30)
        with pytest.raises(TopicNotFoundError):  # brokers listed: an unknown topic fails at once
            known.message_queues("NoSuchTopic", refresh=True)

        namesrv.kill()
        namesrv.start(["namesrv", "--host", "127.0.0.1", "--port", str(ns_port), "--no-auto-create"])
        assert known.cluster_brokers() == {}  # restarted: the broker has not registered again yet
        # the client that knew the route keeps using it
        assert [q.queue_id for q in known.message_queues("NsT", refresh=True)] == [0, 1]
        # a new client waits for the name server (what writer tasks and the commit ride out)
        new = RemotingClient(ns, config)
        started = time.monotonic()
        with pytest.raises(ConnectionFailedError, match=r"lists no broker yet.*no route|lists no broker yet"):
            new.message_queues("NsT")
        assert time.monotonic() - started < 15  # bounded by the client's retries
        # once the broker registers again, the new client has the route
        assert wait_until(lambda: _has_route(new, "NsT"), 40)
    finally:
        for c in (known, new):
            if c is not None:
                c.close()
        broker.kill()
        namesrv.kill()


def _has_route(client: RemotingClient, topic: str) -> bool:
    try:
        return len(client.message_queues(topic, refresh=True)) == 2
    except (TopicNotFoundError, ConnectionFailedError):
        return False
