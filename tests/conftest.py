"""Shared fixtures: the brokers (embedded, and the real Apache RocketMQ), transports, clients.

A module runs its tests on both brokers by setting ``BROKERS = ("embedded", "real")`` (see
brokers.py); without it ``broker`` is an EmbeddedBroker as before. Naming the parity kinds
too (``*PARITY_KINDS``) runs the tests marked ``parity`` on the older releases of the matrix.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

# Spark's Python workers must run this interpreter, not whatever python3 is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Spark's Python processes load pyspark from its installation, not compiled anew from its zip each
# time (see worker_site/sitecustomize.py): the same code, half a second less per process started
os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in (
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_site"),
    *os.environ.get("PYTHONPATH", "").split(os.pathsep)) if p))

from brokers import ALL_TRANSPORTS, READ_TRANSPORTS, Target, Transport, parity_release, skip_or_fail
from real_rocketmq import VERSION, RealCluster, RealRocketMQ, java_available, provision
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from tls_support import Pki, make_pki

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="reliability tests in their long version (more kills, more frames, longer outages)")


def pytest_configure(config: pytest.Config) -> None:
    # module-level settings (hypothesis example counts) read this; set before test modules import
    if config.getoption("--soak"):
        os.environ["RMQ_SPARK_SOAK"] = "1"


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    """True under ``pytest --soak``: reliability tests scale their rounds up."""
    return bool(request.config.getoption("--soak"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``broker`` over the module's BROKERS, ``transport`` over every transport; the pairs a
    broker does not serve are deselected in pytest_collection_modifyitems (not skipped)."""
    kinds = getattr(metafunc.module, "BROKERS", None)
    if kinds and "broker" in metafunc.fixturenames:
        metafunc.parametrize("broker", list(kinds), indirect=True, scope="module")
    if "transport" in metafunc.fixturenames:
        metafunc.parametrize("transport", list(ALL_TRANSPORTS), indirect=True)


def _runs_on(item: pytest.Item, kind: str) -> bool:
    """Whether ``item`` runs on the broker ``kind``: a ``brokers`` marker naming the kind says
    yes; a parity kind (``real-4.9.7``) runs the tests marked ``parity`` only, and a ``brokers``
    marker narrows those as it narrows ``real``."""
    only = item.get_closest_marker("brokers")  # @pytest.mark.brokers("embedded")
    if only is not None and kind in only.args:
        return True
    if parity_release(kind) is not None:
        if item.get_closest_marker("parity") is None:
            return False
        kind = "real"
    return only is None or kind in only.args


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        kind = spec.params.get("broker", "embedded") if spec else "embedded"
        name = spec.params.get("transport") if spec else None
        table = getattr(item.module, "TRANSPORTS", READ_TRANSPORTS)
        marker = item.get_closest_marker("transports")  # @pytest.mark.transports(real=("remoting",))
        if marker is not None:
            table = {**table, **marker.kwargs}
        wrong_kind = spec is not None and "broker" in spec.params and not _runs_on(item, kind)
        # a parity release runs without a proxy: remoting only
        served = ("remoting",) if parity_release(kind) is not None else table.get(kind, ())
        (drop if wrong_kind or (name is not None and name not in served) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local[2] SparkSession for the whole session: the Spark tests and the fault suite's
    own Spark tests (tests/faults) share it, one JVM start instead of one per directory."""
    from pyspark.sql import SparkSession

    import rocketmq_spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("rocketmq-spark-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    rocketmq_spark.register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def real_rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRocketMQ]:
    """Apache RocketMQ 5.x (name server, broker, proxy) from Maven Central, one per session."""
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(), tmp_path_factory.mktemp("rocketmq-real"))
    rmq.start()
    try:
        yield rmq
    finally:
        rmq.stop(grace_s=5)


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """Apache RocketMQ (the suite's release) as a production cluster: one name server, broker
    groups ``broker-a`` (a SYNC_MASTER with a slave) and ``broker-b``, no proxy; one per session
    (four JVMs), shared by the cluster tests (test_cluster.py) and the master/slave tests. A
    test that kills a member starts it again before it ends."""
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    cluster = RealCluster(provision(VERSION), tmp_path_factory.mktemp("rocketmq-cluster"), version=VERSION,
                          slaves=("broker-a",))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker | Target]:
    """One embedded broker per test module (temp data dir, ephemeral ports); in a module with
    BROKERS, a :class:`Target`: that embedded broker, the session's real one, or a parity
    release (``real-4.9.7``: a name server and a broker, no proxy) started for this module."""
    kind = getattr(request, "param", None)
    if kind == "real":
        yield Target.of_real(request.getfixturevalue("real_rocketmq"))
        return
    release = parity_release(kind) if kind is not None else None
    if release is not None:
        missing = java_available()
        if missing:
            skip_or_fail(f"Apache RocketMQ {release} cannot run here: {missing}")
        workdir = request.getfixturevalue("tmp_path_factory").mktemp(f"rocketmq-{release}")
        rmq = RealRocketMQ(provision(release), workdir, version=release, proxy=False)
        rmq.start()
        try:
            yield Target.of_real(rmq)
        finally:
            rmq.stop(grace_s=3)  # a throw-away store: no need to wait for a clean shutdown
        return
    # property filters on, as the session's Apache RocketMQ has them (enablePropertyFilter=true)
    with EmbeddedBroker(enable_property_filter=True) as mq:
        yield mq if kind is None else Target.of_embedded(mq)


@pytest.fixture()
def transport(request: pytest.FixtureRequest, broker: EmbeddedBroker | Target) -> Transport:
    """Remoting (namesrvAddr) or gRPC (endpoints) to ``broker``."""
    target = broker if isinstance(broker, Target) else Target.of_embedded(broker)
    return Transport.over(request.param, target)


@pytest.fixture()
def client(broker: EmbeddedBroker) -> Iterator[RemotingClient]:
    c = RemotingClient(broker.namesrv_addr)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture()
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test."""
    name = request.node.name.replace("[", "_").replace("]", "").replace("-", "_")
    return f"T_{name}"[:100]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA with server (127.0.0.1/localhost, and a wrong name) and client
    certificates, made with the openssl command line (tests/tls_support.py)."""
    return make_pki(tmp_path_factory.mktemp("pki"))
