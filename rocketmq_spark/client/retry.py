"""Bounded retries of transient faults, shared by the remoting and gRPC clients."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential

from ..errors import RocketMQSparkError
from ..remoting.acl import Credentials

log = logging.getLogger(__name__)

__all__ = ["ClientConfig", "Credentials", "retrying"]

T = TypeVar("T")


class ClientConfig:
    """Timeouts (seconds), retry bounds and ACL credentials of a client.

    With ``credentials`` every request the client sends is signed (ACL 1.0, see
    :mod:`rocketmq_spark.remoting.acl`). The config pickles (Spark ships clients to executors),
    its repr masks the secret."""

    __slots__ = (
        "backoff_max_s",
        "connect_timeout_s",
        "credentials",
        "request_timeout_s",
        "retries",
        "retry_budget_s",
        "route_refresh_s",
    )

    def __init__(self, *, request_timeout_s: float = 10.0, connect_timeout_s: float = 3.0, retries: int = 5,
                 retry_budget_s: float = 30.0, route_refresh_s: float = 30.0, backoff_max_s: float = 2.0,
                 credentials: Credentials | None = None) -> None:
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.retry_budget_s = retry_budget_s
        self.route_refresh_s = route_refresh_s
        self.backoff_max_s = backoff_max_s
        self.credentials = credentials

    def with_credentials(self, credentials: Credentials | None) -> ClientConfig:
        """A copy of this config with ``credentials`` instead."""
        state = self.__getstate__()
        state["credentials"] = credentials
        return ClientConfig(**state)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"ClientConfig({fields})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.credentials = None  # state pickled before credentials existed
        for k, v in state.items():
            setattr(self, k, v)


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, RocketMQSparkError) and exc.retriable


def retrying(fn: Callable[[], T], cfg: ClientConfig) -> T:
    """``fn()`` with bounded retries (attempts and time budget, exponential backoff) on
    retriable faults; the first attempt runs without building the retry machinery."""
    try:
        return fn()
    except RocketMQSparkError as exc:
        if not exc.retriable or cfg.retries <= 1:
            raise
        log.debug("retrying after a transient fault: %s", exc)
    for attempt in Retrying(
        stop=stop_after_attempt(cfg.retries - 1) | stop_after_delay(cfg.retry_budget_s),
        wait=wait_exponential(multiplier=0.05, max=cfg.backoff_max_s),
        retry=retry_if_exception(_retriable),
        reraise=True,
        before=lambda _state: time.sleep(0.05),
    ):
        with attempt:
            return fn()
    raise AssertionError("unreachable")
