"""The cluster as separate processes: `rocketmq-spark namesrv` and brokers started with
`broker --namesrv ADDR` (REGISTER_BROKER heartbeats), and `broker --brokers N`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from brokers import wait_for  # tests/ is on sys.path through conftest
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.errors import ConnectionFailedError

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "rocketmq_spark.cli"]


def _start(*args: str) -> tuple[subprocess.Popen[str], dict]:
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"{args[0]} exited before printing its addresses")
    return proc, json.loads(line)


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(30)
    finally:
        if proc.stdout is not None:
            proc.stdout.close()


def test_brokers_in_their_own_processes_register_heartbeat_and_drop_out(tmp_path) -> None:
    ns, info = _start("namesrv", "--port", "0", "--broker-timeout", "2")
    brokers = []
    try:
        for name in ("broker-a", "broker-b"):
            brokers.append(_start("broker", "--namesrv", info["namesrv"], "--broker-name", name, "--broker-port", "0",
                                  "--grpc-port", "-1", "--register-interval-ms", "300",
                                  "--data-dir", str(tmp_path / name)))
        c = RemotingClient(info["namesrv"])
        try:
            # a route miss creates the topic on both brokers of the other processes
            qs = c.message_queues("CLI_CLUSTER")
            assert sorted({q.broker for q in qs}) == ["broker-a", "broker-b"] and len(qs) == 8
            for i, q in enumerate(qs):
                c.send(q, b"m%d" % i)
            assert all(c.max_offset(q) == 1 for q in qs)
            assert sorted(c.cluster_brokers()) == ["broker-a", "broker-b"]
            # SIGKILL: no unregister; the name server drops it after its heartbeats stop
            _stop(brokers[1][0], signal.SIGKILL)
            t0 = time.monotonic()
            wait_for(lambda: {q.broker for q in c.message_queues("CLI_CLUSTER", refresh=True)} == {"broker-a"},
                     "broker-b to leave the route", 20)
            assert time.monotonic() - t0 < 10
            # a restarted broker-b registers again, with its data
            brokers[1] = _start("broker", "--namesrv", info["namesrv"], "--broker-name", "broker-b", "--broker-port",
                                "0", "--grpc-port", "-1", "--register-interval-ms", "300",
                                "--data-dir", str(tmp_path / "broker-b"))
            wait_for(lambda: len(c.message_queues("CLI_CLUSTER", refresh=True)) == 8, "broker-b to come back", 20)
            assert sum(c.max_offset(q) for q in c.message_queues("CLI_CLUSTER")) == 8
            # SIGTERM: a clean stop unregisters at once (no timeout to wait for)
            assert _stop(brokers[0][0]) == 0
            assert {q.broker for q in c.message_queues("CLI_CLUSTER", refresh=True)} == {"broker-b"}
            assert _stop(brokers[1][0]) == 0
            # no broker left: the name server cannot tell a missing topic from brokers not
            # registered yet (its own restart). A client that knew the route keeps it, as the
            # Java client does, and finds the broker gone when it asks it; a new one is told
            # the name server lists no broker, not that the topic does not exist
            assert {q.broker for q in c.message_queues("CLI_CLUSTER", refresh=True)} == {"broker-b"}
            with pytest.raises(ConnectionFailedError):
                c.max_offset(next(q for q in qs if q.broker == "broker-b"))
            fresh = RemotingClient(info["namesrv"], ClientConfig(retries=1))
            try:
                with pytest.raises(ConnectionFailedError, match="lists no broker"):
                    fresh.message_queues("CLI_CLUSTER")
            finally:
                fresh.close()
            assert sorted(c.cluster_brokers()) == []
        finally:
            c.close()
    finally:
        for proc, _ in brokers:
            _stop(proc, signal.SIGKILL)
        assert _stop(ns) == 0


def test_broker_command_runs_a_name_server_and_n_brokers(tmp_path) -> None:
    proc, info = _start("broker", "--brokers", "2", "--namesrv-port", "0", "--broker-port", "0", "--grpc-port", "0",
                        "--data-dir", str(tmp_path))
    try:
        assert sorted(info["brokers"]) == ["broker-a", "broker-b"]
        assert all(b["grpc"] for b in info["brokers"].values())
        c = RemotingClient(info["namesrv"])
        try:
            assert c.cluster_brokers() == {n: b["broker"] for n, b in info["brokers"].items()}
            assert sorted({q.broker for q in c.message_queues("CLI_N")}) == ["broker-a", "broker-b"]
        finally:
            c.close()
        assert (tmp_path / "broker-a" / "store").is_dir() and (tmp_path / "broker-b" / "store").is_dir()
    finally:
        assert _stop(proc) == 0
