"""A fault-injecting TCP proxy: what a client sees of a slow, partitioned or dropped network path.

::

    with FaultProxy(target=("127.0.0.2", port), listen=("127.0.0.1", port)) as proxy:
        ...                      # clients connect to proxy.address, bytes pass through untouched
        proxy.delay(50)          # +50 ms each way (at least: never less)
        proxy.blackhole()        # connections stay open, nothing passes either way
        proxy.heal()             # pass-through again (see heal() for what the blackhole held)
        proxy.reset_all()        # every proxied connection closed with RST
        proxy.refuse()           # new connections refused (the port closed), open ones untouched
        proxy.stats()            # counters

Every control call is applied on the proxy's event loop before it returns, so a test may
assert right after it; any thread may call them. The proxy runs one asyncio loop in a daemon
thread; data moves in chunks of up to 256 KiB as the kernel hands them over (no per-byte
work), with flow control both ways, so it carries what a Spark query pushes through a broker.

What it cannot do, being a proxy and not a network: TCP keepalive probes are answered by the
proxy's own sockets (a blackholed connection never dies of keepalive), and a byte stream
never loses bytes, so :meth:`FaultProxy.drop` models packet loss as TCP shows it to
applications (bytes arriving late, in order) and a connection that lost data is reset.
"""

from __future__ import annotations

import array
import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import random
import socket
import struct
import termios
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Protocol, TypeVar

log = logging.getLogger(__name__)

__all__ = ["Direction", "FaultProxy", "ProxyStats"]

#: ``up``: client -> target; ``down``: target -> client
Direction = Literal["up", "down", "both"]

_T = TypeVar("_T")
#: asyncio's write buffer of one socket before its source is paused (then resumed below _WRITE_LOW)
_WRITE_HIGH = 4 * 1024 * 1024
_WRITE_LOW = 1024 * 1024
#: bytes a delayed direction may hold before its source is paused
_HELD_HIGH = 8 * 1024 * 1024
_HELD_LOW = 2 * 1024 * 1024
_LINGER_RST = struct.pack("ii", 1, 0)


@dataclass(frozen=True)
class ProxyStats:
    """Counters since the proxy started. Bytes are counted as the proxy reads them."""

    #: connections accepted
    accepted: int
    #: proxied connections open now (accepted, not yet closed)
    open: int
    #: accepted connections whose target could not be reached (closed with RST)
    upstream_failures: int
    #: bytes read from clients (towards the target) / from the target (towards clients)
    bytes_up: int
    bytes_down: int
    #: bytes a blackhole held that :meth:`FaultProxy.heal` threw away (queued or still unread)
    bytes_dropped: int
    #: connections the proxy closed with RST (reset_all, a heal that dropped data, upstream failures)
    resets: int


