"""Apache RocketMQ itself, from Maven Central, on loopback: the reference the tests compare with.

    lib = provision(VERSION)               # jars cached outside the repo (see cache_root)
    with RealRocketMQ(lib, workdir) as rmq:  # name server + broker (+ 5.x proxy, cluster mode)
        rmq.namesrv_addr, rmq.broker_addr, rmq.grpc_endpoint, rmq.proxy_remoting_addr
        rmq.mqadmin("consumerProgress", "-g", "G")
        rmq.restart_broker()

Used by the tests' ``real_rocketmq`` fixture and by benchmarks/ (no pytest here). The JVMs
get small heaps, their own ``user.home`` (logs and the store stay in ``workdir``), loopback
addresses, and ports picked free; :meth:`RealRocketMQ.stop` ends them (SIGTERM, then SIGKILL)
whatever happened.

Facts this relies on, read from the broker's sources and checked here:
- ``rocketmq.home.dir`` must be set, and each role is told its own logback file
  (``rmq.<role>.logback.xml``, shipped in the role's jar) or it loads the proxy's;
- a broker also listens on listenPort-2 (the "fast" remoting port) and on its HA port, which
  binds every interface: all three must be free, and listenPort is never 0; 4.9.x ignores
  ``haListenPort`` and always takes listenPort+1 (``BrokerStartup`` sets it after reading the
  config);
- the listen and fast ports bind ``bindAddress`` (the fast port's server config is a clone of
  the main one), the HA port ignores it (DefaultHAService binds the port alone); the broker
  registers and stamps records with ``brokerIP1:listenPort``, so a proxy in front of it must
  forward listenPort (and listenPort-2 for Java clients with vipChannelEnabled, off by default
  in 5.x);
- 4.9.x has no proxy and reads its logback XML from ``$ROCKETMQ_HOME/conf`` (written here);
- ``mqadmin`` exits 0 on errors: callers read its output.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NEWEST", "PARITY_RELEASES", "VERSION", "VERSION_4", "VERSION_ENV", "JavaMissing", "RealCluster",
           "RealRocketMQ", "acl2_broker_conf", "cache_root", "java_available", "maven_jars", "parity_releases",
           "pom_of", "provision", "release_from_env"]

#: the newest release that resolves on Maven Central (5.5.1 does not yet): ACL 2.0, TLS and HA run on it
NEWEST = "5.5.0"
#: the 4.9 line's newest release on Maven Central with namesrv and broker jars (4.9.8 has none)
VERSION_4 = "4.9.7"
#: names another 5.x release for the whole real-broker suite (the JVMs never see it: ``_env``)
VERSION_ENV = "ROCKETMQ_SPARK_REAL_VERSION"


def release_from_env(environ: Mapping[str, str]) -> str:
    """The release the whole real-broker suite runs against: ``$ROCKETMQ_SPARK_REAL_VERSION``
    when set and not empty, else :data:`NEWEST`. ValueError for anything but a 5.x release
    written MAJOR.MINOR.PATCH: the suite needs the 5.x proxy (gRPC), which 4.x does not have."""
    value = environ.get(VERSION_ENV, "").strip()
    if not value:
        return NEWEST
    if not re.fullmatch(r"5\.\d+\.\d+", value):
        raise ValueError(f"{VERSION_ENV}={value!r} is not a release the real-broker suite can run on: give a "
                         f"5.x release as MAJOR.MINOR.PATCH, e.g. {NEWEST} or 5.3.3 (4.x has no proxy; "
                         f"{VERSION_4} runs the parity subset of tests/spark/test_real_parity.py)")
    return value


def parity_releases(version: str) -> tuple[str, ...]:
    """The releases the parity subset (the tests marked ``parity`` in
    tests/spark/test_real_parity.py) runs on besides ``version``, the full suite's: 5.3.3 (the
    last release before 5.4) and VERSION_4, newest first, ``version`` left out."""
    return tuple(v for v in ("5.3.3", VERSION_4) if v != version)


#: the 5.x release the whole real-broker suite runs against
VERSION = release_from_env(os.environ)
#: the older releases of the matrix: each runs the parity subset
PARITY_RELEASES = parity_releases(VERSION)
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
_log = logging.getLogger(__name__)


class JavaMissing(RuntimeError):
    """java or mvn is not on PATH: the real broker cannot run here."""


def java_available() -> str | None:
    """None when java, javac and mvn are on PATH, else what is missing."""
    missing = [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]
    return f"{', '.join(missing)} not on PATH" if missing else None


def cache_root() -> Path:
    """Where the jars are cached: ``$ROCKETMQ_SPARK_CACHE``, else ``~/.cache/rocketmq-spark``
    (outside the repository; never committed)."""
    env = os.environ.get("ROCKETMQ_SPARK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rocketmq-spark"


def _pom(version: str) -> str:
    artifacts = ["rocketmq-namesrv", "rocketmq-broker", "rocketmq-tools", "rocketmq-client"]
    if not version.startswith("4."):
        artifacts.append("rocketmq-proxy")
    return pom_of(f"rocketmq-{version}", [("org.apache.rocketmq", a, version) for a in artifacts])


def provision(version: str = VERSION, *, timeout_s: float = 900) -> Path:
    """The directory of every runtime jar of RocketMQ ``version`` (name server, broker, proxy,
    tools, client), fetched by Maven into the cache once; later calls return at once.
    Safe across processes (a lock file); raises RuntimeError with Maven's output on failure."""
    return maven_jars(f"rocketmq-{version}", _pom(version), f"Apache RocketMQ {version}", timeout_s=timeout_s)


def build_once(home: Path, build: Callable[[], str]) -> None:
    """Runs ``build()`` once for the cache folder ``home``, whichever process asks first (a lock
    file), and marks the folder done with what it returns (``.complete``): a build cut short
    leaves no mark and runs again."""
    done = home / ".complete"
    if done.exists():
        return
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            done.write_text(build())


