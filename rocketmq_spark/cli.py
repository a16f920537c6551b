"""The ``rocketmq-spark`` command line.

Commands: ``broker`` (run the embedded broker), ``topic`` (create/list/describe),
``produce`` (generated or JSON-lines messages), ``progress`` (a consumer group's lag per
queue), ``reset-offset`` (a group's offsets by timestamp) and ``demo`` (the main job:
embedded broker -> produce -> Spark streaming query -> Parquet, offsets committed).

Only this module configures logging. Errors a user can act on print one line (what is
wrong and what to do) and exit with code 2; the traceback only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import errno
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import IO, Any

from .errors import (
    BrokerError,
    ConnectionFailedError,
    NoPermissionError,
    OptionError,
    RequestNotSupportedError,
    RocketMQSparkError,
    TopicNotFoundError,
)
from .model import MessageQueue
from .names import GROUP_RULE, TOPIC_RULE, group_problem, topic_problem
from .offsets import Offsets

log = logging.getLogger(__name__)

__all__ = ["CliError", "ProgressBar", "build_parser", "main", "parse_timestamp"]

PROG = "rocketmq-spark"
DEFAULT_NAMESRV = "127.0.0.1:9876"
_MAX_BATCH_MESSAGES = 128
_MAX_BATCH_BYTES = 1 << 20


class CliError(Exception):
    """A problem the user can fix: printed as one line (what is wrong, what to do); exit 2."""


# -- argument parsing -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong + where to look), exit 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _namesrv_arg(value: str) -> str:
    from .client.remoting import parse_namesrv_addr

    try:
        addrs = parse_namesrv_addr(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; pass host:port, several separated by ';'") from None
    if not addrs:
        raise argparse.ArgumentTypeError("empty name server list; pass host:port")
    return ";".join(addrs)


def _topic_arg(value: str) -> str:
    problem = topic_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem} ({TOPIC_RULE})")
    return value


def _group_arg(value: str) -> str:
    problem = group_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem} ({GROUP_RULE})")
    return value


def _positive_int(value: str) -> int:
    try:
        n = int(value.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return n


def parse_timestamp(value: str, *, now_ms: int | None = None) -> int:
    """``now`` | ``earliest`` (0) | ``latest`` (-1) | epoch milliseconds | ISO-8601 -> epoch ms.

    An ISO-8601 time without a zone is local time. Epoch *seconds* are refused (they would
    silently mean 1970), with the millisecond value to pass instead.
    """
    text = value.strip()
    low = text.lower()
    if low == "now":
        return int(time.time() * 1000) if now_ms is None else now_ms
    if low == "earliest":
        return 0
    if low == "latest":
        return -1
    if re.fullmatch(r"\d+", text):
        ms = int(text)
        if 0 < ms < 10**11:
            raise argparse.ArgumentTypeError(
                f"{text} looks like epoch seconds; pass milliseconds ({ms * 1000}) or ISO-8601")
        return ms
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a time: give epoch milliseconds, ISO-8601 (2024-05-01T12:00:00Z) or 'now'") from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time, as mqadmin reads it
    return int(when.timestamp() * 1000)


def _timestamp_arg(value: str) -> int:
    return parse_timestamp(value)


def _client_parent() -> _Parser:
    p = _Parser(add_help=False)
    p.add_argument("-n", "--namesrv", type=_namesrv_arg, default=None, metavar="HOST:PORT[;HOST:PORT]",
                   help=f"name server list (default $NAMESRV_ADDR, else {DEFAULT_NAMESRV})")
    p.add_argument("--access-key", default=None, metavar="AK",
                   help="ACL access key: sign every request (default $ROCKETMQ_ACCESS_KEY)")
    p.add_argument("--secret-key", default=None, metavar="SK",
                   help="ACL secret key (default $ROCKETMQ_SECRET_KEY; the variable keeps it out of `ps`)")
    return p


def _json_parent() -> _Parser:
    p = _Parser(add_help=False)
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return p


def _namesrv(args: argparse.Namespace) -> str:
    return (getattr(args, "namesrv", None) or getattr(args, "global_namesrv", None)
            or os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV)


def _credentials(args: argparse.Namespace | None) -> Any:
    """ACL credentials from --access-key/--secret-key, else $ROCKETMQ_ACCESS_KEY/$ROCKETMQ_SECRET_KEY
    (each flag falls back to its variable); None when neither key is set."""
    from .remoting.acl import Credentials

    ak = getattr(args, "access_key", None) or os.environ.get("ROCKETMQ_ACCESS_KEY") or ""
    sk = getattr(args, "secret_key", None) or os.environ.get("ROCKETMQ_SECRET_KEY") or ""
    if not ak and not sk:
        return None
    if not ak or not sk:
        missing = "--access-key (or $ROCKETMQ_ACCESS_KEY)" if not ak else "--secret-key (or $ROCKETMQ_SECRET_KEY)"
        raise CliError(f"ACL credentials need both an access key and a secret key: {missing} is missing")
    return Credentials(ak, sk)


def _client(namesrv: str, args: argparse.Namespace | None = None) -> Any:
    from .client.remoting import ClientConfig, RemotingClient

    # A tool should say quickly that an address is wrong: two attempts, a short budget.
    return RemotingClient(namesrv, ClientConfig(connect_timeout_s=3.0, request_timeout_s=10.0, retries=2,
                                                retry_budget_s=5.0, credentials=_credentials(args)))


# -- output helpers ---------------------------------------------------------------------


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """A plain-text progress bar on a TTY: ``\\r[#####     ] 5000/10000 12,345 msg/s``.

    Drawn only when the stream is a terminal (at most every ``interval_s``); otherwise
    silent, and the caller prints a summary line. ``total=None``: a counter and a rate.
    """

    def __init__(self, total: int | None, *, unit: str = "msg", stream: IO[str] | None = None,
                 width: int = 30, interval_s: float = 0.1) -> None:
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.interval_s = interval_s
        self.enabled = _isatty(self.stream)
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_len = 0

    def render(self, done: int) -> str:
        rate = done / max(time.monotonic() - self.t0, 1e-6)
        if self.total:
            filled = min(self.width, self.width * done // self.total)
            return f"[{'#' * filled}{' ' * (self.width - filled)}] {done}/{self.total} {rate:,.0f} {self.unit}/s"
        return f"{done} {self.unit} {rate:,.0f} {self.unit}/s"

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.interval_s:
            return
        self._last_draw = now
        text = self.render(done)
        pad = max(0, self._last_len - len(text))
        self._last_len = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def close(self, done: int) -> None:
        if self.enabled:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
    """Columns padded to fit; numbers right-aligned, text left-aligned."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    numeric = [all(isinstance(r[i], (int, float, Decimal)) or r[i] is None for r in rows) and bool(rows)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)]
        return (indent + "  ".join(parts)).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def _fmt_time(ms: int | None) -> str | None:
    """Local time like mqadmin prints it: ``2024-05-01 12:00:00.123``."""
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _iso_utc(ms: int | None) -> str | None:
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _is_system_topic(topic: str) -> bool:
    from .broker.state import SYSTEM_TOPICS

    return (topic in SYSTEM_TOPICS or topic.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_", "rmq_sys_"))
            or topic.endswith("_REPLY_TOPIC"))


def _require_topic(client: Any, topic: str, namesrv: str) -> None:
    """Fail with a one-line hint when the name servers do not know ``topic`` (a route lookup
    would auto-create it on an embedded broker, which a read-only command must not do)."""
    if topic not in client.topic_list():
        raise CliError(f"topic {topic!r} does not exist on {namesrv}: create it with "
                       f"`{PROG} topic create {topic}` (existing topics: `{PROG} topic list`)")


# -- broker -----------------------------------------------------------------------------


def _add_broker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="where the store lives (default: ~/.rocketmq-spark/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    p.add_argument("--namesrv-port", type=int, default=9876, help="name server port, 0 = ephemeral (default 9876)")
    p.add_argument("--broker-port", type=int, default=10911,
                   help="broker port, 0 = ephemeral (default 10911; with --brokers N, broker i gets this + 10*i)")
    p.add_argument("--grpc-port", type=int, default=8081,
                   help="gRPC (RocketMQ 5 proxy) port, 0 = ephemeral, -1 = off (default 8081; broker i: + i)")
    p.add_argument("--flush", choices=("async", "sync"), default="async",
                   help="sync: a send succeeds only once fsynced (default async)")
    p.add_argument("--broker-name", default="broker-a", help="(one broker) its name (default broker-a)")
    p.add_argument("--brokers", type=_positive_int, default=1,
                   help="run a name server and this many brokers (broker-a, broker-b, ...) in this process")
    p.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]",
                   help="register with these name servers (started with `namesrv`) instead of running one here")
    p.add_argument("--register-interval-ms", type=_positive_int, default=30_000,
                   help="how often brokers register again with the name servers (default 30000)")
    p.add_argument("--no-auto-create", action="store_true", help="refuse unknown topics instead of creating them")
    p.add_argument("--max-pull-messages", type=int, default=None,
                   help="cap on messages per pull (a real broker serves 32)")
    p.add_argument("--acl", action="append", default=[], metavar="AK:SK",
                   help="ACL on: accept requests signed with access key AK and secret key SK (repeatable; the name "
                        "server does not check signatures)")
    p.add_argument("--acl-file", metavar="PATH",
                   help='ACL on: a JSON file {"accessKey": "secretKey", ...} (merged with --acl)')


