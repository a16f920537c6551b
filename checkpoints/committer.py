"""A StreamingQueryListener for a stopping query's last batch, and the lag per queue.

A streaming query's reader writes the group's offsets at every trigger: Spark plans a batch
only once the one before it finished, so the broker holds the end of every finished batch by
the next trigger, idle ones included. What no trigger follows is the last batch of a query
stopped (``query.stop()``, the driver's shutdown) before it planned again. Attach this listener
and that batch's ``endOffset`` goes to the brokers when the query terminates::

    spark.streams.addListener(RocketMQOffsetCommitter("127.0.0.1:9876", "etl"))

It writes a queue's offset only where the broker holds none or still holds the one the reader
wrote when it planned that batch (its start): a reset made meanwhile to another offset is left
for the next run to follow (a 5.x broker ignores the write while its server-side reset waits,
whatever the offset; a direct write of exactly that start, as a 4.x tool makes for a group with
no consumer online, cannot be told from the reader's own and is overwritten). It also measures lag per queue
(:func:`~rocketmq_spark.checkpoints.progress.queue_lags`): messages behind the latest offset and
milliseconds behind (now minus the store time of the oldest unread message), at each progress
event, logged and kept in :attr:`RocketMQOffsetCommitter.lag`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from ..client import connect
from ..errors import AccessDeniedError, OptionError, RocketMQSparkError
from ..model import MessageQueue
from ..offsets import OffsetsFormatError, split_batch_end
from ..options import credentials, group_name, tls_config, topic_name
from ..options import namespace as namespace_option
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


def _held_at_start(start: Any, end: Any) -> dict[MessageQueue, int]:
    """What the reader wrote to the brokers when it planned the batch from ``start`` to ``end``
    (their offsets JSON): the ends of the batch before, and for a queue the batch read from a
    reset offset (named in ``end``), that offset, which the broker held (for a queue new to the
    query, named there too, its first offset: the broker held nothing, or that)."""
    try:
        ends = dict(split_batch_end(start)[0])
        ends.update(split_batch_end(end)[1])
    except OffsetsFormatError:
        return {}
    return ends


class RocketMQOffsetCommitter(StreamingQueryListener):
    """Commits the ``endOffset`` of a terminated query's last batch of rocketmq sources to
    ``consumer_group`` (see the module docstring), and measures the lag at each progress event.

    ``topics`` limits it to those topics (default: every offset that has the rocketmq
    shape); ``query_name`` to one query. Against brokers with ACL on, pass the query's
    ``access_key``/``secret_key`` (and ``security_token``): its commits are signed like the
    reader's (ACL 2.0: the user needs Sub on the group and the topics, Get on the topics for
    the lag). Against brokers that require TLS, pass the query's TLS options: ``tls=True``,
    ``tls_ca_file``, ``tls_cert_file``/``tls_key_file`` (mutual TLS), ``tls_verify_hostname``
    (options tls, tlsCaFile, ... of the reader, checked by the same rules). A query reading with
    the option ``namespace`` needs the same ``namespace`` here (``consumer_group`` and ``topics``
    are then the user's names, as in the reader's options; ``group``, ``lag`` and ``committed``
    hold the names as they travel). Commit failures are logged with the queue and offset; they
    never fail the query (a listener cannot), an ACL refusal is logged as an error and not retried.
    """

    def __init__(self, namesrv_addr: str | Sequence[str] | None, consumer_group: str, *,
                 endpoints: str | Sequence[str] | None = None, topics: Sequence[str] | None = None,
                 query_name: str | None = None, measure_lag: bool = True,
                 access_key: str | None = None, secret_key: str | None = None,
                 security_token: str | None = None, tls: bool = False, tls_ca_file: str | None = None,
                 tls_cert_file: str | None = None, tls_key_file: str | None = None,
                 tls_verify_hostname: bool = True, namespace: str | None = None) -> None:
        if not namesrv_addr and not endpoints:
            raise OptionError("namesrv_addr", None, "RocketMQOffsetCommitter needs namesrv_addr (remoting) or "
                                                    "endpoints (gRPC)")
        # the query's option namespace: the group and topics as they travel, wrapped in it
        space = namespace_option(namespace)
        consumer_group = group_name("consumer_group", consumer_group, space)
        topics = [topic_name("topics", ",".join(topics or ()), t, space) for t in topics or ()]
        # the query's accessKey/secretKey/securityToken, checked by the same rules as its reader's
        creds = credentials({"accessKey": access_key or "", "secretKey": secret_key or "",
                             "securityToken": security_token or ""})
        tls_opts = {"tls": str(tls).lower(), "tlsCaFile": tls_ca_file, "tlsCertFile": tls_cert_file,
                    "tlsKeyFile": tls_key_file,
                    "tlsVerifyHostname": None if tls_verify_hostname else "false"}
        tls_settings = tls_config({k: v for k, v in tls_opts.items() if v is not None})
        self.client = connect(namesrv_addr or (), endpoints, credentials=creds, tls=tls_settings,
                              namespace=space)
        self.store = BrokerOffsetStore(self.client, consumer_group, retry_after_s=RETRY_AFTER_S)
        self.group = consumer_group
        self.topics = set(topics) if topics else None
        self.query_name = query_name
        self.measure_lag = measure_lag
        self.lag: dict[MessageQueue, QueueLag] = {}
        self.committed: dict[MessageQueue, int] = {}
        #: per query run: the offsets the reader wrote to the brokers when it planned its latest
        #: batch (the batch's start), and that batch's end
        self._last: dict[str, tuple[dict[MessageQueue, int], dict[MessageQueue, int]]] = {}
        self._lock = threading.Lock()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self.query_name is not None and progress.name != self.query_name:
            return
        ends: dict[MessageQueue, int] = {}
        starts: dict[MessageQueue, int] = {}
        for source in progress.sources:
            offsets = _parse_offsets(source.endOffset)
            if self.topics is not None:
                offsets = {mq: o for mq, o in offsets.items() if mq.topic in self.topics}
            ends.update(offsets)
            held = _held_at_start(source.startOffset, source.endOffset) if source.startOffset else {}
            starts.update({mq: o for mq, o in held.items() if mq in offsets})
        if not ends:
            return
        with self._lock:
            self._last[str(progress.runId)] = (starts, ends)
        if self.measure_lag:
            self._measure(ends)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        """The query's last batch (from its last progress event): each queue's end offset goes to
        the brokers where they still hold the offset the reader wrote when it planned the batch
        (where they hold the end already, or another offset, a reset, nothing is written)."""
        with self._lock:
            last = self._last.pop(str(event.runId), None)
        if last is None:
            return
        starts, ends = last
        try:
            held = self.store.read_many(sorted(ends))
        except RocketMQSparkError as exc:
            log.warning("group %s: offsets of the query's last batch not committed at its end, the brokers' not "
                        "readable: %s", self.group, exc)
            return
        todo = {mq: off for mq, off in ends.items() if held.get(mq) != off
                and (held.get(mq) is None or held.get(mq) == starts.get(mq))}
        for mq, off in ends.items():
            if mq not in todo and held.get(mq) != off:
                log.info("%s: group %s holds %s, neither the last batch's start (%s) nor its end (%d): a reset, "
                         "left to the next run", mq, self.group, held.get(mq), starts.get(mq), off)
        if todo:  # a store of its own: nothing an earlier run failed to write is retried now
            try:
                self._write(BrokerOffsetStore(self.client, self.group), todo, "at the query's end")
            except AccessDeniedError as exc:  # a listener cannot fail the query: said once, loudly
                log.error("group %s: offsets of the query's last batch refused: %s", self.group, exc)

    def commit(self, offsets: dict[MessageQueue, int]) -> None:
        """Write ``offsets`` as the group's (failures logged, retried at the next call; an ACL
        refusal is raised: :class:`~rocketmq_spark.errors.AccessDeniedError`)."""
        self._write(self.store, offsets, "by hand")

    def _write(self, store: BrokerOffsetStore, offsets: dict[MessageQueue, int], why: str) -> None:
        with self._lock:
            failed = store.commit(offsets)
            self.committed.update({mq: off for mq, off in offsets.items() if mq not in failed})
        log.info("group %s: offsets of %d queues committed %s", self.group, len(offsets) - len(failed), why)
        if self.measure_lag:
            self._measure({mq: off for mq, off in offsets.items() if mq not in failed})

    def _measure(self, reached: dict[MessageQueue, int]) -> None:
        """The lag of the queues at ``reached`` (not of queues whose commit failed: their broker
        may not answer, and each progress event would wait for it again)."""
        try:
            lags = queue_lags(self.client, reached)
        except RocketMQSparkError as exc:
            log.warning("lag of group %s on %d queues unavailable: %s", self.group, len(reached), exc)
            return
        with self._lock:
            self.lag.update(lags)
            total = sum(x.messages_behind for x in self.lag.values())
            worst = max((x.ms_behind for x in self.lag.values()), default=0)
        log.info("group %s: lag %d messages, %d ms behind at worst", self.group, total, worst)
