"""The partition a batch's planning hands to a read task: one queue over ``[start, end)``,
with what the task needs to connect and to pull (pickled to an executor)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from ..client import Credentials
from ..model import MessageQueue
from ..tls import TlsConfig

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
    #: 0: it answered): a task that gets no answer either counts its wait from then (see :class:`.pull_loop.PullLoop`)
    broker_silent_s: float = 0.0
    #: (offset, store time in epoch ms) of a message of the store the range was planned on (the
    #: queue's mark, see :mod:`.marks`); None: none known. A task compares it before it hands
    #: on what it pulled, and again whenever its connection to the broker was replaced: a broker
    #: that lost its store serves other messages at the planned offsets (see :class:`.pull_loop.PullLoop`)
    mark: tuple[int, int] | None = None
    #: TLS of the task's connections (paths: the executor reads the files)
    tls: TlsConfig | None = None
    #: the namespace ``mq`` and ``group`` are wrapped in ("" for none): the task's client names
    #: it, and the rows it yields name the user's topics (see rocketmq_spark.namespaces)
    namespace: str = ""
    #: how ``sub_expression`` filters: TAG (a tag expression; the task drops tags it does not
    #: name too) or SQL92 (a property filter the broker applies)
    sub_type: str = "TAG"
    #: the topic the task sends trace records of what it hands on to (as it travels; option
    #: traceEnabled): None, no tracing (see :mod:`.tracing`)
    trace_topic: str | None = None
