"""Synthetic data for the benchmarks: the body every suite sends, and spark_io's floor, a Python
streaming data source that costs about nothing.

``format("rmqbench_synthetic")`` has the reader's schema (``SCHEMA_DDL``); each micro-batch is
split into ``partitions`` ranges, and each range yields one prebuilt Arrow RecordBatch of
``batchRows`` rows (the reader's batch size) again and again, sliced for the last. Spark's
Python workers import this module by name (spark_io puts the repository on their PYTHONPATH).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from rocketmq_spark.source import ARROW_SCHEMA, SCHEMA_DDL

__all__ = ["SyntheticDataSource", "body_of", "template_batch"]

#: option defaults: the reader's queues per topic in spark_io and its rows per Arrow batch
PARTITIONS = 8
BATCH_ROWS = 1024


def body_of(size: int) -> bytes:
    """The ``size``-byte body the benchmarks send (the same bytes every time)."""
    return bytes((i * 37 + 11) % 256 for i in range(size))


@dataclass(frozen=True)
class SyntheticPartition(InputPartition):
    index: int
    rows: int
    body_size: int
    batch_rows: int


def template_batch(n: int, body_size: int, index: int) -> Any:
    """``n`` rows in ARROW_SCHEMA that look like the reader's (built once per partition)."""
    import pyarrow as pa

    now_us = int(time.time() * 1e6)
    body = body_of(body_size)
    return pa.RecordBatch.from_pydict({
        "topic": ["bench-synthetic"] * n,
        "broker": ["broker-a"] * n,
        "queueId": [index] * n,
        "queueOffset": list(range(n)),
        "messageId": [f"0A000001{index:08X}{i:016X}" for i in range(n)],
        "tag": ["TagA"] * n,
        "keys": [[f"order-{i}"] for i in range(n)],
        "body": [body] * n,
        "properties": [[("region", "eu-west-1")]] * n,
        "bornTimestamp": [now_us] * n,
        "storeTimestamp": [now_us] * n,
        "bornHost": ["127.0.0.1:40000"] * n,
        "storeHost": ["127.0.0.1:10911"] * n,
    }, schema=ARROW_SCHEMA)


class SyntheticStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``{"offset": rows}``; each batch split into ``partitions`` ranges."""

    def __init__(self, rows: int, body_size: int, partitions: int, batch_rows: int) -> None:
        self.rows, self.body_size, self.parts, self.batch_rows = rows, body_size, partitions, batch_rows

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        return {"offset": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[SyntheticPartition]:
        total = int(end["offset"]) - int(start["offset"])
        per = [total // self.parts + (1 if i < total % self.parts else 0) for i in range(self.parts)]
        return [SyntheticPartition(i, n, self.body_size, self.batch_rows) for i, n in enumerate(per) if n]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SyntheticPartition):
            raise TypeError(f"not a synthetic partition: {partition!r}")
        full = template_batch(partition.batch_rows, partition.body_size, partition.index)
        left = partition.rows
        while left > 0:
            k = min(left, partition.batch_rows)
            yield full if k == partition.batch_rows else full.slice(0, k)
            left -= k

    def commit(self, end: dict) -> None:
        pass


class SyntheticDataSource(DataSource):
    """``format("rmqbench_synthetic")``: options rows, bodySize (100), partitions (8), batchRows (1024)."""

    @classmethod
    def name(cls) -> str:
        return "rmqbench_synthetic"

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        o = self.options
        return SyntheticStreamReader(int(o["rows"]), int(o.get("bodySize", 100)), int(o.get("partitions", PARTITIONS)),
                                     int(o.get("batchRows", BATCH_ROWS)))
