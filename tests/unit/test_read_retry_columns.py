"""includeRetryTopic in a read task, without sockets: a retry topic's rows say where each message
was given back from (its RETRY_TOPIC property and reconsume times, decoded in the same walk as
the other columns), a topic's own rows carry null and 0, and the other columns are as without."""

from __future__ import annotations

from typing import Any

import pytest

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import encode_record
from rocketmq_spark.codec.arrow import RETRY_COLUMNS
from rocketmq_spark.model import MessageQueue, PullResult
from rocketmq_spark.source.pull_loop import read_range
from rocketmq_spark.source.queue_range import QueueRange

N = 300  # about 50 KiB of records: the vectorised decoder's input, not the reference's


def _record(topic: str, i: int) -> bytes:
    props = {"TAGS": "a" if i % 4 else "b", "KEYS": f"k{i}", "UNIQ_KEY": f"U{i:031d}"}
    if i % 3:  # given back by a consumer; the others were sent to the retry topic by hand
        props["RETRY_TOPIC"] = ("Orders", "Payments")[i % 3 - 1]
    return encode_record(topic=topic, queue_id=0, queue_offset=i, body=b"body-%d" % i, properties=props,
                         reconsume_times=i % 7, born_host="10.0.0.1:5000", store_host="10.0.0.2:10911",
                         born_timestamp=1_700_000_000_000 + i, store_timestamp=1_700_000_000_001 + i)


class OneQueueClient:
    """A broker holding ``N`` records of one queue, 32 a pull; rows as the remoting transport
    builds them (the pull bodies through the decoder)."""

    def __init__(self, topic: str) -> None:
        self.records = [_record(topic, i) for i in range(N)]
        self.asked: list[tuple[str, ...] | None] = []  # the columns of each rows() call

    def pull_async(self, mq: MessageQueue, offset: int, max_nums: int, **_kw: Any) -> int:
        return offset

    def pull_async_many(self, mq: MessageQueue, offsets: list[int], max_nums: int, **_kw: Any) -> list[int]:
        return list(offsets)

    def pull_result(self, mq: MessageQueue, offset: int) -> PullResult:
        nxt = min(offset + 32, N)
        return PullResult("FOUND", nxt, 0, N, b"".join(self.records[offset:nxt]))

    def rows(self, mq: MessageQueue, results: list[PullResult], end: int | None = None, columns: Any = None) -> Any:
        self.asked.append(None if columns is None else tuple(columns))
        return RemotingClient.rows(self, mq, results, end, columns)  # type: ignore[arg-type]

    def connection_epoch(self, broker: str) -> object:
        return None

    def broker_addr(self, broker: str, topic: str) -> str:
        return "127.0.0.1:10911"


def _read(topic: str, *, retry: bool, columns: tuple[str, ...] | None = None, tags: str = "*",
          start: int = 10, end: int = 290) -> tuple[list[dict[str, Any]], OneQueueClient]:
    client = OneQueueClient(topic)
    part = QueueRange(MessageQueue(topic, "broker-a", 0), start, end, ("127.0.0.1:9876",), None, "g", tags, 1024,
                      True, retry_columns=retry, columns=columns)
    return [row for batch in read_range(part, client) for row in batch.to_pylist()], client  # type: ignore[arg-type]


def _given_back(i: int) -> tuple[str | None, int]:
    return (None if i % 3 == 0 else ("Orders", "Payments")[i % 3 - 1]), i % 7


@pytest.mark.parametrize("tags", ["*", "a"])
def test_a_retry_topics_rows_say_where_each_message_came_from(tags: str) -> None:
    rows, client = _read("%RETRY%g", retry=True, tags=tags)
    plain, _ = _read("%RETRY%g", retry=False, tags=tags)
    offsets = [r["queueOffset"] for r in rows]
    assert offsets == [r["queueOffset"] for r in plain] and len(offsets) == (280 if tags == "*" else 210)
    assert [(r["retryTopic"], r["reconsumeTimes"]) for r in rows] == [_given_back(i) for i in offsets]
    assert [{k: v for k, v in r.items() if k not in RETRY_COLUMNS} for r in rows] == plain
    # decoded in one walk with the other columns (none parsed again afterwards)
    assert client.asked and all(cols is not None and cols[-2:] == RETRY_COLUMNS for cols in client.asked)


def test_a_topics_own_rows_carry_no_retry_origin() -> None:
    rows, client = _read("Orders", retry=True)
    assert len(rows) == 280 and {(r["retryTopic"], r["reconsumeTimes"]) for r in rows} == {(None, 0)}
    assert all(cols is None for cols in client.asked)  # the decoder is not asked for them


@pytest.mark.parametrize("topic", ["%RETRY%g", "Orders"])
@pytest.mark.parametrize("columns", [("retryTopic",), ("reconsumeTimes", "body"), ("queueOffset", "retryTopic")])
def test_a_schema_of_some_columns_with_retry_columns(topic: str, columns: tuple[str, ...]) -> None:
    rows, _ = _read(topic, retry=True, columns=columns)
    full, _ = _read(topic, retry=True)
    assert len(rows) == 280 and all(list(r) == list(columns) for r in rows)
    assert rows == [{c: r[c] for c in columns} for r in full]
