"""The ports the real-broker harness picks: every port a broker binds is free, and 4.9.x's HA port
is where 4.9.x puts it (listenPort+1, whatever the config says), not where the config asks."""

from __future__ import annotations

import socket
from pathlib import Path

from real_rocketmq import VERSION, VERSION_4, RealRocketMQ, _bindable, _ephemeral_low


def _ports(version: str) -> RealRocketMQ:
    rmq = RealRocketMQ(lib=Path("/nonexistent"), workdir=Path("/nonexistent"), version=version)
    rmq.assign_ports()
    return rmq


def test_a_4_9_broker_gets_its_ha_port_next_to_its_listen_port() -> None:
    for _ in range(20):
        rmq = _ports(VERSION_4)
        assert rmq.ha_port == rmq.broker_port + 1
        for port in (rmq.broker_port - 2, rmq.broker_port, rmq.ha_port):
            assert _bindable(port), port


def test_every_port_a_broker_binds_is_free_and_none_is_shared() -> None:
    for version in (VERSION, VERSION_4):
        rmq = _ports(version)
        bound = [rmq.namesrv_port, rmq.broker_port - 2, rmq.broker_port, rmq.ha_port]
        if version.startswith("5."):
            bound += [rmq.grpc_port, rmq.proxy_remoting_port]
        assert len(set(bound)) == len(bound), bound
        assert all(_bindable(p) for p in bound), bound


def test_ports_are_picked_below_the_range_outgoing_connections_take() -> None:
    rmq = _ports(VERSION)
    low = _ephemeral_low()
    for port in (rmq.namesrv_port, rmq.broker_port, rmq.ha_port, rmq.grpc_port, rmq.proxy_remoting_port):
        assert 1024 < port < low, port


def test_a_port_in_use_is_not_bindable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not _bindable(s.getsockname()[1])