def _acl_table(args: argparse.Namespace) -> dict[str, str]:
    """--acl AK:SK entries and --acl-file's JSON object -> access key -> secret key."""
    table: dict[str, str] = {}
    if args.acl_file:
        try:
            with open(args.acl_file, encoding="utf-8") as f:
                obj = json.load(f)
        except OSError as exc:
            raise CliError(f"--acl-file {args.acl_file}: cannot read it ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise CliError(f"--acl-file {args.acl_file}: not JSON ({exc}); expected "
                           '{"accessKey": "secretKey", ...}') from None
        if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                                for k, v in obj.items()):
            raise CliError(f"--acl-file {args.acl_file}: expected a JSON object of non-empty strings "
                           '{"accessKey": "secretKey", ...}')
        table.update(obj)
    for entry in args.acl:
        ak, sep, sk = entry.partition(":")
        if not sep or not ak or not sk:
            # the entry may be (or hold) a secret: show the access key only when it is clearly one
            shown = f"{ak}:***" if sep and ak else "***"
            raise CliError(f"--acl {shown}: expected ACCESS_KEY:SECRET_KEY, both non-empty")
        table[ak] = sk
    return table


def _offset_port(port: int, i: int, step: int) -> int:
    return port if port <= 0 else port + i * step


async def _serve_until_signal(start: Callable[[], Any], stop: Callable[[], Any],
                              first_line: Callable[[], dict[str, Any]], human: Callable[[], str]) -> None:
    await start()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    # One machine-readable line first (tools and tests parse it), then a human one.
    sys.stdout.write(json.dumps(first_line()) + "\n")
    sys.stdout.write(human())
    sys.stdout.flush()
    await done.wait()
    await stop()


