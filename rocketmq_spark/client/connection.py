"""One client-side TCP connection multiplexing requests by opaque id."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future

from ..errors import ConnectionFailedError, ProtocolError, RequestTimeoutError
from ..remoting.frame import (
    DEFAULT_MAX_FRAME,
    FLAG_RESPONSE,
    RemotingCommand,
    read_frame_length,
)

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
    """

    def __init__(
        self,
        address: str,
        *,
        connect_timeout_s: float = 3.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        on_request: Callable[[RemotingConnection, RemotingCommand], None] | None = None,
        signer: Callable[[RemotingCommand], None] | None = None,
    ) -> None:
        self.address = address
        self.signer = signer
        self._max_frame = max_frame
        self._on_request = on_request
        self._pending: dict[int, Future[RemotingCommand] | Reply] = {}
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self._opaque = itertools.count(1)
        self.closed = False
        host, port = _split(address)
        try:
            self._sock = socket.create_connection((host, port), timeout=connect_timeout_s)
        except OSError as exc:
            raise ConnectionFailedError(address, "connect", exc) from None
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = threading.Thread(target=self._read_loop, name=f"rocketmq-conn-{address}", daemon=True)
        self._reader.start()

    def send(self, cmd: RemotingCommand, *, oneway: bool = False) -> Future[RemotingCommand]:
        fut: Future[RemotingCommand] = Future()
        if self.closed:
            fut.set_exception(ConnectionFailedError(self.address, f"request code {cmd.code}", "connection closed"))
            return fut
        cmd.opaque = next(self._opaque)
        if not oneway:
            with self._lock:
                self._pending[cmd.opaque] = fut
        if self.signer is not None:
            self.signer(cmd)
        data = cmd.encode()
        try:
            with self._wlock:
                self._sock.sendall(data)
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
                fut.set_exception(ConnectionFailedError(self.address, f"request code {cmd.code}", "connection closed"))
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
            with self._wlock:
                self._sock.sendall(data)
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
            with self._wlock:
                self._sock.sendall(cmd.encode())
        except OSError as exc:
            self._fail_all(exc)

    def _read_loop(self) -> None:
        # what arrives is read in large pieces and cut into frames here (two recv calls per
        # answer cost more than decoding it when thousands of answers come back at once)
        buf = bytearray()
        try:
            while True:
                chunk = self._sock.recv(_READ_SIZE)
                if not chunk:
                    raise ConnectionResetError("connection closed by the peer")
                buf += chunk
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
            self._fail_all(exc)

    def _received(self, cmd: RemotingCommand) -> None:
        if cmd.flag & FLAG_RESPONSE:
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
        for fut in pending:
            if not fut.done():
                fut.set_exception(ConnectionFailedError(self.address, "request", exc))
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
