"""The Spark data source ``rocketmq``: readers from :mod:`.source`, writers from :mod:`.sink`."""

from __future__ import annotations

import logging
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

logger = logging.getLogger(__name__)


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
        from .sink import RocketMQBatchWriter, WriterOptions, check_columns  # not in a reader's processes

        _no_overwrite(overwrite)
        opts = WriterOptions.parse(self.options)
        check_columns(schema, opts)
        return RocketMQBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """As :meth:`writer`; delivery=exactly-once also needs a checkpointLocation."""
        from .sink import RocketMQStreamWriter, WriterOptions, check_columns

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
    """Make ``format("rocketmq")`` available in ``spark``.

    The class is registered with a thread-safe environment map. Spark 4.x hands the map of a
    registered Python data source to every streaming query that reads it: each query's
    driver-side source runner puts its worker settings into that one map
    (``PythonStreamingSourceRunner.init``) while other queries' tasks serialize it. Two queries
    starting at once in one session could tear a plain map (its size no longer matching its
    entries), after which every task of the source failed to deserialize on every attempt
    (``java.io.OptionalDataException``). Where that cannot be built (another pyspark, Spark
    Connect), pyspark's own registration is used and a warning says so."""
    try:
        _register_thread_safe(spark)
    except Exception as exc:  # a private pyspark/py4j path: any failure falls back, said once
        logger.warning("rocketmq: registered through pyspark's own DataSource registration (%s: %s); "
                       "several streaming queries starting at once in this session share a map "
                       "that is not thread-safe", type(exc).__name__, exc)
        spark.dataSource.register(RocketMQDataSource)


def _register_thread_safe(spark: Any) -> None:
    """pyspark's ``spark.dataSource.register`` with the wrapped class's environment copied into a
    ``java.util.concurrent.ConcurrentHashMap``: puts from query threads cannot tear it, and it
    serializes consistently while they happen."""
    from pyspark.sql.udf import _wrap_function

    sc = spark.sparkContext
    jvm = sc._jvm
    wrapped = _wrap_function(sc, RocketMQDataSource)
    env = jvm.java.util.concurrent.ConcurrentHashMap(wrapped.envVars())
    func = jvm.org.apache.spark.api.python.SimplePythonFunction(
        wrapped.command(), env, wrapped.pythonIncludes(), wrapped.pythonExec(), wrapped.pythonVer(),
        wrapped.broadcastVars(), wrapped.accumulator())
    source = getattr(jvm, "org.apache.spark.sql.execution.datasources.v2.python.UserDefinedPythonDataSource")(func)
    spark._jsparkSession.dataSource().registerPython(RocketMQDataSource.name(), source)
