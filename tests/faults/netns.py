"""A process (a broker) in its own network namespace, joined to ours by a veth pair that a
test can cut: a real network partition, seen by the kernels on both sides, not by a proxy.

::

    reason = available()                 # None, or why it cannot run here
    with Netns.create() as ns:           # 10.231.a.b/30: ns.host_addr here, ns.ns_addr inside
        proc = ns.run([sys.executable, "-m", "rocketmq_spark.cli", "broker", "--host", ns.ns_addr,
                       "--namesrv", f"{ns.host_addr}:{port}", ...], stdout=subprocess.PIPE)
        ns.partition()                   # packets either way vanish; sockets stay open
        ns.heal()                        # they flow again; TCP resends what was lost
    # the namespace, the veth pair and every process left inside are gone

Addresses: a /30 of 10.231.0.0/16, the host end in this namespace (``host_addr``), the other
inside (``ns_addr``). Nothing routes further: the namespace has no default route, and this
namespace gets ``unreachable 10.231.0.0/16`` (metric 4242; added once, left in place) so
that a packet for a namespace that is gone (or cut) never follows the default route off the
machine. Each side has the other's MAC address as a permanent neighbour, so a cut does not
turn into "no route to host" after failed ARP: connects and sends simply get no answer.

:meth:`Netns.partition` sets the inside end down: this side keeps its route (marked
linkdown) and its packets are dropped by the veth; inside, the routes go with the link, so
the process there gets ENETUNREACH for new connections while its open ones wait.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN for ``ip netns``) and iproute2. A namespace whose
creator died without cleaning up is removed by the next :meth:`Netns.create` (each holds a
lock file under /run/rocketmq-spark-faults while it lives).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Any

log = logging.getLogger(__name__)

__all__ = ["Netns", "NetnsError", "available"]

#: every address the suite puts in namespaces comes from here
SUBNET = "10.231.0.0/16"
_GUARD_METRIC = "4242"
#: namespaces are named rmqf-<creator pid>-<index>; their veth ends rmqf<index>h / rmqf<index>n
_PREFIX = "rmqf"
_LOCKS = "/run/rocketmq-spark-faults"
_SLOTS = 16384  # /30s in a /16


class NetnsError(RuntimeError):
    """An ``ip`` command failed; the message has the command and its output."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and run.returncode != 0:
        raise NetnsError(f"`ip {' '.join(args)}` failed (exit {run.returncode}): {run.stderr.strip()}")
    return run


@functools.cache
def available() -> str | None:
    """None when network namespaces can be made here, else the reason (not root, no ``ip``,
    or the kernel/container refusing a namespace or a veth pair). Tried once per process."""
    if os.geteuid() != 0:
        return f"network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); running as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not on PATH"
    name = f"{_PREFIX}-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        probe = f"{_PREFIX}p{os.getpid() % 100000}"
        _ip("link", "add", probe, "type", "veth", "peer", "name", probe + "x", "netns", name)
        _ip("link", "del", probe, check=False)
    except (NetnsError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a veth pair: {exc}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def _addr(slot: int, host: int) -> str:
    base = slot * 4 + host
    return f"10.231.{base // 256}.{base % 256}"


def _mac(ns: str | None, ifname: str) -> str:
    args = ("-n", ns) if ns else ()
    out = _ip(*args, "-o", "link", "show", ifname).stdout
    m = re.search(r"link/ether ([0-9a-f:]{17})", out)
    if m is None:
        raise NetnsError(f"no MAC address for {ifname} in `ip link show`: {out.strip()}")
    return m.group(1)


def _pids_in(ns: str) -> list[int]:
    run = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in run.stdout.split()] if run.returncode == 0 else []


