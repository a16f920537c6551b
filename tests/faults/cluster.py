"""The fault suite's brokers: a name server and two broker groups, each its own process, so
that each can be killed, paused, restarted or wiped alone.

- ``broker-a`` binds 127.0.0.2:P and advertises 127.0.0.1:P, where a :class:`~.proxy.FaultProxy`
  listens: every client that learns it from the name server goes through the proxy
  (delay, loss, reset, half-open, refused connections);
- ``broker-b`` runs in its own network namespace (:class:`~.netns.Netns`) when this machine
  allows it (root), behind a veth pair whose link a partition cuts; elsewhere on 127.0.0.1
  and the partition fault cannot run (``netns_reason`` says why);
- the name server binds the host end of that veth (an address of this machine that the
  namespace can reach) or 127.0.0.1.

:class:`EmbeddedProcesses`: ``rocketmq-spark namesrv`` and two ``rocketmq-spark broker
--namesrv ...`` processes. :class:`RealProcesses`: Apache RocketMQ (``real_rocketmq.VERSION``,
5.5.0), a name server and two broker JVMs (two :class:`~real_rocketmq.RealRocketMQ` groups under one name server). Both
create topics explicitly on each broker (auto-creation off, as production clusters run).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from real_rocketmq import VERSION, RealRocketMQ, provision
from rocketmq_spark.client import ClientConfig, RemotingClient

from .netns import Netns, available
from .proxy import FaultProxy

log = logging.getLogger(__name__)

__all__ = ["BROKERS", "Cluster", "EmbeddedProcesses", "RealProcesses", "start_cluster"]

BROKERS = ("broker-a", "broker-b")
CLI = [sys.executable, "-m", "rocketmq_spark.cli"]


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _admin(namesrv: str) -> RemotingClient:
    return RemotingClient(namesrv, ClientConfig(request_timeout_s=5.0, retries=3, retry_budget_s=15.0))


class Cluster:
    """What the suite needs of a cluster, whichever broker it runs. Targets: ``namesrv``,
    ``broker-a``, ``broker-b``."""

    kind = ""
    namesrv_addr = ""
    proxy: FaultProxy
    netns: Netns | None = None
    #: why broker-b is not in a network namespace (None when it is)
    netns_reason: str | None = None
    topics: dict[str, int]

    def __init__(self, workdir: Path, *, use_netns: bool = True) -> None:
        """Starts the cluster in ``workdir`` (broker-b in a network namespace when ``use_netns``
        and root allow it); whatever started is stopped again if the rest fails."""
        self.workdir = workdir
        self.topics = {}
        self.netns_reason = available() if use_netns else "not asked for (--no-netns)"
        self.netns = Netns.create() if self.netns_reason is None else None
        try:
            self._start_all()
        except BaseException:
            self.close()
            raise

    def _start_all(self) -> None:
        raise NotImplementedError

    def pid(self, target: str) -> int | None:
        raise NotImplementedError

    def kill(self, target: str) -> None:
        """SIGKILL ``target`` and wait until it is gone."""
        raise NotImplementedError

    def start(self, target: str) -> None:
        """Start ``target`` again on its ports with its store; returns once it serves (a broker:
        once the name server lists it, or after a timeout if the name server is down)."""
        raise NotImplementedError

    def store_dir(self, broker: str) -> Path:
        raise NotImplementedError

    def direct_addr(self, broker: str) -> str:
        """Where ``broker`` listens, past the proxy (admin requests during faults)."""
        raise NotImplementedError

    def running(self, target: str) -> bool:
        pid = self.pid(target)
        if pid is None:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except OSError:
            return False

    def wipe(self, broker: str) -> None:
        """Deletes the store of ``broker`` (stopped): its messages, topics, groups and offsets."""
        assert not self.running(broker), f"{broker} must be stopped before its store is wiped"
        shutil.rmtree(self.store_dir(broker), ignore_errors=True)

    def create_topics(self, topics: dict[str, int], brokers: tuple[str, ...] = BROKERS,
                      timeout_s: float = 60.0) -> None:
        """Creates each topic with its number of queues on each of ``brokers`` (directly, past
        the proxy) and waits until the name server routes it to all of them."""
        self.topics = {**getattr(self, "topics", {}), **topics}
        c = _admin(self.namesrv_addr)
        try:
            for broker in brokers:
                for topic, queues in topics.items():
                    c.create_topic(topic, queues, broker_addr=self.direct_addr(broker))
            deadline = time.monotonic() + timeout_s
            for topic in topics:
                while True:
                    try:
                        names = {b.broker_name for b in c.route(topic, refresh=True).broker_datas}
                    except Exception:
                        names = set()
                    if set(brokers) <= names:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"topic {topic} not routed to {sorted(brokers)} after {timeout_s:g}s "
                                           f"(routed to {sorted(names)})")
                    time.sleep(0.2)
        finally:
            c.close()

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        """Until the name server answers and routes every topic to both brokers, each at its
        advertised address, and both brokers answer (after heal: a deterministic drain)."""
        deadline = time.monotonic() + timeout_s
        last: object = None
        while time.monotonic() < deadline:
            c = _admin(self.namesrv_addr)
            try:
                if set(c.cluster_brokers()) >= set(BROKERS):
                    for topic in self.topics:
                        routed = {b.broker_name for b in c.route(topic, refresh=True).broker_datas}
                        if not set(BROKERS) <= routed:
                            raise RuntimeError(f"topic {topic} routed to {sorted(routed)} only")
                        for mq in c.message_queues(topic)[:1]:
                            c.max_offset(mq)
                    for broker in BROKERS:
                        mqs = [q for t in self.topics for q in c.message_queues(t) if q.broker == broker]
                        if mqs:
                            c.max_offset(mqs[0])
                    return
                last = f"brokers listed: {sorted(c.cluster_brokers())}"
            except Exception as exc:
                last = exc
            finally:
                c.close()
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not become healthy in {timeout_s:g}s: {last}")

    def close(self) -> None:
        raise NotImplementedError


# -- embedded -----------------------------------------------------------------------------------


class _CliProcess:
    """One ``rocketmq-spark`` server process; its output goes to ``<workdir>/<name>.log``."""

    def __init__(self, name: str, workdir: Path, prefix: list[str] | None = None) -> None:
        self.name = name
        self.workdir = workdir
        self.prefix = prefix or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / f"{name}.log"

    def start(self, args: list[str], timeout_s: float = 60.0) -> dict[str, Any]:
        """Starts it; returns the JSON of its first line (its addresses)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        out: IO[bytes]
        with open(self.log, "ab") as out:
            start = out.tell()
            self.proc = subprocess.Popen([*self.prefix, *CLI, *args], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with open(self.log, "rb") as f:
                f.seek(start)
                text = f.read()
            for line in text.splitlines():
                if line.startswith(b"{"):
                    return dict(json.loads(line))
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode} before serving:\n"
                                   f"{text.decode(errors='replace')[-3000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not print its addresses within {timeout_s:g}s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGCONT)  # a stopped process dies only once continued
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


