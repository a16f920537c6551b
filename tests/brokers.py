"""The two brokers a test can run against, behind one face.

``embedded``: our EmbeddedBroker (module-scoped, a fresh one per test module); ``real``: Apache
RocketMQ from Maven Central (one JVM cluster per test session, see real_rocketmq.py). A test
module opts in to both by setting ``BROKERS = ("embedded", "real")``; its ``broker`` fixture
is then a :class:`Target` parametrized over them, and its ``transport`` fixture over the
transports each broker serves (``TRANSPORTS``, overridable per module).

``real`` is the release the whole suite runs on (real_rocketmq.VERSION). The older releases
of the matrix (PARITY_RELEASES) are kinds of their own, ``real-5.3.3`` and ``real-4.9.7``
(:data:`PARITY_KINDS`): a module naming them in BROKERS starts each once, a name server and
a broker without a proxy, and runs on them only its tests marked ``parity`` (or whose
``brokers`` marker names the kind), over remoting.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from real_rocketmq import PARITY_RELEASES, RealRocketMQ
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.errors import TopicNotFoundError

#: the transports a reading test runs over on each broker: released 5.x proxies serve sends and
#: transactions over gRPC, not pulls or offsets (the reader then fails naming namesrvAddr; a
#: test of its own checks that), so reads over gRPC run on the embedded broker only; the real
#: proxy's remoting port serves everything a classic client needs
READ_TRANSPORTS: dict[str, tuple[str, ...]] = {"embedded": ("remoting", "grpc"), "real": ("remoting", "proxy")}
#: writing tests: every transport on both brokers (over gRPC the real proxy takes the sends)
WRITE_TRANSPORTS: dict[str, tuple[str, ...]] = {"embedded": ("remoting", "grpc"),
                                               "real": ("remoting", "grpc", "proxy")}
#: every transport name: ``proxy`` is remoting through the 5.x proxy's remoting port (real only)
ALL_TRANSPORTS = ("remoting", "grpc", "proxy")
#: the broker kinds of the parity releases: ``real-<release>``
PARITY_KINDS = tuple(f"real-{release}" for release in PARITY_RELEASES)


def parity_release(kind: str) -> str | None:
    """The release a parity kind (``real-4.9.7``) names, else None (``embedded``, ``real``)."""
    return kind.removeprefix("real-") if kind.startswith("real-") else None


@dataclass
class Target:
    """Addresses and admin actions of the broker a test runs against."""

    kind: str  # "embedded" | "real"
    namesrv_addr: str
    broker_addr: str
    grpc_endpoint: str
    broker_name: str
    embedded: EmbeddedBroker | None = None
    real: RealRocketMQ | None = None

    @classmethod
    def of_embedded(cls, mq: EmbeddedBroker) -> Target:
        return cls("embedded", mq.namesrv_addr, mq.broker_addr, mq.grpc_endpoint, mq.broker.config.broker_name,
                   embedded=mq)

    @classmethod
    def of_real(cls, rmq: RealRocketMQ) -> Target:
        return cls("real", rmq.namesrv_addr, rmq.broker_addr, rmq.grpc_endpoint, rmq.broker_name, real=rmq)

    @property
    def is_real(self) -> bool:
        return self.kind == "real"

    @property
    def release(self) -> str | None:
        """The Apache RocketMQ release behind a real target (``5.5.0``, ``4.9.7``), else None."""
        return self.real.version if self.real is not None else None

    def create_topic(self, topic: str, queues: int = 4, *, perm: int = 6, message_type: str | None = None) -> str:
        """Creates ``topic`` (the real name server routes only topics that exist; the embedded
        one would create it on first lookup) and waits until every way in routes it.
        ``message_type``: the topic's message.type (a 5.x proxy takes only that type)."""
        c = RemotingClient(self.namesrv_addr)
        try:
            c.create_topic(topic, queues=queues, perm=perm, message_type=message_type)
        finally:
            c.close()
        if self.real is not None:
            self.real.topic_route_ready(topic)
        return topic

    def restart_broker(self, *, kill: bool = False) -> None:
        """Stops the broker (SIGTERM, or SIGKILL with ``kill``) and starts it again with its store."""
        if self.real is not None:
            self.real.restart_broker(kill=kill)
        else:
            raise NotImplementedError("the embedded broker restarts through EmbeddedCluster or a broker process")

    def __getattr__(self, name: str) -> Any:
        # embedded-only internals (mq.call, mq.broker ...) stay reachable for embedded-only checks
        if name != "embedded" and self.embedded is not None:
            return getattr(self.embedded, name)
        raise AttributeError(f"{self.kind} broker target has no {name!r}")