def _rst(transport: asyncio.Transport | None) -> None:
    """Closes ``transport`` so that its peer sees a reset (SO_LINGER 0), not a FIN."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    transport.abort()


class _Fileno(Protocol):
    def fileno(self) -> int: ...


def _unread(sock: _Fileno | None) -> int:
    """Bytes the kernel holds for ``sock`` that nobody has read yet (FIONREAD); 0 once closed."""
    if sock is None or sock.fileno() < 0:
        return 0
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    except OSError:
        return 0
    return buf[0]


class _Side(asyncio.Protocol):
    """One socket of a proxied connection (the client's or the target's)."""

    def __init__(self, pipe: _Pipe, name: str, pauses: set[str]) -> None:
        self.pipe = pipe
        self.name = name
        self.transport: asyncio.Transport | None = None
        #: why reading is paused (backpressure, held, blackhole, connecting): read only when empty
        self._pauses = set(pauses)
        self.out: _Flow | None = None  # where this side's bytes go
        self.peer: _Side | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH, low=_WRITE_LOW)
        if self._pauses:
            transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        assert self.out is not None
        self.out.push(data)

    def eof_received(self) -> bool:
        assert self.out is not None
        self.out.push(None)
        return True  # keep the socket open for what the other direction still sends

    def connection_lost(self, exc: Exception | None) -> None:
        self.pipe.side_lost(self, exc)

    # the peer's write buffer is full: stop reading what would go there
    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause("backpressure")

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume("backpressure")

    def pause(self, reason: str) -> None:
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
        self._pauses.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self._pauses:
            return
        self._pauses.discard(reason)
        if not self._pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()


class _Flow:
    """One direction of a proxied connection: bytes read from ``src`` written to ``dst``,
    through a release queue when a delay or loss applies (order is always kept)."""

    def __init__(self, pipe: _Pipe, src: _Side, dst: _Side, up: bool) -> None:
        self.pipe = pipe
        self.src = src
        self.dst = dst
        self.up = up
        self.queue: deque[tuple[float, bytes | None]] = deque()  # (release time, bytes or None = EOF)
        self.held = 0
        self.last_release = 0.0
        self.timer: asyncio.TimerHandle | None = None
        src.out = self
        src.peer = dst
        dst.peer = src

    def push(self, data: bytes | None) -> None:
        proxy = self.pipe.proxy
        if data is not None:
            proxy.count(self.up, len(data))
        wait = proxy.wait_s(self.up)
        if wait <= 0 and not self.queue:
            self._deliver(data)
            return
        loop = proxy.loop
        at = max(loop.time() + wait, self.last_release)
        self.last_release = at
        self.queue.append((at, data))
        if data is not None:
            self.held += len(data)
            if self.held >= _HELD_HIGH:
                self.src.pause("held")
        if self.timer is None:
            self.timer = loop.call_at(at, self._release)

    def _release(self) -> None:
        self.timer = None
        now = self.pipe.proxy.loop.time()
        while self.queue and self.queue[0][0] <= now:
            _, data = self.queue.popleft()
            if data is not None:
                self.held -= len(data)
            self._deliver(data)
        if self.held < _HELD_LOW:
            self.src.resume("held")
        if self.queue:
            self.timer = self.pipe.proxy.loop.call_at(self.queue[0][0], self._release)

    def _deliver(self, data: bytes | None) -> None:
        t = self.dst.transport
        if t is None or t.is_closing():
            return
        if data is not None:
            t.write(data)
            return
        if t.can_write_eof():
            try:
                t.write_eof()
            except OSError as exc:  # the peer is gone already (ENOTCONN): as if its socket failed
                self.pipe.side_lost(self.dst, exc)
                return
        self.pipe.eof_passed()

    def discard(self) -> int:
        """Throws away what the queue holds; returns how many bytes that was."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        dropped = self.held
        self.queue.clear()
        self.held = 0
        self.src.resume("held")
        return dropped