class EmbeddedProcesses(Cluster):
    kind = "embedded"

    def __init__(self, workdir: Path, *, use_netns: bool = True, register_interval_ms: int = 2000) -> None:
        self.register_interval_ms = register_interval_ms
        super().__init__(workdir, use_netns=use_netns)

    def _start_all(self) -> None:
        ns_host = self.netns.host_addr if self.netns is not None else "127.0.0.1"
        self._namesrv = _CliProcess("namesrv", self.workdir)
        self._ns_port = _free_port(ns_host)
        self.namesrv_addr = f"{ns_host}:{self._ns_port}"
        self._start_namesrv()
        # the proxy first, on a port free on 127.0.0.1; broker-a then binds that port on 127.0.0.2
        self.proxy = FaultProxy(target=("127.0.0.2", 0), name="fault-proxy-broker-a")
        self._b_host = self.netns.ns_addr if self.netns is not None else "127.0.0.1"
        self._b_port = _free_port("127.0.0.1") if self.netns is None else 10911
        self._procs = {"namesrv": self._namesrv, "broker-a": _CliProcess("broker-a", self.workdir),
                       "broker-b": _CliProcess("broker-b", self.workdir,
                                               self.netns.argv([]) if self.netns is not None else None)}
        for b in BROKERS:
            self.start(b)

    def _start_namesrv(self) -> None:
        host = self.namesrv_addr.rsplit(":", 1)[0]
        self._namesrv.start(["namesrv", "--host", host, "--port", str(self._ns_port), "--no-auto-create"])

    def _broker_args(self, broker: str) -> list[str]:
        common = ["--namesrv", self.namesrv_addr, "--broker-name", broker, "--grpc-port", "-1",
                  "--data-dir", str(self.store_dir(broker)), "--register-interval-ms", str(self.register_interval_ms),
                  "--no-auto-create"]
        if broker == "broker-a":
            return ["broker", "--host", "127.0.0.2", "--advertise-host", "127.0.0.1", "--broker-port",
                    str(self.proxy.port), *common]
        return ["broker", "--host", self._b_host, "--broker-port", str(self._b_port), *common]

    def advertised(self, broker: str) -> str:
        return self.proxy.address if broker == "broker-a" else f"{self._b_host}:{self._b_port}"

    def direct_addr(self, broker: str) -> str:
        return f"127.0.0.2:{self.proxy.port}" if broker == "broker-a" else self.advertised(broker)

    def store_dir(self, broker: str) -> Path:
        return self.workdir / broker

    def pid(self, target: str) -> int | None:
        return self._procs[target].pid

    def kill(self, target: str) -> None:
        self._procs[target].kill()

    def start(self, target: str) -> None:
        if target == "namesrv":
            self._start_namesrv()
            return
        self._procs[target].start(self._broker_args(target))
        _wait_registered(self.namesrv_addr, target, self.advertised(target), 30.0)

    def close(self) -> None:
        for p in getattr(self, "_procs", {}).values():
            p.kill()
        if getattr(self, "proxy", None) is not None:
            self.proxy.stop()
        if self.netns is not None:
            self.netns.cleanup()


