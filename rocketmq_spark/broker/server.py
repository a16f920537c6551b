"""Running name servers and brokers: in the foreground (CLI) or in a thread (Python API).

- :class:`NamesrvServer`: a name server on its own port.
- :class:`BrokerServer`: one broker (remoting port, optional gRPC endpoint) registered with
  a name server: its own (``namesrv_port``), an in-process one (``namesrv``), or remote
  ones (``namesrv_addrs``: REGISTER_BROKER, repeated every ``register_interval_ms`` as its
  heartbeat; UNREGISTER_BROKER when it stops cleanly).
- :class:`EmbeddedCluster`: a name server and N brokers on one event loop in a thread.
- :class:`EmbeddedBroker`: the one-broker case.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import ssl
import tempfile
import threading
import zlib
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import DEFAULT_MAX_FRAME, RemotingCommand
from ..tls import ServerTls
from .broker import Broker
from .config import BrokerConfig
from .connection import Connection, ManyHandler
from .namesrv import BrokerRegistration, NameServer
from .outbound import request
from .remoting_service import RemotingService

log = logging.getLogger(__name__)

__all__ = ["BrokerServer", "EmbeddedBroker", "EmbeddedCluster", "NamesrvServer"]


def _fmt(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _Listeners:
    """TCP listeners whose connections dispatch remoting requests (over TLS only, when ``tls``);
    closes them all."""

    def __init__(self, max_frame: int, tls: ServerTls | None = None) -> None:
        self.max_frame = max_frame
        self.tls = tls
        self._ssl: ssl.SSLContext | None = tls.server_context() if tls is not None else None
        self._servers: list[asyncio.base_events.Server] = []
        self._conns: set[Connection] = set()

    async def _listen(self, host: str, port: int, name: str, dispatch: Callable[[Connection, Any], Any],
                      on_close: Callable[[Connection], None] | None = None,
                      dispatch_many: ManyHandler | None = None) -> int:
        def make() -> Connection:
            def closed(conn: Connection) -> None:
                self._conns.discard(conn)
                if on_close is not None:
                    on_close(conn)

            conn = Connection(dispatch, closed, max_frame=self.max_frame, name=name, dispatch_many=dispatch_many)
            self._conns.add(conn)
            return conn

        # a client that does not start a TLS handshake fails it at its first bytes and is hung up on
        srv = await asyncio.get_running_loop().create_server(make, host, port, ssl=self._ssl,
                                                             ssl_handshake_timeout=10.0 if self._ssl else None)
        self._servers.append(srv)
        return int(srv.sockets[0].getsockname()[1])

    async def _close_listeners(self) -> None:
        for srv in self._servers:
            srv.close()
        for conn in list(self._conns):
            if conn.transport is not None:
                conn.transport.close()
        for srv in self._servers:
            await srv.wait_closed()
        self._servers = []


class NamesrvServer(_Listeners):
    """A name server listening on ``host:port`` (0: ephemeral), TLS only with ``tls``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 9876, *, auto_create_topics: bool = True,
                 broker_timeout_s: float = 120.0, max_frame: int = DEFAULT_MAX_FRAME,
                 tls: ServerTls | None = None) -> None:
        super().__init__(max_frame, tls)
        self.host = host
        self.port = port
        self.namesrv = NameServer(auto_create_topics=auto_create_topics, broker_timeout_s=broker_timeout_s)
        if tls is not None:
            self.namesrv.outbound_tls = tls.outbound().context(f"{host}:{port}")

    @property
    def addr(self) -> str:
        return _fmt(self.host, self.port)

    async def start(self) -> None:
        self.port = await self._listen(self.host, self.port, "namesrv", self.namesrv.dispatch)

    async def stop(self) -> None:
        await self._close_listeners()