class _Pipe:
    """One proxied connection: the client's socket, the target's, a flow each way."""

    def __init__(self, proxy: FaultProxy, client_sock: socket.socket, peer: str) -> None:
        self.proxy = proxy
        self.peer = peer
        self.client_sock: socket.socket | None = client_sock
        #: the accepted socket, also once its transport owns it (for FIONREAD)
        self.client_raw = client_sock
        self.target_raw: _Fileno | None = None
        pauses = {"connecting"} | ({"blackhole"} if proxy.blackholed else set())
        self.client = _Side(self, "client", pauses)
        self.target = _Side(self, "target", pauses)
        self.up = _Flow(self, self.client, self.target, up=True)
        self.down = _Flow(self, self.target, self.client, up=False)
        self.closed = False
        #: data of this connection was thrown away: its streams have a hole, it cannot resume
        self.lost_data = False
        self._eofs = 0
        self.task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        proxy = self.proxy
        loop = proxy.loop
        host, port = proxy.target
        try:
            await asyncio.wait_for(loop.create_connection(lambda: self.target, host, port),
                                   proxy.connect_timeout_s)
        except (TimeoutError, OSError) as exc:  # asyncio's timeout is the builtin since 3.11
            log.debug("fault proxy %s: target %s:%s unreachable for client %s: %s", proxy.address, host, port,
                      self.peer, exc)
            proxy.upstream_failed()
            self.reset()
            return
        if self.closed:  # reset while connecting
            _rst(self.target.transport)
            return
        assert self.target.transport is not None
        self.target_raw = self.target.transport.get_extra_info("socket")
        assert self.client_sock is not None
        sock, self.client_sock = self.client_sock, None  # the client's transport owns it from here
        await loop.connect_accepted_socket(lambda: self.client, sock)
        if self.closed:
            self.reset()
            return
        self.client.resume("connecting")
        self.target.resume("connecting")

    def eof_passed(self) -> None:
        self._eofs += 1
        if self._eofs == 2:  # both directions ended cleanly: close, flushing what is buffered
            self.closed = True
            for side in (self.client, self.target):
                if side.transport is not None:
                    side.transport.close()
            self.proxy.forget(self)

    def side_lost(self, side: _Side, exc: Exception | None) -> None:
        if self.closed:
            return
        # one socket failed (reset, broken pipe): the other end learns it the same way
        log.debug("fault proxy %s: %s side of %s lost (%s): resetting the other", self.proxy.address, side.name,
                  self.peer, exc)
        self.closed = True
        self.up.discard()
        self.down.discard()
        other = self.target if side is self.client else self.client
        _rst(other.transport)
        self.proxy.forget(self)

    def blackhole(self) -> None:
        self.client.pause("blackhole")
        self.target.pause("blackhole")
        if self.up.held or self.down.held or self.up.queue or self.down.queue:
            self.proxy.dropped(self.up.discard() + self.down.discard())
            self.lost_data = True

    def heal(self) -> bool:
        """Resumes the connection (at once, or once connected if it is still connecting);
        False, and the connection reset, when the blackhole held data of it."""
        unread = _unread(self.client_raw) + _unread(self.target_raw)
        if unread or self.lost_data:
            self.proxy.dropped(unread)
            self.reset()
            return False
        self.client.resume("blackhole")
        self.target.resume("blackhole")
        return True

    def reset(self) -> None:
        was_closed, self.closed = self.closed, True
        self.up.discard()
        self.down.discard()
        if self.client_sock is not None:  # not handed to a transport yet
            with contextlib.suppress(OSError):
                self.client_sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
            self.client_sock.close()
            self.client_sock = None
        _rst(self.client.transport)
        _rst(self.target.transport)
        if not was_closed:
            self.proxy.forget(self, reset=True)


