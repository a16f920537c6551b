"""Which brokers a query can read now. A broker that does not answer (down, restarting, gone
from the routes) keeps its queues at their planned offsets, never skipped, for up to
brokerDownTimeoutMs; then the query fails naming it. A broker known to be down is asked again
only every few seconds, and then once, so it neither slows every trigger down nor stretches
the bound."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from ..client.retry import bounded
from ..errors import BrokerUnavailableError, RocketMQSparkError
from ..model import MessageQueue
from .options import ReaderOptions

log = logging.getLogger(__name__)

__all__ = ["REPROBE_BUDGET_S", "Availability"]

V = TypeVar("V")
#: A broker known to be down is asked again at most this often (seconds).
REPROBE_S = 2.0
#: the retry budget of asking a broker known to be down again (seconds): quick faults (a
#: refused connection) are retried within it, a request that times out is not asked again
#: (brokerDownTimeoutMs bounds the wait for the broker, not a chain of timeouts per trigger)
REPROBE_BUDGET_S = 1.0
# how often the "broker unavailable" warning repeats while the broker stays down (triggers
# come every few milliseconds when the other queues are busy; DEBUG in between)
WARN_EVERY_S = 10.0


def by_broker(queues: list[MessageQueue]) -> dict[str, list[MessageQueue]]:
    out: dict[str, list[MessageQueue]] = {}
    for mq in queues:
        out.setdefault(mq.broker, []).append(mq)
    return out


class Availability:
    """The brokers a query found down, since when and why."""

    def __init__(self, options: ReaderOptions, answered: Callable[[str], None]) -> None:
        self.options = options
        #: told of a broker that answers again (the offset store's commits need not wait for it)
        self._answered = answered
        #: broker -> (monotonic time it was first found unavailable, why)
        self.down: dict[str, tuple[float, str]] = {}
        self._warned: dict[str, float] = {}
        self._probed: dict[str, float] = {}  # broker -> when a down broker was last asked

    def note_down(self, broker: str, since: float, why: str) -> None:
        """``broker`` did not answer a request that went out at ``since`` (monotonic)."""
        self.down.setdefault(broker, (since, why))

    def silent_s(self) -> dict[str, float]:
        """How long each broker found down has not answered (seconds)."""
        now = time.monotonic()
        return {b: now - since for b, (since, _why) in self.down.items()}

    def ask(self, queues: list[MessageQueue], ask: Callable[[list[MessageQueue]], dict[MessageQueue, V]], *,
            fail: bool = True) -> dict[MessageQueue, V]:
        """``ask(queues of one broker)`` for every broker (the client pipelines the per-queue
        requests); a broker that fails with a transient fault (after the client's retries,
        bounded by brokerDownTimeoutMs) is noted as down since the request that failed went
        out, and the caller reads on with the rest. A broker known to be down is asked again
        only every ``REPROBE_S`` and then once (no chain of request timeouts), so a broker
        that stopped answering neither slows every trigger down nor stretches the wait
        brokerDownTimeoutMs bounds. With ``fail``, a down broker is said (:meth:`unavailable`:
        a warning when it is found, BrokerUnavailableError once it has been down for longer
        than brokerDownTimeoutMs and did not answer the last time it was asked)."""
        out: dict[MessageQueue, V] = {}
        now = time.monotonic()
        for b, mqs in by_broker(queues).items():
            down = self.down.get(b)
            if down is not None and now - self._probed.get(b, 0.0) < REPROBE_S:
                if fail:
                    self.unavailable(mqs)
                continue
            asked = time.monotonic()
            try:
                if down is None:
                    out.update(ask(mqs))
                else:
                    with bounded(REPROBE_BUDGET_S):
                        out.update(ask(mqs))
            except RocketMQSparkError as exc:
                if not exc.retriable:
                    raise
                self._probed[b] = time.monotonic()
                if down is None:
                    self.down[b] = (asked, str(exc))
                if fail:
                    self.unavailable(mqs)
        for broker in {mq.broker for mq in out}:
            if self.down.pop(broker, None) is not None:
                self._warned.pop(broker, None)
                self._answered(broker)
                log.warning("broker %s answers again; reading its queues", broker)
        return out

    def unavailable(self, queues: list[MessageQueue]) -> None:
        """Queues with planned offsets that cannot be read now (their broker is down or gone
        from the routes): they keep their offsets (never skipped) for up to
        brokerDownTimeoutMs, then the query fails naming the broker."""
        now = time.monotonic()
        for broker, mqs in sorted(by_broker(queues).items()):
            since, why = self.down.setdefault(broker, (now, "its queues are no longer in the topic's route"))
            waited = now - since
            names = ", ".join(str(m) for m in sorted(mqs))
            if waited * 1000 >= self.options.broker_down_timeout_ms:
                raise BrokerUnavailableError(
                    f"broker {broker} has been unavailable for {waited:.0f}s ({why}); its queues {names} are not "
                    f"read and keep their offsets in the checkpoint: restart the query when the broker is back "
                    f"(brokerDownTimeoutMs={self.options.broker_down_timeout_ms} bounds the wait)")
            last = self._warned.get(broker)
            level = logging.WARNING if last is None or now - last >= WARN_EVERY_S else logging.DEBUG
            if level == logging.WARNING:
                self._warned[broker] = now
            log.log(level, "broker %s unavailable for %.0fs (%s): queues %s wait at their offsets, the others "
                    "are read", broker, waited, why, names)
