"""One client-side TCP connection multiplexing requests by opaque id."""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..errors import ConnectionFailedError, ProtocolError, RequestTimeoutError, TlsError
from ..remoting.codes import RequestCode
from ..remoting.frame import (
    DEFAULT_MAX_FRAME,
    FLAG_RESPONSE,
    RemotingCommand,
    read_frame_length,
)
from ..tls import TlsConfig, probe_hangs_up_after_handshake, probe_plaintext_answered, probe_tls

log = logging.getLogger(__name__)

__all__ = ["RemotingConnection", "Reply"]

#: bytes asked of the socket per read
_READ_SIZE = 256 * 1024
#: taken to settle a Reply (the reader thread and a failing sender may both try)
_SETTLE = threading.Lock()


class Reply:
    """The answer to come to one request of :meth:`RemotingConnection.send_many`: what callers
    use of a Future (``result``, ``done``, ``set_result``, ``set_exception``) on a bare lock,
    held until it is settled (a Future builds a Condition; a writer sends thousands of
    requests a second). The first result or exception set wins."""

    __slots__ = ("_done", "_error", "_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._value: RemotingCommand | None = None
        self._error: BaseException | None = None
        self._done = False

    def _settle(self, value: RemotingCommand | None, error: BaseException | None) -> None:
        with _SETTLE:
            if self._done:
                return
            self._done = True
        self._value, self._error = value, error
        self._lock.release()

    def set_result(self, value: RemotingCommand) -> None:
        self._settle(value, None)

    def set_exception(self, error: BaseException) -> None:
        self._settle(None, error)

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None) -> RemotingCommand:
        """The answer; raises what :meth:`set_exception` set, TimeoutError past ``timeout`` seconds."""
        if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError(f"no answer within {timeout:g}s")
        self._lock.release()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit():
        raise ConnectionFailedError(address, "connect", "address is not host:port")
    return host, int(port)


