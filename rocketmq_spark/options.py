"""Parsing helpers shared by the reader's and the writer's options, the offset committer
and the command line.

Every error names the option, the value and what is accepted (:class:`OptionError`); the
command line words them as flags (it catches the error and keeps its own one-line style).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping

from .client.remoting import parse_namesrv_addr
from .errors import OptionError
from .names import GROUP_RULE, TOPIC_RULE, group_problem, topic_problem
from .namespaces import NAMESPACE_RULE, is_system_resource, namespace_problem, wrap
from .remoting.acl import Credentials
from .tls import TlsConfig

__all__ = ["CREDENTIAL_OPTIONS", "TLS_OPTIONS", "TRACE_OPTIONS", "byte_size", "canonical_options", "credentials",
           "duration_ms", "endpoint_list", "group_name", "namespace", "namesrv_list", "non_negative_int", "parse_bool",
           "parse_positive_int", "positive_int", "tls_config", "topic_name", "trace_topic"]

#: ACL options of the reader and the writer (accessKey and secretKey go together).
CREDENTIAL_OPTIONS = ("accessKey", "secretKey", "securityToken")
#: TLS options of the reader, the writer, the committer and the CLI (see :func:`tls_config`).
TLS_OPTIONS = ("tls", "tlsCaFile", "tlsCertFile", "tlsKeyFile", "tlsVerifyHostname")
#: message trace options of the reader and the writer (see :func:`trace_topic`)
TRACE_OPTIONS = ("traceEnabled", "traceTopic")
#: Values of options whose lower-cased name contains one of these are never echoed in errors.
_SECRET_WORDS = ("secret", "token", "password", "signature")


def canonical_options(options: Mapping[str, str], names: Iterable[str], *,
                      hidden: Iterable[str] = ()) -> dict[str, str]:
    """Case-insensitive keys -> their canonical spelling; unknown keys are rejected.

    ``hidden`` names are accepted (Spark sets them) but not listed as accepted.
    """
    known = {n.lower(): n for n in (*names, *hidden)}
    out: dict[str, str] = {}
    for key, value in options.items():
        canon = known.get(key.lower())
        if canon is None:
            shown = "***" if any(w in key.lower() for w in _SECRET_WORDS) else value
            listed = sorted(names)
            near = difflib.get_close_matches(key.lower(), [n.lower() for n in listed], n=1, cutoff=0.6)
            hint = f"did you mean {known[near[0]]}? " if near else ""
            raise OptionError(key, shown, f"unknown option; {hint}accepted: {listed}")
        out[canon] = str(value)
    return out


def topic_name(name: str, raw: str, topic: str, namespace: str = "") -> str:
    """``topic`` (one name given by option or column ``name`` as ``raw``) if RocketMQ accepts it;
    with a ``namespace``, as it travels (wrapped in the namespace), which is what is checked."""
    wire = wrap(namespace, topic)
    problem = topic_problem(wire)
    if problem:
        shown = f"{topic!r} (sent as {wire!r})" if wire != topic else repr(topic)
        raise OptionError(name, raw, f"{shown}: {problem} ({TOPIC_RULE})")
    return wire


def group_name(name: str, raw: str, namespace: str = "") -> str:
    """The consumer or producer group given by option ``name`` if RocketMQ accepts it; with a
    ``namespace``, as it travels (wrapped in the namespace), which is what is checked."""
    wire = wrap(namespace, raw)
    problem = group_problem(wire)
    if problem:
        shown = f" (sent as {wire!r})" if wire != raw else ""
        raise OptionError(name, raw, f"{problem}{shown} ({GROUP_RULE})")
    return wire


# -- namespaces (the option namespace of the reader, the writer, the committer and the CLI) --

def namespace(raw: str | None) -> str:
    """The option namespace: "" when not given or blank; else the namespace the Java client's
    ``setNamespace`` would wrap names in (see :mod:`rocketmq_spark.namespaces`)."""
    value = (raw or "").strip()
    if not value:
        return ""
    problem = namespace_problem(value)
    if problem:
        raise OptionError("namespace", raw, f"{problem}; {NAMESPACE_RULE}")
    return value


def parse_bool(name: str, raw: str) -> bool:
    v = raw.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise OptionError(name, raw, "accepted: true or false")


def parse_positive_int(raw: str) -> int:
    """``raw`` as an integer >= 1; else :class:`ValueError` saying what is wrong ("is not a whole
    number" or "must be at least 1"), for the caller to word as its surface does."""
    try:
        n = int(raw)
    except ValueError:
        raise ValueError("is not a whole number") from None
    if n <= 0:
        raise ValueError("must be at least 1")
    return n


def positive_int(name: str, raw: str) -> int:
    """Option ``name`` as an integer >= 1 (:func:`parse_positive_int`)."""
    try:
        return parse_positive_int(raw)
    except ValueError:
        raise OptionError(name, raw, "accepted: a positive integer") from None


def non_negative_int(name: str, raw: str) -> int:
    """Option ``name`` as an integer >= 0."""
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise OptionError(name, raw, "accepted: a whole number, 0 or more")
    return n


#: maxTriggerDelay-style durations: a whole number with a unit (a bare number is milliseconds)
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


#: maxBytesPerTrigger-style sizes: binary units, as Spark's byte strings (a bare number is bytes)
_BYTE_UNITS = {"b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}


def _scaled(raw: str, units: Mapping[str, int], bare: str) -> int | None:
    """``raw`` as a whole number with one of ``units`` (``bare`` when it has none), scaled by
    it; None when it is not that."""
    v = raw.strip().lower()
    digits = v.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = v[len(digits):].strip() or bare
    if not digits.isascii() or not digits.isdigit() or unit not in units:
        return None
    return int(digits) * units[unit]


def duration_ms(name: str, raw: str) -> int:
    """Option ``name`` as a duration in milliseconds, >= 0: ``500ms``, ``30s``, ``15m``
    (``15min``), ``1h``, ``1d``, or a bare number of milliseconds (as Spark reads Kafka's
    maxTriggerDelay)."""
    ms = _scaled(raw, _DURATION_UNITS, "ms")
    if ms is None:
        raise OptionError(name, raw, "accepted: a whole number with a unit: ms, s, m (or min), h, d, e.g. 30s or 15m "
                          "(a bare number is milliseconds)")
    return ms


def byte_size(name: str, raw: str) -> int:
    """Option ``name`` as a positive number of bytes: ``65536``, ``64k``, ``64m``, ``1g`` (binary)."""
    n = _scaled(raw, _BYTE_UNITS, "b")
    if not n:
        raise OptionError(name, raw, "accepted: a positive whole number of bytes, or with a unit k, m or g (binary: "
                          "1k = 1024 bytes), e.g. 64m")
    return n


def trace_topic(opts: Mapping[str, str], endpoints: str | None, ns: str) -> str | None:
    """The topic message traces go to as it travels (wrapped in namespace ``ns`` unless a
    system topic, as the Java client's trace producer sends it), or None without
    traceEnabled=true. traceTopic alone is refused (it would trace nothing), and so is a
    system trace topic over gRPC (5.x proxies refuse sends to system topics)."""
    from .codec.trace import DEFAULT_TRACE_TOPIC

    enabled = parse_bool("traceEnabled", opts.get("traceEnabled", "false"))
    raw = opts.get("traceTopic")
    if not enabled:
        if raw is not None:
            raise OptionError("traceTopic", raw, "names where message traces go: give traceEnabled=true too")
        return None
    topic = raw.strip() if raw is not None else DEFAULT_TRACE_TOPIC
    wire = topic_name("traceTopic", raw if raw is not None else topic, topic, ns)
    if endpoints and is_system_resource(wire):
        raise OptionError("traceTopic", raw if raw is not None else topic,
                          f"{topic!r} is a system topic, and 5.x proxies (endpoints) refuse sends to system topics: "
                          "name a topic of your own with traceTopic, or use namesrvAddr")
    return wire


def _address_list(name: str, raw: str, accepted: str) -> tuple[str, ...]:
    """``host:port;host:port`` -> addresses; none at all, or a port outside 1-65535, is an error."""
    try:
        out = tuple(parse_namesrv_addr(raw))
    except ValueError as exc:
        raise OptionError(name, raw, f"{accepted} ({exc})") from None
    if not out:
        raise OptionError(name, raw, f"{accepted} (no address given)")
    for addr in out:
        port = addr.rpartition(":")[2]
        if not port.isascii() or not 1 <= int(port) <= 65535:
            raise OptionError(name, raw, f"{accepted} (port of {addr!r} is not in 1-65535)")
    return out


def namesrv_list(raw: str) -> tuple[str, ...]:
    return _address_list("namesrvAddr", raw, "accepted: host:port;host:port")


def endpoint_list(raw: str) -> tuple[str, ...]:
    return _address_list("endpoints", raw, "accepted: gRPC endpoints host:port;host:port")


def credentials(opts: Mapping[str, str]) -> Credentials | None:
    """ACL credentials from canonical options ``accessKey``, ``secretKey``, ``securityToken``;
    None when neither key is given. Errors never contain the secret key or the token."""
    ak = (opts.get("accessKey") or "").strip()
    sk = opts.get("secretKey") or ""
    token = opts.get("securityToken") or None
    if not ak and not sk:
        if token:
            raise OptionError("securityToken", "***", "accepted only together with accessKey and secretKey")
        return None
    if not ak:
        raise OptionError("accessKey", None, "accessKey and secretKey must be given together (secretKey is set, "
                          "accessKey is missing)")
    if not sk:
        raise OptionError("secretKey", None, "accessKey and secretKey must be given together (accessKey is set, "
                          "secretKey is missing)")
    return Credentials(ak, sk, token)


def _pem_file(name: str, raw: str, what: str) -> str:
    path = raw.strip()
    if not path:
        raise OptionError(name, raw, f"accepted: the path of {what}")
    if not os.path.isfile(path):
        raise OptionError(name, raw, f"no such file: the path of {what} is expected, readable on the driver and on "
                          "every executor (each reads it where it connects)")
    return path


def tls_config(opts: Mapping[str, str]) -> TlsConfig | None:
    """TLS settings from canonical options ``tls`` (true|false, default false), ``tlsCaFile``
    (PEM CA certificates; absent: the system's trust store), ``tlsCertFile`` and ``tlsKeyFile``
    (PEM client certificate and key for mutual TLS, both or neither) and ``tlsVerifyHostname``
    (default true); None when ``tls`` is off. The files must exist here (the driver connects
    too); the executors read them again where they connect."""
    enabled = parse_bool("tls", opts.get("tls", "false"))
    given = [n for n in TLS_OPTIONS[1:] if opts.get(n) is not None]
    if not enabled:
        if given:
            raise OptionError(given[0], opts[given[0]], "accepted only with tls=true (TLS is off by default)")
        return None
    ca = opts.get("tlsCaFile")
    cert = opts.get("tlsCertFile")
    key = opts.get("tlsKeyFile")
    if (cert is None) != (key is None):
        have, missing = ("tlsCertFile", "tlsKeyFile") if cert is not None else ("tlsKeyFile", "tlsCertFile")
        raise OptionError(missing, None, f"tlsCertFile and tlsKeyFile must be given together (mutual TLS): {have} is "
                          f"set, {missing} is missing")
    return TlsConfig(
        ca_file=_pem_file("tlsCaFile", ca, "a PEM file of CA certificates (leave tlsCaFile out to trust the "
                          "system's CAs)") if ca is not None else None,
        cert_file=_pem_file("tlsCertFile", cert, "a PEM client certificate") if cert is not None else None,
        key_file=_pem_file("tlsKeyFile", key, "a PEM private key") if key is not None else None,
        verify_hostname=parse_bool("tlsVerifyHostname", opts.get("tlsVerifyHostname", "true")),
    )
