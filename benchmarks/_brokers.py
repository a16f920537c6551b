"""Ways to run the broker under test: in a child process (how users run it) or in a thread.

* ``cli``: ``python -m rocketmq_spark.cli broker --namesrv-port 0 --broker-port 0 ...``,
  the address read from the JSON line it prints first.
* ``mp``: :class:`~rocketmq_spark.broker.EmbeddedBroker` started in a ``multiprocessing``
  child (spawn) that sends its address back through a pipe. The pipe also carries
  profiling commands (cProfile on the broker's event-loop thread).
* ``thread``: :class:`~rocketmq_spark.broker.EmbeddedBroker` in this process, so client
  and broker share one GIL.
* ``real``: Apache RocketMQ itself (name server + broker, no proxy), provisioned from Maven
  Central by the test suite's fixture (``tests/real_rocketmq.py``; needs java and mvn); the
  data directory is its work directory.

Every launcher takes an explicit data directory so a later broker can reopen the same
store (the pull scenarios reuse the data of the append scenarios).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import select
import signal
import subprocess
import sys
import time
from typing import Any

__all__ = ["LAUNCHERS", "BrokerHandle", "chosen_launcher", "start_broker"]

LAUNCHERS = ("cli", "mp", "thread", "real")
_START_TIMEOUT_S = 60.0


class BrokerHandle:
    """A running broker: ``namesrv_addr``, ``launcher``, ``close()``; a context manager."""

    launcher = "?"
    namesrv_addr = ""
    grpc_endpoint = ""
    pid: int | None = None

    def close(self) -> None:
        raise NotImplementedError

    def profile_start(self) -> None:
        raise RuntimeError(f"the {self.launcher} launcher cannot profile; use mp")

    def profile_stop(self, path: str) -> None:
        raise RuntimeError(f"the {self.launcher} launcher cannot profile; use mp")

    def __enter__(self) -> BrokerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- in this process ----------------------------------------------------------------


class ThreadBroker(BrokerHandle):
    launcher = "thread"

    def __init__(self, data_dir: str, config: dict[str, Any]) -> None:
        from rocketmq_spark.broker import EmbeddedBroker

        self._mq = EmbeddedBroker(data_dir, **config).start()
        self.namesrv_addr = self._mq.namesrv_addr
        self.grpc_endpoint = self._mq.grpc_endpoint or ""
        self.pid = os.getpid()

    def close(self) -> None:
        self._mq.close()  # data_dir is ours: EmbeddedBroker leaves it in place


# -- the CLI in a child process -------------------------------------------------------


def cli_available() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("rocketmq_spark.cli") is not None
    except (ImportError, ValueError):
        return False


def chosen_launcher(launcher: str) -> str:
    """``launcher``, with ``auto`` made ``cli`` when the CLI is importable and ``mp`` otherwise."""
    if launcher != "auto":
        return launcher
    return "cli" if cli_available() else "mp"


class CliBroker(BrokerHandle):
    launcher = "cli"

    def __init__(self, data_dir: str, config: dict[str, Any]) -> None:
        cmd = [sys.executable, "-m", "rocketmq_spark.cli", "broker", "--namesrv-port", "0",
               "--broker-port", "0", "--grpc-port", "0", "--data-dir", data_dir,
               "--flush", config.get("flush", "async")]
        if config.get("max_pull_messages"):
            cmd += ["--max-pull-messages", str(config["max_pull_messages"])]
        unknown = set(config) - {"flush", "max_pull_messages"}
        if unknown:
            raise ValueError(f"the cli launcher cannot set {sorted(unknown)}")
        os.makedirs(data_dir, exist_ok=True)
        self._log_path = os.path.join(data_dir, "broker-cli.log")
        self._log = open(self._log_path, "ab")  # noqa: SIM115 (closed in close())
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL)
        self.pid = self._proc.pid
        assert self._proc.stdout is not None
        deadline = time.monotonic() + _START_TIMEOUT_S
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or self._proc.poll() is not None:
                break
            ready, _, _ = select.select([self._proc.stdout], [], [], min(left, 0.5))
            if ready:
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
        first = line.split(b"\n", 1)[0]
        try:
            info = json.loads(first)
            self.namesrv_addr = info["namesrv"]
            self.grpc_endpoint = info.get("grpc") or ""
        except (ValueError, KeyError, TypeError):
            self.close()
            with open(self._log_path, "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"broker CLI did not report its address (got {first[:200]!r}); log:\n{tail}") from None

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)  # graceful: final flush, then exit
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._log.close()


# -- EmbeddedBroker in a multiprocessing child ------------------------------------------


def _child_main(conn: Any, data_dir: str, config: dict[str, Any]) -> None:
    """Child process: start the broker, report its address, then obey the pipe."""
    import cProfile

    from rocketmq_spark.broker import EmbeddedBroker

    try:
        mq = EmbeddedBroker(data_dir, **config).start()
    except BaseException as exc:  # noqa: BLE001 (reported to the parent)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", (mq.namesrv_addr, mq.grpc_endpoint or "")))
    prof: cProfile.Profile | None = None
    try:
        while True:
            try:
                cmd, arg = conn.recv()
            except (EOFError, OSError):  # the parent went away
                break
            if cmd == "stop":
                break
            if cmd == "profile_start":
                # CPU time of the loop thread: wall time would charge the broker for the
                # moments the client preempts it on a shared core (inside send(), mostly).
                prof = cProfile.Profile(time.thread_time)
                mq.call(prof.enable)  # profiles the broker's event-loop thread
                conn.send(("ok", None))
            elif cmd == "profile_stop":
                if prof is not None:
                    mq.call(prof.disable)
                    prof.dump_stats(arg)
                conn.send(("ok", arg))
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
    finally:
        mq.close()
    try:
        conn.send(("stopped", None))
    except (OSError, BrokenPipeError):
        pass


class MpBroker(BrokerHandle):
    launcher = "mp"

    def __init__(self, data_dir: str, config: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")  # never fork a process that has client threads
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(child, data_dir, config),
                                 name="benchmark-broker", daemon=True)
        self._proc.start()
        child.close()
        self.pid = self._proc.pid
        if not self._conn.poll(_START_TIMEOUT_S):
            self.close()
            raise RuntimeError("broker child did not start in time")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            kind, value = "error", f"the child exited (code {self._proc.exitcode}) before reporting its address"
        if kind != "ready":
            self.close()
            raise RuntimeError(f"broker child failed to start: {value}")
        self.namesrv_addr, self.grpc_endpoint = value

    def _ask(self, cmd: str, arg: Any = None) -> Any:
        self._conn.send((cmd, arg))
        if not self._conn.poll(60):
            raise RuntimeError(f"broker child did not answer {cmd}")
        kind, value = self._conn.recv()
        if kind != "ok":
            raise RuntimeError(f"broker child: {value}")
        return value

    def profile_start(self) -> None:
        self._ask("profile_start")

    def profile_stop(self, path: str) -> None:
        self._ask("profile_stop", path)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("stop", None))
                if self._conn.poll(30):
                    self._conn.recv()
            except (OSError, EOFError):
                pass
            self._proc.join(30)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(5)
        self._conn.close()


def tests_on_path() -> None:
    """tests/ importable: real_rocketmq (Apache RocketMQ from Maven Central, its cache) and
    java_peer (the Java client peer) are the test suite's, and benchmarks run without pytest."""
    tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


