"""``broker`` and ``namesrv``: the embedded servers in the foreground, until a signal."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from .common import PROG, CliError, Parser, add_tls_server_args, positive_int_arg, server_tls_of


def add_commands(sub: argparse._SubParsersAction[Parser]) -> None:
    b = sub.add_parser("broker", help="run the embedded name server + broker(s) in the foreground")
    _add_broker_args(b)
    b.set_defaults(func=_cmd_broker)

    n = sub.add_parser("namesrv", help="run a name server alone in the foreground (brokers join with --namesrv)")
    n.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    n.add_argument("--port", type=int, default=9876, help="port, 0 = ephemeral (default 9876)")
    n.add_argument("--broker-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="drop a broker from routes after this long without its registration (default 120)")
    n.add_argument("--no-auto-create", action="store_true", help="refuse unknown topics instead of creating them")
    add_tls_server_args(n, outbound=False)
    n.set_defaults(func=_cmd_namesrv)


def _add_broker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="where the store lives (default: ~/.rocketmq-spark/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    p.add_argument("--advertise-host", metavar="HOST",
                   help="address the brokers give out (registered with the name server, in gRPC routes) instead "
                        "of --host, which they still bind (Java's brokerIP1 vs bindAddress): for a TCP proxy on "
                        "HOST:<port> forwarding to --host:<port>. The name server is not affected")
    p.add_argument("--namesrv-port", type=int, default=9876, help="name server port, 0 = ephemeral (default 9876)")
    p.add_argument("--broker-port", type=int, default=10911,
                   help="broker port, 0 = ephemeral (default 10911; with --brokers N, broker i gets this + 10*i)")
    p.add_argument("--grpc-port", type=int, default=8081,
                   help="gRPC (RocketMQ 5 proxy) port, 0 = ephemeral, -1 = off (default 8081; broker i: + i)")
    p.add_argument("--flush", choices=("async", "sync"), default="async",
                   help="sync: a send succeeds only once fsynced (default async)")
    p.add_argument("--broker-name", default="broker-a", help="(one broker) its name (default broker-a)")
    p.add_argument("--brokers", type=positive_int_arg, default=1,
                   help="run a name server and this many brokers (broker-a, broker-b, ...) in this process")
    p.add_argument("--namesrv", metavar="HOST:PORT[;HOST:PORT]",
                   help="register with these name servers (started with `namesrv`) instead of running one here")
    p.add_argument("--register-interval-ms", type=positive_int_arg, default=30_000,
                   help="how often brokers register again with the name servers (default 30000)")
    p.add_argument("--no-auto-create", action="store_true", help="refuse unknown topics instead of creating them")
    p.add_argument("--max-pull-messages", type=int, default=None,
                   help="cap on messages per pull (a real broker serves 32)")
    p.add_argument("--enable-property-filter", action="store_true",
                   help="serve SQL92 property filters (a reader's subExpressionType=SQL92), as Apache RocketMQ's "
                        "enablePropertyFilter=true does (off by default, as there)")
    p.add_argument("--acl", action="append", default=[], metavar="AK:SK",
                   help="ACL on: accept requests signed with access key AK and secret key SK (repeatable; the name "
                        "server does not check signatures)")
    p.add_argument("--acl-file", metavar="PATH",
                   help='ACL on: a JSON file {"accessKey": "secretKey", ...} (merged with --acl)')
    add_tls_server_args(p, outbound=True)


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
    from ..broker.config import BrokerConfig
    from ..broker.server import BrokerServer, NamesrvServer, broker_names
    from ..client.remoting import parse_namesrv_addr

    data_dir = args.data_dir or os.path.join(os.path.expanduser("~"), ".rocketmq-spark", "broker")
    os.makedirs(data_dir, exist_ok=True)
    extra: dict[str, Any] = {"register_interval_ms": args.register_interval_ms}
    if args.max_pull_messages:
        extra["max_pull_messages"] = args.max_pull_messages
    if args.enable_property_filter:
        extra["enable_property_filter"] = True
    acl = _acl_table(args)
    if acl:
        extra["acl"] = acl
    tls = server_tls_of(args)
    if tls is not None:
        extra["tls"] = tls
    remote = []
    if args.namesrv:
        try:
            remote = parse_namesrv_addr(args.namesrv)
        except ValueError as exc:
            raise CliError(f"--namesrv {args.namesrv!r}: {exc}; expected host:port;host:port") from None
    names = [args.broker_name] if args.brokers == 1 else broker_names(args.brokers)
    namesrv = None if remote else NamesrvServer(args.host, args.namesrv_port,
                                                auto_create_topics=not args.no_auto_create, tls=tls)
    servers = []
    for i, name in enumerate(names):
        config = BrokerConfig(data_dir=data_dir if len(names) == 1 else os.path.join(data_dir, name), host=args.host,
                              advertise_host=args.advertise_host, flush=args.flush, broker_name=name,
                              auto_create_topics=not args.no_auto_create, **extra)
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
                "bind": head.bind_addr, "brokerName": head.config.broker_name, "dataDir": data_dir,
                "tls": tls is not None,
                "brokers": {s.config.broker_name: {"broker": s.broker_addr, "grpc": s.grpc_endpoint,
                                                   "bind": s.bind_addr} for s in servers}}

    def human() -> str:
        lines = [f"name server {'listening on' if namesrv is not None else 'at'} {ns_addr()}"]
        for s in servers:
            where = s.broker_addr if s.bind_addr == s.broker_addr else f"{s.bind_addr} (advertised as {s.broker_addr})"
            lines.append(f"broker {s.config.broker_name} listening on {where}; gRPC endpoint (RocketMQ 5 "
                         f"proxy) on {s.grpc_endpoint or 'off'}")
        if acl:
            lines.append(f"ACL on: requests must be signed by access key {', '.join(sorted(acl))} (the name server "
                         "does not check)")
        if tls is not None:
            lines.append("TLS only on every port" + (" (mutual: clients need a certificate)"
                                                     if tls.client_ca_file else "") + ": connect with --tls")
        lines.append(f"data in {data_dir}; Ctrl-C to stop")
        return "\n".join(lines) + "\n"

    asyncio.run(_serve_until_signal(start, stop, first_line, human))
    return 0


def _cmd_namesrv(args: argparse.Namespace) -> int:
    from ..broker.server import NamesrvServer

    server = NamesrvServer(args.host, args.port, auto_create_topics=not args.no_auto_create,
                           broker_timeout_s=args.broker_timeout, tls=server_tls_of(args))

    def first_line() -> dict[str, Any]:
        return {"namesrv": server.addr}

    asyncio.run(_serve_until_signal(server.start, server.stop, first_line,
                                    lambda: f"name server listening on {server.addr}; brokers join with "
                                            f"`{PROG} broker --namesrv {server.addr}`; Ctrl-C to stop\n"))
    return 0
