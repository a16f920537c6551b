"""CPU accounting for the benchmarks: what our own processes used, and what the rest of the
machine took meanwhile (Linux ``/proc``; a figure is None where it cannot be read).

On a shared machine wall-clock figures move with the neighbours; CPU seconds per message much
less. Every suite reports one or more of these, each read from ``/proc`` in one place here:

* :class:`TreeMeter` (spark_io): wall time, CPU seconds of this process's whole tree (driver,
  JVM, Python workers, broker) sampled per process, split by process kind, and ``noise``: the
  share of the CPUs other processes used.
* :class:`OtherProcesses` (broker): the share of the CPUs other processes used, where "ours" is
  this process plus the broker's process, or plus this process's reaped children.
* :class:`Clock` (client_decode, peers): wall and this process's CPU time of a block.
* :func:`steal_ticks` (client_decode): the time the hypervisor gave to other machines.

"Busy" is all the machine's CPU time but idle and iowait (the first line of ``/proc/stat``);
"other processes" is busy time minus ours, as a share of ``wall x CPUs`` (:func:`other_share`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator

__all__ = ["Clock", "OtherProcesses", "TreeMeter", "broker_process", "machine_busy", "other_share",
           "steal_ticks", "tree_cpu_by_pid"]

_HZ = os.sysconf("SC_CLK_TCK")


def _machine_ticks() -> list[int] | None:
    """The machine's CPU ticks by state (user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def machine_busy() -> float | None:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    t = _machine_ticks()
    return None if t is None else (sum(t[:8]) - t[3] - t[4]) / _HZ


def steal_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the machine (steal: time the hypervisor gave to others)."""
    t = _machine_ticks()
    if t is None or len(t) < 8:
        return None
    return t[7], sum(t[:8])


def _stat(pid: int | str) -> tuple[int, float]:
    """(ppid, own CPU seconds: utime + stime) of a process; OSError, ValueError or IndexError
    when it is gone or unreadable."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
    return int(st[1]), (int(st[11]) + int(st[12])) / _HZ


def other_share(busy_s: float, own_s: float, wall_s: float) -> float:
    """The share of all the machine's CPUs that processes other than ours used: the machine's
    busy CPU seconds over ``wall_s`` less our own, over ``wall_s`` x CPUs (not rounded)."""
    return max(0.0, busy_s - own_s) / (wall_s * (os.cpu_count() or 1))


# -- our process tree ------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, own CPU seconds) of every process we can read."""
    out: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            out[int(name)] = _stat(name)
        except (OSError, ValueError, IndexError):
            continue
    return out


def tree_cpu_by_pid(root: int | None = None) -> dict[int, float]:
    """Own CPU seconds of ``root`` (this process) and of each of its live descendants."""
    root = root or os.getpid()
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[int, float] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            out[pid] = table[pid][1]
        todo.extend(kids.get(pid, ()))
    return out


def _kind(pid: int) -> str:
    """What a process of our tree is, from its command line (read while it lives)."""
    if pid == TreeMeter.broker_pid:
        return "broker"
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "pyspark.daemon pyspark.worker" in cmd:
        return "python workers"
    if "pyspark" in cmd and "java" not in cmd.split(" ", 1)[0]:
        return "python planners"  # planning, commit and streaming source runner processes
    return "jvm" if "java" in cmd.split(" ", 1)[0] else "other"


