"""What the commands share: the error a user can fix, argument types, the name server and
client a command talks to, and the text/JSON output helpers."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ..errors import OptionError

if TYPE_CHECKING:
    from ..client.remoting import RemotingClient
    from ..remoting.acl import Credentials
    from ..tls import ServerTls, TlsConfig

PROG = "rocketmq-spark"
DEFAULT_NAMESRV = "127.0.0.1:9876"


class CliError(Exception):
    """A problem the user can fix: printed as one line (what is wrong, what to do); exit 2."""


# -- argument parsing -------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong + where to look), exit 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def namesrv_arg(value: str) -> str:
    from ..client.remoting import parse_namesrv_addr

    try:
        addrs = parse_namesrv_addr(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; pass host:port, several separated by ';'") from None
    if not addrs:
        raise argparse.ArgumentTypeError("empty name server list; pass host:port")
    return ";".join(addrs)


def topic_arg(value: str) -> str:
    from ..options import topic_name

    try:
        return topic_name("topic", value, value)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(exc.accepted) from None


def group_arg(value: str) -> str:
    from ..options import group_name

    try:
        return group_name("group", value)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc.accepted}") from None


def positive_int_arg(value: str) -> int:
    from ..options import parse_positive_int

    try:
        # typed by people: digit grouping (10,000 or 10_000) is allowed here
        return parse_positive_int(value.replace("_", "").replace(",", ""))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} {exc}") from None


def parse_timestamp(value: str, *, now_ms: int | None = None) -> int:
    """``now`` | ``earliest`` (0) | ``latest`` (-1) | epoch milliseconds | ISO-8601 -> epoch ms.

    An ISO-8601 time without a zone is local time. Epoch *seconds* are refused (they would
    silently mean 1970), with the millisecond value to pass instead.

    Deliberately not the reader's ``startingTimestamp`` parser (source/options.py): a time
    without a zone is local here, as mqadmin resetOffsetByTime reads it, but UTC there, so
    that a query means the same instant on every machine it runs on; the words and the
    epoch-seconds guard are for people typing at a terminal.
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


def timestamp_arg(value: str) -> int:
    return parse_timestamp(value)


def client_parent() -> Parser:
    p = Parser(add_help=False)
    p.add_argument("-n", "--namesrv", type=namesrv_arg, default=None, metavar="HOST:PORT[;HOST:PORT]",
                   help=f"name server list (default $NAMESRV_ADDR, else {DEFAULT_NAMESRV})")
    p.add_argument("--access-key", default=None, metavar="AK",
                   help="ACL access key: sign every request (default $ROCKETMQ_ACCESS_KEY)")
    p.add_argument("--secret-key", default=None, metavar="SK",
                   help="ACL secret key (default $ROCKETMQ_SECRET_KEY; the variable keeps it out of `ps`)")
    p.add_argument("--namespace", type=namespace_arg, default="", metavar="NS",
                   help="the namespace of the topic and group, as the Java client's setNamespace (and the "
                        "option namespace) names them: sent as NS%%topic, NS%%group")
    add_tls_client_args(p)
    return p


def namespace_arg(value: str) -> str:
    from ..options import namespace

    try:
        return namespace(value)
    except OptionError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: {exc.accepted}") from None


#: the arguments of the client commands that name a topic (``name``: topic create/describe)
_TOPIC_ARGS = ("topic", "name")


def apply_namespace(args: argparse.Namespace) -> None:
    """With --namespace, the topic and group arguments become the names they travel as (wrapped
    in the namespace; output then shows those names), once, before a command runs."""
    from ..options import group_name, topic_name

    space = getattr(args, "namespace", "")
    if not space:
        return
    try:
        for attr in _TOPIC_ARGS:
            value = getattr(args, attr, None)
            if isinstance(value, str) and value:
                setattr(args, attr, topic_name(attr, value, value, space))
        group = getattr(args, "group", None)
        if isinstance(group, str) and group:
            args.group = group_name("group", group, space)
    except OptionError as exc:
        raise CliError(f"{exc.option} {exc.value!r} in namespace {space!r}: {exc.accepted}") from None


