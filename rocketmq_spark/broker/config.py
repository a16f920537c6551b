"""The settings of one embedded broker."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tls import ServerTls
from .store import StoreConfig

__all__ = ["BrokerConfig"]


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Settings of one embedded broker. Times in milliseconds, sizes in bytes."""

    data_dir: str
    #: the address the broker's ports bind (Java's bindAddress)
    host: str = "127.0.0.1"
    #: the address the broker gives out (Java's brokerIP1): registered with name servers, in
    #: gRPC routes, in stored records' store host and message ids. None: ``host``. A different
    #: one puts something else in front of the broker, e.g. a TCP proxy on
    #: ``advertise_host:<broker port>`` forwarding to ``host:<broker port>`` (ports are not
    #: translated: the proxy listens on the port the broker binds)
    advertise_host: str | None = None
    broker_name: str = "broker-a"
    cluster: str = "DefaultCluster"
    flush: str = "async"  # async | sync
    flush_interval_ms: int = 500
    auto_create_topics: bool = True
    #: Java's autoCreateSubscriptionGroup: a consumer group comes into being on its first pull
    #: or consumer heartbeat; off, only UPDATE_AND_CREATE_SUBSCRIPTIONGROUP creates one
    auto_create_groups: bool = True
    #: Java's enableMixedMessageType: topics of message.type MIXED may be created (off by default)
    mixed_message_type: bool = False
    #: Java 5.x's useServerSideResetOffset (on by default): a reset by time writes the group's offsets,
    #: ignores its commits of those queues until its next pull of each, which is answered
    #: PULL_OFFSET_MOVED to the reset offset; nothing is pushed. Off: the 4.x way, the offsets are
    #: written and pushed to the group's online consumers (RESET_CONSUMER_CLIENT_OFFSET)
    server_side_reset: bool = True
    #: Java's enablePropertyFilter (off by default, as there): subscriptions of expressionType
    #: SQL92 filter pulls by message properties; off, such a pull is refused (SYSTEM_ERROR)
    enable_property_filter: bool = False
    default_queue_nums: int = 4
    max_message_size: int = 4 * 1024 * 1024
    #: Real brokers cap a pull at 32 messages / 256 KiB from memory; the embedded one
    #: serves larger pulls by default so local pipelines are not round-trip bound.
    max_pull_messages: int = 1024
    max_pull_bytes: int = 4 * 1024 * 1024
    max_suspend_ms: int = 30_000
    segment_size: int = 64 * 1024 * 1024
    retention_hours: float = 72.0
    #: How often the broker registers with its name servers again (its heartbeat there).
    register_interval_ms: int = 30_000
    transaction_timeout_ms: int = 6_000
    transaction_check_interval_ms: int = 30_000
    transaction_max_checks: int = 15
    #: Check-backs (and rollbacks after the last check) sent per housekeeping round (about a
    #: second) at most, oldest halves first; 0: no limit. A long exactly-once write leaves tens
    #: of thousands of halves past transaction_timeout_ms at once, and asking about every one in
    #: one pass held the event loop (the sends and ENDs waiting behind it) for seconds.
    transaction_checks_per_round: int = 512
    #: Longest delay a 5.x timer property may ask for (Java's timerMaxDelaySec: 3 days).
    max_delay_ms: int = 3 * 24 * 3600_000
    #: ACL 1.0: access key -> secret key. When set, every remoting request must be signed by
    #: one of these keys or is answered NO_PERMISSION (16). Left out of the repr (secrets).
    acl: dict[str, str] | None = field(default=None, repr=False)
    #: TLS on every port (name server, remoting, gRPC): plaintext connections are refused, as
    #: Apache RocketMQ's ``tls.server.mode=enforcing`` does. None: plaintext only.
    tls: ServerTls | None = None

    @property
    def advertised_host(self) -> str:
        """The host clients are told to connect to (``advertise_host``, else ``host``)."""
        return self.advertise_host or self.host

    def store_config(self) -> StoreConfig:
        return StoreConfig(segment_size=self.segment_size, max_message_size=self.max_message_size)
