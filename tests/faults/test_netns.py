"""An embedded broker (the CLI) in its own network namespace, its name server and a client
outside, and the veth between them cut and joined again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from brokers import skip_or_fail, wait_until
from rocketmq_spark.client import ClientConfig, RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import RequestTimeoutError
from rocketmq_spark.model import MessageQueue

from .netns import Netns, available
from .procs import process_state

pytestmark = [pytest.mark.faults, pytest.mark.integration]

CLI = [sys.executable, "-m", "rocketmq_spark.cli"]


@pytest.fixture()
def netns_usable() -> None:
    reason = available()
    if reason is not None:
        skip_or_fail(f"network namespaces cannot be used here: {reason}")


@pytest.fixture()
def ns(netns_usable: None) -> Iterator[Netns]:
    with Netns.create() as created:
        yield created
    assert not os.path.exists(f"/run/netns/{created.name}")
    assert not os.path.exists(f"/sys/class/net/{created.host_if}")


def _first_line(proc: subprocess.Popen[str], what: str) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"the {what} exited (code {proc.wait(5)}) before printing its addresses")
    return dict(json.loads(line))


def _route_dev(addr: str) -> str:
    out = subprocess.run(["ip", "route", "get", addr], capture_output=True, text=True, check=True).stdout
    return out.split(" dev ", 1)[1].split()[0]


def test_a_broker_behind_a_cut_link_times_out_and_comes_back_with_every_message(ns: Netns, tmp_path: Path) -> None:
    namesrv = subprocess.Popen([*CLI, "namesrv", "--host", ns.host_addr, "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        ns_addr = str(_first_line(namesrv, "name server")["namesrv"])
        broker = ns.run([*CLI, "broker", "--host", ns.ns_addr, "--namesrv", ns_addr, "--broker-port", "0",
                         "--grpc-port", "-1", "--data-dir", str(tmp_path / "store"), "--register-interval-ms",
                         "1000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        broker_addr = str(_first_line(broker, "broker in the namespace")["broker"])
        assert broker_addr.startswith(ns.ns_addr + ":")
        client = RemotingClient(ns_addr, ClientConfig(request_timeout_s=1.0, retries=1))
        try:
            assert wait_until(lambda: client.cluster_brokers().get("broker-a") == broker_addr, 10)
            mq = MessageQueue("FaultsNetns", "broker-a", 0)
            client.create_topic(mq.topic, queues=1)
            client.send_batch(mq, [BatchEntry(b"m%d" % i) for i in range(100)])

            ns.partition()
            # the route stays on the veth (no leak off the machine), packets just vanish
            assert _route_dev(ns.ns_addr) == ns.host_if
            with pytest.raises(RequestTimeoutError) as cut:
                client.max_offset(mq)
            assert cut.value.address == broker_addr
            assert process_state(broker.pid) not in (None, "Z")  # cut off, not dead

            ns.heal()

            def answers() -> bool:
                try:
                    return client.max_offset(mq) == 100
                except RequestTimeoutError:
                    return False

            assert wait_until(answers, 20)
            res = client.pull(mq, 0, 1000)
            assert [r.body for r in decode_records(res.body)] == [b"m%d" % i for i in range(100)]
        finally:
            client.close()
    finally:
        namesrv.kill()
        namesrv.wait(10)


def test_a_namespace_whose_creator_was_killed_is_removed_by_the_next_create(netns_usable: None) -> None:
    root = Path(__file__).resolve().parents[2]
    orphan_maker = subprocess.Popen(
        [sys.executable, "-c", "import time; from tests.faults.netns import Netns; ns = Netns.create(); "
         "ns.run(['sleep', '600']); print(ns.name, ns.host_if, flush=True); time.sleep(600)"],
        cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert orphan_maker.stdout is not None
        name, host_if = orphan_maker.stdout.readline().split()
    finally:
        orphan_maker.kill()  # no cleanup runs: the namespace, its veth and its sleeper stay behind
        orphan_maker.wait(10)
    assert os.path.exists(f"/run/netns/{name}")
    with Netns.create():
        assert not os.path.exists(f"/run/netns/{name}")
        assert not os.path.exists(f"/sys/class/net/{host_if}")


def test_cleanup_removes_everything_even_when_the_test_fails(ns: Netns) -> None:
    sleeper = ns.run(["sleep", "600"])
    with pytest.raises(RuntimeError, match="boom"):
        with ns:
            assert subprocess.run(ns.argv(["ip", "-o", "addr", "show", "lo"]), capture_output=True, text=True,
                                  check=True).stdout.count("127.0.0.1") == 1
            raise RuntimeError("boom")
    assert sleeper.wait(5) == -9
    assert not os.path.exists(f"/run/netns/{ns.name}")
    assert not os.path.exists(f"/sys/class/net/{ns.host_if}")
    ns.cleanup()  # again: nothing left to do, no error
