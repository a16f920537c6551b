"""Protocol clients (remoting TCP; gRPC later). Never imports pyspark."""

from .connection import RemotingConnection
from .remoting import ClientConfig, RemotingClient, parse_namesrv_addr

__all__ = ["ClientConfig", "RemotingClient", "RemotingConnection", "parse_namesrv_addr"]
