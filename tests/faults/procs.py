"""Signals to a process and its children, and the Python workers of a local SparkSession.

::

    kill_tree(proc.pid)                          # SIGKILL it and everything it started
    with suspended(spark_python_workers(spark, role="worker")):
        ...                                      # SIGSTOPped; SIGCONT on the way out, always
    suspender.stop(pid); ...; suspender.resume_all()

Process trees are read from /proc (Linux). A SIGSTOPped process left stopped would hang the
run that made it, so every stop goes through a :class:`Suspender`, which continues what it
stopped when its block ends, when :meth:`Suspender.resume_all` is called, and in any case at
interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["SparkPythonProcess", "Suspender", "children", "descendants", "kill_tree", "process_state",
           "python_workers_of", "signal_tree", "spark_jvm_below", "spark_jvm_pid", "spark_python_workers",
           "suspended"]


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()  # the name in parentheses may hold anything
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0]


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` in /proc (``R``, ``S``, ``T`` stopped, ``Z`` zombie ...);
    None when there is no such process."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                out[int(entry)] = stat[0]
    return out


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` now (sorted)."""
    return sorted(p for p, parent in _parents().items() if parent == pid)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now, parents before their children (``pid`` excluded)."""
    kids: dict[int, list[int]] = {}
    for p, parent in _parents().items():
        kids.setdefault(parent, []).append(p)
    out: list[int] = []
    todo = sorted(kids.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(kids.get(p, [])))
    return out


def _guard(pid: int) -> None:
    if pid <= 1 or pid == os.getpid():
        raise ValueError(f"refusing to signal pid {pid} (init, or this process itself)")


def signal_tree(pid: int, sig: int, *, tree: bool = True) -> list[int]:
    """Sends ``sig`` to ``pid`` and (``tree``) to every process below it, the parent first
    so that it cannot start new children meanwhile; returns the pids signalled (those gone
    by then are skipped). The tree is read before the first signal."""
    _guard(pid)
    pids = [pid, *(descendants(pid) if tree else [])]
    done = []
    for p in pids:
        if p == os.getpid():
            continue
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            continue
        done.append(p)
    return done


def kill_tree(pid: int) -> list[int]:
    """SIGKILL to ``pid`` and its descendants (a crash of all of them); returns the pids."""
    return signal_tree(pid, signal.SIGKILL)


class Suspender:
    """SIGSTOPs processes and remembers them, to SIGCONT them later whatever happens.

    Thread-safe. Every live Suspender resumes what it holds at interpreter exit, so even a
    test that dies halfway leaves nothing stopped behind."""

    _live: set[Suspender] = set()
    _live_lock = threading.Lock()

    def __init__(self) -> None:
        self._stopped: list[int] = []
        self._lock = threading.Lock()
        with Suspender._live_lock:
            Suspender._live.add(self)

    @property
    def stopped(self) -> list[int]:
        with self._lock:
            return list(self._stopped)

    def stop(self, pid: int, *, tree: bool = True) -> list[int]:
        """SIGSTOP ``pid`` (and, with ``tree``, its descendants); returns the pids stopped."""
        with self._lock:
            pids = signal_tree(pid, signal.SIGSTOP, tree=tree)
            self._stopped.extend(p for p in pids if p not in self._stopped)
            return pids

    def resume(self, pid: int) -> None:
        """SIGCONT one process this suspender stopped (no error when it is gone)."""
        with self._lock:
            if pid in self._stopped:
                self._stopped.remove(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def resume_all(self) -> list[int]:
        """SIGCONT everything stopped through this suspender, children first; returns the pids."""
        with self._lock:
            pids, self._stopped = self._stopped[::-1], []
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGCONT)
        return pids

    def __enter__(self) -> Suspender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.resume_all()
        with Suspender._live_lock:
            Suspender._live.discard(self)


@atexit.register
def _resume_everything() -> None:
    with Suspender._live_lock:
        live = list(Suspender._live)
    for s in live:
        s.resume_all()


@contextlib.contextmanager
def suspended(pids: int | Iterable[int] | Iterable[SparkPythonProcess], *, tree: bool = True) -> Iterator[list[int]]:
    """SIGSTOPs ``pids`` (with their descendants unless ``tree=False``) for the ``with`` block
    and SIGCONTs them when it ends, however it ends. Yields the pids stopped."""
    items: list[int | SparkPythonProcess] = [pids] if isinstance(pids, int) else list(pids)
    with Suspender() as s:
        stopped: list[int] = []
        for item in items:
            stopped += s.stop(item.pid if isinstance(item, SparkPythonProcess) else item, tree=tree)
        yield stopped


# -- Spark ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SparkPythonProcess:
    """A Python process Spark started for a local session: ``daemon`` (``pyspark.daemon``,
    a child of the JVM that forks workers), ``worker`` (a task's Python worker: a child of the
    daemon, or of the JVM when the daemon is off) or ``other`` (a Python child of the JVM
    running something else). ``module``: the worker module it serves (``pyspark.worker`` for
    tasks, ``pyspark.sql.worker.*`` for a Python data source's planning and commits): a
    daemon's argument, which its forked workers share."""

    pid: int
    ppid: int
    role: Literal["daemon", "worker", "other"]
    module: str
    cmdline: tuple[str, ...]


def spark_jvm_pid(spark: Any) -> int:
    """The pid of the JVM behind a classic (not Spark Connect) SparkSession, as the JVM
    itself reports it."""
    jvm = spark.sparkContext._jvm
    return int(jvm.java.lang.ProcessHandle.current().pid())


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ()
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def _module(cmd: tuple[str, ...]) -> str:
    """``python -m pyspark.daemon pyspark.worker`` -> pyspark.worker; ``-m pyspark.worker`` -> the same."""
    if "-m" not in cmd or cmd.index("-m") + 1 >= len(cmd):
        return ""
    args = cmd[cmd.index("-m") + 1:]
    return args[1] if args[0] == "pyspark.daemon" and len(args) > 1 else args[0]


def spark_python_workers(spark: Any, *, role: str | None = None) -> list[SparkPythonProcess]:
    """The Python processes below the session's JVM now (``role``: only those of that role).
    A forked worker has the daemon's command line; it is told apart by its parent."""
    return python_workers_of(spark_jvm_pid(spark), role=role)


def spark_jvm_below(pid: int) -> int | None:
    """The JVM a PySpark driver process ``pid`` (a Python program that built a SparkSession)
    started: its first ``java`` descendant; None while there is none."""
    for p in descendants(pid):
        cmd = _cmdline(p)
        if cmd and os.path.basename(cmd[0]) == "java":
            return p
    return None


def python_workers_of(jvm: int, *, role: str | None = None) -> list[SparkPythonProcess]:
    """:func:`spark_python_workers` of the Spark JVM ``jvm`` (a driver in another process)."""
    parents = _parents()
    out = []
    for pid in descendants(jvm):
        cmd = _cmdline(pid)
        if not cmd or "python" not in os.path.basename(cmd[0]):
            continue
        ppid = parents.get(pid, 0)
        if ppid == jvm:
            kind: Literal["daemon", "worker", "other"] = (
                "daemon" if "pyspark.daemon" in cmd else "worker" if "pyspark.worker" in cmd else "other")
        else:
            kind = "worker"
        if role is None or kind == role:
            out.append(SparkPythonProcess(pid, ppid, kind, _module(cmd), cmd))
    return out