def _cmd_broker(args: argparse.Namespace) -> int:
    from .broker.config import BrokerConfig
    from .broker.server import BrokerServer, NamesrvServer, broker_names
    from .client.remoting import parse_namesrv_addr

    data_dir = args.data_dir or os.path.join(os.path.expanduser("~"), ".rocketmq-spark", "broker")
    os.makedirs(data_dir, exist_ok=True)
    extra: dict[str, Any] = {"register_interval_ms": args.register_interval_ms}
    if args.max_pull_messages:
        extra["max_pull_messages"] = args.max_pull_messages
    acl = _acl_table(args)
    if acl:
        extra["acl"] = acl
    remote = []
    if args.namesrv:
        try:
            remote = parse_namesrv_addr(args.namesrv)
        except ValueError as exc:
            raise CliError(f"--namesrv {args.namesrv!r}: {exc}; expected host:port;host:port") from None
    names = [args.broker_name] if args.brokers == 1 else broker_names(args.brokers)
    namesrv = None if remote else NamesrvServer(args.host, args.namesrv_port,
                                                auto_create_topics=not args.no_auto_create)
    servers = []
    for i, name in enumerate(names):
        config = BrokerConfig(data_dir=data_dir if len(names) == 1 else os.path.join(data_dir, name), host=args.host,
                              flush=args.flush, broker_name=name, auto_create_topics=not args.no_auto_create, **extra)
        servers.append(BrokerServer(
            config, namesrv_port=None, broker_port=_offset_port(args.broker_port, i, 10),
            grpc_port=None if args.grpc_port < 0 else _offset_port(args.grpc_port, i, 1),
            namesrv=namesrv.namesrv if namesrv is not None else None, namesrv_addrs=remote))

    async def start() -> None:
        if namesrv is not None:
            await namesrv.start()
        for server in servers:
            await server.start()

    async def stop() -> None:
        for server in servers:
            await server.stop()
        if namesrv is not None:
            await namesrv.stop()

    def ns_addr() -> str:
        return namesrv.addr if namesrv is not None else ";".join(remote)

    def first_line() -> dict[str, Any]:
        head = servers[0]
        return {"namesrv": ns_addr(), "broker": head.broker_addr, "grpc": head.grpc_endpoint,
                "brokerName": head.config.broker_name, "dataDir": data_dir,
                "brokers": {s.config.broker_name: {"broker": s.broker_addr, "grpc": s.grpc_endpoint} for s in servers}}

    def human() -> str:
        lines = [f"name server {'listening on' if namesrv is not None else 'at'} {ns_addr()}"]
        for s in servers:
            lines.append(f"broker {s.config.broker_name} listening on {s.broker_addr}; gRPC endpoint (RocketMQ 5 "
                         f"proxy) on {s.grpc_endpoint or 'off'}")
        if acl:
            lines.append(f"ACL on: requests must be signed by access key {', '.join(sorted(acl))} (the name server "
                         "does not check)")
        lines.append(f"data in {data_dir}; Ctrl-C to stop")
        return "\n".join(lines) + "\n"

    asyncio.run(_serve_until_signal(start, stop, first_line, human))
    return 0


def _cmd_namesrv(args: argparse.Namespace) -> int:
    from .broker.server import NamesrvServer

    server = NamesrvServer(args.host, args.port, auto_create_topics=not args.no_auto_create,
                           broker_timeout_s=args.broker_timeout)

    def first_line() -> dict[str, Any]:
        return {"namesrv": server.addr}

    asyncio.run(_serve_until_signal(server.start, server.stop, first_line,
                                    lambda: f"name server listening on {server.addr}; brokers join with "
                                            f"`{PROG} broker --namesrv {server.addr}`; Ctrl-C to stop\n"))
    return 0


# -- topic ------------------------------------------------------------------------------


def _perm_text(perm: int) -> str:
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-")


def _cmd_topic_create(args: argparse.Namespace) -> int:
    ns = _namesrv(args)
    client = _client(ns, args)
    try:
        brokers = client.cluster_brokers()
        if args.broker:
            if args.broker not in brokers:
                known = ", ".join(sorted(brokers)) or "none"
                raise CliError(f"broker {args.broker!r} is not registered on {ns} (brokers: {known}): "
                               "pass one of them to --broker")
            brokers = {args.broker: brokers[args.broker]}
        if not brokers:
            raise CliError(f"the name server {ns} knows no broker: start one with `{PROG} broker`")
        existed = args.name in client.topic_list()
        perm = {"rw": 6, "r": 4, "w": 2}[args.perm]
        for addr in brokers.values():
            client.create_topic(args.name, args.queues, broker_addr=addr, perm=perm)
        verb = "updated" if existed else "created"
        print(f"{verb} topic {args.name} with {args.queues} queues ({_perm_text(perm)}) on "
              + ", ".join(f"{n} ({a})" for n, a in brokers.items()))
    finally:
        client.close()
    return 0


def _cmd_topic_list(args: argparse.Namespace) -> int:
    ns = _namesrv(args)
    client = _client(ns, args)
    try:
        names = client.topic_list()
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for broker, addr in client.cluster_brokers().items():
            try:
                configs = client.topic_configs(addr)
            except BrokerError as exc:  # a broker without code 21: names only
                log.debug("topic configs of %s unavailable: %s", broker, exc)
                continue
            for topic, cfg in sorted(configs.items()):
                if topic not in names:
                    continue
                seen.add(topic)
                rows.append({"topic": topic, "broker": broker, "readQueues": int(cfg.get("readQueueNums", 0)),
                             "writeQueues": int(cfg.get("writeQueueNums", 0)), "perm": int(cfg.get("perm", 6))})
        rows += [{"topic": t, "broker": None, "readQueues": None, "writeQueues": None, "perm": None}
                 for t in names if t not in seen]
        if not args.all:
            rows = [r for r in rows if not _is_system_topic(r["topic"])]
        rows.sort(key=lambda r: (r["topic"], r["broker"] or ""))
        if args.json:
            _print_json(rows)
            return 0
        if not rows:
            print(f"no topics on {ns} yet: create one with `{PROG} topic create NAME`")
            return 0
        print(_table(["TOPIC", "BROKER", "READ QUEUES", "WRITE QUEUES", "PERM"],
                     [[r["topic"], r["broker"], r["readQueues"], r["writeQueues"],
                       None if r["perm"] is None else _perm_text(r["perm"])] for r in rows]))
    finally:
        client.close()
    return 0


