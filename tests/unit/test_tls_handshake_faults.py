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