class RemotingConnection:
    """A socket plus a reader thread; :meth:`send` returns a future per request.

    Any number of requests may be in flight. Frames the peer sends as requests
    (flag bit 0 clear: CHECK_TRANSACTION_STATE, NOTIFY_...) go to ``on_request``.
    A read error fails every pending future with :class:`ConnectionFailedError`.

    ``signer`` (ACL request signing) is applied to every request frame just before it is
    encoded, whichever method sends it (:meth:`send`, :meth:`send_many`, :meth:`invoke`, and
    :meth:`reply` when the frame is a request such as the END_TRANSACTION answering a
    check-back); responses are never signed.

    With ``tls`` the connection is TLS (handshake before the constructor returns). Faults that
    asking again cannot cure raise :class:`TlsError` at once, worded for the operator: a
    certificate that fails verification, a server that does not speak TLS, and (``tls`` off)
    a server that hangs up before answering the first request and accepts a TLS handshake
    when probed, i.e. one that requires TLS (Apache RocketMQ's ``tls.server.mode=enforcing``
    closes such connections without a word).
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout_s: float = 3.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_request: Callable[[RemotingConnection, RemotingCommand], None] | None = None,
        signer: Callable[[RemotingCommand], None] | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
        self._connect_timeout_s = connect_timeout_s
        #: whether any response arrived (a plaintext connection hung up before one may mean TLS is required)
        self._answered = False
        #: the TlsError that closed the connection, given to requests sent after it (a TLS 1.3
        #: server refuses a missing client certificate just after the handshake, maybe before any)
        self._tls_fault: TlsError | None = None
        self.signer = signer
        self._max_frame = max_frame
        self._on_request = on_request
        self._pending: dict[int, Future[RemotingCommand] | Reply] = {}
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._opaque = itertools.count(1)
        self.closed = False
        host, port = _split(address)
        self._host, self._port = host, port
        ctx = tls.context(address) if tls is not None else None
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise ConnectionFailedError(address, "connect", exc) from None
        #: TLS state when ``tls``: records go through memory buffers so that the reader thread
        #: and senders never use one OpenSSL object at once (``_slock``)
        self._tls_obj: ssl.SSLObject | None = None
        self._tls_in = ssl.MemoryBIO()
        self._tls_out = ssl.MemoryBIO()
        self._slock = threading.Lock()
        if ctx is not None:
            try:
                self._handshake(ctx, host)
            except BaseException:
                self._sock.close()
                raise
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = threading.Thread(target=self._read_loop, name=f"rocketmq-conn-{address}", daemon=True)
        self._reader.start()

    # -- TLS ------------------------------------------------------------------------

    def _handshake(self, ctx: ssl.SSLContext, host: str) -> None:
        """The TLS handshake, bounded by the connect timeout; TlsError saying what went wrong."""
        obj = ctx.wrap_bio(self._tls_in, self._tls_out, server_hostname=host)
        try:
            while True:
                try:
                    obj.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    out = self._tls_out.read()
                    if out:
                        self._sock.sendall(out)
                    data = self._sock.recv(_READ_SIZE)
                    if not data:
                        raise ConnectionResetError("the server closed the connection") from None
                    self._tls_in.write(data)
            out = self._tls_out.read()
            if out:
                self._sock.sendall(out)
        except ssl.SSLCertVerificationError as exc:
            raise TlsError(self.address, "TLS handshake", _verify_problem(exc)) from None
        except ssl.SSLError as exc:
            reason = str(exc.reason or exc)
            if "ALERT" in reason.upper():
                raise TlsError(self.address, "TLS handshake", f"the server refused the handshake ({reason})"
                               + _CLIENT_CERT_HINT) from None
            raise TlsError(self.address, "TLS handshake", f"the server does not speak TLS ({reason}): set tls=false "
                           "if it serves plaintext, or check the port") from None
        # No answer, or a hang-up, is what a paused or restarting broker gives as well: a fault
        # retried with bounds as any lost connection (reported with the hint if it persists).
        except TimeoutError:
            raise ConnectionFailedError(self.address, "TLS handshake", f"no TLS answer within "
                                        f"{self._connect_timeout_s:g}s (if the server serves plaintext, set "
                                        "tls=false)") from None
        except OSError as exc:
            raise ConnectionFailedError(self.address, "TLS handshake", f"the server hung up during the handshake "
                                        f"({exc}; if it serves plaintext, set tls=false)") from None
        self._tls_obj = obj

    def _write(self, data: bytes) -> None:
        """Send ``data`` (encrypted when TLS): raises OSError. Under the write lock, so that the
        records go out in the order they were made."""
        obj = self._tls_obj
        with self._wlock:
            if obj is None:
                self._sock.sendall(data)
                return
            with self._slock:
                obj.write(data)
                out = self._tls_out.read()
            self._sock.sendall(out)

    def _recv(self) -> bytes:
        """The next bytes of the stream (decrypted when TLS); raises ConnectionResetError at its end."""
        while True:
            chunk = self._sock.recv(_READ_SIZE)
            if not chunk:
                raise ConnectionResetError("connection closed by the peer")
            obj = self._tls_obj
            if obj is None:
                return chunk
            parts = []
            with self._slock:
                self._tls_in.write(chunk)
                try:
                    while True:
                        parts.append(obj.read(_READ_SIZE))
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    raise ConnectionResetError("the server ended the TLS session") from None
                pending = self._tls_out.pending
            if pending:  # the session answered something itself (e.g. a key update)
                self._write(b"")
            data = b"".join(parts)
            if data:
                return data

    def _fault(self, exc: BaseException) -> BaseException:
        """What a read fault means: a TlsError when it is one (see the class docstring)."""
        if isinstance(exc, ssl.SSLError):
            reason = str(exc.reason or exc)
            hint = _CLIENT_CERT_HINT if "CERTIFICATE_REQUIRED" in reason.upper() else ""
            return TlsError(self.address, "request", f"the server ended the TLS session ({reason}){hint}")
        if self._answered or self.closed or not isinstance(exc, OSError):
            return exc  # a frame that does not decode is not a TLS matter (TLS records are caught unread)
        timeout = min(self._connect_timeout_s, 3.0)
        if self.tls is None:
            # a permissive server (Apache RocketMQ's default) speaks both: it requires TLS only
            # when it also hangs up on a plaintext request made now
            if probe_tls(self._host, self._port, timeout) and not probe_plaintext_answered(
                    self._host, self._port, _PROBE_REQUEST, timeout):
                return TlsError(self.address, "request", "the server requires TLS: it hung up on a plaintext request "
                                "and accepts a TLS handshake; set tls=true (CLI: --tls)")
        elif self.tls.cert_file is None and probe_hangs_up_after_handshake(self.tls.context(self.address), self._host,
                                                                          self._port, timeout):
            return TlsError(self.address, "request", "the server ends every TLS session right after the handshake "
                            "without a word: it requires a client certificate (mutual TLS); set tlsCertFile and "
                            "tlsKeyFile")
        return exc

    # -- requests -------------------------------------------------------------------

    def send(self, cmd: RemotingCommand, *, oneway: bool = False) -> Future[RemotingCommand]:
        fut: Future[RemotingCommand] = Future()
        if self.closed:
            fut.set_exception(self._tls_fault or ConnectionFailedError(self.address, f"request code {cmd.code}",
                                                                       "connection closed"))
            return fut
        cmd.opaque = next(self._opaque)
        if not oneway:
            with self._lock:
                self._pending[cmd.opaque] = fut
        if self.signer is not None:
            self.signer(cmd)
        data = cmd.encode()
        try:
            self._write(data)
        except OSError as exc:
            with self._lock:
                self._pending.pop(cmd.opaque, None)
            self._fail_all(exc)
            err = ConnectionFailedError(self.address, f"request code {cmd.code}", exc)
            if not fut.done():
                fut.set_exception(err)
            return fut
        if oneway:
            fut.set_result(cmd)
        return fut

    def send_many(self, cmds: list[RemotingCommand]) -> list[Reply]:
        """Several requests written with one ``sendall`` (a syscall per request costs more than
        encoding it when thousands go out at once); one :class:`Reply` per request, in order."""
        futs = [Reply() for _ in cmds]
        if self.closed:
            for cmd, fut in zip(cmds, futs):
                fut.set_exception(self._tls_fault or ConnectionFailedError(self.address, f"request code {cmd.code}",
                                                                           "connection closed"))
            return futs
        for cmd in cmds:
            cmd.opaque = next(self._opaque)
        with self._lock:
            for cmd, fut in zip(cmds, futs):
                self._pending[cmd.opaque] = fut
        if self.signer is not None:
            for cmd in cmds:
                self.signer(cmd)
        data = b"".join(cmd.encode() for cmd in cmds)
        try:
            self._write(data)
        except OSError as exc:
            with self._lock:
                for cmd in cmds:
                    self._pending.pop(cmd.opaque, None)
            self._fail_all(exc)
            for cmd, fut in zip(cmds, futs):
                if not fut.done():
                    fut.set_exception(ConnectionFailedError(self.address, f"request code {cmd.code}", exc))
        return futs

    def invoke(self, cmd: RemotingCommand, timeout_s: float, operation: str) -> RemotingCommand:
        fut = self.send(cmd)
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            with self._lock:
                self._pending.pop(cmd.opaque, None)
            raise RequestTimeoutError(self.address, operation, f"no response within {timeout_s:g}s") from None
        except ConnectionFailedError as exc:
            raise ConnectionFailedError(self.address, operation, exc.args[0]) from None

    def reply(self, cmd: RemotingCommand) -> None:
        """Send a response or oneway frame (answers to the peer's requests); a request frame
        (e.g. END_TRANSACTION answering CHECK_TRANSACTION_STATE) is signed like any request."""
        if self.signer is not None and not cmd.flag & FLAG_RESPONSE:
            self.signer(cmd)
        try:
            self._write(cmd.encode())
        except OSError as exc:
            self._fail_all(exc)

    def _read_loop(self) -> None:
        # what arrives is read in large pieces and cut into frames here (two recv calls per
        # answer cost more than decoding it when thousands of answers come back at once)
        buf = bytearray()
        try:
            while True:
                buf += self._recv()
                if not self._answered and self.tls is None and buf[:1] in (b"\x15", b"\x16") and buf[1:2] == b"\x03":
                    # a TLS record (an alert or a handshake) where a frame's length should be
                    self._fail_all(TlsError(self.address, "request", "the server answered a plaintext request with a "
                                            "TLS record: it requires TLS; set tls=true (CLI: --tls)"))
                    return
                pos, n = 0, len(buf)
                while n - pos >= 4:
                    length = read_frame_length(bytes(buf[pos:pos + 4]), self._max_frame)
                    if n - pos - 4 < length:
                        break
                    frame = memoryview(buf)[pos + 4:pos + 4 + length]
                    try:
                        cmd = RemotingCommand.decode(frame)
                    finally:
                        frame.release()
                    pos += 4 + length
                    self._received(cmd)
                if pos:
                    del buf[:pos]
        except (OSError, ProtocolError) as exc:
            if not self.closed:
                log.debug("connection to %s lost: %s", self.address, exc)
            self._fail_all(self._fault(exc))

    def _received(self, cmd: RemotingCommand) -> None:
        if cmd.flag & FLAG_RESPONSE:
            self._answered = True
            with self._lock:
                fut = self._pending.pop(cmd.opaque, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
        elif self._on_request is not None:
            try:
                self._on_request(self, cmd)
            except Exception:
                log.exception("handling request code %d from %s failed", cmd.code, self.address)

    def _fail_all(self, exc: BaseException) -> None:
        self.closed = True
        with self._lock:
            pending = list(self._pending.values())
            self._pending.clear()
        if isinstance(exc, TlsError):
            self._tls_fault = exc
        err = exc if isinstance(exc, TlsError) else ConnectionFailedError(self.address, "request", exc)
        for fut in pending:
            if not fut.done():
                fut.set_exception(err)
        try:
            self._sock.close()
        except OSError:
            pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._fail_all(ConnectionResetError("closed by the client"))


#: what the plaintext probe sends (see :meth:`RemotingConnection._fault`): a request every
#: remoting server answers, a name server with its clusters, a broker or proxy with "not supported"
_PROBE_REQUEST = RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO).encode()
_CLIENT_CERT_HINT = ": if it requires a client certificate (mutual TLS), set tlsCertFile and tlsKeyFile"

#: OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH
_NAME_MISMATCH = (62, 64)


def _verify_problem(exc: ssl.SSLCertVerificationError) -> str:
    what = f"certificate verify failed ({exc.verify_message or exc.reason})"
    if exc.verify_code in _NAME_MISMATCH:
        return (f"{what}: the server's certificate does not name the host connected to; connect by a name or "
                "address the certificate lists, or set tlsVerifyHostname=false")
    return f"{what}: set tlsCaFile to the PEM file of the CA that signed the server's certificate"