def _cmd_topic_describe(args: argparse.Namespace) -> int:
    ns = _namesrv(args)
    client = _client(ns, args)
    try:
        _require_topic(client, args.name, ns)
        route = client.route(args.name, refresh=True)
        queues = client.message_queues(args.name)
        rows = []
        ranges = client.offset_ranges(queues)
        for mq in queues:
            lo, hi = ranges[mq]
            last = client.store_time_at(mq, hi - 1) if hi > lo else None
            rows.append({"broker": mq.broker, "queueId": mq.queue_id, "minOffset": lo, "maxOffset": hi,
                         "messages": hi - lo, "lastStoreTimestamp": last, "lastStoreTime": _iso_utc(last)})
        brokers = [{"broker": q.broker_name, "address": route.broker_addr(q.broker_name),
                    "readQueues": q.read_queue_nums, "writeQueues": q.write_queue_nums, "perm": q.perm}
                   for q in route.queue_datas]
        if args.json:
            _print_json({"topic": args.name, "brokers": brokers, "queues": rows})
            return 0
        total = sum(r["messages"] for r in rows)
        print(f"topic {args.name}: {len(rows)} readable queues on {len(brokers)} broker(s), {total:,} messages")
        for b in brokers:
            print(f"  {b['broker']} at {b['address']}: read {b['readQueues']}, write {b['writeQueues']}, "
                  f"perm {_perm_text(b['perm'])}")
        print(_table(["BROKER", "QUEUE", "MIN OFFSET", "MAX OFFSET", "MESSAGES", "LAST STORE TIME"],
                     [[r["broker"], r["queueId"], r["minOffset"], r["maxOffset"], r["messages"],
                       _fmt_time(r["lastStoreTimestamp"])] for r in rows]))
    finally:
        client.close()
    return 0


# -- produce ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Message:
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] | None = None


class _UniqKeys:
    """Client message ids (UNIQ_KEY): 32 hex digits, unique per producer run."""

    def __init__(self) -> None:
        self.prefix = os.urandom(11).hex().upper()
        self.seq = 0

    def next(self) -> str:
        self.seq += 1
        return f"{self.prefix}{self.seq:010X}"


def _entry(msg: _Message, uniq: _UniqKeys) -> Any:
    from .codec import BatchEntry, encode_properties

    props: dict[str, str] = dict(msg.properties or {})
    if msg.tag:
        props["TAGS"] = msg.tag
    keys = " ".join(k for k in msg.keys if k)
    if keys:
        props["KEYS"] = keys
    props["UNIQ_KEY"] = uniq.next()
    return BatchEntry(msg.body, encode_properties(props))


def _send_messages(client: Any, topic: str, messages: Iterable[_Message], total: int | None,
                   *, batch_size: int = _MAX_BATCH_MESSAGES) -> tuple[int, int, int, float]:
    """Send message i to writable queue i mod n (round-robin, as producers do), in batches of up
    to ``batch_size`` messages / 1 MiB per queue, drawing a progress bar.

    Returns (messages, body bytes, queues, seconds).
    """
    queues = client.message_queues(topic, writable=True)
    if not queues:
        raise CliError(f"topic {topic!r} has no writable queue: recreate it with `{PROG} topic create {topic}`")
    uniq = _UniqKeys()
    bar = ProgressBar(total)
    pending: list[list[Any]] = [[] for _ in queues]
    sizes = [0] * len(queues)
    sent = 0
    nbytes = 0

    def flush(qi: int) -> None:
        nonlocal sent
        batch = pending[qi]
        client.send_batch(queues[qi], batch)
        sent += len(batch)
        pending[qi], sizes[qi] = [], 0
        bar.update(sent)

    t0 = time.monotonic()
    try:
        for i, msg in enumerate(messages):
            qi = i % len(queues)
            e = _entry(msg, uniq)
            esize = len(e.body) + len(e.properties) + 32
            if pending[qi] and (len(pending[qi]) >= batch_size or sizes[qi] + esize > _MAX_BATCH_BYTES):
                flush(qi)
            pending[qi].append(e)
            sizes[qi] += esize
            nbytes += len(e.body)
        for qi in range(len(queues)):
            if pending[qi]:
                flush(qi)
    finally:
        bar.close(sent)
    return sent, nbytes, len(queues), time.monotonic() - t0


