"""The latency suite's floor: a trivial Python streaming data source whose rows appear with the
clock, so the time from a row's appearing to the sink is Spark's own (the Python data source
path, the micro-batch loop, the foreachBatch sink) and nothing else's.

``format("rmqbench_clock")`` has the schema ``id BIGINT, sent_us BIGINT`` and one partition per
micro-batch. Rows appear at ``rate`` per second from the moment the driver writes a start time
(microseconds since the epoch, as text) into the file ``control``: row ``i`` becomes available
at ``start + i / rate`` and carries that instant as ``sent_us``, its "send time". Before the file
exists the source is empty; after ``total`` rows it stays at ``total``. Spark's Python workers
import this module by name (the latency suite puts the repository on their PYTHONPATH).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

__all__ = ["SCHEMA", "ClockDataSource"]

SCHEMA = "id BIGINT, sent_us BIGINT"


@dataclass(frozen=True)
class ClockPartition(InputPartition):
    start: int  # first row id
    end: int  # last row id + 1
    start_us: int  # when row 0 became available
    rate: float


class ClockStreamReader(DataSourceStreamReader):
    """Offsets ``{"offset": rows available}``; each batch one range of row ids."""

    def __init__(self, rate: float, total: int, control: str) -> None:
        self.rate, self.total, self.control = rate, total, control
        self.start_us: int | None = None

    def _started(self) -> int | None:
        if self.start_us is None:
            try:
                with open(self.control) as f:
                    self.start_us = int(f.read().strip())
            except (OSError, ValueError):  # not written yet (or being written)
                return None
        return self.start_us

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        t0 = self._started()
        if t0 is None:
            return {"offset": 0}
        # row i is available from t0 + i / rate on: rows 0..floor(elapsed * rate) are
        available = int((time.time_ns() // 1000 - t0) * self.rate / 1e6) + 1
        return {"offset": max(0, min(self.total, available))}

    def partitions(self, start: dict, end: dict) -> list[ClockPartition]:
        t0 = self._started()
        s, e = int(start["offset"]), int(end["offset"])
        return [ClockPartition(s, e, t0 or 0, self.rate)] if e > s else []

    def read(self, partition: InputPartition) -> Iterator[tuple[int, int]]:
        if not isinstance(partition, ClockPartition):
            raise TypeError(f"not a clock partition: {partition!r}")
        step = 1e6 / partition.rate
        for i in range(partition.start, partition.end):
            yield i, partition.start_us + int(i * step)

    def commit(self, end: dict) -> None:
        pass


class ClockDataSource(DataSource):
    """``format("rmqbench_clock")``: options rate (rows/s), total (rows), control (the file the
    start time appears in)."""

    @classmethod
    def name(cls) -> str:
        return "rmqbench_clock"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        o = self.options
        return ClockStreamReader(float(o["rate"]), int(o["total"]), str(o["control"]))
