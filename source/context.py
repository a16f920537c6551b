"""What every part of one query's planning shares: its options, its client and the consumer
group's offsets on the brokers, each opened on first use (the planning process gets a pickled
copy of the reader: sockets open there, never in ``__init__``, and are never pickled)."""

from __future__ import annotations

from typing import Any

from ..checkpoints import BrokerOffsetStore
from ..checkpoints.offset_store import RETRY_AFTER_S
from ..client import BrokerClient, ClientConfig, connect
from ..errors import OptionError
from .options import ReaderOptions

__all__ = ["QueryContext", "client_config"]


def client_config(broker_down_timeout_ms: int) -> ClientConfig:
    """The config of a reader's clients (planner and tasks): a call's retries end within
    brokerDownTimeoutMs, the bound of the reader's own wait for a broker that does not answer."""
    base = ClientConfig()
    return ClientConfig(retry_budget_s=min(base.retry_budget_s, broker_down_timeout_ms / 1000))


class QueryContext:
    """A query's options, client and group offset store (see the module's docstring)."""

    def __init__(self, options: ReaderOptions, client: BrokerClient | None = None) -> None:
        self.options = options
        self._client = client
        self._store: BrokerOffsetStore | None = None
        #: the topics read now: those named, and those subscribePattern matched so far (see
        #: Planner.topics)
        self.topics: tuple[str, ...] = options.topics

    @property
    def subscriptions(self) -> dict[str, str]:
        """topic -> tag expression of the topics read now, for a broker's first contact with the
        group (``*`` with an SQL92 filter: see :attr:`member_subscriptions`)."""
        expr = self.options.sub_expression if self.options.sub_type == "TAG" else "*"
        return {t: expr for t in self.topics}

    @property
    def member_subscriptions(self) -> dict[str, str]:
        """topic -> expression (of type ``options.sub_type``) of the topics read now, as an
        online consumer of the group tells its brokers what it reads (mqadmin consumerConnection
        shows them)."""
        return {t: self.options.sub_expression for t in self.topics}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_store"] = None
        return state

    @property
    def client(self) -> BrokerClient:
        """The query's client, connected on first use."""
        if self._client is None:
            o = self.options
            self._client = connect(o.namesrv_addr, o.endpoints, client_config(o.broker_down_timeout_ms),
                                   credentials=o.credentials, tls=o.tls, namespace=o.namespace)
        return self._client

    @property
    def store(self) -> BrokerOffsetStore:
        """The consumer group's offsets on the brokers; OptionError without a consumerGroup."""
        if self._store is None:
            if not self.options.consumer_group:
                raise OptionError("consumerGroup", None, "required to read or commit a group's offsets")
            self._store = BrokerOffsetStore(self.client, self.options.consumer_group, retry_after_s=RETRY_AFTER_S)
        return self._store

    @property
    def opened_store(self) -> BrokerOffsetStore | None:
        """The offset store when it is open (None: nothing to tell it)."""
        return self._store