class BrokerServer(_Listeners):
    """One broker on ``broker_port`` (+ gRPC on ``grpc_port`` unless None), registered with a
    name server: its own on ``namesrv_port`` (the default), ``namesrv`` (in-process), or
    the remote ``namesrv_addrs``."""

    def __init__(
        self,
        config: BrokerConfig,
        *,
        namesrv_port: int | None = 9876,
        broker_port: int = 10911,
        grpc_port: int | None = 8081,
        max_frame: int = DEFAULT_MAX_FRAME,
        namesrv: NameServer | None = None,
        namesrv_addrs: Sequence[str] = (),
    ) -> None:
        super().__init__(max_frame, config.tls)
        self.config = config
        self.broker_port = broker_port
        #: the client context of its requests to remote name servers (TLS when ``config.tls``)
        self._outbound_tls = config.tls.outbound().context(self.namesrv_addr_hint(namesrv_addrs)) \
            if config.tls is not None else None
        #: None: no gRPC endpoint (grpcio is then not even imported).
        self.grpc_port = grpc_port
        self.namesrv_addrs = list(namesrv_addrs)
        self.own_namesrv: NamesrvServer | None = None
        if namesrv is None and not self.namesrv_addrs and namesrv_port is not None:
            self.own_namesrv = NamesrvServer(config.host, namesrv_port, auto_create_topics=config.auto_create_topics,
                                             max_frame=max_frame, tls=config.tls)
            namesrv = self.own_namesrv.namesrv
        self.namesrv = namesrv
        self.broker: Broker | None = None
        #: the remoting request handlers over the broker
        self.remoting: RemotingService | None = None
        self._grpc_server: Any = None
        self._heartbeat: asyncio.Task[None] | None = None

    @staticmethod
    def namesrv_addr_hint(addrs: Sequence[str]) -> str:
        return ";".join(addrs) or "name server"

    @property
    def host(self) -> str:
        return self.config.host

    @property
    def namesrv_port(self) -> int | None:
        return self.own_namesrv.port if self.own_namesrv is not None else None

    @property
    def namesrv_addr(self) -> str:
        """The name server(s) this broker registers with (``host:port;host:port``)."""
        if self.own_namesrv is not None:
            return self.own_namesrv.addr
        return ";".join(self.namesrv_addrs)

    @property
    def broker_addr(self) -> str:
        """The address the broker gives out (registered with name servers): its advertised
        host (``config.advertise_host``, else the bind host) and its port."""
        return _fmt(self.config.advertised_host, self.broker_port)

    @property
    def bind_addr(self) -> str:
        """Where the broker's remoting port listens (``config.host``)."""
        return _fmt(self.host, self.broker_port)

    @property
    def grpc_endpoint(self) -> str | None:
        """Advertised ``host:port`` of the gRPC (RocketMQ 5 proxy) endpoint, None when it is off."""
        return None if self.grpc_port is None else _fmt(self.config.advertised_host, self.grpc_port)

    async def start(self) -> None:
        # Bind the broker first: its address goes into every stored record.
        self.broker_port = await self._listen(self.host, self.broker_port, "broker", self._dispatch, self._closed,
                                              self._dispatch_many)
        self.broker = Broker(self.config, self.broker_addr)
        self.remoting = RemotingService(self.broker)
        if self.own_namesrv is not None:
            await self.own_namesrv.start()
        self.broker.on_topics_changed.append(self._topics_changed)
        self.broker.start()
        await self.register()
        self._heartbeat = asyncio.ensure_future(self._register_every())
        if self.grpc_port is not None:
            from .grpc_service import start_grpc_server

            self._grpc_server, self.grpc_port = await start_grpc_server(
                self.broker, self.host, self.grpc_port, self.max_frame, advertise_host=self.config.advertised_host,
                tls=self.config.tls)
        log.info("embedded RocketMQ broker %s on %s (gRPC %s), name server %s, data %s", self.config.broker_name,
                 self.broker_addr if self.config.advertise_host is None else f"{self.broker_addr} (bound to "
                 f"{self.bind_addr})", self.grpc_endpoint or "off", self.namesrv_addr or "?", self.config.data_dir)

    def _dispatch(self, conn: Connection, req: Any) -> Any:
        assert self.remoting is not None
        return self.remoting.dispatch(conn, req)

    def _dispatch_many(self, conn: Connection, reqs: list[Any]) -> list[Any]:
        assert self.remoting is not None
        return self.remoting.dispatch_many(conn, reqs)

    def _closed(self, conn: Connection) -> None:
        if self.broker is not None:
            self.broker.on_close(conn)

    # -- registration with name servers ---------------------------------------------

    def _registration(self) -> BrokerRegistration:
        assert self.broker is not None
        return BrokerRegistration(self.config.broker_name, self.broker_addr, self.config.cluster,
                                  self.broker.topic_table(), create_topic=self.broker.create_topic)

    def _topics_changed(self) -> None:
        if self.namesrv is not None:
            self.namesrv.register(self._registration())
        else:
            asyncio.ensure_future(self.register())

    async def register(self) -> None:
        """Register with every name server now (in-process: a call; remote: REGISTER_BROKER)."""
        if self.namesrv is not None:
            self.namesrv.register(self._registration())
            return
        reg = self._registration()
        table = {t: {"topicName": t, "readQueueNums": r, "writeQueueNums": w, "perm": p}
                 for t, (r, w, p) in reg.topics.items()}
        body = json.dumps({"topicConfigSerializeWrapper": {"topicConfigTable": table},
                           "filterServerList": []}).encode()
        for addr in self.namesrv_addrs:
            cmd = RemotingCommand(RequestCode.REGISTER_BROKER, opaque=1, ext_fields={
                "brokerName": reg.broker_name, "brokerAddr": reg.broker_addr, "clusterName": reg.cluster,
                "brokerId": "0", "haServerAddr": "", "compressed": "false",
                "bodyCrc32": str(zlib.crc32(body) & 0x7FFFFFFF)}, body=body)
            try:
                resp = await request(addr, cmd, tls=self._outbound_tls)
            except (OSError, TimeoutError) as exc:
                log.warning("register broker %s with name server %s failed: %s", reg.broker_name, addr, exc)
                continue
            if resp.code != ResponseCode.SUCCESS:
                log.warning("name server %s refused to register broker %s: %s", addr, reg.broker_name, resp.remark)

    async def _register_every(self) -> None:
        while True:
            await asyncio.sleep(self.config.register_interval_ms / 1000.0)
            try:
                await self.register()
            except Exception:
                log.exception("registering broker %s failed", self.config.broker_name)

    async def _unregister(self) -> None:
        name = self.config.broker_name
        if self.namesrv is not None:
            self.namesrv.unregister(name)
            return
        for addr in self.namesrv_addrs:
            cmd = RemotingCommand(RequestCode.UNREGISTER_BROKER, opaque=1, ext_fields={
                "brokerName": name, "brokerAddr": self.broker_addr, "clusterName": self.config.cluster,
                "brokerId": "0"})
            try:
                await request(addr, cmd, timeout_s=1.0, tls=self._outbound_tls)
            except (OSError, TimeoutError) as exc:
                log.info("unregister broker %s from name server %s failed: %s", name, addr, exc)

    async def stop(self, *, unregister: bool = True) -> None:
        """Stop serving. ``unregister=False`` leaves the name servers to notice the silence
        (what a crash looks like to them)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if unregister and self.broker is not None:
            await self._unregister()
        if self._grpc_server is not None:
            await self._grpc_server.stop(0)
            self._grpc_server = None
        await self._close_listeners()
        if self.own_namesrv is not None:
            await self.own_namesrv.stop()
        if self.broker is not None:
            await self.broker.stop()
        log.info("embedded RocketMQ broker %s at %s stopped", self.config.broker_name, self.broker_addr)


class _LoopThread:
    """Servers on an asyncio loop in a daemon thread; ``call()`` runs code on that loop."""

    def __init__(self, start_timeout_s: float) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._start_timeout_s = start_timeout_s

    async def _start_servers(self) -> None:
        raise NotImplementedError

    async def _stop_servers(self) -> None:
        raise NotImplementedError

    def _start_thread(self, name: str) -> None:
        if self._thread is not None:
            return
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        if not self._ready.wait(self._start_timeout_s):
            raise RuntimeError(f"{name} did not start within {self._start_timeout_s}s")
        if self._error is not None:
            self._thread.join()
            self._thread = None
            raise self._error

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start_servers())
        except BaseException as exc:  # report start failures (port in use ...) to the starter
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._stop_servers())
            loop.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the servers' loop and return its result (tests, tools)."""
        assert self._loop is not None, "not started"
        fut: Any = asyncio.run_coroutine_threadsafe(self._acall(fn, *args), self._loop)
        return fut.result(30)

    @staticmethod
    async def _acall(fn: Any, *args: Any) -> Any:
        result = fn(*args)
        if asyncio.iscoroutine(result):
            result = await result
        return result

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._thread = None
        self._loop = None


