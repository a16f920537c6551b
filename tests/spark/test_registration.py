"""rocketmq_spark.register(): the registered source's environment map survives concurrent queries.

Spark 4.x gives every streaming query of a Python data source the map of the registered class
(``PythonStreamingSourceRunner.init`` puts worker settings into it on the driver, one query
thread each) and serializes that same map into every read task. A plain map torn by two query
threads made every task of the source fail to deserialize (``java.io.OptionalDataException``,
seen once in the fault suite). These tests work on the object Spark serializes, in the JVM.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

import rocketmq_spark
from rocketmq_spark.datasource import RocketMQDataSource

pytestmark = [pytest.mark.spark]

THREADS, KEYS = 4, 150


def _registered(spark: Any) -> Any:
    return spark._jsparkSession.sessionState().dataSourceManager().lookupDataSource("rocketmq")


def _round_trip(jvm: Any, obj: Any) -> Any:
    """Java-serializes ``obj`` and reads it back, as a task binary is."""
    out = jvm.java.io.ByteArrayOutputStream()
    stream = jvm.java.io.ObjectOutputStream(out)
    stream.writeObject(obj)
    stream.close()
    return jvm.java.io.ObjectInputStream(jvm.java.io.ByteArrayInputStream(out.toByteArray())).readObject()


def test_registered_environment_takes_concurrent_puts_while_it_is_serialized(spark) -> None:
    rocketmq_spark.register(spark)
    jvm = spark.sparkContext._jvm
    source = _registered(spark)
    env = source.dataSourceCls().envVars()
    assert env.getClass().getName() == "java.util.concurrent.ConcurrentHashMap"
    before = env.size()
    # every runner puts the same names (SPARK_LOCAL_DIRS, ...): the threads share half the keys
    shared = [f"RMQ_REGISTRATION_TEST_{i}" for i in range(KEYS)]
    names = shared + [f"RMQ_REGISTRATION_TEST_{t}_{i}" for t in range(THREADS) for i in range(KEYS)]
    failures: list[BaseException] = []
    sizes: list[tuple[int, int]] = []
    done = threading.Event()

    def put(t: int) -> None:
        try:
            for i in range(KEYS):
                env.put(shared[i], str(t))
                env.put(f"RMQ_REGISTRATION_TEST_{t}_{i}", str(i))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(exc)

    def serialize() -> None:
        try:
            while not done.is_set():
                copy = _round_trip(jvm, source).dataSourceCls().envVars()
                sizes.append((copy.size(), copy.keySet().toArray().__len__()))
        except BaseException as exc:  # noqa: BLE001
            failures.append(exc)

    writers = [threading.Thread(target=put, args=(t,)) for t in range(THREADS)]
    reader = threading.Thread(target=serialize)
    reader.start()
    try:
        for w in writers:
            w.start()
        for w in writers:
            w.join(120)
    finally:
        done.set()
        reader.join(120)
        after = env.size()
        for name in names:  # the session is shared: its workers' environment is left as found
            env.remove(name)
    assert not failures, failures
    assert sizes, "the map was never serialized while the puts ran"
    assert all(size == entries for size, entries in sizes), sizes
    assert after == before + len(names)
    assert env.size() == before


def test_registered_environment_keeps_the_worker_settings(spark) -> None:
    """The copy holds what pyspark's own registration would give Spark's Python workers."""
    from pyspark.sql.udf import _wrap_function

    rocketmq_spark.register(spark)
    env = _registered(spark).dataSourceCls().envVars()
    plain = _wrap_function(spark.sparkContext, RocketMQDataSource).envVars()
    for key in plain.keySet().toArray():
        assert env.get(key) == plain.get(key), key


class _ConnectLike:
    """A session without a SparkContext (Spark Connect): only ``dataSource.register`` works."""

    def __init__(self) -> None:
        self.registered: list[type] = []
        self.dataSource = self

    @property
    def sparkContext(self) -> Any:
        raise RuntimeError("no SparkContext in a Spark Connect session")

    def register(self, cls: type) -> None:
        self.registered.append(cls)


def test_register_falls_back_to_pyspark_when_the_jvm_is_out_of_reach(caplog) -> None:
    session = _ConnectLike()
    with caplog.at_level(logging.WARNING, logger="rocketmq_spark.datasource"):
        rocketmq_spark.register(session)
    assert session.registered == [RocketMQDataSource]
    assert "no SparkContext in a Spark Connect session" in caplog.text
    assert "not thread-safe" in caplog.text
