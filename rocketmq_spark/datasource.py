"""The Spark data source ``rocketmq``: readers from :mod:`.source`, writers from :mod:`.sink`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .errors import OptionError
from .options import parse_bool
from .sink import RocketMQBatchWriter, RocketMQStreamWriter, WriterOptions, check_columns
from .source import (
    RETRY_SCHEMA_DDL,
    SCHEMA_DDL,
    ReaderOptions,
    RocketMQBatchReader,
    RocketMQPushdownBatchReader,
    RocketMQStreamReader,
    asked_columns,
)

__all__ = ["RocketMQDataSource", "register"]


class RocketMQDataSource(DataSource):
    """``format("rocketmq")`` for spark.read/readStream and DataFrame.write/writeStream.

    Options are parsed when Spark asks for a reader or writer (on the driver); a missing,
    unknown or invalid option or column raises :class:`OptionError` naming it. Nothing here
    connects to a broker."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> str:
        """The reader's row schema (:data:`~rocketmq_spark.codec.arrow.SCHEMA_DDL`), with
        retryTopic and reconsumeTimes after it when includeRetryTopic is true."""
        raw = next((v for k, v in self.options.items() if k.lower() == "includeretrytopic"), "false")
        return RETRY_SCHEMA_DDL if parse_bool("includeRetryTopic", str(raw)) else SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        """``schema``: the row schema, or a user-given subset of its fields (only those are
        decoded); another field or type raises OptionError naming it."""
        opts = self._reader_options(schema, stream=False)
        return RocketMQPushdownBatchReader(opts) if opts.filter_pushdown else RocketMQBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RocketMQStreamReader(self._reader_options(schema, stream=True))

    def _reader_options(self, schema: StructType, *, stream: bool) -> ReaderOptions:
        opts = ReaderOptions.parse(self.options, stream=stream)
        columns = asked_columns(schema, opts.include_retry_topic)
        return replace(opts, columns=columns) if columns is not None else opts

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Append only: overwrite mode raises OptionError, as do options or columns the
        writer does not accept."""
        _no_overwrite(overwrite)
        opts = WriterOptions.parse(self.options)
        check_columns(schema, opts)
        return RocketMQBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """As :meth:`writer`; delivery=exactly-once also needs a checkpointLocation."""
        _no_overwrite(overwrite)
        opts = WriterOptions.parse(self.options)
        check_columns(schema, opts)
        if opts.exactly_once and not opts.checkpoint_location:
            raise OptionError("checkpointLocation", None, "delivery=exactly-once needs a checkpointLocation")
        return RocketMQStreamWriter(opts)


def _no_overwrite(overwrite: bool) -> None:
    """A topic is a log: nothing in it can be replaced (as Spark's Kafka sink says too)."""
    if overwrite:
        raise OptionError("mode", "overwrite", "a RocketMQ topic cannot be overwritten, only appended to: "
                                               "accepted save mode: append (.mode(\"append\"))")


def register(spark: Any) -> None:
    """Make ``format("rocketmq")`` available in ``spark``."""
    spark.dataSource.register(RocketMQDataSource)