def java_missing() -> str | None:
    """None when the real peers (Apache RocketMQ, the Java client, Kafka) can run here, else
    what is missing."""
    tests_on_path()
    from real_rocketmq import java_available

    missing: str | None = java_available()
    return missing


class RealBroker(BrokerHandle):
    """Apache RocketMQ (see the module docstring); ``pid`` is its broker JVM's; ``broker_config``:
    broker.conf keys over the test harness's."""

    launcher = "real"

    def __init__(self, data_dir: str, broker_config: dict[str, Any] | None = None) -> None:
        tests_on_path()
        from pathlib import Path

        from real_rocketmq import VERSION, RealRocketMQ, provision

        self.version = VERSION
        os.makedirs(data_dir, exist_ok=True)
        self._rmq = RealRocketMQ(provision(), Path(data_dir), proxy=False, broker_config=dict(broker_config or {}))
        self._rmq.start()
        self.namesrv_addr = self._rmq.namesrv_addr
        self.pid = self._rmq._jvms["broker"].proc.pid  # type: ignore[union-attr]

    def close(self) -> None:
        self._rmq.stop()


def start_broker(launcher: str, data_dir: str, **config: Any) -> BrokerHandle:
    """Start a broker on ``data_dir`` with ``launcher`` (cli | mp | thread | real)."""
    if launcher == "real":
        return RealBroker(data_dir)
    if launcher == "cli":
        return CliBroker(data_dir, config)
    if launcher == "mp":
        return MpBroker(data_dir, config)
    if launcher == "thread":
        return ThreadBroker(data_dir, config)
    raise ValueError(f"unknown launcher {launcher!r}; one of {LAUNCHERS}")
