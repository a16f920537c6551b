"""The embedded RocketMQ broker: name server + broker(s) in one asyncio process.

It never imports pyspark or the Spark-facing packages: it is a standalone server that
any RocketMQ client can use.
"""

from .broker import Broker
from .config import BrokerConfig
from .server import BrokerServer, EmbeddedBroker, EmbeddedCluster, NamesrvServer
from .store import MessageStore, StoreConfig

__all__ = ["Broker", "BrokerConfig", "BrokerServer", "EmbeddedBroker", "EmbeddedCluster", "MessageStore",
           "NamesrvServer", "StoreConfig"]
