"""Bounded retries of transient faults, shared by the remoting and gRPC clients."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception, wait_exponential

from ..errors import RequestTimeoutError, RocketMQSparkError
from ..remoting.acl import Credentials
from ..tls import TlsConfig

log = logging.getLogger(__name__)

__all__ = ["ClientConfig", "Credentials", "bounded", "may_retry", "retry_budget", "retrying"]

T = TypeVar("T")


class ClientConfig:
    """Timeouts (seconds), retry bounds, ACL credentials and TLS settings of a client.

    A request unanswered after ``request_timeout_s`` fails with RequestTimeoutError; a call
    makes up to ``retries`` attempts within ``retry_budget_s`` from its first (see
    :func:`retrying`). With ``credentials`` every request the client sends is signed (ACL 1.0, see
    :mod:`rocketmq_spark.remoting.acl`). With ``tls`` every connection (name servers, brokers,
    gRPC endpoints) is TLS (:class:`~rocketmq_spark.tls.TlsConfig`). ``namespace``: the namespace
    the names given to the client are already wrapped in (:mod:`rocketmq_spark.namespaces`); the
    gRPC transport also names it in every ``Resource`` it sends. The config pickles (Spark ships
    clients to executors), its repr masks the secret."""

    __slots__ = (
        "backoff_max_s",
        "connect_timeout_s",
        "credentials",
        "namespace",
        "request_timeout_s",
        "retries",
        "retry_budget_s",
        "route_refresh_s",
        "tls",
    )

    def __init__(self, *, request_timeout_s: float = 10.0, connect_timeout_s: float = 3.0, retries: int = 5,
                 retry_budget_s: float = 30.0, route_refresh_s: float = 30.0, backoff_max_s: float = 2.0,
                 credentials: Credentials | None = None, tls: TlsConfig | None = None,
                 namespace: str = "") -> None:
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.retry_budget_s = retry_budget_s
        self.route_refresh_s = route_refresh_s
        self.backoff_max_s = backoff_max_s
        self.credentials = credentials
        self.tls = tls
        self.namespace = namespace

    def with_credentials(self, credentials: Credentials | None) -> ClientConfig:
        """A copy of this config with ``credentials`` instead."""
        state = self.__getstate__()
        state["credentials"] = credentials
        return ClientConfig(**state)

    def with_tls(self, tls: TlsConfig | None) -> ClientConfig:
        """A copy of this config with ``tls`` instead."""
        state = self.__getstate__()
        state["tls"] = tls
        return ClientConfig(**state)

    def with_namespace(self, namespace: str) -> ClientConfig:
        """A copy of this config with ``namespace`` instead."""
        state = self.__getstate__()
        state["namespace"] = namespace
        return ClientConfig(**state)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"ClientConfig({fields})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.credentials = None  # state pickled before credentials existed
        self.tls = None
        self.namespace = ""
        for k, v in state.items():
            setattr(self, k, v)


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, RocketMQSparkError) and exc.retriable


#: the clock and the sleep of the retries (tests replace them)
_now = time.monotonic
_sleep = time.sleep
#: the pause before every retry, on top of the backoff (seconds)
_PAUSE_S = 0.05

#: a cap on the retry budget of the calls made in a :func:`bounded` block (this thread or task)
_BUDGET_CAP: ContextVar[float | None] = ContextVar("rocketmq_spark_retry_budget_cap", default=None)


@contextmanager
def bounded(budget_s: float) -> Iterator[None]:
    """Calls retried in this block (by this thread or task only) spend at most ``budget_s``
    seconds on their attempts (their config's budget when that is smaller; see :func:`retrying`).
    For callers that have their own way of waiting for a peer, e.g. asking again a broker
    already known to be down: one attempt that times out, no chain of them."""
    cap = _BUDGET_CAP.get()
    token = _BUDGET_CAP.set(budget_s if cap is None else min(cap, budget_s))
    try:
        yield
    finally:
        _BUDGET_CAP.reset(token)


def retry_budget(cfg: ClientConfig) -> float:
    """The time budget :func:`retrying` gives a call here: the config's, or less in :func:`bounded`."""
    cap = _BUDGET_CAP.get()
    return cfg.retry_budget_s if cap is None else min(cap, cfg.retry_budget_s)


def retrying(fn: Callable[[], T], cfg: ClientConfig, *, started: float | None = None) -> T:
    """``fn()`` with bounded retries on retriable faults, exponential backoff between attempts.

    Bounds: at most ``cfg.retries`` attempts, and a time budget (:func:`retry_budget`) counted
    from the first attempt, or from ``started`` (a ``time.monotonic()`` value: when the call's
    first attempt went out elsewhere, e.g. in a pipelined round): no attempt starts once the
    budget is spent (backoff included), nor after one that timed out (:class:`RequestTimeoutError`)
    when another as long would end past it. So a peer that stopped answering costs a caller
    the budget at most, or one request timeout when the budget is shorter; an attempt that
    started in time and then hangs may end up to one request timeout past it. The first
    attempt runs without building the retry machinery."""
    t0 = _now() if started is None else started
    began = [_now()]  # when the latest attempt started
    try:
        return fn()
    except RocketMQSparkError as exc:
        if not exc.retriable or cfg.retries <= 1:
            raise
        budget = retry_budget(cfg)
        if _spent(exc, t0, began[0], budget):
            raise
        if isinstance(exc, RequestTimeoutError):
            log.info("%s; asking again for up to %.0fs more", exc, budget - (_now() - t0))
        else:
            log.debug("retrying after a transient fault: %s", exc)

    def attempt() -> T:
        began[0] = _now()
        return fn()

    backoff = wait_exponential(multiplier=0.05, max=cfg.backoff_max_s)

    def stop(state: RetryCallState) -> bool:
        if state.attempt_number >= cfg.retries - 1:
            return True
        exc = state.outcome.exception() if state.outcome else None
        return _spent(exc, t0, began[0], budget, backoff(state))

    for tried in Retrying(
        stop=stop,
        wait=backoff,
        sleep=lambda seconds: _sleep(seconds),
        retry=retry_if_exception(_retriable),
        reraise=True,
        before=lambda _state: _sleep(_PAUSE_S),
    ):
        with tried:
            return attempt()
    raise AssertionError("unreachable")


def may_retry(exc: RocketMQSparkError, cfg: ClientConfig, started: float) -> bool:
    """Whether :func:`retrying` would make another attempt after a first one that went out at
    ``started`` and failed with ``exc`` (for callers whose first attempt is their own, e.g. a
    pipelined round)."""
    return exc.retriable and cfg.retries > 1 and not _spent(exc, started, started, retry_budget(cfg))


def _spent(exc: BaseException | None, t0: float, began: float, budget: float, backoff: float = 0.0) -> bool:
    """Whether the budget leaves no room for another attempt, after ``backoff``, following one
    that failed with ``exc`` (started at ``began``; the call's first at ``t0``)."""
    now = _now()
    need = now - began if isinstance(exc, RequestTimeoutError) else 0.0
    return now - t0 + backoff + _PAUSE_S + need >= budget
