"""Every copy a topic's queues hold, read back for a checker.

Tests that prove nothing was lost or doubled compare what a query read with what the brokers
store; a send retried after a timeout may be stored twice, and a checker that counted only
reads would take that for a duplicate the reader made. Shared by the failover tests
(``tests/spark/test_master_slave.py``), the busy-broker commit test and the fault suite's
checker (``tests/faults/checker.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import decode_records
from rocketmq_spark.codec.record import MessageRecord
from rocketmq_spark.model import MessageQueue

__all__ = ["stored_records"]


def stored_records(client: RemotingClient, queues: Iterable[MessageQueue]
                   ) -> Iterator[tuple[MessageQueue, MessageRecord]]:
    """Each record of each of ``queues``, from the queue's min offset to its max offset (both
    asked when the queue is reached), in offset order. A pull that finds no message where the
    broker says the next one is further on (an offset moved) goes on from there; one that
    neither finds messages nor moves on raises RuntimeError naming the queue and offset."""
    for mq in queues:
        at, hi = client.min_offset(mq), client.max_offset(mq)
        while at < hi:
            res = client.pull(mq, at, 32)
            if res.status == "FOUND" and res.next_offset > at:
                for rec in decode_records(res.body or b""):
                    yield mq, rec
            elif res.status == "FOUND" or res.next_offset <= at:
                raise RuntimeError(f"reading {mq} at offset {at} (max {hi}): {res.status}, next offset "
                                   f"{res.next_offset}")
            at = res.next_offset
