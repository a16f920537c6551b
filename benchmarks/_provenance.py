"""Where a run's figures come from: the commit and the working tree's changes, the machine and
the libraries, and when it ran. Every suite's JSON carries some of these (each suite keeps the
keys it always wrote)."""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import platform
import subprocess
from typing import Any

__all__ = ["REPO", "created", "git_commit", "git_modified", "library_versions", "machine_info"]

#: the checkout the benchmarks run from
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    """git's stdout in the checkout, None when git is missing, slow or fails."""
    try:
        out = subprocess.run(["git", *args], check=False, capture_output=True, text=True, timeout=5, cwd=REPO)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit() -> str | None:
    """The commit checked out (HEAD)."""
    out = _git("rev-parse", "HEAD")
    return (out.strip() or None) if out is not None else None


def git_modified() -> list[str] | None:
    """Files of the working tree that differ from the commit (the figures are of those)."""
    out = _git("status", "--porcelain")
    return None if out is None else [ln[3:] for ln in out.splitlines() if ln[:2].strip()]


def created() -> str:
    """Now, in UTC, to the second (ISO 8601)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def library_versions(*names: str) -> dict[str, str]:
    """``{name: version}`` of the given importable libraries (numpy, pyarrow, pyspark)."""
    return {name: str(importlib.import_module(name).__version__) for name in names}


def machine_info() -> dict[str, Any]:
    """CPUs, the ones this process may use, CPU model, load average now, memory, Python and the
    platform (what is unreadable is left out)."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for ln in f:
                if ln.startswith("model name"):
                    info["cpu_model"] = ln.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return info