@dataclass
class Transport:
    """How a test reaches the broker: remoting (namesrvAddr) or gRPC (endpoints)."""

    name: str
    options: dict[str, str]
    #: options to read back what a test wrote (the real 5.x proxy serves no pulls over gRPC)
    read_options: dict[str, str]
    broker: Target

    def __call__(self, text: str) -> str:
        """A topic or group name unique to this broker and transport."""
        suffix = self.name.upper() + ("_REAL" if self.broker.is_real else "")
        return f"{text}_{suffix}"

    @classmethod
    def over(cls, name: str, broker: Target) -> Transport:
        remoting = {"namesrvAddr": broker.namesrv_addr}
        if name == "proxy":
            assert broker.real is not None, "the proxy's remoting port is a real-broker transport"
            through = {"namesrvAddr": broker.real.proxy_remoting_addr}
            return cls(name, through, through, broker)
        if name == "grpc":
            grpc = {"endpoints": broker.grpc_endpoint}
            return cls(name, grpc, remoting if broker.is_real else grpc, broker)
        return cls(name, remoting, remoting, broker)


def wait_until(pred: Any, timeout_s: float = 30, every_s: float = 0.1) -> bool:
    """Polls ``pred()`` until it is true or ``timeout_s`` passes; returns its last value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return bool(value)
        time.sleep(every_s)


def wait_for(pred: Any, what: Any, timeout_s: float = 30, every_s: float = 0.1) -> None:
    """Polls ``pred()`` until it is true; AssertionError naming ``what`` (a string, or a callable
    giving one: the state at the time) once ``timeout_s`` passes without."""
    if not wait_until(pred, timeout_s, every_s):
        raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what() if callable(what) else what}")


def queued(client: Any, topic: str, queues: Any = None) -> int:
    """How many messages ``topic``'s consume queues hold (or just ``queues`` of them): the sum
    of max - min offset over its readable queues (what a batch read, a pull or GET_MAX_OFFSET sees)."""
    mqs = list(queues) if queues is not None else client.message_queues(topic)
    return sum(hi - lo for lo, hi in client.offset_ranges(mqs).values())


def settles_at(client: Any, topic: str, expected: int, timeout_s: float = 10, *, queues: Any = None) -> int:
    """:func:`queued` once it reaches ``expected`` (or ``timeout_s`` passes): the caller asserts
    it equals ``expected``, so an overshoot still fails. Apache RocketMQ answers a send once its
    commit log holds the message; its consume queue, what offsets, pulls and reads see, is
    dispatched a moment later (the broker's reput thread), so a count or a read right after a
    send returned can miss the last messages."""
    def reached() -> bool:
        try:
            return queued(client, topic, queues) >= expected
        except TopicNotFoundError:  # a topic a send auto-created: routed a moment later
            return False

    wait_until(reached, timeout_s, every_s=0.05)
    return queued(client, topic, queues)


def skip_or_fail(reason: str) -> None:
    """Skip, except under CI=true: CI has java and mvn, so a skip there is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: nothing may be skipped)", pytrace=False)
    pytest.skip(reason)


def real_broker(workdir: Any, *, grace_s: float = 15.0, **kw: Any) -> Iterator[RealRocketMQ]:
    """A module fixture's body: Apache RocketMQ (the suite's release unless ``kw`` names a
    ``version``) started in ``workdir`` with ``kw`` (see :class:`RealRocketMQ`), stopped after;
    skipped, or failed under CI=true, where no JVM can run."""
    from real_rocketmq import VERSION, java_available, provision

    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(kw.get("version", VERSION)), workdir, **kw)
    rmq.start()
    try:
        yield rmq
    finally:
        rmq.stop(grace_s=grace_s)