@dataclass
class Netns:
    """A network namespace ``name`` with one veth pair: ``host_if`` (``host_addr``) here,
    ``ns_if`` (``ns_addr``) inside, on the /30 ``subnet``. Build it with :meth:`create`;
    :meth:`cleanup` (or the ``with`` block) removes it whatever state it is in."""

    name: str
    slot: int
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str
    subnet: str
    partitioned: bool = False
    _lock: IO[str] | None = field(default=None, repr=False)
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls) -> Netns:
        """A new namespace on a free /30 of 10.231.0.0/16, lo and the veth up in it.
        NetnsError when it cannot be made (see :func:`available` for why beforehand);
        nothing is left behind then."""
        reason = available()
        if reason is not None:
            raise NetnsError(reason)
        _sweep_stale()
        _ip("route", "replace", "unreachable", SUBNET, "metric", _GUARD_METRIC)
        os.makedirs(_LOCKS, exist_ok=True)
        rng = random.Random()
        for _ in range(50):
            slot = rng.randrange(1, _SLOTS)
            ns = cls(name=f"{_PREFIX}-{os.getpid()}-{slot}", slot=slot, host_if=f"{_PREFIX}{slot}h",
                     ns_if=f"{_PREFIX}{slot}n", host_addr=_addr(slot, 1), ns_addr=_addr(slot, 2),
                     subnet=f"{_addr(slot, 0)}/30")
            if not ns._claim():
                continue
            try:
                ns._build()
            except BaseException:
                ns.cleanup()
                raise
            return ns
        raise NetnsError("no free /30 in 10.231.0.0/16 after 50 tries")

    def _claim(self) -> bool:
        """Takes the slot: its lock file (held while we live) and the veth names, which
        the kernel gives to one creator only."""
        lock = open(os.path.join(_LOCKS, f"slot-{self.slot}.lock"), "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            return False
        lock.seek(0)
        lock.truncate()
        lock.write(f"{self.name}\n")
        lock.flush()
        self._lock = lock
        try:
            _ip("netns", "add", self.name)
            made = _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.name,
                       check=False)
        except BaseException:
            self.cleanup()
            raise
        if made.returncode != 0:
            log.debug("veth %s taken (%s); trying another slot", self.host_if, made.stderr.strip())
            self.cleanup()
            return False
        return True

    def _build(self) -> None:
        _ip("addr", "add", f"{self.host_addr}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.ns_addr}/30", "dev", self.ns_if)
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        _ip("neigh", "replace", self.ns_addr, "lladdr", _mac(self.name, self.ns_if), "dev", self.host_if,
            "nud", "permanent")
        _ip("-n", self.name, "neigh", "replace", self.host_addr, "lladdr", _mac(None, self.host_if), "dev",
            self.ns_if, "nud", "permanent")

    # -- using it -------------------------------------------------------------------------

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: list[str], **popen: Any) -> subprocess.Popen[Any]:
        """Starts ``argv`` inside the namespace (Popen keyword arguments pass through; its own
        session unless ``start_new_session`` says otherwise). :meth:`cleanup` kills it if it
        still runs."""
        popen.setdefault("start_new_session", True)
        proc: subprocess.Popen[Any] = subprocess.Popen(self.argv(argv), **popen)
        self._procs.append(proc)
        return proc

    def partition(self) -> None:
        """Cuts the link: from now on nothing passes either way, and neither side is told
        (no RST, no FIN; see the module docstring for what each side sees)."""
        _ip("-n", self.name, "link", "set", self.ns_if, "down")
        self.partitioned = True

    def heal(self) -> None:
        """Joins the link again: packets flow, TCP delivers what it was resending."""
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        # the link-down dropped the permanent neighbour inside with the link's routes
        _ip("-n", self.name, "neigh", "replace", self.host_addr, "lladdr", _mac(None, self.host_if), "dev",
            self.ns_if, "nud", "permanent")
        self.partitioned = False

    # -- removal --------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Kills what runs inside (SIGKILL), removes the namespace and the veth pair, and
        releases the slot. Safe to call at any point, more than once; raises NetnsError only
        when the namespace or the host end is still there afterwards."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        _remove(self.name, self.host_if)
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self._procs.clear()
        if self._lock is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._lock.name)
            self._lock.close()
            self._lock = None
        left = [what for what, there in ((f"namespace {self.name}", _exists_ns(self.name)),
                                         (f"interface {self.host_if}", _exists_link(self.host_if))) if there]
        if left:
            raise NetnsError(f"cleanup left {' and '.join(left)} behind")

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.cleanup()


def _exists_ns(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def _exists_link(ifname: str) -> bool:
    return os.path.exists(os.path.join("/sys/class/net", ifname))


def _remove(name: str, host_if: str) -> None:
    """Kills every process in namespace ``name``, then deletes it (its end of the veth goes
    with it, and so the pair) and the host end should it remain."""
    pids = _pids_in(name) if _exists_ns(name) else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        # a namespace lives while a process is in it: wait until they are gone (zombies count as gone)
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.02)
    if _exists_ns(name):
        _ip("netns", "del", name, check=False)
    if _exists_link(host_if):
        _ip("link", "del", host_if, check=False)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _sweep_stale() -> None:
    """Removes namespaces of ours whose creator is gone: their slot's lock is free."""
    if not os.path.isdir(_LOCKS):
        return
    for entry in os.listdir(_LOCKS):
        m = re.fullmatch(r"slot-(\d+)\.lock", entry)
        if m is None:
            continue
        path = os.path.join(_LOCKS, entry)
        try:
            lock = open(path, "a+")
        except OSError:
            continue
        with lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its creator lives
            lock.seek(0)
            name = lock.read().strip()
            if re.fullmatch(rf"{_PREFIX}-\d+-{m.group(1)}", name):
                log.info("removing network namespace %s left by a process that died", name)
                _remove(name, f"{_PREFIX}{m.group(1)}h")
            with contextlib.suppress(OSError):
                os.unlink(path)
