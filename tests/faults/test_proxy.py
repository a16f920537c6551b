"""The fault proxy with plain sockets: pass-through, delay, blackhole, reset, refusal, loss."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from brokers import wait_until

from .proxy import FaultProxy

pytestmark = pytest.mark.faults


class EchoServer:
    """Echoes every connection on 127.0.0.2 (the proxy's target) from a thread per
    connection; records how each connection ended."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.2", 0))
        self.port = self.sock.getsockname()[1]
        self.ends: list[str] = []  # "eof" | "reset" | other error names
        self.accepted = 0
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _echo(self, conn: socket.socket) -> None:
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        try:
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    self.ends.append("eof")
                    conn.shutdown(socket.SHUT_WR)  # our half closes after the client's
                    return
                conn.sendall(view[:n])
        except ConnectionResetError:
            self.ends.append("reset")
        except OSError as exc:
            self.ends.append(type(exc).__name__)
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()
        for c in self._conns:
            c.close()
        for t in self._threads:
            t.join(5)


@pytest.fixture()
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture()
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(target=("127.0.0.2", echo.port)) as p:
        yield p


def _connect(proxy: FaultProxy, timeout_s: float = 10.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout_s)
    return s


def _recv_exactly(s: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = s.recv(min(1 << 20, n - len(out)))
        if not chunk:
            raise EOFError(f"connection closed after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


def _round_trip(s: socket.socket, data: bytes = b"ping") -> float:
    start = time.monotonic()
    s.sendall(data)
    assert _recv_exactly(s, len(data)) == data
    return time.monotonic() - start


def test_bytes_pass_intact_under_load_while_another_thread_changes_the_delay(proxy: FaultProxy) -> None:
    """Four connections push 16 MiB each both ways at once; every byte comes back in order
    although a control thread keeps switching a small delay on and off."""
    payloads = [os.urandom(16 << 20) for _ in range(4)]
    results: list[bytes | BaseException] = [b""] * len(payloads)

    def one(i: int) -> None:
        try:
            with _connect(proxy, timeout_s=60) as s:
                reader_out = bytearray()

                def read() -> None:
                    reader_out.extend(_recv_exactly(s, len(payloads[i])))

                reader = threading.Thread(target=read)
                reader.start()
                s.sendall(payloads[i])
                reader.join(60)
                results[i] = bytes(reader_out)
        except BaseException as exc:  # reported by the main thread
            results[i] = exc

    stop = threading.Event()

    def toggle() -> None:
        while not stop.is_set():
            proxy.delay(2)
            proxy.delay(0)

    toggler = threading.Thread(target=toggle)
    toggler.start()
    workers = [threading.Thread(target=one, args=(i,)) for i in range(len(payloads))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    stop.set()
    toggler.join(10)
    for i, got in enumerate(results):
        assert not isinstance(got, BaseException), f"connection {i}: {got!r}"
        assert got == payloads[i], f"connection {i}: {len(got)} bytes back, not the {len(payloads[i])} sent"
    total = sum(len(p) for p in payloads)
    stats = proxy.stats()
    assert (stats.accepted, stats.bytes_up, stats.bytes_down, stats.bytes_dropped) == (4, total, total, 0)


def test_delay_adds_at_least_the_delay_in_each_delayed_direction(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        _round_trip(s)  # connection set up, nothing delayed
        proxy.delay(150)
        assert _round_trip(s) >= 0.3  # 150 ms up + 150 ms down
        proxy.delay(0)
        proxy.delay(200, direction="up")
        assert _round_trip(s) >= 0.2
        proxy.delay(0)
        proxy.delay(100, direction="down", jitter_ms=50)
        assert _round_trip(s, b"x" * 100_000) >= 0.1
        proxy.heal()
        _round_trip(s)


def test_blackhole_keeps_connections_open_and_silent_then_heal_resets_those_that_held_data(
        proxy: FaultProxy, echo: EchoServer) -> None:
    talker = _connect(proxy)
    quiet = _connect(proxy)
    _round_trip(talker)
    _round_trip(quiet)
    proxy.blackhole()
    talker.sendall(b"into the void")  # the write succeeds: TCP accepted it
    talker.settimeout(0.5)
    with pytest.raises(TimeoutError):
        talker.recv(100)
    late = _connect(proxy)  # accepted while black-holed, and silent too
    late.sendall(b"hello?")
    late.settimeout(0.5)
    with pytest.raises(TimeoutError):
        late.recv(100)
    late_quiet = _connect(proxy)
    # nobody was told anything: no FIN, no RST on any of them
    assert wait_until(lambda: proxy.stats().open == 4 and echo.accepted == 4, 5)  # the target saw them opened
    assert echo.ends == []

    proxy.heal()
    for s in (talker, late):  # what they sent was dropped, so their streams have a hole: reset
        s.settimeout(5)
        with pytest.raises(ConnectionResetError):
            s.recv(100)
    _round_trip(quiet)  # it held nothing: it carries on
    _round_trip(late_quiet)
    with _connect(proxy) as fresh:
        _round_trip(fresh)
    stats = proxy.stats()
    assert stats.bytes_dropped == len(b"into the void") + len(b"hello?")
    assert stats.resets == 2
    for s in (talker, quiet, late, late_quiet):
        s.close()


def test_reset_all_makes_both_ends_see_a_reset(proxy: FaultProxy, echo: EchoServer) -> None:
    a, b = _connect(proxy), _connect(proxy)
    _round_trip(a)
    _round_trip(b)
    assert proxy.reset_all() == 2
    for s in (a, b):
        with pytest.raises(ConnectionResetError):
            s.recv(10)
        s.close()
    assert wait_until(lambda: echo.ends == ["reset", "reset"], 5), echo.ends
    assert proxy.stats().open == 0
    with _connect(proxy) as c:  # new connections are not affected
        _round_trip(c)


def test_refuse_closes_the_port_but_keeps_it_and_open_connections_go_on(proxy: FaultProxy) -> None:
    with _connect(proxy) as before:
        _round_trip(before)
        proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        _round_trip(before)
        with socket.socket() as squatter, pytest.raises(OSError) as taken:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", proxy.port))
        assert taken.value.errno == errno.EADDRINUSE
        proxy.heal()
        with _connect(proxy) as after:
            _round_trip(after)


def test_drop_delays_lost_chunks_by_the_retransmission_time_and_loses_no_byte(proxy: FaultProxy) -> None:
    with _connect(proxy) as s:
        proxy.drop(1.0, rto_ms=120)
        assert _round_trip(s) >= 0.24  # lost once each way
        proxy.drop(0.3, rto_ms=20)
        data = os.urandom(4 << 20)
        s.sendall(data)
        assert _recv_exactly(s, len(data)) == data
        proxy.heal()
        with pytest.raises(ValueError, match="probability"):
            proxy.drop(1.5)


def test_a_client_whose_target_is_down_is_reset() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        dead = s.getsockname()[1]  # bound, not listening: connections to it are refused
        with FaultProxy(target=("127.0.0.2", dead)) as proxy:
            # the reset may reach the client before its connect() returns (a busy machine: the
            # proxy accepted, was refused and reset it first): then connect() raises it
            with pytest.raises(ConnectionResetError), _connect(proxy) as c:
                c.recv(10)
            assert proxy.stats().upstream_failures == 1  # counted before the client is reset


def test_a_half_close_passes_through(proxy: FaultProxy, echo: EchoServer) -> None:
    with _connect(proxy) as s:
        s.sendall(b"last words")
        s.shutdown(socket.SHUT_WR)
        assert _recv_exactly(s, 10) == b"last words"
        assert s.recv(10) == b""  # the target's FIN after ours
    assert wait_until(lambda: echo.ends == ["eof"], 5)
    assert wait_until(lambda: proxy.stats().open == 0, 5)


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stop_leaves_no_thread_and_no_socket(echo: EchoServer) -> None:
    threads, fds = threading.active_count(), _fds()
    proxy = FaultProxy(target=("127.0.0.2", echo.port))
    clients = [_connect(proxy) for _ in range(3)]
    for c in clients:
        _round_trip(c)
    proxy.delay(1000)
    clients[0].sendall(b"held in the delay queue")
    proxy.stop()
    proxy.stop()  # idempotent
    for c in clients:
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        c.close()
    assert wait_until(lambda: len(echo.ends) == 3, 5)  # the target's ends of the connections saw it
    # each echo thread notes its end before it closes its socket and exits: wait for those too
    # (checked at once, the count failed under load: a CI run with a busy machine)
    assert wait_until(lambda: threading.active_count() == threads and _fds() == fds, 5), \
        f"threads {threading.active_count()} (were {threads}), fds {_fds()} (were {fds})"
    with pytest.raises(RuntimeError, match="stopped"):
        proxy.blackhole()


def test_listening_on_a_taken_port_fails_naming_it(proxy: FaultProxy) -> None:
    with pytest.raises(OSError, match=f"127.0.0.1:{proxy.port}"):
        FaultProxy(target=proxy.target, listen=("127.0.0.1", proxy.port))


def test_an_eof_for_a_peer_already_gone_resets_the_connection_instead_of_failing_the_loop(
        proxy: FaultProxy) -> None:
    # a delayed EOF released in the same loop iteration in which the client's RST arrived (a
    # killed client): shutdown(SHUT_WR) fails with ENOTCONN before asyncio saw the reset
    from .proxy import _Pipe

    class Gone:
        aborted = False

        def is_closing(self) -> bool:
            return False

        def can_write_eof(self) -> bool:
            return True

        def write_eof(self) -> None:
            raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

        def get_extra_info(self, name: str) -> None:
            return None

        def abort(self) -> None:
            self.aborted = True

    a, b = socket.socketpair()
    try:
        def deliver_eof() -> tuple[bool, bool, bool]:
            pipe = _Pipe(proxy, a, "killed-client")
            proxy._pipes.add(pipe)
            gone = Gone()
            pipe.client.transport = gone  # type: ignore[assignment]
            pipe.down._deliver(None)  # the target's EOF, towards the client
            return pipe.closed, pipe in proxy._pipes, gone.aborted

        assert proxy._call(deliver_eof) == (True, False, False)  # closed and forgotten, no exception
    finally:
        a.close()
        b.close()
