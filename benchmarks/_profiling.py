"""Profiles of a benchmark scenario and their summaries (the suites' ``--profile``).

* py-spy (spark_io): :func:`py_spy_record` samples this process and its subprocesses (JVM, Python
  workers, broker) while a scenario runs; :func:`summarize_collapsed` reads its raw output.
* cProfile (broker): :func:`summarize_cprofile` reads what the broker's event-loop thread
  recorded (``BrokerHandle.profile_start``/``profile_stop``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ._provenance import REPO

__all__ = ["py_spy", "py_spy_record", "summarize_collapsed", "summarize_cprofile"]

T = TypeVar("T")


# -- py-spy ----------------------------------------------------------------------------------


def py_spy() -> str | None:
    """py-spy's executable (beside this Python first), None when it is not installed."""
    exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return exe if os.path.exists(exe) else shutil.which("py-spy")


def py_spy_record(exe: str, raw: str, fn: Callable[[], T]) -> tuple[T, str]:
    """``fn()`` sampled by py-spy (100/s, subprocesses included, idle threads mostly dropped),
    its raw (collapsed) stacks written to ``raw``. -> (what fn returned, py-spy's stderr)."""
    spy = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--function",
                            "--nonblocking", "--rate", "100", "--format", "raw", "-o", raw],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.5)  # py-spy attaches
    result = fn()
    spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
    try:
        _, err = spy.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        spy.kill()
        _, err = spy.communicate()
    return result, err.decode(errors="replace")


def _proc_kind(frame: str) -> str:
    """py-spy's ``process PID:"cmdline"`` frame -> a short name (broker, worker kind, driver)."""
    if "rocketmq_spark.cli" in frame:
        return "broker"
    if "benchmarks" in frame:
        return "driver"
    cmd = frame.split(":", 1)[-1].strip('"')
    if "jspawnhelper" in cmd:
        return "python worker (starting)"  # the JVM forks through jspawnhelper, then execs python
    if "pyspark" in cmd:
        return "python worker " + cmd.rsplit(" ", 1)[-1].split(".")[-1]  # daemon, worker, <runner name>
    return cmd.split(" ", 1)[0].rsplit("/", 1)[-1]


def _ours(frame: str) -> bool:
    """A frame of rocketmq_spark code (py-spy prints paths relative to sys.path entries)."""
    return any(s in frame for s in ("(source/", "(sink/", "(checkpoints/", "rocketmq_spark/", "/source/", "/sink/"))


def _count_collapsed(path: str) -> tuple[int, dict[str, int], dict[tuple[str, str], int], dict[str, int]]:
    """py-spy's raw output -> (samples, samples per process, self samples per (process, frame),
    inclusive samples per frame)."""
    self_counts: dict[tuple[str, str], int] = {}
    incl_counts: dict[str, int] = {}
    by_proc: dict[str, int] = {}
    total = 0
    with open(path) as f:
        for ln in f:
            stack, _, cnt = ln.rstrip("\n").rpartition(" ")
            try:
                k = int(cnt)
            except ValueError:
                continue
            frames = stack.split(";")
            procs = 0
            while procs < len(frames) and frames[procs].startswith("process "):
                procs += 1  # --subprocesses: the process chain (driver;java;daemon;worker) comes first
            proc = _proc_kind(frames[procs - 1]) if procs else "driver"
            frames = frames[procs:] or ["(no Python frame)"]
            total += k
            by_proc[proc] = by_proc.get(proc, 0) + k
            key = (proc, frames[-1])
            self_counts[key] = self_counts.get(key, 0) + k
            for fr in set(frames):
                incl_counts[fr] = incl_counts.get(fr, 0) + k
    return total, by_proc, self_counts, incl_counts


def summarize_collapsed(path: str, top: int = 12) -> str:
    """py-spy's raw (collapsed) output -> samples per process, the top functions by self samples
    in each busy process, and rocketmq_spark's functions by self and inclusive samples.

    Samples are of running Python threads (py-spy's idle detection drops most waits; what is
    left of waits shows as Condition.wait, select or the pyspark daemon's ``manager``)."""
    total, by_proc, self_counts, incl_counts = _count_collapsed(path)
    if not total:
        return "(no samples)"
    lines = [f"{total:,} samples at 100/s per running Python thread; % of all samples"]
    lines.append("by process: " + ", ".join(f"{p} {100 * k / total:.0f}%"
                                            for p, k in sorted(by_proc.items(), key=lambda kv: -kv[1])))
    for proc, pk in sorted(by_proc.items(), key=lambda kv: -kv[1]):
        if pk < 0.05 * total:
            continue
        lines.append(f"-- {proc} ({100 * pk / total:.0f}%): top functions by self samples --")
        mine = sorted(((fr, k) for (p, fr), k in self_counts.items() if p == proc), key=lambda kv: -kv[1])
        for fr, k in mine[:top]:
            lines.append(f"{100 * k / total:6.1f}%  {fr}")
    lines.append("-- rocketmq_spark functions: self% / inclusive% --")
    own: dict[str, int] = {}
    for (_, fr), k in self_counts.items():
        if _ours(fr):
            own[fr] = own.get(fr, 0) + k
    ranked = sorted((fr for fr in incl_counts if _ours(fr)), key=lambda fr: (-own.get(fr, 0), -incl_counts[fr]))
    for fr in ranked[: 2 * top]:
        lines.append(f"{100 * own.get(fr, 0) / total:6.1f}% {100 * incl_counts[fr] / total:6.1f}%  {fr}")
    return "\n".join(lines)


# -- cProfile ---------------------------------------------------------------------------------


def _idle(func: str) -> bool:
    return "epoll" in func or "kqueue" in func


def summarize_cprofile(st: Any, name: str, elapsed: float, top: int) -> str:
    """Self time per function of a ``pstats.Stats``, in % of the profiled thread's CPU time
    (epoll and kqueue waits excluded), and self time by file."""
    stats = st.stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
    idle = sum(v[2] for k, v in stats.items() if _idle(k[2]))
    busy = sum(v[2] for v in stats.values()) - idle

    def label(k: tuple[str, int, str]) -> str:
        file, line, func = k
        if file == "~":
            return func
        f = os.path.relpath(file, REPO) if file.startswith(REPO) else "/".join(file.split("/")[-2:])
        return f"{f}:{line}:{func}"

    lines = [(f"== {name}: {elapsed:.2f}s wall (profiled), broker loop thread CPU {busy:.2f}s; "
              "% of that CPU time (cProfile with a thread-CPU clock; it inflates call-heavy code) ==")]
    lines.append(f"{'self%':>6} {'cum%':>6} {'calls':>9}  function")
    ranked = sorted(((k, v) for k, v in stats.items() if not _idle(k[2])), key=lambda kv: kv[1][2], reverse=True)
    for k, (_cc, nc, tt, ct, _callers) in ranked[:top]:
        lines.append(f"{100 * tt / busy:6.1f} {100 * ct / busy:6.1f} {nc:>9,}  {label(k)}")
    by_file: dict[str, float] = {}
    for k, v in stats.items():
        if _idle(k[2]):
            continue
        f = k[0]
        key = os.path.relpath(f, REPO) if f.startswith(REPO) else ("builtins" if f == "~" else
                                                                   "stdlib/" + os.path.basename(f))
        by_file[key] = by_file.get(key, 0.0) + v[2]
    lines.append("self time by file: " + ", ".join(
        f"{f} {100 * t / busy:.0f}%" for f, t in sorted(by_file.items(), key=lambda x: -x[1])[:8]))
    return "\n".join(lines)
