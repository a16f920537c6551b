"""One client-side TCP connection multiplexing requests by opaque id."""

from __future__ import annotations

import itertools
import logging
import socket
import struct
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

__all__ = ["RemotingConnection"]

_U32 = struct.Struct(">I")


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
        self._pending: dict[int, Future[RemotingCommand]] = {}
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

    def send_many(self, cmds: list[RemotingCommand]) -> list[Future[RemotingCommand]]:
        """Several requests written with one ``sendall`` (a syscall per request costs more than
        encoding it when thousands go out at once); one future per request, in order."""
        futs: list[Future[RemotingCommand]] = [Future() for _ in cmds]
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

    def _read_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            r = self._sock.recv_into(view[got:], n - got)
            if r == 0:
                raise ConnectionResetError("connection closed by the peer")
            got += r
        return bytes(buf)

    def _read_loop(self) -> None:
        try:
            while True:
                length = read_frame_length(self._read_exact(4), self._max_frame)
                frame = self._read_exact(length)
                cmd = RemotingCommand.decode(frame)
                if cmd.is_response:
                    with self._lock:
                        fut = self._pending.pop(cmd.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(cmd)
                elif self._on_request is not None:
                    try:
                        self._on_request(self, cmd)
                    except Exception:
                        log.exception("handling request code %d from %s failed", cmd.code, self.address)
        except (OSError, ProtocolError) as exc:
            if not self.closed:
                log.debug("connection to %s lost: %s", self.address, exc)
            self._fail_all(exc)

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
