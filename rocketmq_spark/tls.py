"""TLS settings of clients (:class:`TlsConfig`) and of the embedded servers (:class:`ServerTls`),
and the contexts built from them.

Both are frozen, picklable values holding file *paths*: the files are read where a context is
built, i.e. on the Spark executor for a task's connections, so the paths must exist there. A
context is built once per process and setting (:func:`functools.lru_cache`), when the first
connection opens, not when the options are parsed: a missing file fails the first connection
with :class:`~rocketmq_spark.errors.TlsError` naming the option and the path.

The remoting protocol and the gRPC protocol use the same settings. Apache RocketMQ's servers
choose TLS per connection (``tls.server.mode``: ``disabled``, ``permissive``, ``enforcing``);
an ``enforcing`` server closes a connection whose first byte is not a TLS handshake record.
"""

from __future__ import annotations

import functools
import os
import socket
import ssl
from dataclasses import dataclass

from .errors import TlsError

__all__ = ["ServerTls", "TlsConfig", "probe_hangs_up_after_handshake", "probe_plaintext_answered", "probe_tls"]


def _readable(option: str, path: str, address: str) -> None:
    if not os.path.isfile(path):
        raise TlsError(address, "TLS setup", f"{option}={path!r}: no such file (a PEM file is expected, on every "
                       "Spark executor as well as on the driver)")
    if not os.access(path, os.R_OK):
        raise TlsError(address, "TLS setup", f"{option}={path!r}: the file is not readable by this process")


@dataclass(frozen=True)
class TlsConfig:
    """A client's TLS: trust ``ca_file`` (PEM CA certificates; None: the system's trust store),
    present ``cert_file``/``key_file`` (PEM, both or neither) to servers that ask for a client
    certificate (mutual TLS), check that the server's certificate names the host connected to
    unless ``verify_hostname`` is off (an IP address must be in the certificate's IP SANs)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS): give both or neither")

    def context(self, address: str = "?") -> ssl.SSLContext:
        """The client context of these settings (built once per process); TlsError naming the
        option and the file when a file is missing or not PEM."""
        return _client_context(self, address)

    def pem_files(self, address: str = "?") -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA certificates, client key, client certificate chain) as read from the files, None
        for those not set: what gRPC's channel credentials take. TlsError naming the option of
        a missing file."""

        def read(option: str, path: str | None) -> bytes | None:
            if path is None:
                return None
            _readable(option, path, address)
            with open(path, "rb") as f:
                return f.read()

        return read("tlsCaFile", self.ca_file), read("tlsKeyFile", self.key_file), read("tlsCertFile", self.cert_file)


@functools.lru_cache(maxsize=16)
def _client_context(tls: TlsConfig, address: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if tls.ca_file is not None:
        _readable("tlsCaFile", tls.ca_file, address)
        try:
            ctx.load_verify_locations(cafile=tls.ca_file)
        except ssl.SSLError as exc:
            raise TlsError(address, "TLS setup", f"tlsCaFile={tls.ca_file!r} holds no PEM certificate: "
                           f"{exc.reason or exc}") from None
    if tls.cert_file is not None and tls.key_file is not None:
        _readable("tlsCertFile", tls.cert_file, address)
        _readable("tlsKeyFile", tls.key_file, address)
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except ssl.SSLError as exc:
            raise TlsError(address, "TLS setup", f"tlsCertFile={tls.cert_file!r} and tlsKeyFile (not shown) are not "
                           f"a PEM certificate and its private key: {exc.reason or exc}") from None
    ctx.check_hostname = tls.verify_hostname
    return ctx


@dataclass(frozen=True)
class ServerTls:
    """TLS of the embedded name server, broker and gRPC ports (what Apache RocketMQ calls
    ``tls.server.mode=enforcing``: every connection must start a TLS handshake).

    ``cert_file``/``key_file``: the server's PEM certificate (chain) and private key.
    ``client_ca_file``: when given, clients must present a certificate signed by one of these
    CAs (mutual TLS; Java's ``tls.server.need.client.auth=require`` with
    ``tls.server.trustCertPath``). ``ca_file``: what the broker trusts when it connects to remote
    name servers itself (None: the system's trust store); it presents its own certificate there."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None
    ca_file: str | None = None

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file is not None:
            ctx.load_verify_locations(cafile=self.client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def outbound(self) -> TlsConfig:
        """The client settings of the broker's own connections (to remote name servers)."""
        return TlsConfig(ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file)

    def pem_files(self) -> tuple[bytes, bytes, bytes | None]:
        """(private key, certificate chain, client CA certificates or None) as read from the
        files: what gRPC's server credentials take."""
        with open(self.key_file, "rb") as f:
            key = f.read()
        with open(self.cert_file, "rb") as f:
            chain = f.read()
        roots = None
        if self.client_ca_file is not None:
            with open(self.client_ca_file, "rb") as f:
                roots = f.read()
        return key, chain, roots


def probe_tls(host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` completes a TLS handshake (certificate not checked): how a client
    that connected in plaintext and was hung up on tells a server that requires TLS from one
    that failed otherwise. False on any failure within ``timeout_s``."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host):
            return True
    except ssl.SSLError as exc:  # a TLS alert (e.g. a client certificate is required) is TLS spoken
        return "ALERT" in str(exc.reason or "").upper()
    except (OSError, ValueError):
        return False


def probe_plaintext_answered(host: str, port: int, request: bytes, timeout_s: float) -> bool:
    """Whether ``host:port`` answers ``request`` (a whole frame) sent in plaintext on a new
    connection: a server that accepts TLS handshakes may accept plaintext too (Apache
    RocketMQ's default ``tls.server.mode=permissive``), so a plaintext connection hung up on
    there was a fault of the moment, not a server that requires TLS. False on a hang-up, a
    timeout or any other failure."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            raw.sendall(request)
            return raw.recv(1) != b""
    except (OSError, ValueError):
        return False


def probe_hangs_up_after_handshake(ctx: ssl.SSLContext, host: str, port: int, timeout_s: float) -> bool:
    """Whether ``host:port`` ends a TLS session made with ``ctx`` on its own, right after the
    handshake and before any request: what a TLS 1.3 server that requires a client certificate
    does to a client without one (the client's side of the handshake ends first; some servers
    then hang up without an alert). False when the server waits for a request, as any does
    that accepted the client."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.settimeout(min(timeout_s, 1.0))
            return tls.recv(1) == b""
    except TimeoutError:
        return False
    except ssl.SSLError:
        return True
    except (OSError, ValueError):
        return False