def add_tls_client_args(p: argparse.ArgumentParser) -> None:
    """The reader's and writer's TLS options as flags (option tls -> --tls, tlsCaFile -> --tls-ca-file, ...)."""
    p.add_argument("--tls", action="store_true", help="connect over TLS (name servers and brokers)")
    p.add_argument("--tls-ca-file", metavar="PEM", help="(with --tls) trust these CA certificates instead of the "
                   "system's")
    p.add_argument("--tls-cert-file", metavar="PEM", help="(with --tls) client certificate for mutual TLS "
                   "(with --tls-key-file)")
    p.add_argument("--tls-key-file", metavar="PEM", help="(with --tls) the client certificate's private key")
    p.add_argument("--no-tls-verify-hostname", action="store_true",
                   help="(with --tls) accept a server certificate that does not name the host connected to")


def _flag(option: str) -> str:
    """The CLI flag of a TLS option (tlsCaFile -> --tls-ca-file)."""
    if option == "tlsVerifyHostname":
        return "--no-tls-verify-hostname"
    return "--" + "".join(f"-{c.lower()}" if c.isupper() else c for c in option)


def tls_of(args: argparse.Namespace | None) -> TlsConfig | None:
    """The client TLS settings of the --tls flags, by the rules of the tls options
    (:func:`rocketmq_spark.options.tls_config`), worded as flags."""
    from ..options import tls_config

    opts = {"tls": "true" if getattr(args, "tls", False) else "false",
            "tlsCaFile": getattr(args, "tls_ca_file", None), "tlsCertFile": getattr(args, "tls_cert_file", None),
            "tlsKeyFile": getattr(args, "tls_key_file", None),
            "tlsVerifyHostname": "false" if getattr(args, "no_tls_verify_hostname", False) else None}
    try:
        return tls_config({k: v for k, v in opts.items() if v is not None})
    except OptionError as exc:
        accepted = exc.accepted
        for name in ("tlsCaFile", "tlsCertFile", "tlsKeyFile", "tlsVerifyHostname", "tls=true"):
            accepted = accepted.replace(name, "--tls" if name == "tls=true" else _flag(name))
        shown = f" {exc.value}" if isinstance(exc.value, str) and exc.option != "tlsVerifyHostname" else ""
        raise CliError(f"{_flag(exc.option)}{shown}: {accepted}") from None


def add_tls_server_args(p: argparse.ArgumentParser, *, outbound: bool) -> None:
    """TLS of the embedded servers' ports (``outbound``: the broker's own connections too)."""
    p.add_argument("--tls-cert-file", metavar="PEM", help="serve TLS only (plaintext clients are refused, as "
                   "tls.server.mode=enforcing does): the server certificate (chain), with --tls-key-file")
    p.add_argument("--tls-key-file", metavar="PEM", help="the server certificate's private key")
    p.add_argument("--tls-client-ca-file", metavar="PEM", help="mutual TLS: clients must present a certificate "
                   "signed by one of these CAs")
    if outbound:
        p.add_argument("--tls-ca-file", metavar="PEM", help="CA certificates the broker trusts when it connects "
                       "to name servers given by --namesrv (default: the system's)")


