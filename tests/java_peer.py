"""Builds and runs ``java_peer/JavaPeer.java``: a test peer driving the Apache RocketMQ Java
client (classic remoting protocol) so tests can check interop with it.

    classes = build(lib_dir, cache_dir)
    lines = run(lib_dir, classes, "produce", {"namesrv": addr, "topic": "T", "messages": [...]})

``lib_dir`` holds rocketmq-client and its dependencies (every jar in it goes on the class
path). Each command reads its arguments as one JSON object on stdin and answers one JSON
object per line on stdout; see JavaPeer.java for the commands and their fields.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent / "java_peer" / "JavaPeer.java"
_MARKER = "BUILT"
_TAIL = 4000


def build(lib_dir: Path, cache_dir: Path) -> Path:
    """Compile JavaPeer.java (once per source version) and return its classes directory."""
    source = SOURCE.read_bytes()
    classes = Path(cache_dir) / f"java-peer-{hashlib.sha256(source).hexdigest()[:12]}"
    if (classes / _MARKER).exists():
        return classes
    javac = shutil.which("javac")
    if javac is None:
        raise RuntimeError("javac is not on PATH")
    classes.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".java-peer-build-", dir=classes.parent))
    os.chmod(tmp, 0o755)
    try:
        proc = subprocess.run(
            [javac, "--release", "17", "-encoding", "UTF-8", "-nowarn", "-cp", f"{Path(lib_dir)}/*",
             "-d", str(tmp), str(SOURCE)],
            check=False, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"javac failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-_TAIL:]}")
        (tmp / _MARKER).write_text("ok\n")
        try:
            os.rename(tmp, classes)  # atomic; fails if another process got there first
        except OSError:
            if not (classes / _MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return classes


def run(lib_dir: Path, classes: Path, command: str, args: dict[str, Any], *, timeout: float = 120,
        home: Path | None = None, prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run one JavaPeer command with ``args`` on stdin and return its output lines, parsed.

    ``home`` becomes the JVM's user.home (the client keeps its logs and local offsets under
    it); a temporary directory when None, removed after a successful run. ``prefix``: what
    the JVM runs under (``taskset -c 0`` pins it to one core for a benchmark).
    """
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java is not on PATH")
    tmp_home = None if home is not None else Path(tempfile.mkdtemp(prefix="java-peer-home-"))
    user_home = Path(home) if home is not None else tmp_home
    assert user_home is not None
    cmd = [*prefix, java, "-XX:+UseSerialGC", "-Xmx256m", f"-Duser.home={user_home}",
           f"-Drocketmq.client.logRoot={user_home / 'logs'}",
           "-cp", f"{classes}{os.pathsep}{Path(lib_dir)}/*", "JavaPeer", command]
    try:
        proc = subprocess.run(cmd, input=json.dumps(args), check=False, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the JVM
        raise RuntimeError(f"JavaPeer {command} timed out after {timeout} s (home {user_home}); stderr tail:\n"
                           f"{_text(exc.stderr)[-_TAIL:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"JavaPeer {command} exited with {proc.returncode} (home {user_home}); stderr tail:\n"
                           f"{proc.stderr[-_TAIL:]}")
    try:
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"JavaPeer {command} printed a line that is not JSON ({exc}):\n"
                           f"{proc.stdout[-_TAIL:]}") from None
    if tmp_home is not None:
        shutil.rmtree(tmp_home, ignore_errors=True)
    return lines


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