def maven_jars(name: str, pom: str, what: str, *, timeout_s: float = 900) -> Path:
    """``cache_root()/name/lib``: the runtime jars of the dependencies ``pom`` lists (copied by
    Maven's dependency plugin), fetched once; later calls return at once. Safe across processes
    (a lock file); raises RuntimeError naming ``what`` with Maven's output on failure, and
    JavaMissing when java or mvn is not on PATH."""
    missing = java_available()
    if missing:
        raise JavaMissing(missing)
    home = cache_root() / name
    lib = home / "lib"

    def fetch() -> str:
        (home / "pom.xml").write_text(pom)
        staging = Path(tempfile.mkdtemp(prefix="lib-", dir=home))
        cmd = ["mvn", "-B", "-q", "-f", str(home / "pom.xml"), f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
               f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if run.returncode != 0:
                raise RuntimeError(f"fetching {what} from Maven Central failed "
                                   f"({' '.join(cmd)}):\n{(run.stdout + run.stderr)[-3000:]}")
            if lib.exists():
                shutil.rmtree(lib)
            staging.rename(lib)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return name + "\n"

    build_once(home, fetch)
    return lib


def pom_of(name: str, deps: list[tuple[str, str, str]]) -> str:
    """A pom listing ``deps`` ((groupId, artifactId, version) each) for :func:`maven_jars`."""
    body = "".join(f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                   "</dependency>" for g, a, v in deps)
    return ('<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
            f"<groupId>rocketmq-spark.tests</groupId><artifactId>{name}</artifactId>"
            f"<version>1</version><packaging>pom</packaging><dependencies>{body}</dependencies></project>\n")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port(host: str = "127.0.0.1", avoid: set[int] | None = None) -> int:
    """A port free on ``host`` and on every interface (some RocketMQ sockets bind 0.0.0.0),
    below the kernel's ephemeral range: outgoing connections take their local ports from that
    range, so a port picked there can be taken by one before the JVM binds it."""
    low = min(_ephemeral_low(), 60000)
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(max(1030, low - 12000), low - 1)
        if avoid and port in avoid:
            continue
        if _bindable(port):
            return port
    raise RuntimeError("no free port found")


def _bindable(port: int) -> bool:
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


#: the ports :meth:`RealRocketMQ.assign_ports` picks
_PORTS = ("namesrv_port", "broker_port", "ha_port", "grpc_port", "proxy_remoting_port")


def _broker_port(avoid: set[int], ha_next: bool = False) -> int:
    """A listen port L with L-2 (the broker's fast remoting port) free too, and L+1 when the
    broker takes its HA port there whatever it is told (``ha_next``: 4.9.x)."""
    for _ in range(200):
        port = _free_port(avoid=avoid)
        neighbours = [port - 2] + ([port + 1] if ha_next else [])
        if all(n not in avoid and _bindable(n) for n in neighbours):
            return port
    raise RuntimeError("no free broker port pair found")


_LOGBACK_49 = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>${user.home}/logs/rocketmqlogs/%s.log</file>
    <encoder><pattern>%%d{HH:mm:ss.SSS} %%-5p %%c{0} - %%m%%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="F"/></root>
</configuration>
"""


@dataclass
class _Jvm:
    role: str
    argv: list[str]
    log: Path
    ready: str
    proc: subprocess.Popen[bytes] | None = None
    #: where this run's output starts in ``log`` (a restart appends to it)
    log_from: int = 0

    def start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.log_from = out.tell()
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while time.monotonic() < deadline:
            text = self.output()
            if self.ready in text:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the {self.role} exited with code {self.proc.returncode} before it was "
                                   f"ready; the end of {self.log}:\n{_tail(text)}")
            time.sleep(0.1)
        raise RuntimeError(f"the {self.role} was not ready in time; the end of {self.log}:\n"
                           f"{_tail(self.output())}")

    def output(self) -> str:
        """What this run of the JVM printed so far."""
        with open(self.log, "rb") as f:
            f.seek(self.log_from)
            return f.read().decode(errors="replace")

    def stop(self, grace_s: float = 15.0) -> None:
        self.terminate()
        self.reap(time.monotonic() + grace_s)

    def terminate(self) -> None:
        """SIGTERM to the JVM (its shutdown hooks run); :meth:`reap` waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Waits for the JVM to end until ``deadline`` (time.monotonic()), then SIGKILLs it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _tail(text: str, lines: int = 40) -> str:
    kept = [ln for ln in text.splitlines() if "|-INFO in" not in ln and "|-WARN in" not in ln]
    return "\n".join(kept[-lines:])


@dataclass
class RealRocketMQ:
    """A name server, one broker (``broker-a``) and, for 5.x, a proxy in cluster mode, all on
    127.0.0.1 under ``workdir``. Broker settings differ from the defaults only where a test
    machine needs it (small files and heaps) or a test would otherwise wait minutes
    (``transactionCheckInterval``: the first check-back of an open half message comes after
    ``transactionTimeOut`` = 3 s, then every 2 s, instead of 6 s / 30 s; ``transactionOpBatchInterval``
    200 ms instead of 3 s, so a half message ended just before a check is not checked too).

    A cluster of two broker groups is two instances: the first runs the name server and
    ``broker-a``, the second (``external_namesrv`` = the first's ``namesrv_addr``,
    ``proxy=False``, its own ``workdir`` and ``broker_name``) only ``broker-b``."""

    lib: Path
    workdir: Path
    version: str = VERSION
    proxy: bool = True
    java: str = "java"
    namesrv_port: int = 0
    broker_port: int = 0
    ha_port: int = 0
    grpc_port: int = 0
    proxy_remoting_port: int = 0
    broker_name: str = "broker-a"
    cluster: str = "DefaultCluster"
    #: the address the broker's listen port and its fast port (listenPort - 2) bind (bindAddress);
    #: it still advertises 127.0.0.1 (brokerIP1). Another loopback address (127.0.0.2) leaves
    #: 127.0.0.1:broker_port to a proxy in front of the broker (see tests/faults/)
    broker_bind: str = "127.0.0.1"
    #: the address the broker advertises (brokerIP1/brokerIP2: registered with the name server,
    #: stamped in message ids); a broker inside a network namespace gives its address there
    broker_ip: str = "127.0.0.1"
    #: where the name server binds and is reached (another address than 127.0.0.1 for a name server
    #: that a broker inside a network namespace must reach: the host end of its veth)
    namesrv_host: str = "127.0.0.1"
    #: ``host:port`` of a name server started elsewhere: none is started here and the broker
    #: registers there (a second broker group of a cluster, with its own name, ports and store)
    external_namesrv: str | None = None
    #: put before the broker's java command line (``ip netns exec NAME``: the broker runs there)
    broker_launcher: tuple[str, ...] = ()
    #: how often the broker registers with the name server (registerNameServerPeriod; the broker
    #: clamps it to [10 s, 60 s]); the name server drops a broker silent for 120 s
    register_period_ms: int = 30_000
    #: autoCreateTopicEnable: production clusters turn it off and create topics explicitly
    auto_create_topics: bool = True
    #: ``-Dname=value`` system properties of every JVM (name server, broker, proxy, mqadmin), e.g.
    #: TLS: ``tls.server.mode=enforcing``, ``tls.test.mode.enable=false``, ``tls.server.certPath=...``
    system_properties: dict[str, str] = field(default_factory=dict)
    #: entries added to the proxy's rmq-proxy.json (its gRPC TLS: tlsTestModeEnable, tlsCertPath, tlsKeyPath)
    proxy_config: dict[str, object] = field(default_factory=dict)
    #: the client settings this harness's own remoting clients use (TLS when the servers enforce it)
    client_config: object = None
    #: the broker's id in its group (brokerId): 0 is the master, a slave has 1 or more (and
    #: ``broker_role="SLAVE"``; it finds its master through the name server). None: a broker in
    #: controller mode (``enableControllerMode``), whose id and role the controller gives: neither
    #: brokerId nor brokerRole is written, and it counts as registered at any id of its group
    broker_id: int | None = 0
    #: brokerRole: ASYNC_MASTER, SYNC_MASTER (a send is answered once a slave has it) or SLAVE
    broker_role: str = "ASYNC_MASTER"
    #: the broker JVM's heap (-Xms/-Xmx)
    broker_heap: str = "512m"
    #: more broker.conf keys (they win over the ones written here), e.g. {"slaveReadEnable": "true"},
    #: or ACL 2.0's ``authenticationEnabled``/``authorizationEnabled`` and providers (:func:`acl2_broker_conf`)
    broker_config: dict[str, object] = field(default_factory=dict)
    #: more namesrv.conf keys, e.g. the controller it runs inside itself (:class:`RealCluster` ``controller``)
    namesrv_config: dict[str, object] = field(default_factory=dict)
    #: (access key, secret key) mqadmin signs with ($ROCKETMQ_HOME/conf/tools.yml): a broker with
    #: authentication on answers an unsigned admin request NO_PERMISSION
    admin_credentials: tuple[str, str] | None = None
    _jvms: dict[str, _Jvm] = field(default_factory=dict)

    @property
    def is_4x(self) -> bool:
        return self.version.startswith("4.")

    @property
    def namesrv_addr(self) -> str:
        return self.external_namesrv or f"{self.namesrv_host}:{self.namesrv_port}"

    @property
    def broker_addr(self) -> str:
        return f"{self.broker_ip}:{self.broker_port}"

    @property
    def store_dir(self) -> Path:
        """The broker's store (commit log, queues, and its config: topics, groups, offsets)."""
        return self.workdir / "store"

    def pid(self, role: str) -> int | None:
        """The pid of the ``role`` JVM (namesrv, broker, proxy) while it runs, else None."""
        jvm = self._jvms.get(role)
        proc = jvm.proc if jvm is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def broker_bind_addr(self) -> str:
        """Where the broker's listen port is bound (its advertised address is broker_addr)."""
        return f"{self.broker_bind}:{self.broker_port}"

    @property
    def grpc_endpoint(self) -> str:
        """The 5.x proxy's gRPC endpoint (apache.rocketmq.v2)."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def proxy_remoting_addr(self) -> str:
        """The 5.x proxy's remoting port: classic clients may use it as their name server."""
        return f"127.0.0.1:{self.proxy_remoting_port}"

    def _env(self) -> dict[str, str]:
        """The JVMs' environment: ours without ROCKETMQ_* (a user's settings must not leak in)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROCKETMQ_")}
        env["ROCKETMQ_HOME"] = str(self.workdir)
        return env

    # -- life cycle -----------------------------------------------------------------------

    def __enter__(self) -> RealRocketMQ:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def assign_ports(self) -> None:
        """Picks a free port for each port left at 0 (start() calls it; call it first to know
        ``broker_port`` before the broker runs, e.g. to put a proxy on it)."""
        taken: set[int] = set()
        for name in _PORTS:
            if name == "ha_port" and self.is_4x:
                self.ha_port = self.broker_port + 1  # 4.9.x binds it there whatever it is told
            elif not getattr(self, name):
                port = _broker_port(taken, ha_next=self.is_4x) if name == "broker_port" else _free_port(avoid=taken)
                setattr(self, name, port)
            taken |= {getattr(self, name), getattr(self, name) - 2, getattr(self, name) + 1}

    def start(self, timeout_s: float = 120, *, broker: bool = True) -> None:
        """Starts the name server (unless ``external_namesrv``), the broker and the proxy;
        ``broker=False``: the name server only (:meth:`start_broker` starts the broker later)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proxy = self.proxy and not self.is_4x
        self.assign_ports()
        self._write_configs()
        env = self._env()
        deadline = time.monotonic() + timeout_s
        try:
            if self.external_namesrv is None:
                self._jvm("namesrv").start(env)
                self._jvms["namesrv"].wait_ready(deadline)
            if not broker:
                return
            self._jvm("broker").start(env)
            self._jvms["broker"].wait_ready(deadline)
            self._wait_registered(deadline)
            if self.proxy:  # it creates system topics on the cluster as it starts: after the broker
                self._start_proxy(env, deadline)
        except BaseException:
            self.stop()
            raise

    def _start_proxy(self, env: dict[str, str], deadline: float, attempts: int = 3) -> None:
        """Starts the proxy, again (up to ``attempts`` in all) when it exits before it is ready:
        it creates its system topics on the broker as it starts, each request with what is left
        of a 3 s budget, and exits when one times out (seen on a loaded machine); the topics it
        did create stay, and a deterministic failure fails every attempt with the same log."""
        for attempt in range(1, attempts + 1):
            jvm = self._jvm("proxy")
            jvm.start(env)
            try:
                jvm.wait_ready(deadline)
                return
            except RuntimeError:
                if attempt == attempts or jvm.proc is None or jvm.proc.poll() is None:
                    raise  # the last attempt, or not ready in time (not an exit)
                _log.warning("the %s proxy exited before it was ready (attempt %d of %d); starting it again",
                             self.version, attempt, attempts)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stops every JVM (proxy, broker, name server): SIGTERM to all at once, SIGKILL to those
        still running ``grace_s`` later (a clean broker shutdown takes ~10 s here, the name
        server's ~5 s; a throw-away store need not wait for them)."""
        self.terminate()
        self.reap(time.monotonic() + grace_s)

    def terminate(self) -> None:
        """SIGTERM to every JVM (proxy, broker, name server); :meth:`reap` waits for them."""
        for role in ("proxy", "broker", "namesrv"):
            if role in self._jvms:
                self._jvms[role].terminate()

    def reap(self, deadline: float) -> None:
        """Waits for every JVM to end until ``deadline`` (time.monotonic()), then SIGKILLs the rest."""
        for role in ("proxy", "broker", "namesrv"):
            if role in self._jvms:
                self._jvms[role].reap(deadline)

    def _stop_jvm(self, role: str, kill: bool) -> None:
        jvm = self._jvms[role]
        if kill and jvm.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(jvm.proc.pid, signal.SIGKILL)
            jvm.proc.wait(10)
            jvm.proc = None
        jvm.stop()

    def stop_broker(self, *, kill: bool = False) -> None:
        """Stops the broker (SIGTERM and wait, or SIGKILL: a crash)."""
        self._stop_jvm("broker", kill)

    def start_broker(self, timeout_s: float = 90) -> None:
        """Starts the broker (again) on its ports, with its store; returns once it serves."""
        env = self._env()
        deadline = time.monotonic() + timeout_s
        jvm = self._jvms.get("broker") or self._jvm("broker")
        while not _bindable(self.ha_port) and time.monotonic() < deadline:
            time.sleep(0.2)  # the old process's sockets
        jvm.start(env)
        jvm.wait_ready(deadline)
        self._wait_registered(deadline)

    def restart_broker(self, *, kill: bool = False) -> None:
        self.stop_broker(kill=kill)
        self.start_broker()

    def stop_namesrv(self, *, kill: bool = False) -> None:
        """Stops the name server (SIGTERM and wait, or SIGKILL). Brokers keep running and
        register again once it is back (every ``register_period_ms``)."""
        self._stop_jvm("namesrv", kill)

    def start_namesrv(self, timeout_s: float = 60) -> None:
        """Starts the name server again on its port; returns once it serves (its routes come
        back as the brokers register again)."""
        deadline = time.monotonic() + timeout_s
        jvm = self._jvms["namesrv"]
        jvm.start(self._env())
        jvm.wait_ready(deadline)

    def _wait_registered(self, deadline: float) -> None:
        """Until the name server lists the broker (it registers right after its ready line)."""
        from rocketmq_spark.client import RemotingClient

        c = RemotingClient(self.namesrv_addr, self.client_config)  # type: ignore[arg-type]
        try:
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    group = c.cluster_members().get(self.broker_name, {})
                    if self.broker_id is None:
                        if self.broker_addr in group.values():
                            return
                    elif group.get(self.broker_id) == self.broker_addr:
                        return
                time.sleep(0.1)
        finally:
            c.close()
        raise RuntimeError(f"broker {self.broker_name} (id {self.broker_id}) did not register with the name server "
                           f"{self.namesrv_addr}")

    # -- configuration ----------------------------------------------------------------------

    def _jvm_argv(self, role: str, heap: str, main: str, *args: str, flags: tuple[str, ...] = ()) -> list[str]:
        """A java command line for one of RocketMQ's main classes (``role`` names its logback file)."""
        argv = [self.java, "-XX:+UseSerialGC", *flags, f"-Xms{heap}", f"-Xmx{heap}", "-XX:MaxDirectMemorySize=256m",
                f"-Duser.home={self.workdir}", f"-Drocketmq.home.dir={self.workdir}",
                "-Djava.net.preferIPv4Stack=true", *(f"-D{k}={v}" for k, v in self.system_properties.items())]
        if not self.is_4x:
            argv.append(f"-Drmq.logback.configurationFile=rmq.{role}.logback.xml")
        return [*argv, "-cp", f"{self.lib}/*", main, *args]

    def _jvm(self, role: str) -> _Jvm:
        w = self.workdir
        if role == "namesrv":
            argv = self._jvm_argv(role, "128m", "org.apache.rocketmq.namesrv.NamesrvStartup",
                                  "-c", str(w / "namesrv.conf"))
            ready = "The Name Server boot success"
        elif role == "broker":
            argv = [*self.broker_launcher, *self._jvm_argv(role, self.broker_heap,
                                                           "org.apache.rocketmq.broker.BrokerStartup",
                                                           "-c", str(w / "broker.conf"))]
            ready = "boot success"
        else:
            argv = self._jvm_argv(role, "256m", "org.apache.rocketmq.proxy.ProxyStartup", "-pm", "cluster",
                                  "-pc", str(w / "rmq-proxy.json"), "-n", self.namesrv_addr)
            ready = "rocketmq-proxy startup successfully"
        jvm = _Jvm(role, argv, w / f"{role}.out", ready)
        self._jvms[role] = jvm
        return jvm

    def _write_configs(self) -> None:
        w = self.workdir
        store = w / "store"
        namesrv = {"listenPort": self.namesrv_port, "bindAddress": self.namesrv_host,
                   "kvConfigPath": w / "namesrv-kv.json", **self.namesrv_config}
        (w / "namesrv.conf").write_text("".join(f"{k}={v}\n" for k, v in namesrv.items()))
        role = {} if self.broker_id is None else {"brokerId": self.broker_id, "brokerRole": self.broker_role}
        broker = {
            "brokerClusterName": self.cluster, "brokerName": self.broker_name, **role, "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": self.namesrv_addr, "listenPort": self.broker_port, "haListenPort": self.ha_port,
            "bindAddress": self.broker_bind, "brokerIP1": self.broker_ip, "brokerIP2": self.broker_ip,
            "storePathRootDir": store, "storePathCommitLog": store / "commitlog",
            "mappedFileSizeCommitLog": 64 * 1024 * 1024, "mappedFileSizeConsumeQueue": 600_000,
            "maxHashSlotNum": 50_000, "maxIndexNum": 200_000,
            "autoCreateTopicEnable": str(self.auto_create_topics).lower(), "autoCreateSubscriptionGroup": "true",
            "registerNameServerPeriod": self.register_period_ms,
            "enablePropertyFilter": "true", "warmMapedFileEnable": "false", "transientStorePoolEnable": "false",
            "transactionTimeOut": 3000, "transactionCheckInterval": 2000,
            # ended transactions are recorded (op messages) in batches this often; with the short check
            # timings above a check-back could otherwise come for a half message already committed
            **self._op_batch_settings(),
            # a test machine's disk may be fuller than a server's; the broker refuses writes past it
            "diskMaxUsedSpaceRatio": 95,
            **self.broker_config,
        }
        (w / "broker.conf").write_text("".join(f"{k}={v}\n" for k, v in broker.items()))
        if self.admin_credentials is not None:  # MQAdminStartup reads it for every command
            (w / "conf").mkdir(exist_ok=True)
            ak, sk = self.admin_credentials
            (w / "conf" / "tools.yml").write_text(f"accessKey: {json.dumps(ak)}\nsecretKey: {json.dumps(sk)}\n")
        if self.proxy:
            (w / "rmq-proxy.json").write_text(json.dumps({
                "rocketMQClusterName": self.cluster, "namesrvAddr": self.namesrv_addr,
                "grpcServerPort": self.grpc_port, "remotingListenPort": self.proxy_remoting_port,
                "localServeAddr": "127.0.0.1", **self.proxy_config}))
        if self.is_4x:  # 4.x reads $ROCKETMQ_HOME/conf/logback_<role>.xml
            conf = w / "conf"
            conf.mkdir(exist_ok=True)
            for role in ("namesrv", "broker", "tools"):
                (conf / f"logback_{role}.xml").write_text(_LOGBACK_49 % role)

    # -- the admin tool ---------------------------------------------------------------------

    def _op_batch_settings(self) -> dict[str, object]:
        """How the broker records ended transactions (op messages). 5.3.3 and before: in batches
        every 200 ms. From 5.4 (5.5.0 seen), the batch service spins on a whole core once any
        transaction has ended (apache/rocketmq#10966: an idle queue's last write time makes its
        wait 0), which starved everything else on a 2-core machine: there every END is written
        at once (a batch of one message) and the interval is long enough that it never lapses.
        The cost: a wakeup of that service lost in a race waits out the hour, so a burst of more
        than 20,000 ENDs fills its queue and each END after waits 100 ms. No test sends that
        many; the exactly-once benchmark (200,000) runs Apache's defaults instead."""
        major, minor = (int(p) for p in self.version.split(".")[:2])
        if (major, minor) >= (5, 4):
            return {"transactionOpMsgMaxSize": 1, "transactionOpBatchInterval": 3_600_000}
        return {"transactionOpBatchInterval": 200}

    def mqadmin(self, *args: str, timeout_s: float = 120, namesrv: str | None = None) -> str:
        """Runs ``mqadmin <args>`` against this cluster (``-n`` added; ``namesrv`` points it at
        another one, e.g. an embedded broker's) and returns its output. mqadmin exits 0 on most
        errors: a Java exception in the output is raised here."""
        argv = self._jvm_argv("tools", "256m", "org.apache.rocketmq.tools.command.MQAdminStartup", *args,
                              "-n", namesrv or self.namesrv_addr, flags=("-XX:TieredStopAtLevel=1",))  # short-lived
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=self._env())
        out = run.stdout + run.stderr
        if run.returncode != 0 or "Exception" in out:
            raise RuntimeError(f"mqadmin {' '.join(args)} failed (exit {run.returncode}):\n{_tail(out)}")
        return run.stdout

    def topic_route_ready(self, topic: str, timeout_s: float = 30) -> None:
        """Until the name server (and the proxy, when there is one) route ``topic``."""
        from rocketmq_spark.client import RemotingClient

        deadline = time.monotonic() + timeout_s
        addrs = [self.namesrv_addr] + ([self.proxy_remoting_addr] if self.proxy else [])
        for addr in addrs:
            c = RemotingClient(addr, self.client_config)  # type: ignore[arg-type]
            try:
                while True:
                    try:  # the route itself: a write-only topic has no queue to read but is routed
                        if c.route(topic, refresh=True).queue_datas:
                            break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{addr} routes topic {topic!r} with no queues after {timeout_s:g}s")
                    time.sleep(0.1)
            finally:
                c.close()


def acl2_broker_conf(admin: tuple[str, str]) -> dict[str, object]:
    """broker.conf lines that turn ACL 2.0 on (5.4+; keys read from 5.5.0's AuthConfig and
    AuthenticationFactory): authentication and authorization with the default providers, users and
    policies kept in the broker's store (the Local*MetadataProvider classes: without a metadata
    provider every request is refused), and ``admin`` = (user, password) created at start as a
    super user (``initAuthenticationUser``), which also signs the broker's own requests to its
    peers (``innerClientAuthenticationCredentials``). The name server checks nothing."""
    user, password = admin
    pkg = "org.apache.rocketmq.auth"
    compact = {"separators": (",", ":")}
    return {
        "authenticationEnabled": "true",
        "authenticationProvider": f"{pkg}.authentication.provider.DefaultAuthenticationProvider",
        "authenticationMetadataProvider": f"{pkg}.authentication.provider.LocalAuthenticationMetadataProvider",
        "authorizationEnabled": "true",
        "authorizationProvider": f"{pkg}.authorization.provider.DefaultAuthorizationProvider",
        "authorizationMetadataProvider": f"{pkg}.authorization.provider.LocalAuthorizationMetadataProvider",
        "initAuthenticationUser": json.dumps({"username": user, "password": password}, **compact),
        "innerClientAuthenticationCredentials": json.dumps({"accessKey": user, "secretKey": password}, **compact),
    }


def acl2_proxy_conf(admin: tuple[str, str]) -> dict[str, object]:
    """rmq-proxy.json entries that turn ACL 2.0 on in a cluster-mode proxy (keys read from 5.5.0's
    AuthConfig, ProxyConfig and DefaultMessagingProcessor): the proxy authenticates and authorizes
    every gRPC call (and remoting request) itself, with the default providers, asking the broker
    for users and policies (the Proxy*MetadataProvider classes: no copy of them in the proxy); and
    it signs its own requests to the broker as ``admin`` (``innerClientAuthenticationCredentials``,
    used only with ``enableAclRpcHookForClusterMode``): unsigned, the broker refuses even the
    system topics the proxy creates as it starts."""
    user, password = admin
    auth, proxy = "org.apache.rocketmq.auth", "org.apache.rocketmq.proxy.auth"
    return {
        "authenticationEnabled": True,
        "authenticationProvider": f"{auth}.authentication.provider.DefaultAuthenticationProvider",
        "authenticationMetadataProvider": f"{proxy}.ProxyAuthenticationMetadataProvider",
        "authorizationEnabled": True,
        "authorizationProvider": f"{auth}.authorization.provider.DefaultAuthorizationProvider",
        "authorizationMetadataProvider": f"{proxy}.ProxyAuthorizationMetadataProvider",
        "enableAclRpcHookForClusterMode": True,
        "innerClientAuthenticationCredentials": json.dumps({"accessKey": user, "secretKey": password},
                                                           separators=(",", ":")),
    }


@dataclass
class RealCluster:
    """One name server and several broker groups of Apache RocketMQ on 127.0.0.1, no proxy: a
    master per group in ``groups`` and a slave (brokerId 1) for each group in ``slaves``.

        with RealCluster(provision(NEWEST), workdir, slaves=("broker-a",)) as cluster:
            cluster.namesrv_addr, cluster.addr("broker-a"), cluster.addr("broker-a", 1)
            cluster.kill("broker-a")          # SIGKILL the master
            cluster.start_member("broker-a")  # back on its ports, with its store

    Each member is a :class:`RealRocketMQ` (``member(name, broker_id)``), the first one runs the
    name server. A group with a slave is a SYNC_MASTER (a send is answered once the slave has
    it, so a slave read after the master's crash misses nothing the producer was told is
    stored); the others are ASYNC_MASTERs. Every member has ``slaveReadEnable=true`` (a slave
    refuses pulls without it; a master suggests its slave to a consumer that lags past its
    memory) and registers every 10 s (the floor the broker takes), so a slave learns that its
    master is back within 10 s.

    ``controller=True``: automatic master election (5.x "controller mode"). The name server
    runs a controller inside itself, and every broker starts with no id and no role: the
    controller gives each an id in its group (1, 2, ... in the order they ask, kept in the
    broker's store, ``broker.identity``) and makes one the master; the master registers with the
    name server as brokerId 0, the others under their controller id. When the master's
    connection to the controller closes (a crash) or its heartbeats stop for
    ``controllerHeartBeatTimeoutMills`` (10 s), the controller elects another member of the
    group's sync state set (the members caught up with the master) and tells the brokers; the
    new master registers as brokerId 0 at its own address. A member started again registers
    under its old id and follows the new master as a slave. Here ``member(name, n)`` is the
    n-th member started (0 first: usually the first master), not a broker id; ask
    :meth:`master_of` or :meth:`replica_info` who the master is now. Facts read from
    apache/rocketmq (develop of 2025-09, checked against 5.5.0's classes with javap):

    - name server (NamesrvStartup, ControllerConfig): ``enableControllerInNamesrv=true`` reads
      the ControllerConfig keys from the same namesrv.conf; the controller is a DLedger group
      (``controllerType`` DLedger, the default; jRaft is the other) of ``controllerDLegerPeers``
      (``n0-127.0.0.1:P``), ``controllerDLegerSelfId`` (n0), ``controllerDLegerGroup``,
      ``controllerStorePath`` (its log; ``mappedFileSize`` 1 GB by default, 4 MB here), and it
      serves brokers on P (DLedger's own remoting server), not on the name server's port;
      ``enableElectUncleanMaster`` (false) keeps a member outside the sync state set from
      being elected;
    - broker (BrokerConfig, MessageStoreConfig, ReplicasManager): ``enableControllerMode=true``
      and ``controllerAddr`` (the controller's P); brokerId/brokerRole are ignored (BrokerStartup
      skips them) and the broker stays fenced (registers with no name server) until the
      controller has told it its role; ``allAckInSyncStateSet=true`` makes the master answer a
      send only once every member of the sync state set has it (without it a master acks
      alone: ``inSyncReplicas`` 1), so an acked message survives the election;
      ``checkSyncStateSetPeriod`` (how often the master reports a caught-up slave to the
      controller, 5 s by default, 1 s here) and ``syncBrokerMetadataPeriod`` (how often a broker
      asks the controller who the master is, 5 s, 1 s here: the controller also tells the
      brokers at once, ``notifyBrokerRoleChanged``); an idle slave reports its offset to the
      master every ``haSendHeartbeatInterval`` (5 s, 1 s here), and the master takes it into the
      sync state set on such a report once it has caught up; a slave more than
      ``haMaxTimeSlaveNotCatchup`` (15 s) behind leaves the sync state set; a broker in
      controller mode must not use the DLedger commit log (``enableDLegerCommitLog``)."""

    lib: Path
    workdir: Path
    version: str = NEWEST
    groups: tuple[str, ...] = ("broker-a", "broker-b")
    slaves: tuple[str, ...] = ()
    broker_heap: str = "256m"
    #: more broker.conf keys for every member
    broker_config: dict[str, object] = field(default_factory=dict)
    #: automatic master election: a controller in the name server, brokers with no fixed role
    #: (see the class docstring); a group in ``slaves`` then has two members
    controller: bool = False
    #: the controller's port (picked at start when 0): brokers reach it there
    controller_port: int = 0
    members: dict[tuple[str, int], RealRocketMQ] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.slaves) - set(self.groups))
        if unknown:
            raise ValueError(f"slaves {unknown} name no group of {list(self.groups)}")
        for name in self.groups:
            ids = (0, 1) if name in self.slaves else (0,)
            for broker_id in ids:
                role = "SLAVE" if broker_id else "SYNC_MASTER" if name in self.slaves else "ASYNC_MASTER"
                self.members[(name, broker_id)] = RealRocketMQ(
                    self.lib, self.workdir / f"{name}-{broker_id}", version=self.version, proxy=False,
                    broker_name=name, broker_id=None if self.controller else broker_id, broker_role=role,
                    broker_heap=self.broker_heap, register_period_ms=10_000,
                    broker_config={"slaveReadEnable": "true", **self.broker_config})

    @property
    def controller_addr(self) -> str:
        """Where the brokers reach the controller (``controllerAddr``); ``controller=True`` only."""
        if not self.controller:
            raise ValueError("this cluster runs no controller (controller=False)")
        return f"127.0.0.1:{self.controller_port}"

    def _configure_controller(self) -> None:
        """Puts the controller into the first member's name server and points every broker at it."""
        # every member's ports now, apart from the others' (they start together: a port picked
        # twice would not show as taken before a JVM binds it)
        # (each port with its neighbours: a broker's fast port is listenPort - 2, another's HA
        # port may be any of them)
        taken: set[int] = set()
        for rmq in self.members.values():
            for _ in range(20):
                rmq.assign_ports()
                ports = {getattr(rmq, n) for n in _PORTS}
                near = ports | {p - 2 for p in ports} | {p + 1 for p in ports}
                if not near & taken:
                    break
                for n in _PORTS:
                    setattr(rmq, n, 0)
            taken |= near
        if not self.controller_port:
            self.controller_port = _free_port(avoid=taken)
        self.first.namesrv_config.update({
            "enableControllerInNamesrv": "true", "controllerDLegerGroup": f"{self.first.cluster}-controller",
            "controllerDLegerPeers": f"n0-{self.controller_addr}", "controllerDLegerSelfId": "n0",
            "controllerStorePath": self.workdir / "controller", "mappedFileSize": 4 * 1024 * 1024,
            "enableElectUncleanMaster": "false", "notifyBrokerRoleChanged": "true"})
        for rmq in self.members.values():
            rmq.broker_config = {"enableControllerMode": "true", "controllerAddr": self.controller_addr,
                                 "allAckInSyncStateSet": "true", "checkSyncStateSetPeriod": 1000,
                                 "syncBrokerMetadataPeriod": 1000, "haSendHeartbeatInterval": 1000,
                                 **rmq.broker_config}

    @property
    def first(self) -> RealRocketMQ:
        return self.members[(self.groups[0], 0)]

    @property
    def namesrv_addr(self) -> str:
        return self.first.namesrv_addr

    def member(self, name: str, broker_id: int = 0) -> RealRocketMQ:
        return self.members[(name, broker_id)]

    def addr(self, name: str, broker_id: int = 0) -> str:
        """The address member ``broker_id`` of group ``name`` registers (0: the master; with
        ``controller``, the member started first: see :meth:`master_of`)."""
        return self.member(name, broker_id).broker_addr

    def __enter__(self) -> RealCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 180) -> None:
        """The name server with the first master, then the other members (masters before their
        slaves); returns once every one is registered. With ``controller``, the first member's
        name server runs the controller, and the brokers start together once it serves (one
        after another cost a JVM start each, ~10 s on a busy machine): the first to register
        with the controller becomes the master."""
        try:
            if self.controller:
                self._configure_controller()
                self.first.start(timeout_s, broker=False)
                for rmq in self.members.values():
                    rmq.external_namesrv = None if rmq is self.first else self.namesrv_addr
                with ThreadPoolExecutor(len(self.members)) as pool:
                    starts = [pool.submit(rmq.start_broker if rmq is self.first else rmq.start, timeout_s)
                              for rmq in self.members.values()]
                    for started in starts:
                        started.result()
                return
            self.first.start(timeout_s)
            for rmq in self.members.values():
                if rmq is not self.first:
                    rmq.external_namesrv = self.namesrv_addr
                    rmq.start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stops every member: SIGTERM to all (slaves first, the name server last), SIGKILL to
        those still running 5 s later (a broker's clean shutdown takes ~10 s here; a throw-away
        store need not wait for it, and one member after another cost 5 s each)."""
        ordered = [rmq for _, rmq in sorted(self.members.items(), key=lambda kv: (kv[1] is self.first, -kv[0][1]))]
        for rmq in ordered:
            rmq.terminate()
        deadline = time.monotonic() + 5.0
        for rmq in ordered:
            rmq.reap(deadline)

    def master_of(self, name: str) -> int | None:
        """The member (its number in ``members``) the name server lists as group ``name``'s
        master (brokerId 0) now, None when it lists none."""
        from rocketmq_spark.client import RemotingClient

        c = RemotingClient(self.namesrv_addr)
        try:
            addr = c.cluster_members().get(name, {}).get(0)
        finally:
            c.close()
        return next((n for (group, n), rmq in self.members.items() if group == name and rmq.broker_addr == addr), None)

    def replica_info(self, name: str) -> tuple[int | None, str | None, set[int]]:
        """What the controller says of group ``name``: (the master's controller id, its address,
        the controller ids in the sync state set). CONTROLLER_GET_REPLICA_INFO (1004): the
        master in the answer's header, the set in its body ({"syncStateSet": [...], ...})."""
        from rocketmq_spark.client import RemotingClient
        from rocketmq_spark.remoting.frame import RemotingCommand
        from rocketmq_spark.remoting.route import loads_lenient

        get_replica_info = 1004  # RequestCode.CONTROLLER_GET_REPLICA_INFO
        c = RemotingClient(self.namesrv_addr)
        try:
            resp = c.invoke(self.controller_addr, RemotingCommand(get_replica_info, ext_fields={"brokerName": name}),
                            f"replica info of {name}")
        finally:
            c.close()
        master = resp.ext_fields.get("masterBrokerId")
        body = loads_lenient(resp.body) if resp.body else {}
        return (int(master) if master else None, resp.ext_fields.get("masterAddress") or None,
                {int(i) for i in body.get("syncStateSet") or ()})

    def wait_in_sync(self, name: str, timeout_s: float = 60) -> None:
        """Until every member of group ``name`` is in its sync state set (``controller`` only):
        the controller elects only such a member, and before a slave joins, the master acks
        sends without it."""
        want = sum(1 for group, _ in self.members if group == name)
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(Exception):
                master, _, in_sync = self.replica_info(name)
                if master is not None and len(in_sync) >= want:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"group {name}'s sync state set did not reach its {want} members in "
                                   f"{timeout_s:g}s: the controller says {self._replica_text(name)}")
            time.sleep(0.2)

    def _replica_text(self, name: str) -> str:
        try:
            master, addr, in_sync = self.replica_info(name)
        except Exception as exc:  # for an error message only
            return f"nothing ({exc})"
        return f"master id {master} at {addr}, sync state set {sorted(in_sync)}"

    def kill(self, name: str, broker_id: int = 0) -> None:
        """SIGKILL one member (a crash: its connections close, the name server drops it at once)."""
        self.member(name, broker_id).stop_broker(kill=True)

    def start_member(self, name: str, broker_id: int = 0, timeout_s: float = 90) -> None:
        """Starts a stopped member again on its ports, with its store; returns once registered."""
        self.member(name, broker_id).start_broker(timeout_s)

    def mqadmin(self, *args: str, timeout_s: float = 120) -> str:
        """``mqadmin <args>`` against the cluster's name server (see :meth:`RealRocketMQ.mqadmin`)."""
        return self.first.mqadmin(*args, timeout_s=timeout_s)

    def create_topic(self, topic: str, queues: int = 2) -> None:
        """``topic`` with ``queues`` read and write queues on every member of every group (masters
        and slaves alike, UPDATE_AND_CREATE_TOPIC as mqadmin sends it), routed when this
        returns. A slave would copy the topic from its master by itself, but only once a
        minute (BrokerController schedules SlaveSynchronize.syncAll at most every 60 s since
        5.1): until then it answers pulls with "topic not exist". Creating it there too is what
        an operator's script does and keeps the tests from waiting for that minute."""
        from rocketmq_spark.client import RemotingClient

        c = RemotingClient(self.namesrv_addr)
        try:
            for rmq in self.members.values():
                c.create_topic(topic, queues, broker_addr=rmq.broker_addr)
        finally:
            c.close()
        self.first.topic_route_ready(topic)

    def create_group(self, group: str) -> None:
        """Consumer group ``group`` on every member (a slave refuses commits of a group it does
        not know, and copies its master's groups only once a minute, as topics)."""
        from rocketmq_spark.client import RemotingClient

        c = RemotingClient(self.namesrv_addr)
        try:
            for rmq in self.members.values():
                c.create_group(group, broker_addr=rmq.broker_addr)
        finally:
            c.close()


@contextlib.contextmanager
def running(version: str = VERSION, workdir: Path | None = None, **kw: object) -> Iterator[RealRocketMQ]:
    """Provision ``version`` and run it for the ``with`` block (a temp workdir unless given)."""
    lib = provision(version)
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix=f"rocketmq-{version}-")) if workdir is None else workdir
    try:
        with RealRocketMQ(lib, wd, version=version, **kw) as rmq:  # type: ignore[arg-type]
            yield rmq
    finally:
        if own:
            shutil.rmtree(wd, ignore_errors=True)
