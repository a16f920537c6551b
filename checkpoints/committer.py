"""A StreamingQueryListener that keeps the group's broker offsets at the end of every batch.

Spark calls a source's ``commit(end)`` for batch N only when batch N+1 starts, and never
for the last batch of a query (an AvailableNow run's end, an idle stream). Attach this
listener and the broker offsets follow each batch's ``endOffset`` as soon as Spark
reports the batch done::

    spark.streams.addListener(RocketMQOffsetCommitter("127.0.0.1:9876", "etl"))

It also measures lag per queue (:func:`~rocketmq_spark.checkpoints.progress.queue_lags`):
messages behind the latest offset and milliseconds behind (now minus the store time of the
oldest unread message), logged and kept in :attr:`RocketMQOffsetCommitter.lag`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from ..client import connect
from ..errors import OptionError, RocketMQSparkError
from ..model import MessageQueue
from ..offsets import OffsetsFormatError, split_batch_end
from ..options import credentials, group_name, topic_name
from .offset_store import RETRY_AFTER_S, BrokerOffsetStore
from .progress import QueueLag, queue_lags

log = logging.getLogger(__name__)

__all__ = ["RocketMQOffsetCommitter"]


def _parse_offsets(raw: Any) -> dict[MessageQueue, int]:
    """A source's end offsets from Spark's progress, or {} when they are not in the rocketmq
    offsets form (the progress of every source of the query comes here)."""
    try:
        return dict(split_batch_end(raw)[0])  # a batch that followed a reset: its ends are committed
    except OffsetsFormatError as exc:
        log.debug("end offsets not in the rocketmq form, not committed (%s): %.200s", exc, raw)
        return {}


class RocketMQOffsetCommitter(StreamingQueryListener):
    """Commits each finished batch's ``endOffset`` of rocketmq sources to ``consumer_group``.

    ``topics`` limits it to those topics (default: every offset that has the rocketmq
    shape); ``query_name`` to one query. Against brokers with ACL on, pass the query's
    ``access_key``/``secret_key`` (and ``security_token``): its commits are signed like the
    reader's. Commit failures are logged with the queue and
    offset and retried at the next progress event; they never fail the query.
    """

    def __init__(self, namesrv_addr: str | Sequence[str] | None, consumer_group: str, *,
                 endpoints: str | Sequence[str] | None = None, topics: Sequence[str] | None = None,
                 query_name: str | None = None, measure_lag: bool = True,
                 access_key: str | None = None, secret_key: str | None = None,
                 security_token: str | None = None) -> None:
        if not namesrv_addr and not endpoints:
            raise OptionError("namesrv_addr", None, "RocketMQOffsetCommitter needs namesrv_addr (remoting) or "
                                                    "endpoints (gRPC)")
        group_name("consumer_group", consumer_group)
        for t in topics or ():
            topic_name("topics", ",".join(topics or ()), t)
        # the query's accessKey/secretKey/securityToken, checked by the same rules as its reader's
        creds = credentials({"accessKey": access_key or "", "secretKey": secret_key or "",
                             "securityToken": security_token or ""})
        self.client = connect(namesrv_addr or (), endpoints, credentials=creds)
        self.store = BrokerOffsetStore(self.client, consumer_group, retry_after_s=RETRY_AFTER_S)
        self.group = consumer_group
        self.topics = set(topics) if topics else None
        self.query_name = query_name
        self.measure_lag = measure_lag
        self.lag: dict[MessageQueue, QueueLag] = {}
        self.committed: dict[MessageQueue, int] = {}
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self.query_name is not None and progress.name != self.query_name:
            return
        for source in progress.sources:
            offsets = _parse_offsets(source.endOffset)
            if self.topics is not None:
                offsets = {mq: o for mq, o in offsets.items() if mq.topic in self.topics}
            if offsets:
                self.commit(offsets)

    def commit(self, offsets: dict[MessageQueue, int]) -> None:
        with self._lock:
            failed = self.store.commit(offsets)
            for mq, off in offsets.items():
                if mq not in failed:
                    self.committed[mq] = off
            if self.measure_lag:
                # not of the queues whose commit failed: their broker may not answer, and each
                # progress event would wait for it again
                reached = {mq: off for mq, off in offsets.items() if mq not in failed}
                try:
                    self.lag.update(queue_lags(self.client, reached))
                except RocketMQSparkError as exc:
                    log.warning("lag of group %s on %d queues unavailable: %s", self.group, len(offsets), exc)
                total = sum(x.messages_behind for x in self.lag.values())
                worst = max((x.ms_behind for x in self.lag.values()), default=0)
                log.info("group %s committed %d queues; lag %d messages, %d ms behind at worst",
                         self.group, len(offsets), total, worst)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
