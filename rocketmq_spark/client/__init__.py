"""Protocol clients: remoting (TCP, :class:`RemotingClient`) and gRPC (:class:`GrpcClient`,
imported on first use), both implementing :class:`BrokerClient` (see :mod:`.contract`).
Never imports pyspark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..tls import TlsConfig
from .connection import RemotingConnection
from .contract import BrokerClient, CheckHandler
from .remoting import ClientConfig, Credentials, RemotingClient, parse_namesrv_addr

if TYPE_CHECKING:
    from .grpc_client import GrpcClient

__all__ = ["BrokerClient", "CheckHandler", "ClientConfig", "Credentials", "GrpcClient", "RemotingClient",
           "RemotingConnection", "connect", "parse_namesrv_addr"]

def connect(namesrv_addr: Sequence[str] | str = (), endpoints: Sequence[str] | str | None = None,
            config: ClientConfig | None = None, credentials: Credentials | None = None,
            tls: TlsConfig | None = None, namespace: str | None = None) -> BrokerClient:
    """A gRPC client when ``endpoints`` are given, else a remoting client of the name servers.

    ``credentials`` (ACL access key and secret key) replace ``config.credentials`` when given;
    so does ``tls`` (:class:`~rocketmq_spark.tls.TlsConfig`) ``config.tls``, and ``namespace``
    (the one the names given to the client are wrapped in) ``config.namespace``."""
    if credentials is not None:
        config = (config or ClientConfig()).with_credentials(credentials)
    if tls is not None:
        config = (config or ClientConfig()).with_tls(tls)
    if namespace:
        config = (config or ClientConfig()).with_namespace(namespace)
    if endpoints:
        from .grpc_client import GrpcClient

        client: BrokerClient = GrpcClient(endpoints, config)
        return client
    return RemotingClient(namesrv_addr, config)


def __getattr__(name: str) -> Any:
    if name == "GrpcClient":
        from .grpc_client import GrpcClient

        return GrpcClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