def _wait_registered(namesrv: str, broker: str, addr: str, timeout_s: float) -> bool:
    """Until the name server lists ``broker`` at ``addr``; False after ``timeout_s`` (a name
    server that is down meanwhile: the broker registers once it is back)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c = _admin(namesrv)
        try:
            if c.cluster_brokers().get(broker) == addr:
                return True
        except Exception:
            pass
        finally:
            c.close()
        time.sleep(0.2)
    log.warning("%s not registered at %s with name server %s after %.0fs", broker, addr, namesrv, timeout_s)
    return False


# -- Apache RocketMQ ----------------------------------------------------------------------------


class RealProcesses(Cluster):
    kind = "real"

    def __init__(self, workdir: Path, *, use_netns: bool = True, release: str | None = None) -> None:
        self._groups: dict[str, RealRocketMQ] = {}
        #: the Apache RocketMQ release (None: real_rocketmq.VERSION)
        self.release = release or VERSION
        super().__init__(workdir, use_netns=use_netns)

    def _start_all(self) -> None:
        lib = provision(self.release)
        ns = self.netns
        common: dict[str, Any] = {"proxy": False, "auto_create_topics": False, "register_period_ms": 10_000,
                                  "version": self.release}
        a = RealRocketMQ(lib, self.workdir / "broker-a", broker_bind="127.0.0.2",
                         namesrv_host=ns.host_addr if ns is not None else "127.0.0.1", **common)
        a.assign_ports()
        self._groups["broker-a"] = a
        self.proxy = FaultProxy(target=("127.0.0.2", a.broker_port), listen=("127.0.0.1", a.broker_port),
                                name="fault-proxy-broker-a")
        a.start()
        self.namesrv_addr = a.namesrv_addr
        b_host = ns.ns_addr if ns is not None else "127.0.0.1"
        b = RealRocketMQ(lib, self.workdir / "broker-b", broker_name="broker-b", external_namesrv=a.namesrv_addr,
                         broker_bind=b_host, broker_ip=b_host,
                         broker_launcher=tuple(ns.argv([])) if ns is not None else (), **common)
        self._groups["broker-b"] = b
        b.start()

    def direct_addr(self, broker: str) -> str:
        g = self._groups[broker]
        return g.broker_bind_addr

    def store_dir(self, broker: str) -> Path:
        return self._groups[broker].store_dir

    def pid(self, target: str) -> int | None:
        if target == "namesrv":
            return self._groups["broker-a"].pid("namesrv")
        return self._groups[target].pid("broker")

    def kill(self, target: str) -> None:
        pid = self.pid(target)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)
        if target == "namesrv":
            self._groups["broker-a"].stop_namesrv(kill=True)
        else:
            self._groups[target].stop_broker(kill=True)

    def start(self, target: str) -> None:
        if target == "namesrv":
            self._groups["broker-a"].start_namesrv()
            return
        g = self._groups[target]
        try:
            g.start_broker()
        except RuntimeError:
            # started, but not registered in time (the name server is down or restarting): it
            # registers every 10 s once it is back
            if not self.running(target):
                raise
            log.warning("%s started but is not registered yet", target)

    def close(self) -> None:
        for name in ("broker-b", "broker-a"):
            g = self._groups.get(name)
            if g is not None:
                for role in ("broker", "namesrv"):
                    pid = g.pid(role)
                    if pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pid, signal.SIGCONT)
                g.stop(grace_s=3)
        if getattr(self, "proxy", None) is not None:
            self.proxy.stop()
        if self.netns is not None:
            self.netns.cleanup()


def start_cluster(kind: str, workdir: Path, *, use_netns: bool = True, release: str | None = None) -> Cluster:
    """The cluster of broker ``kind``; ``release``: the Apache RocketMQ release of kind real."""
    if kind == "embedded":
        return EmbeddedProcesses(workdir, use_netns=use_netns)
    if kind == "real":
        return RealProcesses(workdir, use_netns=use_netns, release=release)
    raise ValueError(f"broker kind {kind!r}: expected embedded or real")
