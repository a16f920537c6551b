"""An exactly-once write whose broker refuses its ENDs as busy.

Apache RocketMQ answers SYSTEM_BUSY ([TIMEOUT_CLEAN_QUEUE]) for an END that waited longer than
``waitTimeMillsInTransactionQueue`` in its queue. With one END thread and 1 ms it does so all
through a commit. The commit must go on while its ENDs still apply, with fewer in flight, and
write each row once. (Seen for real: a 5.5.0 broker whose op-message queue jammed refused a
200,000-row commit after 96,739 rows, and the writer gave up after three tries.)

Apache RocketMQ only: the embedded broker queues no requests, so it never answers SYSTEM_BUSY.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest

from brokers import real_broker
from readback import stored_records
from real_rocketmq import RealRocketMQ
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, TransactionType
from rocketmq_spark.errors import SystemBusyError
from rocketmq_spark.model import MessageQueue, Txn
from rocketmq_spark.remoting.codes import ResponseCode

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability]

ROWS = 5000


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRocketMQ]:
    yield from real_broker(tmp_path_factory.mktemp("busy-real"), grace_s=2, proxy=False,
                           broker_config={"endTransactionThreadPoolNums": 1, "waitTimeMillsInTransactionQueue": 1})


def _halves(client: RemotingClient, qs: list[MessageQueue], n: int) -> list[Txn]:
    """``n`` half messages, 50 in flight at a time; a send the broker refuses as busy (its send
    queue, too, sheds requests that waited over 200 ms) is sent again, as the writer does."""
    props = "TRAN_MSG\x01true\x02PGROUP\x01PG_BUSY\x02"
    txns: list[Txn] = []
    for first in range(0, n, 50):
        reqs = [(i, q, client.send_request(q, [BatchEntry(b"probe", f"{props}UNIQ_KEY\x01B{i:05d}\x02")],
                                           producer_group="PG_BUSY", sys_flag=TransactionType.PREPARED))
                for i, q in ((i, qs[i % len(qs)]) for i in range(first, min(n, first + 50)))]
        futs = client.send_async_many([(q, req) for _, q, req in reqs])
        for (i, mq, req), fut in zip(reqs, futs, strict=True):
            resp = fut.result(10)
            for _ in range(20):
                if resp.code != ResponseCode.SYSTEM_BUSY:
                    break
                time.sleep(0.1)
                resp = client.send_async_many([(mq, req)])[0].result(10)
            txns.append(client.transaction(client.send_results(mq, 1, resp)[0], f"B{i:05d}"))
    return txns


def _stored(client: RemotingClient, qs: list[MessageQueue]) -> Counter[bytes]:
    return Counter(rec.payload() for _, rec in stored_records(client, qs))


def test_a_commit_the_broker_refuses_as_busy_goes_on_and_writes_each_row_once(spark, busy) -> None:  # noqa: ANN001
    client = RemotingClient(busy.namesrv_addr)
    try:
        # the broker does refuse: 256 ENDs in flight, as a commit starts, meet SYSTEM_BUSY
        probe = "BusyProbe"
        client.create_topic(probe, 4)
        txns = _halves(client, client.message_queues(probe, refresh=True), 600)
        with pytest.raises(SystemBusyError, match="TIMEOUT_CLEAN_QUEUE"):
            client.end_transactions(txns, commit=True, producer_group="PG_BUSY", retry_failed=False)
        client.end_transactions(txns, commit=False, producer_group="PG_BUSY")  # (any still open)

        topic = "BusyCommit"
        client.create_topic(topic, 4)
        (spark.range(ROWS).selectExpr("CAST(CONCAT('row-', id) AS BINARY) AS body").coalesce(2)
         .write.mode("append").format("rocketmq").option("namesrvAddr", busy.namesrv_addr)
         .option("topic", topic).option("delivery", "exactly-once").save())
        got = _stored(client, client.message_queues(topic, refresh=True))
        assert sum(got.values()) == ROWS and set(got) == {b"row-%d" % i for i in range(ROWS)}, \
            f"{sum(got.values())} stored, {len(got)} distinct, {sum(v > 1 for v in got.values())} twice"
    finally:
        client.close()
