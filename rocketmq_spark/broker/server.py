"""Running the name server and broker: in the foreground (CLI) or in a thread (Python API)."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from types import TracebackType
from typing import Any

from ..remoting.frame import DEFAULT_MAX_FRAME
from .broker import Broker, BrokerConfig
from .connection import Connection
from .namesrv import BrokerRegistration, NameServer

log = logging.getLogger(__name__)

__all__ = ["BrokerServer", "EmbeddedBroker"]


class BrokerServer:
    """Name server + broker listening on two TCP ports of one event loop."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        namesrv_port: int = 9876,
        broker_port: int = 10911,
        grpc_port: int | None = 8081,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        self.config = config
        self.namesrv_port = namesrv_port
        self.broker_port = broker_port
        #: None: no gRPC endpoint (grpcio is then not even imported).
        self.grpc_port = grpc_port
        self.max_frame = max_frame
        self._grpc_server: Any = None
        self.namesrv = NameServer(auto_create_topics=config.auto_create_topics)
        self.broker: Broker | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[Connection] = set()

    @property
    def host(self) -> str:
        return self.config.host

    def _fmt(self, port: int) -> str:
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"

    @property
    def namesrv_addr(self) -> str:
        return self._fmt(self.namesrv_port)

    @property
    def broker_addr(self) -> str:
        return self._fmt(self.broker_port)

    @property
    def grpc_endpoint(self) -> str | None:
        """``host:port`` of the gRPC (RocketMQ 5 proxy) endpoint, None when it is off."""
        return None if self.grpc_port is None else self._fmt(self.grpc_port)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        # Bind the broker first: its address goes into every stored record.
        broker_srv = await loop.create_server(lambda: self._connection("broker"), self.host, self.broker_port)
        self.broker_port = broker_srv.sockets[0].getsockname()[1]
        self.broker = Broker(self.config, self.broker_addr)
        ns_srv = await loop.create_server(lambda: self._connection("namesrv"), self.host, self.namesrv_port)
        self.namesrv_port = ns_srv.sockets[0].getsockname()[1]
        self._servers = [broker_srv, ns_srv]
        self.broker.on_topics_changed.append(self._register)
        self._register()
        self.broker.start()
        if self.grpc_port is not None:
            await self._start_grpc()
        log.info("embedded RocketMQ: name server %s, broker %s (%s), gRPC %s, data %s",
                 self.namesrv_addr, self.broker_addr, self.config.broker_name, self.grpc_endpoint or "off",
                 self.config.data_dir)

    async def _start_grpc(self) -> None:
        from .grpc_service import start_grpc_server

        assert self.broker is not None and self.grpc_port is not None
        self._grpc_server, self.grpc_port = await start_grpc_server(self.broker, self.host, self.grpc_port,
                                                                    self.max_frame)

    def _register(self) -> None:
        assert self.broker is not None
        self.namesrv.register(BrokerRegistration(
            self.config.broker_name, self.broker_addr, self.config.cluster,
            self.broker.topic_table(), create_topic=self.broker.create_topic,
        ))

    def _connection(self, role: str) -> Connection:
        def on_close(conn: Connection) -> None:
            self._conns.discard(conn)
            if role == "broker" and self.broker is not None:
                self.broker.on_close(conn)

        def dispatch(conn: Connection, req: Any) -> Any:
            if role == "broker":
                assert self.broker is not None
                return self.broker.dispatch(conn, req)
            return self.namesrv.dispatch(conn, req)

        conn = Connection(dispatch, on_close, max_frame=self.max_frame, name=role)
        self._conns.add(conn)
        return conn

    async def stop(self) -> None:
        if self._grpc_server is not None:
            await self._grpc_server.stop(0)
            self._grpc_server = None
        for srv in self._servers:
            srv.close()
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.close()
        for srv in self._servers:
            await srv.wait_closed()
        if self.broker is not None:
            await self.broker.stop()
        log.info("embedded RocketMQ at %s stopped", self.broker_addr)


class EmbeddedBroker:
    """A name server and broker running in a background thread of this process.

    ::

        with EmbeddedBroker() as mq:            # temp data dir, ephemeral ports
            addr = mq.namesrv_addr              # "127.0.0.1:<port>"

    ``data_dir=None`` uses a temporary directory removed on exit; give a path to keep
    the data across restarts. Ports default to 0 (ephemeral); ``grpc_port=None`` turns
    the gRPC endpoint (``.grpc_endpoint``) off. Keyword arguments not
    listed are :class:`BrokerConfig` fields (``flush="sync"``, ``broker_name`` ...).
    """

    def __init__(
        self,
        data_dir: str | None = None,
        *,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        broker_port: int = 0,
        grpc_port: int | None = 0,
        max_frame: int = DEFAULT_MAX_FRAME,
        start_timeout_s: float = 30.0,
        **config: Any,
    ) -> None:
        self._tmp = None if data_dir is not None else tempfile.mkdtemp(prefix="rocketmq-embedded-")
        self.data_dir = data_dir if data_dir is not None else self._tmp
        assert self.data_dir is not None
        self.config = BrokerConfig(data_dir=self.data_dir, host=host, **config)
        self._server = BrokerServer(self.config, namesrv_port=namesrv_port, broker_port=broker_port,
                                    grpc_port=grpc_port, max_frame=max_frame)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._start_timeout_s = start_timeout_s

    @property
    def namesrv_addr(self) -> str:
        return self._server.namesrv_addr

    @property
    def broker_addr(self) -> str:
        return self._server.broker_addr

    @property
    def grpc_endpoint(self) -> str | None:
        """``host:port`` of the gRPC endpoint (option ``endpoints``), None when it is off."""
        return self._server.grpc_endpoint

    @property
    def broker_name(self) -> str:
        return self.config.broker_name

    @property
    def broker(self) -> Broker:
        assert self._server.broker is not None, "the broker is not started"
        return self._server.broker

    def start(self) -> EmbeddedBroker:
        if self._thread is not None:
            return self
        self._ready.clear()
        self._thread = threading.Thread(target=self._run, name="rocketmq-embedded", daemon=True)
        self._thread.start()
        if not self._ready.wait(self._start_timeout_s):
            raise RuntimeError(f"embedded broker did not start within {self._start_timeout_s}s")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._server.start())
        except BaseException as exc:  # report start failures (port in use ...) to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._server.stop())
            loop.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (tests, tools)."""
        assert self._loop is not None
        fut: Any = asyncio.run_coroutine_threadsafe(self._acall(fn, *args), self._loop)
        return fut.result(30)

    @staticmethod
    async def _acall(fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def flush(self) -> None:
        """Make everything stored so far durable (fsync) before returning."""
        self.call(lambda: self.broker.flusher.flush_once() if self.broker.flusher else None)

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._thread = None
        self._loop = None

    def restart(self) -> EmbeddedBroker:
        """Stop and start again on the same data dir and ports."""
        self.stop()
        self._server = BrokerServer(self.config, namesrv_port=self._server.namesrv_port,
                                    broker_port=self._server.broker_port, grpc_port=self._server.grpc_port,
                                    max_frame=self._server.max_frame)
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def with_config(self, **changes: Any) -> EmbeddedBroker:
        """A new (unstarted) broker on the same data dir with changed settings."""
        return EmbeddedBroker(self.data_dir, **{**_config_kwargs(self.config), **changes})

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _config_kwargs(cfg: BrokerConfig) -> dict[str, Any]:
    from dataclasses import asdict

    out = asdict(cfg)
    out.pop("data_dir")
    return out

