"""The hand-over from planning to reading: :class:`QueueRange`, one Spark partition, and the
small helpers both sides use (the clients' config, a message's store time, times in messages).

The planner (driver side, :mod:`.reader`) makes the ranges; a task (executor side,
:mod:`.pull_loop`) reads one. Both import this module, neither imports the other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ..client import BrokerClient, ClientConfig, Credentials
from ..model import MessageQueue, PullResult

__all__ = ["QueueRange"]


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: queue ``mq`` over ``[start, end)``.

    ``start`` is the first offset read, ``end`` the first one not read (next-offsets).
    Pickled to an executor, it carries what the task needs to connect (``namesrv`` or
    ``endpoints``, ``credentials``) and to pull (``pull_batch_size`` messages a pull)."""

    mq: MessageQueue
    start: int
    end: int
    namesrv: tuple[str, ...]
    endpoints: str | None
    group: str
    sub_expression: str
    pull_batch_size: int
    fail_on_data_loss: bool
    #: how long a task keeps retrying pulls from an unreachable broker (brokerDownTimeoutMs)
    broker_down_timeout_ms: int = 30_000
    #: ACL credentials the task signs its requests with (repr masks the secret)
    credentials: Credentials | None = None
    #: rows carry retryTopic and reconsumeTimes (includeRetryTopic)
    retry_columns: bool = False
    #: only these columns, in this order (a user-given schema); None: all
    columns: tuple[str, ...] | None = None
    #: the broker's address as the planner's route gave it (remoting): the task asks no name
    #: server for it (one that does not answer must not stop the read; see read_range)
    broker_addr: str | None = None
    #: how long the broker had not answered the planner when the range was planned (seconds;
    #: 0: it answered): a task that gets no answer either counts its wait from then (see
    #: pull_loop.PullLoop)
    broker_silent_s: float = 0.0
    #: (offset, store time in epoch ms) of a message of the store the range was planned on (the
    #: queue's mark, see Planner._marks); None: none known. A task compares it before it hands
    #: on what it pulled, and again whenever its connection to the broker was replaced: a broker
    #: that lost its store serves other messages at the planned offsets (see pull_loop.PullLoop)
    mark: tuple[int, int] | None = None


def _iso(ms: int) -> str:
    """Epoch millis as ISO-8601 UTC (for messages)."""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _client_config(broker_down_timeout_ms: int) -> ClientConfig:
    """The config of a reader's clients (planner and tasks): a call's retries end within
    brokerDownTimeoutMs, the bound of the reader's own wait for a broker that does not answer."""
    base = ClientConfig()
    return ClientConfig(retry_budget_s=min(base.retry_budget_s, broker_down_timeout_ms / 1000))


def _store_time_in(client: BrokerClient, mq: MessageQueue, offset: int, res: PullResult) -> int | None:
    """Store time (epoch ms) of the message at ``offset`` in a pull's answer, None when it has none."""
    if res.status != "FOUND":
        return None
    rows = client.rows(mq, [res], offset + 1, ["queueOffset", "storeTimestamp"])
    offs = rows.column(0).to_pylist()
    if offset not in offs:
        return None
    us = rows.column(1).cast(pa.int64()).to_pylist()[offs.index(offset)]
    return None if us is None else int(us) // 1000