def _generated(count: int, size: int, tags: Sequence[str], key_prefix: str) -> Iterator[_Message]:
    filler = (b"abcdefghijklmnopqrstuvwxyz0123456789" * (size // 36 + 2))
    for i in range(count):
        head = b"msg-%08d " % i
        body = (head + filler)[:size]
        yield _Message(body, tags[i % len(tags)] if tags else None, [f"{key_prefix}{i}"] if key_prefix else [])


_JSON_FIELDS = ("body", "tag", "keys", "properties")


def _read_jsonl(path: str) -> list[_Message]:
    """Every line of ``path`` (``-`` = stdin) as a message; checked before anything is sent."""
    name = "stdin" if path == "-" else path
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    out: list[_Message] = []
    try:
        for lineno, line in enumerate(stream, 1):
            if not line.strip():
                continue
            where = f"line {lineno} of {name}"
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise CliError(f"{where} is not JSON ({exc.args[0]}): each line must be an object like "
                               '{"body": "...", "tag": "TagA", "keys": ["k1"], "properties": {"p": "v"}}') from None
            if not isinstance(obj, dict):
                raise CliError(f"{where} is a JSON {type(obj).__name__}, not an object with a body field")
            unknown = sorted(set(obj) - set(_JSON_FIELDS))
            if unknown:
                raise CliError(f"{where}: unknown field(s) {', '.join(unknown)}; the fields are "
                               + ", ".join(_JSON_FIELDS))
            if "body" not in obj or obj["body"] is None:
                raise CliError(f"{where} has no body field: every message needs one")
            body = obj["body"]
            data = body.encode() if isinstance(body, str) else json.dumps(body, separators=(",", ":")).encode()
            tag = obj.get("tag")
            if tag is not None and not isinstance(tag, str):
                raise CliError(f"{where}: tag must be a string")
            keys = obj.get("keys") or []
            if isinstance(keys, str):
                keys = keys.split()
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise CliError(f"{where}: keys must be a string or a list of strings")
            props = obj.get("properties") or {}
            if not isinstance(props, dict):
                raise CliError(f"{where}: properties must be an object of string values")
            out.append(_Message(data, tag or None, keys, {str(k): str(v) for k, v in props.items()}))
    finally:
        if stream is not sys.stdin:
            stream.close()
    return out


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _cmd_produce(args: argparse.Namespace) -> int:
    if args.file is not None and (args.count is not None or args.size is not None):
        raise CliError("--count/--size generate messages and --file reads them: pass one or the other")
    messages: Iterable[_Message]
    if args.file is not None:
        items = _read_jsonl(args.file)
        messages, total, what = items, len(items), f"from {'stdin' if args.file == '-' else args.file}"
    else:
        count = args.count or 1000
        size = args.size or 256
        if size > 4 * 1024 * 1024:
            raise CliError(f"--size {size} is over the 4 MiB a broker accepts per message: pass a smaller size")
        tags = [t for t in args.tags.split(",") if t.strip()] if args.tags else []
        messages, total, what = _generated(count, size, tags, args.key_prefix), count, "generated"
    ns = _namesrv(args)
    client = _client(ns, args)
    try:
        try:
            sent, nbytes, nq, secs = _send_messages(client, args.topic, messages, total, batch_size=args.batch)
        except TopicNotFoundError:
            raise CliError(f"topic {args.topic!r} does not exist on {ns} (and the broker does not auto-create "
                           f"topics): create it with `{PROG} topic create {args.topic}`") from None
    finally:
        client.close()
    rate = sent / max(secs, 1e-6)
    print(f"produced {sent:,} messages ({what}, {_fmt_bytes(nbytes)}) to {args.topic} over {nq} queues "
          f"in {secs:.2f}s, {rate:,.0f} msg/s")
    return 0


# -- progress ---------------------------------------------------------------------------


@dataclass(slots=True)
class QueueProgress:
    """One queue of a group, as mqadmin consumerProgress shows it."""

    queue: MessageQueue
    broker_offset: int  # max offset
    consumer_offset: int | None  # None: the group never committed this queue
    min_offset: int
    last_timestamp: int | None  # store time of the last consumed message

    @property
    def lag(self) -> int:
        start = self.consumer_offset if self.consumer_offset is not None else self.min_offset
        return max(0, self.broker_offset - start)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.queue.topic, "broker": self.queue.broker, "queueId": self.queue.queue_id,
                "brokerOffset": self.broker_offset, "consumerOffset": self.consumer_offset, "lag": self.lag,
                "lastTimestamp": self.last_timestamp, "lastTime": _iso_utc(self.last_timestamp)}


def group_progress(client: Any, group: str, topic: str | None, namesrv: str) -> list[QueueProgress]:
    """Per queue: broker (max) offset, ``group``'s offset, lag, last consumed store time.

    Without ``topic``, every non-system topic on which the group has committed an offset.
    A group with no offset at all is a :class:`CliError` (most often a misspelled name).
    """
    if topic is not None:
        _require_topic(client, topic, namesrv)
        topics = [topic]
    else:
        topics = [t for t in client.topic_list() if not _is_system_topic(t)]
    out: list[QueueProgress] = []
    for t in topics:
        queues = client.message_queues(t)
        offsets = client.query_consumer_offsets(group, queues)
        if all(v is None for v in offsets.values()):
            continue
        ranges = client.offset_ranges(queues)
        for mq in queues:
            (lo, hi), off = ranges[mq], offsets[mq]
            last = client.store_time_at(mq, off - 1) if off is not None and off - 1 >= lo else None
            out.append(QueueProgress(mq, hi, off, lo, last))
    if not out:
        where = f"topic {topic!r}" if topic else f"any topic on {namesrv}"
        raise CliError(f"consumer group {group!r} has no committed offsets on {where}: check the group name "
                       "(it is case-sensitive) or let a consumer commit first")
    return out


def _online_consumers(client: Any, group: str) -> int:
    ids: set[str] = set()
    for addr in client.cluster_brokers().values():
        try:
            ids.update(client.consumer_ids(group, addr))
        except RocketMQSparkError as exc:
            log.debug("consumer list of %s at %s unavailable: %s", group, addr, exc)
    return len(ids)


def _progress_table(rows: Sequence[QueueProgress], *, indent: str = "") -> str:
    return _table(["TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "LAST TIME"],
                  [[r.queue.topic, r.queue.broker, r.queue.queue_id, r.broker_offset, r.consumer_offset, r.lag,
                    _fmt_time(r.last_timestamp)] for r in rows], indent=indent)


def _cmd_progress(args: argparse.Namespace) -> int:
    ns = _namesrv(args)
    client = _client(ns, args)
    try:
        rows = group_progress(client, args.group, args.topic, ns)
        online = _online_consumers(client, args.group)
    finally:
        client.close()
    total = sum(r.lag for r in rows)
    topics = sorted({r.queue.topic for r in rows})
    if args.json:
        _print_json({"group": args.group, "topics": topics, "onlineConsumers": online, "totalLag": total,
                     "queues": [r.to_json() for r in rows]})
        return 0
    print(f"consumer group {args.group}: {len(topics)} topic(s), {len(rows)} queues, total lag {total:,}, "
          f"{online} online consumer(s)")
    print(_progress_table(rows))
    return 0


# -- reset-offset -----------------------------------------------------------------------


def _cmd_reset_offset(args: argparse.Namespace) -> int:
    ns = _namesrv(args)
    ts = args.timestamp
    client = _client(ns, args)
    try:
        _require_topic(client, args.topic, ns)
        queues = client.message_queues(args.topic, refresh=True)
        current = client.query_consumer_offsets(args.group, queues)
        maxes = client.max_offsets(queues) if ts < 0 else {}
        plan = [{"broker": mq.broker, "queueId": mq.queue_id, "current": current[mq],
                 "new": maxes[mq] if ts < 0 else client.search_offset(mq, ts)} for mq in queues]
        if not args.dry_run:
            online = _online_consumers(client, args.group)
            written = client.reset_offset_by_timestamp(args.group, args.topic, ts)
            for row in plan:
                got = written.get(MessageQueue(args.topic, row["broker"], row["queueId"]))
                if got is not None:
                    row["new"] = got
    finally:
        client.close()
    when = ("the latest offsets" if ts < 0 else "the earliest offsets" if ts == 0
            else f"the first message at/after {_fmt_time(ts)} ({ts})")
    if args.json:
        out = {"group": args.group, "topic": args.topic, "timestamp": ts, "dryRun": args.dry_run, "queues": plan}
        if not args.dry_run:
            out["notifiedConsumers"] = online
        _print_json(out)
        return 0
    verb = "would reset" if args.dry_run else "reset"
    print(f"{verb} group {args.group} on topic {args.topic} to {when}:")
    print(_table(["BROKER", "QUEUE", "CURRENT OFFSET", "", "NEW OFFSET"],
                 [[r["broker"], r["queueId"], r["current"], "->", r["new"]] for r in plan], indent="  "))
    if args.dry_run:
        print("dry run: nothing was written; run again without --dry-run to apply it")
    else:
        print(f"done: {len(plan)} queues written; {online} online consumer(s) of {args.group} move there (on a 5.x "
              "broker at their next pull of each queue, a 4.x broker tells them at once). A running Spark query "
              "stops with an error naming the reset; its checkpoint keeps its own offsets: the group's offsets "
              "apply to a query started on a new checkpoint")
    return 0


# -- demo -------------------------------------------------------------------------------

_DEMO_CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace")
_DEMO_SCHEMA = "orderId BIGINT, customer STRING, amount DECIMAL(12,2), items INT"

#: Spark's driver logs: warnings and up, and no "Setting default log level" banner (shown
#: only when the REPL logger's level differs from the root's).
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
logger.resolve.name = org.apache.spark.sql.execution.streaming.ResolveWriteToStream
logger.resolve.level = error
logger.resolve2.name = org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream
logger.resolve2.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
"""


def _demo_orders(n: int, seed: int = 7) -> Iterator[tuple[_Message, str, int, bool]]:
    """(message, customer, amount in cents, refunded) for ``n`` sample orders."""
    rng = random.Random(seed)
    for i in range(n):
        customer = _DEMO_CUSTOMERS[rng.randrange(len(_DEMO_CUSTOMERS))]
        cents = rng.randrange(500, 50_000)
        refund = rng.random() < 0.1
        body = json.dumps({"orderId": i, "customer": customer, "amount": cents / 100,
                           "items": rng.randrange(1, 6)}, separators=(",", ":")).encode()
        yield _Message(body, "refund" if refund else "paid", [f"order-{i}"]), customer, cents, refund


def _end_offsets(progress: Any, topic: str) -> dict[str, int]:
    for src in progress.get("sources") or []:
        raw = src.get("endOffset")
        try:
            obj = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get(topic), dict):
            return {k: int(v) for k, v in obj[topic].items()}
    return {}


def _progress_dict(p: Any) -> dict[str, Any]:
    if isinstance(p, dict):
        return p
    raw = getattr(p, "json", None)
    if isinstance(raw, str):
        return json.loads(raw)
    return json.loads(str(p))


def _step(n: int, text: str) -> None:
    print(f"[{n}/5] {text}", flush=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    """Embedded broker -> sample orders -> Spark streaming query -> Parquet, offsets committed."""
    t_start = time.monotonic()
    topic, group, n = args.topic, args.group, args.messages
    per_trigger = args.max_messages_per_trigger or max(1, -(-n // 4))
    cluster = getattr(args, "namesrv", None) or getattr(args, "global_namesrv", None)
    if args.output and os.path.isdir(args.output) and os.listdir(args.output):
        raise CliError(f"--output {args.output} is not empty: pass a new directory (its checkpoint would "
                       "belong to another run)")
    with contextlib.ExitStack() as stack:
        work = tempfile.mkdtemp(prefix="rocketmq-spark-demo-")
        stack.callback(shutil.rmtree, work, True)
        out_dir = os.path.abspath(args.output) if args.output else os.path.join(work, "output")
        orders_dir = os.path.join(out_dir, "orders")
        totals_dir = os.path.join(out_dir, "totals_by_customer")
        checkpoint = os.path.join(out_dir, "_checkpoint")

        # 1. broker
        if cluster:
            ns = cluster
            _step(1, f"using the cluster at name server {ns}")
        else:
            from .broker.server import EmbeddedBroker

            mq = stack.enter_context(EmbeddedBroker(os.path.join(work, "broker")))
            ns = mq.namesrv_addr
            _step(1, f"embedded broker up: name server {ns}, broker {mq.broker_addr} (data in a temp dir)")
        client = _client(ns, args)
        stack.callback(client.close)

        # 2. produce
        if topic not in client.topic_list():
            brokers = client.cluster_brokers()
            if not brokers:
                raise CliError(f"the name server {ns} knows no broker: start one with `{PROG} broker`")
            for addr in brokers.values():
                client.create_topic(topic, 4, broker_addr=addr)
        queues = client.message_queues(topic, refresh=True)
        start = Offsets({mq_: client.max_offset(mq_) for mq_ in queues})
        expected: dict[str, list[int]] = {}  # customer -> [orders, refunds, net cents]

        def orders() -> Iterator[_Message]:
            for msg, customer, cents, refund in _demo_orders(n):
                e = expected.setdefault(customer, [0, 0, 0])
                e[0] += 1
                e[1] += refund
                e[2] += -cents if refund else cents
                yield msg

        sent, nbytes, nq, secs = _send_messages(client, topic, orders(), n)
        _step(2, f"produced {sent:,} orders (JSON, tags paid/refund, {_fmt_bytes(nbytes)}) to topic {topic} "
                 f"over {nq} queues in {secs:.2f}s")

        # 3. Spark
        t_spark = time.monotonic()
        spark = _demo_spark(work)
        stack.callback(spark.stop)
        _step(3, f"Spark {spark.version} (local[2]) started in {time.monotonic() - t_spark:.1f}s")

        # 4. the streaming query
        from pyspark.sql import functions as F

        from .checkpoints.committer import RocketMQOffsetCommitter

        committer = RocketMQOffsetCommitter(ns, group, topics=[topic], measure_lag=False)
        spark.streams.addListener(committer)
        stack.callback(committer.client.close)
        stack.callback(spark.streams.removeListener, committer)
        # earliest on a fresh broker; on a cluster, where this run's orders start
        starting = "earliest" if not cluster else start.dumps()
        source = (spark.readStream.format("rocketmq").option("namesrvAddr", ns).option("topic", topic)
                  .option("consumerGroup", group).option("startingOffsets", starting)
                  .option("maxMessagesPerTrigger", str(per_trigger)).load())
        parsed = (source.select(F.from_json(F.col("body").cast("string"), _DEMO_SCHEMA).alias("o"),
                                F.col("tag").alias("status"), "queueId", "queueOffset", "storeTimestamp")
                  .select("o.*", "status", "queueId", "queueOffset", "storeTimestamp"))
        _step(4, f"streaming query: format(\"rocketmq\") group {group}, maxMessagesPerTrigger={per_trigger}, "
                 "Trigger.AvailableNow -> parse JSON -> Parquet")
        t_query = time.monotonic()
        query = (parsed.writeStream.format("parquet").option("path", orders_dir)
                 .option("checkpointLocation", checkpoint).queryName("rocketmq_demo")
                 .trigger(availableNow=True).start())
        end_total = sum(start.values()) + sent
        seen = -1
        batches = 0
        read = 0
        while True:
            finished = query.awaitTermination(0.2)
            for p in map(_progress_dict, query.recentProgress):
                if p.get("batchId", -1) <= seen:
                    continue
                seen = p["batchId"]
                nrows = int(p.get("numInputRows") or 0)
                if not nrows:
                    continue
                batches += 1
                read += nrows
                ends = _end_offsets(p, topic)
                lag = end_total - sum(ends.values()) if ends else end_total - sum(start.values()) - read
                ms = (p.get("durationMs") or {}).get("triggerExecution", 0)
                print(f"      batch {p['batchId']}: {nrows:,} orders in {ms / 1000:.1f}s; read {read:,}/{sent:,}, "
                      f"lag {lag:,}", flush=True)
            if finished:
                break
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        print(f"      query done: {batches} batches, {read:,} orders in {time.monotonic() - t_query:.1f}s; "
              f"Parquet in {orders_dir}")

        # 5. offsets, lag, result
        maxes = client.max_offsets(queues)
        deadline = time.monotonic() + 20  # listener events arrive asynchronously
        while time.monotonic() < deadline:
            if client.query_consumer_offsets(group, queues) == maxes:
                break
            time.sleep(0.1)
        rows = group_progress(client, group, topic, ns)
        total_lag = sum(r.lag for r in rows)
        _step(5, f"consumer progress of group {group} (committed by RocketMQOffsetCommitter): "
                 f"total lag {total_lag:,}")
        print(_progress_table(rows, indent="      "))

        orders_df = spark.read.parquet(orders_dir)
        refund = F.col("status") == "refund"
        totals = (orders_df.groupBy("customer")
                  .agg(F.count(F.lit(1)).alias("orders"),
                       F.sum(F.when(refund, 1).otherwise(0)).alias("refunds"),
                       F.sum(F.when(refund, -F.col("amount")).otherwise(F.col("amount"))).alias("net_amount"))
                  .orderBy("customer"))
        result = totals.collect()  # a few rows: computed once, then written from the driver
        spark.createDataFrame(result, totals.schema).coalesce(1).write.mode("overwrite").parquet(totals_dir)
        print(f"\nnet amount per customer (Parquet {totals_dir}):")
        print(_table(["CUSTOMER", "ORDERS", "REFUNDS", "NET AMOUNT"],
                     [[r.customer, r.orders, r.refunds, r.net_amount] for r in result], indent="  "))
        got = {r.customer: [r.orders, r.refunds, int(r.net_amount * 100)] for r in result}
        count = sum(v[0] for v in got.values())
        print(f"  total: {count:,} orders, net {sum(Decimal(v[2]) for v in got.values()) / 100:,.2f}")
        kept = f"output kept in {out_dir}" if args.output else "output removed on exit (pass --output DIR to keep it)"
        print(f"\ndone in {time.monotonic() - t_start:.1f}s (Spark start included); {kept}")
        if got != expected:
            print(f"{PROG}: error: the Parquet totals differ from what was produced ({count} of {sent} orders)",
                  file=sys.stderr)
            return 1
        if total_lag:
            print(f"{PROG}: error: group {group} still lags {total_lag} messages after the run", file=sys.stderr)
            return 1
    return 0


def _demo_spark(work: str) -> Any:
    """A quiet local[2] SparkSession that runs Python workers on this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # local[2] talks over loopback; this also spares the "hostname resolves to a loopback" warning
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = os.path.join(work, "log4j2.properties")
    with open(log4j, "w") as fh:
        fh.write(_LOG4J2)
    from pyspark.sql import SparkSession

    import rocketmq_spark

    spark = (SparkSession.builder.master("local[2]").appName("rocketmq-spark-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    rocketmq_spark.register(spark)
    return spark


# -- parser and main --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="RocketMQ for Spark: an embedded broker and tools around it.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    parser.add_argument("-n", "--namesrv", dest="global_namesrv", type=_namesrv_arg, default=None,
                        metavar="HOST:PORT[;HOST:PORT]",
                        help=f"name server list for the client commands (default $NAMESRV_ADDR, else "
                             f"{DEFAULT_NAMESRV}); also accepted after the command")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    client = _client_parent()
    js = _json_parent()

    b = sub.add_parser("broker", help="run the embedded name server + broker(s) in the foreground")
    _add_broker_args(b)
    b.set_defaults(func=_cmd_broker)

    n = sub.add_parser("namesrv", help="run a name server alone in the foreground (brokers join with --namesrv)")
    n.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    n.add_argument("--port", type=int, default=9876, help="port, 0 = ephemeral (default 9876)")
    n.add_argument("--broker-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="drop a broker from routes after this long without its registration (default 120)")
    n.add_argument("--no-auto-create", action="store_true", help="refuse unknown topics instead of creating them")
    n.set_defaults(func=_cmd_namesrv)

    t = sub.add_parser("topic", help="create, list or describe topics")
    tsub = t.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", parents=[client], help="create (or update) a topic on every broker")
    tc.add_argument("name", type=_topic_arg)
    tc.add_argument("-q", "--queues", type=_positive_int, default=4, help="read and write queues (default 4)")
    tc.add_argument("--broker", help="only on this broker (name, e.g. broker-a)")
    tc.add_argument("--perm", choices=("rw", "r", "w"), default="rw", help="permissions (default rw)")
    tc.set_defaults(func=_cmd_topic_create)
    tl = tsub.add_parser("list", parents=[client, js], help="topics with their queues per broker")
    tl.add_argument("-a", "--all", action="store_true", help="include system topics (TBW102, %%RETRY%%...)")
    tl.set_defaults(func=_cmd_topic_list)
    td = tsub.add_parser("describe", parents=[client, js], help="a topic's queues with min/max offsets per broker")
    td.add_argument("name", type=_topic_arg)
    td.set_defaults(func=_cmd_topic_describe)

    p = sub.add_parser("produce", parents=[client], help="send generated messages or JSON lines from a file/stdin",
                       description="Send messages, round-robin over the topic's queues, with a progress bar "
                                   "on stderr (when it is a terminal). JSON lines: one object per line with "
                                   "body (string, or any JSON value sent as JSON text), tag, keys (string or "
                                   "list), properties (object).")
    p.add_argument("-t", "--topic", required=True, type=_topic_arg)
    p.add_argument("-c", "--count", type=_positive_int, default=None, help="messages to generate (default 1000)")
    p.add_argument("-s", "--size", type=_positive_int, default=None, help="body bytes per generated message (256)")
    p.add_argument("--tags", default="TagA,TagB", help="tags of generated messages, cycled (default TagA,TagB; "
                                                       "'' for none)")
    p.add_argument("--key-prefix", default="key-", help="generated keys: PREFIX<i> (default key-; '' for none)")
    p.add_argument("-f", "--file", help="JSON-lines file to send ('-' = stdin)")
    p.add_argument("--batch", type=_positive_int, default=_MAX_BATCH_MESSAGES,
                   help=f"messages per batch send (default {_MAX_BATCH_MESSAGES})")
    p.set_defaults(func=_cmd_produce)

    g = sub.add_parser("progress", parents=[client, js],
                       help="a consumer group's offsets and lag per queue (mqadmin consumerProgress)")
    g.add_argument("-g", "--group", required=True, type=_group_arg)
    g.add_argument("-t", "--topic", type=_topic_arg,
                   help="only this topic (default: every topic the group has offsets on)")
    g.set_defaults(func=_cmd_progress)

    r = sub.add_parser("reset-offset", parents=[client, js],
                       help="set a group's offsets to the first message at/after a time (mqadmin resetOffsetByTime)")
    r.add_argument("-g", "--group", required=True, type=_group_arg)
    r.add_argument("-t", "--topic", required=True, type=_topic_arg)
    r.add_argument("--timestamp", required=True, type=_timestamp_arg,
                   help="epoch milliseconds, ISO-8601 (local time unless it has a zone), 'now', 'earliest' "
                        "or 'latest'")
    r.add_argument("--dry-run", action="store_true", help="print the plan (current -> new offset), write nothing")
    r.set_defaults(func=_cmd_reset_offset)

    d = sub.add_parser("demo",
                       help="the main job: embedded broker -> orders -> Spark streaming query -> Parquet",
                       description="Start an embedded broker in a temp dir (unless -n names a cluster), produce "
                                   "sample orders, read them with a Spark streaming query (format rocketmq, "
                                   "Trigger.AvailableNow) into Parquet, commit the group's offsets, show the "
                                   "progress and the totals per customer.")
    d.add_argument("-n", "--namesrv", type=_namesrv_arg, default=None, metavar="HOST:PORT[;HOST:PORT]",
                   help="run against this cluster instead of an embedded broker (default: embedded, temp dir)")
    d.add_argument("--topic", default="orders", type=_topic_arg)
    d.add_argument("--group", default="demo-etl", type=_group_arg)
    d.add_argument("--messages", type=_positive_int, default=10_000, help="orders to produce (default 10000)")
    d.add_argument("--max-messages-per-trigger", type=_positive_int, default=None,
                   help="admission control per micro-batch (default: a quarter of --messages)")
    d.add_argument("-o", "--output", help="keep the Parquet output and checkpoint here (default: a temp dir)")
    d.set_defaults(func=_cmd_demo)
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
        from .client.remoting import parse_namesrv_addr

        with contextlib.suppress(ValueError):
            namesrvs = parse_namesrv_addr(_namesrv(args))
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


if __name__ == "__main__":
    sys.exit(main())
