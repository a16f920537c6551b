"""The ``rocketmq-spark`` command line.

Commands, one module per family: ``broker`` and ``namesrv`` (servers.py: the embedded
servers in the foreground), ``topic`` create/list/describe (topic.py), ``produce``
(produce.py: generated or JSON-lines messages), ``progress`` (a consumer group's lag per
queue) and ``reset-offset`` (a group's offsets by timestamp) in progress.py, and ``demo``
(demo.py, the main job: embedded broker -> produce -> Spark streaming query -> Parquet,
offsets committed). common.py holds what they share: argument types, the client, output.
The commands parse, call the library and print; what they compute lives in the library.

Only :func:`main` configures logging. Errors a user can act on print one line (what is
wrong and what to do) and exit with code 2; the traceback only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence

from ..errors import (
    AccessDeniedError,
    BrokerError,
    ConnectionFailedError,
    NoPermissionError,
    OptionError,
    RequestNotSupportedError,
    RocketMQSparkError,
    TopicNotFoundError,
)
from . import demo, produce, progress, servers, topic
from .common import (
    DEFAULT_NAMESRV,
    PROG,
    CliError,
    Parser,
    apply_namespace,
    client_parent,
    json_parent,
    namesrv_arg,
    namesrv_of,
)
from .common import parse_timestamp as parse_timestamp
from .produce import ProgressBar as ProgressBar
from .servers import _acl_table as _acl_table  # the ACL tests call it

__all__ = ["CliError", "ProgressBar", "build_parser", "explain", "main", "parse_timestamp"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="RocketMQ for Spark: an embedded broker and tools around it.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    parser.add_argument("-n", "--namesrv", dest="global_namesrv", type=namesrv_arg, default=None,
                        metavar="HOST:PORT[;HOST:PORT]",
                        help=f"name server list for the client commands (default $NAMESRV_ADDR, else "
                             f"{DEFAULT_NAMESRV}); also accepted after the command")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = client_parent()
    js = json_parent()
    servers.add_commands(sub)
    topic.add_commands(sub, client, js)
    produce.add_commands(sub, client)
    progress.add_commands(sub, client, js)
    demo.add_commands(sub)
    return parser


def _connection_reason(exc: ConnectionFailedError) -> str:
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\]\s*([^:;]+)$", text)
    if m:
        reason = m.group(1).strip()
    elif "timed out" in text:
        reason = "timed out"
    else:
        reason = text.rpartition("failed: ")[2] or text
    return reason[:1].lower() + reason[1:]


def explain(exc: BaseException, args: argparse.Namespace | None) -> tuple[str, int]:
    """One line saying what is wrong and what to do, and the exit code."""
    namesrvs: list[str] = []
    if args is not None:
        from ..client.remoting import parse_namesrv_addr

        with contextlib.suppress(ValueError):
            namesrvs = parse_namesrv_addr(namesrv_of(args))
    if isinstance(exc, CliError):
        return str(exc), 2
    if isinstance(exc, ConnectionFailedError):
        reason = _connection_reason(exc)
        if exc.address in namesrvs or not namesrvs:
            return (f"cannot reach name server {exc.address} ({reason}): start one with `{PROG} broker` "
                    "or pass -n host:port"), 2
        return (f"cannot reach broker {exc.address} ({reason}) during {exc.operation}: is the broker running? "
                f"(`{PROG} broker` starts one; the name server lists brokers that may have stopped)"), 2
    if isinstance(exc, RequestNotSupportedError) and exc.address in namesrvs:
        return (f"{exc.address} does not answer as a name server ({exc.remark or exc}): pass the name server's "
                f"address to -n (`{PROG} broker` prints it first)"), 2
    if isinstance(exc, AccessDeniedError) and exc.user:  # names the user, the resource and the action
        return f"{exc.operation} refused at {exc.address}: {exc.remark}", 2
    if isinstance(exc, NoPermissionError):
        return (f"{exc.operation} refused at {exc.address}: {exc.remark or 'no permission'}: pass --access-key/"
                "--secret-key (or set ROCKETMQ_ACCESS_KEY/ROCKETMQ_SECRET_KEY)"), 2
    if isinstance(exc, TopicNotFoundError):
        return f"{exc.operation} failed: topic not found ({exc.remark}): create it with `{PROG} topic create NAME`", 2
    if isinstance(exc, BrokerError):
        detail = exc.remark or f"code {exc.code}"
        return f"{exc.operation} failed at {exc.address}: {detail}", 2
    if isinstance(exc, OptionError):
        return str(exc), 2
    if isinstance(exc, RocketMQSparkError):
        return str(exc), 2
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:
            return (f"{exc.strerror or exc}: another broker may be running; pick other ports with --namesrv-port/"
                    "--broker-port (0 = any free port)"), 2
        if exc.filename is not None:
            return f"cannot open {exc.filename}: {exc.strerror or exc}", 2
        return f"{exc}", 2
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "JAVA_GATEWAY_EXITED" in str(exc) or "Java gateway process exited" in str(exc):
        return "Spark could not start its JVM: install Java 17+ (`java -version` must work) or set JAVA_HOME", 2
    return f"{type(exc).__name__}: {text} (rerun with --verbose for the traceback)", 1


def _setup_logging(verbose: bool, command: str | None) -> None:
    # The broker reports what it does; the client commands only warnings (their output is
    # the result); --verbose: everything.
    level = logging.DEBUG if verbose else (logging.INFO if command == "broker" else logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if not verbose:
        logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.command)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # gRPC's fork handlers (read when grpc loads, later) print a line into our output each time
    # this process starts a subprocess (Spark's JVM, workers) while the broker's gRPC server runs;
    # nothing here forks into gRPC code, so they are not needed
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    func: Callable[[argparse.Namespace], int | None] = args.func
    try:
        apply_namespace(args)
        return int(func(args) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except Exception as exc:  # noqa: BLE001 (every failure becomes one line)
        if args.verbose:
            traceback.print_exc()
        line, code = explain(exc, args)
        print(f"{PROG}: {line}", file=sys.stderr)
        return code