def server_tls_of(args: argparse.Namespace) -> ServerTls | None:
    """The servers' TLS of --tls-cert-file/--tls-key-file/..., files checked now (one-line errors)."""
    import ssl

    from ..tls import ServerTls

    cert, key = getattr(args, "tls_cert_file", None), getattr(args, "tls_key_file", None)
    client_ca, ca = getattr(args, "tls_client_ca_file", None), getattr(args, "tls_ca_file", None)
    if cert is None and key is None:
        if client_ca or ca:
            raise CliError("--tls-client-ca-file and --tls-ca-file need --tls-cert-file and --tls-key-file (the "
                           "servers' certificate)")
        return None
    if cert is None or key is None:
        missing = "--tls-key-file" if key is None else "--tls-cert-file"
        raise CliError(f"serving TLS needs both --tls-cert-file and --tls-key-file: {missing} is missing")
    for flag, path in (("--tls-cert-file", cert), ("--tls-key-file", key), ("--tls-client-ca-file", client_ca),
                       ("--tls-ca-file", ca)):
        if path is not None and not os.path.isfile(path):
            raise CliError(f"{flag} {path}: no such file (a PEM file is expected)")
    tls = ServerTls(cert, key, client_ca_file=client_ca, ca_file=ca)
    try:
        tls.server_context()
    except ssl.SSLError as exc:
        raise CliError(f"--tls-cert-file {cert} / --tls-key-file: not a PEM certificate and its private key, or "
                       f"--tls-client-ca-file holds no PEM certificate ({exc.reason or exc})") from None
    return tls


def json_parent() -> Parser:
    p = Parser(add_help=False)
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    return p


def namesrv_of(args: argparse.Namespace) -> str:
    return (getattr(args, "namesrv", None) or getattr(args, "global_namesrv", None)
            or os.environ.get("NAMESRV_ADDR") or DEFAULT_NAMESRV)


def _credentials(args: argparse.Namespace | None) -> Credentials | None:
    """ACL credentials from --access-key/--secret-key, else $ROCKETMQ_ACCESS_KEY/$ROCKETMQ_SECRET_KEY
    (each flag falls back to its variable); None when neither key is set. The rules are the
    accessKey/secretKey options' (:func:`rocketmq_spark.options.credentials`), worded as flags."""
    from ..options import credentials

    ak = getattr(args, "access_key", None) or os.environ.get("ROCKETMQ_ACCESS_KEY") or ""
    sk = getattr(args, "secret_key", None) or os.environ.get("ROCKETMQ_SECRET_KEY") or ""
    try:
        return credentials({"accessKey": ak, "secretKey": sk})
    except OptionError as exc:
        missing = ("--access-key (or $ROCKETMQ_ACCESS_KEY)" if exc.option == "accessKey"
                   else "--secret-key (or $ROCKETMQ_SECRET_KEY)")
        raise CliError(f"ACL credentials need both an access key and a secret key: {missing} is missing") from None


def make_client(namesrv: str, args: argparse.Namespace | None = None) -> RemotingClient:
    from ..client.remoting import ClientConfig, RemotingClient

    # A tool should say quickly that an address is wrong: two attempts, a short budget.
    return RemotingClient(namesrv, ClientConfig(connect_timeout_s=3.0, request_timeout_s=10.0, retries=2,
                                                retry_budget_s=5.0, credentials=_credentials(args),
                                                tls=tls_of(args)))


# -- output helpers ---------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
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


def fmt_time(ms: int | None) -> str | None:
    """Local time like mqadmin prints it: ``2024-05-01 12:00:00.123``."""
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def iso_utc(ms: int | None) -> str | None:
    if ms is None or ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def is_system_topic(topic: str) -> bool:
    from ..broker.state import SYSTEM_TOPICS

    return (topic in SYSTEM_TOPICS or topic.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_", "rmq_sys_"))
            or topic.endswith("_REPLY_TOPIC"))


def require_topic(client: RemotingClient, topic: str, namesrv: str) -> None:
    """Fail with a one-line hint when the name servers do not know ``topic`` (a route lookup
    would auto-create it on an embedded broker, which a read-only command must not do)."""
    if topic not in client.topic_list():
        raise CliError(f"topic {topic!r} does not exist on {namesrv}: create it with "
                       f"`{PROG} topic create {topic}` (existing topics: `{PROG} topic list`)")
