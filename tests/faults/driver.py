"""The pipeline's Spark driver process (tests/faults/pipeline.py), as the suite runs it: started,
killed, restarted on its checkpoints, and supervised (a driver that exits outside a fault, a
query having failed, is started again, as a cluster manager would), then drained."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocketmq_spark.model import MessageQueue
from rocketmq_spark.offsets import split_batch_end

from .procs import SparkPythonProcess, python_workers_of, spark_jvm_below

log = logging.getLogger(__name__)

__all__ = ["QUERIES", "Driver"]

PIPELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline.py")
QUERIES = ("parquet", "eos", "alo")


class Driver:
    """One pipeline driver process at a time under ``out_dir`` (its checkpoints, Parquet
    output, progress and control files; each start's output in ``driver-<n>.log``).

    Every change of the process (start, kill, the supervisor's restart) happens under
    :attr:`lock`, so a fault that kills and restarts it is never raced by the supervisor.
    ``on_event(kind, detail)`` hears of exits the supervisor saw."""

    def __init__(self, out_dir: Path, config: dict[str, Any], on_event: Callable[[str, dict[str, Any]], None]
                 ) -> None:
        self.out_dir = out_dir
        self.config_path = out_dir / "pipeline.json"
        self.config_path.write_text(json.dumps({**config, "out_dir": str(out_dir)}, indent=1))
        self.progress_dir = out_dir / "progress"
        self.control_dir = out_dir / "control"
        self.progress_dir.mkdir(parents=True, exist_ok=True)
        self.control_dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.starts = 0
        #: exits nobody asked for (a query failed), with their exit codes
        self.unplanned_exits: list[int] = []
        self._on_event = on_event
        self._supervising = threading.Event()
        self._supervisor: threading.Thread | None = None

    # -- the process -----------------------------------------------------------------------

    def start(self, mode: str = "run") -> int:
        with self.lock:
            self.starts += 1
            self.log_path = self.out_dir / f"driver-{self.starts}.log"
            with open(self.log_path, "ab") as out:
                self.proc = subprocess.Popen([sys.executable, PIPELINE, str(self.config_path), mode], stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             env={**os.environ, "PYSPARK_PYTHON": sys.executable,
                                                  "PYSPARK_DRIVER_PYTHON": sys.executable,
                                                  "SPARK_LOCAL_IP": "127.0.0.1"})
            self.started_at = time.time()
            return self.proc.pid

    @property
    def pid(self) -> int | None:
        p = self.proc
        return p.pid if p is not None and p.poll() is None else None

    def kill(self) -> int | None:
        """SIGKILL the driver with its JVM and Python workers (its whole session); its pid."""
        with self.lock:
            p = self.proc
            if p is None:
                return None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
            return p.pid

    def jvm(self) -> int | None:
        pid = self.pid
        return spark_jvm_below(pid) if pid is not None else None

    def task_workers(self) -> list[SparkPythonProcess]:
        """The Python workers running (or ready for) the driver's tasks now."""
        jvm = self.jvm()
        if jvm is None:
            return []
        return [w for w in python_workers_of(jvm, role="worker") if w.module == "pyspark.worker"]

    # -- progress ----------------------------------------------------------------------------

    def progress(self, query: str) -> dict[str, Any] | None:
        try:
            with open(self.progress_dir / f"{query}.json") as f:
                return dict(json.load(f))
        except (OSError, ValueError):
            return None

    def progressed_since(self, t: float, queries: tuple[str, ...] = QUERIES) -> bool:
        """Each of ``queries`` finished a batch after ``t`` (epoch seconds)."""
        for q in queries:
            p = self.progress(q)
            if p is None or p["t"] < t:
                return False
        return True

    def read_up_to(self, query: str) -> dict[MessageQueue, int]:
        """The end offsets of ``query``'s last finished batch (what it read and committed): the
        later of the progress the listener wrote and the checkpoint's last committed batch. The
        listener runs behind the batches, so a driver killed between a batch's commit and its
        progress leaves the progress one batch behind; a restarted driver with nothing new runs
        no batch to write it again (Spark 4 reports an idle trigger as a QueryIdleEvent, with no
        offsets). In busy4 a wipe waited its full 120 s for a catch-up that had happened, with
        the producer paused."""
        p = self.progress(query)
        found = [(int(p["batch"]), str(p["end"]))] if p is not None and p.get("end") else []
        committed = self.last_committed(query)
        if committed is not None:
            found.append(committed)
        if not found:
            return {}
        return dict(split_batch_end(max(found, key=lambda f: f[0])[1])[0])

    def last_committed(self, query: str) -> tuple[int, str] | None:
        """``query``'s last batch in its checkpoint's commit log, with its end offsets (the
        offset log's source line), or None before its first commit."""
        ckpt = self.out_dir / "checkpoints" / query
        try:
            done = sorted((int(n) for n in os.listdir(ckpt / "commits") if n.isdigit()), reverse=True)
        except OSError:
            return None
        for batch in done:
            try:
                lines = (ckpt / "offsets" / str(batch)).read_text().splitlines()
            except OSError:
                continue
            if len(lines) >= 3 and lines[0] == "v1":  # version, batch metadata, then the one source
                return batch, lines[2]
        return None

    # -- supervision -------------------------------------------------------------------------

    def supervise(self) -> None:
        """From now on a driver that exits is started again (after a second)."""
        self._supervising.set()
        self._supervisor = threading.Thread(target=self._watch, name="driver-supervisor", daemon=True)
        self._supervisor.start()

    def stop_supervising(self) -> None:
        self._supervising.clear()
        if self._supervisor is not None:
            self._supervisor.join(10)

    def _watch(self) -> None:
        while self._supervising.is_set():
            time.sleep(0.5)
            with self.lock:
                p = self.proc
                if not self._supervising.is_set() or p is None or p.poll() is None:
                    continue
                code = p.returncode
                self.unplanned_exits.append(code)
                self._on_event("driver-exit", {"code": code, "log": self.log_path.name,
                                               "reason": exit_reason(self.log_path), "tail": _tail(self.log_path)})
                time.sleep(1.0)
                self.start()

    # -- the end -----------------------------------------------------------------------------

    def drain(self, timeout_s: float = 600.0, attempts: int = 3) -> bool:
        """Stops the processing-time queries and runs them to the end of what topic A holds
        (Trigger.AvailableNow) on their checkpoints: the running driver does it when told
        (``control/drain``); one that dies meanwhile is started again in drain mode, up to
        ``attempts`` times. True when all three queries ended cleanly."""
        self.stop_supervising()
        drained = self.control_dir / "drained"
        (self.control_dir / "drain").write_text("drain\n")
        deadline = time.monotonic() + timeout_s
        tries = 0
        while time.monotonic() < deadline:
            if drained.exists():
                p = self.proc
                if p is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(60)
                return True
            p = self.proc
            if p is None or p.poll() is not None:
                if p is not None and p.returncode != 0:
                    self._on_event("driver-exit", {"code": p.returncode, "log": self.log_path.name, "draining": True,
                                                   "reason": exit_reason(self.log_path), "tail": _tail(self.log_path)})
                if tries >= attempts:
                    return False
                tries += 1
                self.start("drain")
            time.sleep(0.5)
        self.kill()
        return False

    def close(self) -> None:
        self.stop_supervising()
        self.kill()


_REASON = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.{0,300})", re.M)


def exit_reason(path: Path) -> str:
    """The last error a driver's log names (``Class: message``), first of all a rocketmq_spark one."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    ours = re.findall(r"^rocketmq_spark\.errors\.(\w+): (.{0,300})", text, re.M)
    found = ours or [m for m in _REASON.findall(text) if m[0] not in ("Py4JException", "Py4JNetworkException")]
    return f"{found[-1][0]}: {found[-1][1]}" if found else ""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 20000))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(keep[-lines:])
