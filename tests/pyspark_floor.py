"""A Python environment with the oldest pyspark that setup.cfg accepts, cached outside the repo.

setup.cfg asks for ``pyspark>=X``; the suite's own venv gets the newest release. This builds a
second venv with ``pyspark==X`` (padded to three parts: ``>=4.2`` admits 4.2.0) and the other
``install_requires`` of setup.cfg, but not this project: a test puts the project on PYTHONPATH
as a built wheel, so one cached venv serves every checkout. The venv lives in
``cache_root()/pyspark-<X>-py<M.m>-<hash of the requirements>`` (the jars' cache, see
real_rocketmq.py) and is built once: the first build installs pyspark's wheel, which pip builds
from the sdist and keeps in its own cache; a changed requirement list gets a new venv.

    python = floor_python()        # Path of the venv's interpreter
"""

from __future__ import annotations

import configparser
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

from real_rocketmq import build_once, cache_root

__all__ = ["floor_python", "floor_requirements", "pyspark_floor"]

ROOT = Path(__file__).resolve().parent.parent


def _install_requires() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = (line.split("#", 1)[0].strip() for line in cfg["options"]["install_requires"].splitlines())
    return [line for line in lines if line]


def pyspark_floor() -> str:
    """The lowest release setup.cfg's ``pyspark>=`` admits, as three parts ("4.2" -> "4.2.0");
    ValueError when setup.cfg names no ``>=`` bound for pyspark."""
    for line in _install_requires():
        req = Requirement(line)
        if req.name == "pyspark":
            floors = [s.version for s in req.specifier if s.operator == ">="]
            if len(floors) == 1:
                parts = floors[0].split(".")
                return ".".join(parts + ["0"] * (3 - len(parts)))
    raise ValueError("setup.cfg's install_requires has no single pyspark>= bound")


def floor_requirements() -> list[str]:
    """setup.cfg's install_requires with pyspark pinned to :func:`pyspark_floor`."""
    floor = pyspark_floor()
    return [f"pyspark=={floor}" if Requirement(line).name == "pyspark" else line for line in _install_requires()]


def floor_python(*, timeout_s: float = 1800) -> Path:
    """The interpreter of the cached floor venv, built on first use (safe across processes: a
    lock file); raises RuntimeError with pip's output when the build fails."""
    reqs = floor_requirements()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    digest = hashlib.sha256("\n".join(sorted(reqs)).encode()).hexdigest()[:10]
    home = cache_root() / f"pyspark-{pyspark_floor()}-py{version}-{digest}"
    venv = home / "venv"
    python = venv / "bin" / "python"

    def build() -> str:
        shutil.rmtree(venv, ignore_errors=True)  # a build cut short leaves a venv without .complete
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs]]
        for cmd in steps:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if run.returncode != 0:
                raise RuntimeError(f"building the pyspark {pyspark_floor()} venv failed ({' '.join(cmd)}):\n"
                                   f"{(run.stdout + run.stderr)[-3000:]}")
        return "\n".join(reqs) + "\n"

    build_once(home, build)
    return python