class TreeMeter:
    """Wall time, our process tree's CPU time and the other processes' share of the machine.

    Our tree is sampled every ``interval`` s per process: Spark's Python workers die when idle
    and the pyspark daemon ignores SIGCHLD, so a reaped worker's CPU time is credited to no
    parent (cutime) and only per-process samples keep it. Each process's CPU is its last
    sample minus its first (0 for a process born during the run); what a short-lived process
    burns after the last sample is missed.
    """

    #: the broker's pid, when known (see :func:`broker_process`): its share of our CPU time is
    #: reported apart (broker_cpu_s)
    broker_pid: int | None = None

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.cpu_s = 0.0
        self.broker_cpu_s: float | None = None
        self.cpu_by_process: dict[str, float] = {}
        self.noise: float | None = None
        self.elapsed = 0.0

    def _sample(self) -> None:
        for pid, cpu in tree_cpu_by_pid().items():
            if pid not in self._first:
                self._first[pid] = 0.0  # born during the run
            if pid not in self._kinds:
                self._kinds[pid] = _kind(pid)  # while it lives: its command line says what it is
            self._last[pid] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeMeter:
        self._first = tree_cpu_by_pid()
        self._last = dict(self._first)
        self._kinds: dict[int, str] = {p: _kind(p) for p in self._first}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-meter", daemon=True)
        self.busy0 = machine_busy()
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.t0
        self._stop.set()
        self._thread.join()
        self._sample()
        busy1 = machine_busy()
        used = {p: max(0.0, self._last[p] - self._first[p]) for p in self._last}
        self.cpu_s = sum(used.values())
        by: dict[str, float] = {}
        for p, cpu in used.items():
            k = self._kinds.get(p) or _kind(p)
            by[k] = by.get(k, 0.0) + cpu
        self.cpu_by_process = {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.01}
        bp = TreeMeter.broker_pid
        if bp is not None and bp in self._last:
            self.broker_cpu_s = round(self._last[bp] - self._first[bp], 2)
        if self.busy0 is not None and busy1 is not None and self.elapsed > 0:
            self.noise = round(other_share(busy1 - self.busy0, self.cpu_s, self.elapsed), 3)


@contextlib.contextmanager
def broker_process(pid: int | None) -> Iterator[None]:
    """Inside the block every :class:`TreeMeter` reports ``pid``'s CPU as the broker's."""
    before, TreeMeter.broker_pid = TreeMeter.broker_pid, pid
    try:
        yield
    finally:
        TreeMeter.broker_pid = before


# -- this process (and the broker's) against the rest of the machine ---------------------------


class OtherProcesses:
    """How busy other processes kept the machine between :meth:`start` and a reading.

    Ours is this process's CPU time (``os.times``) plus the broker process's (``/proc/<pid>/stat``,
    when ``broker_pid`` names another process) or, with ``children``, plus that of this
    process's reaped children.
    """

    def __init__(self, broker_pid: int | None = None, *, children: bool = False) -> None:
        self.pid = broker_pid if broker_pid not in (None, os.getpid()) else None
        self.children = children
        self._start: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float] | None:
        """(wall clock, machine busy CPU s, our CPU s), or None when /proc cannot be read."""
        busy = machine_busy()
        t = os.times()
        mine = t.user + t.system + (t.children_user + t.children_system if self.children else 0.0)
        try:
            if self.pid is not None:
                mine += _stat(self.pid)[1]
        except (OSError, ValueError, IndexError):
            return None
        return None if busy is None else (time.perf_counter(), busy, mine)

    def start(self) -> OtherProcesses:
        self._start = self._read()
        return self

    def share(self) -> float | None:
        """Their share of all CPUs since :meth:`start` (rounded to 0.001), None if unknown."""
        end = self._read()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return None
        return round(other_share(end[1] - self._start[1], end[2] - self._start[2], end[0] - self._start[0]), 3)

    def summary(self, wall_s: float) -> dict[str, float]:
        """``other_processes_cpu_s`` and ``other_processes_cpu_share`` over ``wall_s`` seconds
        since :meth:`start` (empty when unknown)."""
        end = self._read()
        if self._start is None or end is None or wall_s <= 0:
            return {}
        busy, own = end[1] - self._start[1], end[2] - self._start[2]
        return {"other_processes_cpu_s": round(max(0.0, busy - own), 1),
                "other_processes_cpu_share": round(other_share(busy, own, wall_s), 3)}


# -- one block of this process ------------------------------------------------------------------


class Clock:
    """Wall time and this process's CPU time of a ``with`` block (``wall``, ``cpu``, seconds)."""

    wall = 0.0
    cpu = 0.0

    def __enter__(self) -> Clock:
        self._c0, self._t0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self._t0, time.process_time() - self._c0