class EmbeddedBroker(_LoopThread):
    """A name server and broker running in a background thread of this process.

    ::

        with EmbeddedBroker() as mq:            # temp data dir, ephemeral ports
            addr = mq.namesrv_addr              # "127.0.0.1:<port>"

    ``data_dir=None`` uses a temporary directory removed on exit; give a path to keep
    the data across restarts. Ports default to 0 (ephemeral); ``grpc_port=None`` turns
    the gRPC endpoint (``.grpc_endpoint``) off. Keyword arguments not listed are
    :class:`BrokerConfig` fields (``flush="sync"``, ``broker_name`` ...).
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
        super().__init__(start_timeout_s)
        self._tmp = None if data_dir is not None else tempfile.mkdtemp(prefix="rocketmq-embedded-")
        self.data_dir = data_dir if data_dir is not None else self._tmp
        assert self.data_dir is not None
        self.config = BrokerConfig(data_dir=self.data_dir, host=host, **config)
        self._server = BrokerServer(self.config, namesrv_port=namesrv_port, broker_port=broker_port,
                                    grpc_port=grpc_port, max_frame=max_frame)

    async def _start_servers(self) -> None:
        await self._server.start()

    async def _stop_servers(self) -> None:
        await self._server.stop()

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
        self._start_thread("rocketmq-embedded")
        return self

    def flush(self) -> None:
        """Make everything stored so far durable (fsync) before returning."""
        self.call(lambda: self.broker.flusher.flush_once() if self.broker.flusher else None)

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


def broker_names(n: int) -> list[str]:
    """``broker-a``, ``broker-b``, ... (then ``broker-27``, ... past z)."""
    return [f"broker-{chr(ord('a') + i)}" if i < 26 else f"broker-{i + 1}" for i in range(n)]


class EmbeddedCluster(_LoopThread):
    """A name server and ``brokers`` brokers (``broker-a``, ``broker-b``, ...) in a background
    thread: topics spread their queues over every broker, as on a real cluster.

    ::

        with EmbeddedCluster(brokers=2) as cluster:
            cluster.namesrv_addr                 # the name server
            cluster.broker_addrs                 # {"broker-a": "127.0.0.1:<port>", ...}
            cluster.stop_broker("broker-b", unregister=False)   # a crash, as routes see it
            cluster.start_broker("broker-b")     # back on the same port and data

    Each broker keeps its store under ``<data_dir>/<broker name>``. ``broker_timeout_s``:
    how long the name server keeps a silent broker in routes (Java: 120 s); brokers
    re-register every ``register_interval_ms``. Other keyword arguments are
    :class:`BrokerConfig` fields, the same for every broker.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        *,
        brokers: int = 2,
        host: str = "127.0.0.1",
        namesrv_port: int = 0,
        grpc: bool = True,
        broker_timeout_s: float = 120.0,
        max_frame: int = DEFAULT_MAX_FRAME,
        start_timeout_s: float = 30.0,
        **config: Any,
    ) -> None:
        super().__init__(start_timeout_s)
        if brokers < 1:
            raise ValueError(f"brokers={brokers}: at least one broker is needed")
        self._tmp = None if data_dir is not None else tempfile.mkdtemp(prefix="rocketmq-cluster-")
        self.data_dir = data_dir if data_dir is not None else self._tmp
        assert self.data_dir is not None
        self.host = host
        self.max_frame = max_frame
        self._grpc = grpc
        self.names = broker_names(brokers)
        self.configs = {name: BrokerConfig(data_dir=f"{self.data_dir}/{name}", host=host, broker_name=name, **config)
                        for name in self.names}
        self._namesrv = NamesrvServer(host, namesrv_port, auto_create_topics=config.get("auto_create_topics", True),
                                      broker_timeout_s=broker_timeout_s, max_frame=max_frame,
                                      tls=config.get("tls"))
        self._ports: dict[str, tuple[int, int | None]] = {n: (0, 0 if grpc else None) for n in self.names}
        self._servers: dict[str, BrokerServer] = {}

    def _server_for(self, name: str) -> BrokerServer:
        port, grpc_port = self._ports[name]
        return BrokerServer(self.configs[name], broker_port=port, grpc_port=grpc_port, max_frame=self.max_frame,
                            namesrv=self._namesrv.namesrv)

    async def _start_servers(self) -> None:
        await self._namesrv.start()
        for name in self.names:
            await self._start_one(name)

    async def _start_one(self, name: str) -> None:
        server = self._server_for(name)
        await server.start()
        self._servers[name] = server
        self._ports[name] = (server.broker_port, server.grpc_port)

    async def _stop_servers(self) -> None:
        for server in list(self._servers.values()):
            await server.stop()
        self._servers.clear()
        await self._namesrv.stop()

    def start(self) -> EmbeddedCluster:
        self._start_thread("rocketmq-cluster")
        return self

    @property
    def namesrv_addr(self) -> str:
        return self._namesrv.addr

    @property
    def broker_addrs(self) -> dict[str, str]:
        """Broker name -> address, for every broker (running or not)."""
        return {n: _fmt(self.configs[n].advertised_host, self._ports[n][0]) for n in self.names}

    @property
    def grpc_endpoints(self) -> dict[str, str]:
        return {n: _fmt(self.configs[n].advertised_host, p) for n, (_, p) in self._ports.items() if p is not None}

    def broker(self, name: str) -> Broker:
        server = self._servers.get(name)
        if server is None or server.broker is None:
            raise KeyError(f"broker {name!r} is not running (brokers: {self.names})")
        return server.broker

    @property
    def running(self) -> list[str]:
        return sorted(self._servers)

    def stop_broker(self, name: str, *, unregister: bool = True) -> None:
        """Stop one broker; with ``unregister=False`` the name server learns of it only when
        its heartbeats stop for ``broker_timeout_s`` (what a crash looks like)."""
        async def stop() -> None:
            server = self._servers.pop(name)
            await server.stop(unregister=unregister)

        self.call(stop)

    def start_broker(self, name: str) -> None:
        """Start a stopped broker again on the same port and data."""
        if name in self._servers:
            return
        self.call(self._start_one, name)

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _config_kwargs(cfg: BrokerConfig) -> dict[str, Any]:
    from dataclasses import fields

    # shallow: asdict would turn a ServerTls into a dict
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "data_dir"}