class FaultProxy:
    """A TCP proxy from ``listen`` to ``target`` with faults switched on and off at will.

    ``target``: ``(host, port)`` the proxy connects to for each client; port 0 means the
    proxy's own listening port (a broker bound to 127.0.0.2:P behind a proxy on 127.0.0.1:P).
    ``listen``: ``(host, port)``, port 0 picks a free one (:attr:`port` tells which).
    ``connect_timeout_s``: how long a connection to the target may take; a client whose
    target is unreachable is reset. ``seed``: the random source of :meth:`drop` and jitter.

    The proxy listens as soon as it is built (OSError naming the address when it cannot)
    and serves until :meth:`stop`. Faults apply to every connection, open or new:
    :meth:`delay` and :meth:`drop` add up; :meth:`blackhole` and :meth:`refuse` hold until
    :meth:`heal`, which also removes the delay and the loss.
    """

    def __init__(self, target: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0), *,
                 connect_timeout_s: float = 5.0, seed: int | None = None, name: str | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._rng = random.Random(seed)
        self._delay_s = {True: 0.0, False: 0.0}  # up?, seconds
        self._jitter_s = {True: 0.0, False: 0.0}
        self._loss = 0.0
        self._rto_s = 0.2
        self.blackholed = False
        self._pipes: set[_Pipe] = set()
        self._counts = {"accepted": 0, "upstream_failures": 0, "bytes_up": 0, "bytes_down": 0, "bytes_dropped": 0,
                        "resets": 0}
        self._listener: socket.socket | None = self._bind(listen, first=True)
        self.listen: tuple[str, int] = (listen[0], self._listener.getsockname()[1])
        self.target: tuple[str, int] = (target[0], target[1] or self.listen[1])
        self._placeholder: socket.socket | None = None
        self.loop = asyncio.new_event_loop()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name or f"fault-proxy-{self.address}", daemon=True)
        self._thread.start()
        self._call(self._accept_on)

    # -- addresses ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self.listen[1]

    @property
    def address(self) -> str:
        """``host:port`` clients connect to (a RocketMQ address)."""
        host, port = self.listen
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def target_address(self) -> str:
        host, port = self.target
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def __repr__(self) -> str:
        return f"FaultProxy({self.address} -> {self.target_address})"

    # -- faults ---------------------------------------------------------------------------

    def delay(self, ms: float, *, direction: Direction = "both", jitter_ms: float = 0.0) -> None:
        """From now on, bytes read in ``direction`` are written ``ms`` (+ up to ``jitter_ms``,
        uniformly) milliseconds later; order is kept, so a byte never overtakes an earlier one
        (jitter then only ever adds). ``delay(0)`` removes it. A round trip through a proxy
        delayed both ways takes at least ``2 * ms``."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError(f"delay(ms={ms}, jitter_ms={jitter_ms}): both must be >= 0")
        ups = _directions(direction)

        def apply() -> None:
            for up in ups:
                self._delay_s[up] = ms / 1000.0
                self._jitter_s[up] = jitter_ms / 1000.0

        self._call(apply)

    def drop(self, probability: float, *, rto_ms: float = 200.0) -> None:
        """Packet loss as a TCP connection shows it to applications: each chunk the proxy
        reads is, with ``probability``, "lost" and delivered ``rto_ms`` later (a
        retransmission), with everything after it on that connection waiting behind it.
        No byte goes missing (TCP would resend it); to lose connections use :meth:`reset_all`.
        ``drop(0)`` ends it."""
        if not 0.0 <= probability <= 1.0 or rto_ms < 0:
            raise ValueError(f"drop(probability={probability}, rto_ms={rto_ms}): probability must be in [0, 1] "
                             "and rto_ms >= 0")

        def apply() -> None:
            self._loss = probability
            self._rto_s = rto_ms / 1000.0

        self._call(apply)

    def blackhole(self) -> None:
        """Every connection, open or new, stays open and passes nothing either way: what a
        peer behind a partition looks like to TCP (writes succeed until the buffers are
        full, reads wait, nothing is closed). New connections are accepted, the target sees
        them opened, and they pass nothing either. Bytes already queued by :meth:`delay` are
        thrown away. Lasts until :meth:`heal`."""
        def apply() -> None:
            self.blackholed = True
            for pipe in list(self._pipes):
                pipe.blackhole()

        self._call(apply)

    def refuse(self) -> None:
        """New connections are refused (the client's connect fails with ECONNREFUSED, as
        when nothing listens), and those waiting to be accepted are reset. Open connections
        carry on: add :meth:`reset_all` for a target that died. The port stays reserved
        (a non-listening SO_REUSEPORT socket holds it) so :meth:`heal` can listen again.
        Lasts until :meth:`heal`."""
        self._call(self._accept_off)

    def reset_all(self) -> int:
        """Closes every proxied connection now with RST to both ends (the client's next read
        or write fails with ECONNRESET); returns how many. New connections are not affected."""
        def apply() -> int:
            pipes = list(self._pipes)
            for pipe in pipes:
                pipe.reset()
            return len(pipes)

        return self._call(apply)

    def heal(self) -> None:
        """Back to plain pass-through: no delay, no loss, new connections accepted, and the
        blackhole lifted. What a blackhole held is dropped, never delivered late: a
        connection that had bytes queued or unread when the blackhole began or while it
        lasted is reset (RST both ways; a TCP stream with a hole in it is not something a
        real network produces), and one that held nothing resumes as it was."""
        def apply() -> None:
            for up in (True, False):
                self._delay_s[up] = 0.0
                self._jitter_s[up] = 0.0
            self._loss = 0.0
            self._accept_on()
            if self.blackholed:
                self.blackholed = False
                for pipe in list(self._pipes):
                    pipe.heal()

        self._call(apply)

    def stats(self) -> ProxyStats:
        """A consistent snapshot of the counters."""
        return self._call(lambda: ProxyStats(open=len(self._pipes), **self._counts))

    # -- life cycle -----------------------------------------------------------------------

    def stop(self) -> None:
        """Stops listening, resets every proxied connection, ends the thread; idempotent.
        No thread or socket of the proxy is left after it returns."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        self.loop.close()
        for sock in (self._listener, self._placeholder):
            if sock is not None:
                sock.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- inside the loop ------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, fn: Callable[[], _T]) -> _T:
        """Runs ``fn`` on the loop and returns its result (at once when already on it)."""
        if self._stopped:
            raise RuntimeError(f"{self!r} is stopped")
        if threading.current_thread() is self._thread:
            return fn()
        fut: concurrent.futures.Future[_T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return fut.result(30)

    def _bind(self, addr: tuple[str, int], *, first: bool = False) -> socket.socket:
        """A listening socket on ``addr``. SO_REUSEPORT lets :meth:`refuse` keep the port with
        a second socket while none listens; the first bind is made without it so that a port
        someone else holds is refused, not shared."""
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if not first:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)
            if first:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"fault proxy cannot listen on {addr[0]}:{addr[1]}: {exc.strerror}") from None
        return sock

    def _accept_on(self) -> None:
        if self._listener is None:
            self._listener = self._bind(self.listen)
        if self._placeholder is not None:
            self._placeholder.close()
            self._placeholder = None
        with contextlib.suppress(ValueError, KeyError):
            self.loop.remove_reader(self._listener.fileno())
        self.loop.add_reader(self._listener.fileno(), self._accept)

    def _accept_off(self) -> None:
        if self._listener is None:
            return
        family = self._listener.family
        holder = socket.socket(family, socket.SOCK_STREAM)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(self.listen)  # not listening: connections to the port are refused
        self._placeholder = holder
        self.loop.remove_reader(self._listener.fileno())
        self._listener.close()
        self._listener = None

    def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        for _ in range(256):  # a burst of connects is served without starving the open ones
            try:
                sock, peer = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("fault proxy %s: accept failed: %s", self.address, exc)
                return
            sock.setblocking(False)
            self._counts["accepted"] += 1
            pipe = _Pipe(self, sock, f"{peer[0]}:{peer[1]}")
            self._pipes.add(pipe)
            pipe.task = self.loop.create_task(pipe.open())

    async def _shutdown(self) -> None:
        if self._listener is not None:
            self.loop.remove_reader(self._listener.fileno())
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.reset()
        tasks = [p.task for p in pipes if p.task is not None and not p.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pipe in pipes:  # a connect cancelled halfway may have left a transport
            pipe.reset()
        for _ in range(3):  # let the aborted transports run their connection_lost (closing the sockets)
            await asyncio.sleep(0)

    # -- called by the connections --------------------------------------------------------

    def wait_s(self, up: bool) -> float:
        """How long bytes read now in this direction wait before they are written."""
        wait = self._delay_s[up]
        jitter = self._jitter_s[up]
        if jitter:
            wait += self._rng.uniform(0.0, jitter)
        if self._loss and self._rng.random() < self._loss:
            wait += self._rto_s
        return wait

    def count(self, up: bool, n: int) -> None:
        self._counts["bytes_up" if up else "bytes_down"] += n

    def dropped(self, n: int) -> None:
        self._counts["bytes_dropped"] += n

    def upstream_failed(self) -> None:
        self._counts["upstream_failures"] += 1

    def forget(self, pipe: _Pipe, *, reset: bool = False) -> None:
        self._pipes.discard(pipe)
        if reset:
            self._counts["resets"] += 1


def _directions(direction: Direction) -> tuple[bool, ...]:
    if direction == "both":
        return (True, False)
    if direction in ("up", "down"):
        return (direction == "up",)
    raise ValueError(f"direction={direction!r}: expected 'up' (client -> target), 'down' or 'both'")
