"""A TLS handshake cut short by the server (a broker restarting or paused does that too) is a
connection fault, retried with bounds like any lost connection; only what asking again cannot
cure (a certificate that fails verification, a server answering in plaintext) is a TlsError."""

from __future__ import annotations

import socket
import threading

import pytest

from rocketmq_spark.client.connection import RemotingConnection
from rocketmq_spark.errors import ConnectionFailedError, TlsError
from rocketmq_spark.tls import TlsConfig


def _server(behave) -> tuple[socket.socket, threading.Thread]:  # noqa: ANN001
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run() -> None:
        conn, _ = srv.accept()
        try:
            behave(conn)
        finally:
            conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t


def _connect(srv: socket.socket, timeout_s: float = 2.0) -> RemotingConnection:
    host, port = srv.getsockname()
    return RemotingConnection(f"{host}:{port}", connect_timeout_s=timeout_s, tls=TlsConfig())


def test_a_server_hanging_up_during_the_handshake_is_a_retriable_connection_fault() -> None:
    srv, t = _server(lambda conn: conn.recv(1024))  # reads the ClientHello, then hangs up
    try:
        with pytest.raises(ConnectionFailedError, match="TLS handshake.*hung up.*set tls=false") as info:
            _connect(srv)
        assert not isinstance(info.value, TlsError) and info.value.retriable
    finally:
        t.join(5)
        srv.close()


def test_a_server_silent_during_the_handshake_is_a_retriable_connection_fault() -> None:
    done = threading.Event()
    srv, t = _server(lambda conn: done.wait(5))  # a paused broker: no answer at all
    try:
        with pytest.raises(ConnectionFailedError, match="no TLS answer within 0.5s") as info:
            _connect(srv, timeout_s=0.5)
        assert not isinstance(info.value, TlsError) and info.value.retriable
    finally:
        done.set()
        t.join(5)
        srv.close()


def test_a_server_answering_in_plaintext_is_a_tls_error_at_once() -> None:
    srv, t = _server(lambda conn: (conn.recv(1024), conn.sendall(b"\x00\x00\x00\x10" + b"x" * 16)))
    try:
        with pytest.raises(TlsError, match="does not speak TLS") as info:
            _connect(srv)
        assert not info.value.retriable
    finally:
        t.join(5)
        srv.close()


def _tls_or_plain_server(pki, answer_plaintext: bool):  # noqa: ANN001, ANN202
    """A server that hangs up on the first (plaintext) connection before answering, then per
    connection speaks TLS when the client opens with a handshake and plaintext otherwise,
    answering a plaintext request only when ``answer_plaintext`` (Apache RocketMQ's default
    ``tls.server.mode=permissive`` does; ``enforcing`` hangs up)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    seen: list[str] = []

    def run() -> None:
        for i in range(3):
            conn, _ = srv.accept()
            try:
                first = conn.recv(1, socket.MSG_PEEK)
                if i == 0:
                    seen.append("hung up")  # a fault of the moment (a proxy's reset, a restart)
                elif first == b"\x16":
                    with ctx.wrap_socket(conn, server_side=True) as tls:
                        seen.append("tls")
                        tls.recv(1)
                else:
                    conn.recv(4096)
                    seen.append("plaintext")
                    if answer_plaintext:
                        conn.sendall(b"\x00\x00\x00\x10" + b"x" * 16)
            except OSError:
                pass
            finally:
                conn.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return srv, t, seen


@pytest.mark.parametrize("permissive", [True, False])
def test_a_hang_up_on_plaintext_is_tls_required_only_if_plaintext_is_refused_again(tmp_path, permissive) -> None:
    from rocketmq_spark.remoting.codes import RequestCode
    from rocketmq_spark.remoting.frame import RemotingCommand
    from tls_support import make_pki

    srv, t, seen = _tls_or_plain_server(make_pki(tmp_path), answer_plaintext=permissive)
    host, port = srv.getsockname()
    conn = RemotingConnection(f"{host}:{port}", connect_timeout_s=2.0)
    try:
        with pytest.raises((ConnectionFailedError, TlsError)) as info:
            conn.invoke(RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": "t"}), 2.0, "route")
        if permissive:  # it speaks both: the hang-up was a fault, retried like any lost connection
            assert not isinstance(info.value, TlsError) and info.value.retriable, info.value
        else:
            assert isinstance(info.value, TlsError) and "requires TLS" in str(info.value)
        t.join(10)
        assert seen == ["hung up", "tls", "plaintext"]
    finally:
        conn.close()
        srv.close()
