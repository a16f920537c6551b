"""TLS end to end, on the embedded broker and on Apache RocketMQ 5.5.0 started with
``tls.server.mode=enforcing`` (name server, broker and proxy: one start for the module), with a
CA made for the test (tests/tls_support.py): the Spark reader and writer over remoting and gRPC,
the CLI, and the failures an operator meets (plaintext against TLS, TLS against plaintext, an
untrusted certificate, a certificate for another name, a missing client certificate), each
at once and saying what to change."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from brokers import settles_at, skip_or_fail, wait_for
from real_rocketmq import NEWEST, RealRocketMQ, java_available, provision
from rocketmq_spark import EmbeddedBroker
from rocketmq_spark.client import ClientConfig, RemotingClient, connect, retry
from rocketmq_spark.errors import OptionError, TlsError
from rocketmq_spark.tls import ServerTls, TlsConfig
from tls_support import Pki

pytestmark = [pytest.mark.spark, pytest.mark.integration]

CLI = [sys.executable, "-m", "rocketmq_spark.cli"]


@dataclass
class Cluster:
    """A TLS-only broker: its name server and gRPC endpoint, and a TLS admin client."""

    kind: str
    namesrv_addr: str
    grpc_endpoint: str
    real: RealRocketMQ | None = None

    def create_topic(self, topic: str, tls: TlsConfig, queues: int = 2) -> str:
        c = RemotingClient(self.namesrv_addr, ClientConfig(tls=tls))
        try:
            c.create_topic(topic, queues=queues)
        finally:
            c.close()
        if self.real is not None:
            self.real.topic_route_ready(topic)
        return topic

    def settles_at(self, topic: str, tls: TlsConfig, expected: int) -> int:
        """How many messages ``topic`` holds once it holds ``expected`` (brokers.settles_at, over TLS)."""
        c = RemotingClient(self.namesrv_addr, ClientConfig(tls=tls))
        try:
            return settles_at(c, topic, expected)
        finally:
            c.close()


@pytest.fixture(scope="module")
def tls_embedded(pki: Pki) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(tls=ServerTls(pki.server_cert, pki.server_key)) as mq:
        yield mq


@pytest.fixture(scope="module")
def tls_real(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRocketMQ]:
    """Apache RocketMQ 5.5.0 with every port TLS-only: the servers' certificate from
    tls.server.certPath/keyPath (test mode off, else each makes a self-signed one), their own
    clients (broker to name server, proxy to both, mqadmin) on TLS with tls.enable, the
    proxy's gRPC port on the same certificate (tlsTestModeEnable/tlsCertPath/tlsKeyPath)."""
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    props = {"tls.server.mode": "enforcing", "tls.enable": "true", "tls.test.mode.enable": "false",
             "tls.server.certPath": pki.server_cert, "tls.server.keyPath": pki.server_key,
             # mutual TLS where a client offers a certificate (checked against the test CA); the
             # other tests' clients offer none ("require" would refuse them all)
             "tls.server.need.client.auth": "optional", "tls.server.trustCertPath": pki.ca,
             # the default /etc/rocketmq/tls.properties must not change what the test sets
             "tls.config.file": str(tmp_path_factory.mktemp("no-tls-file") / "absent.properties")}
    rmq = RealRocketMQ(provision(NEWEST), tmp_path_factory.mktemp("rocketmq-tls"), version=NEWEST,
                       system_properties=props,
                       proxy_config={"tlsTestModeEnable": False, "tlsCertPath": pki.server_cert,
                                     "tlsKeyPath": pki.server_key},
                       client_config=ClientConfig(tls=TlsConfig(ca_file=pki.ca)))
    rmq.start()
    try:
        yield rmq
    finally:
        rmq.stop(grace_s=5)


@pytest.fixture(params=["embedded", "real"])
def cluster(request: pytest.FixtureRequest) -> Cluster:
    if request.param == "embedded":
        mq: EmbeddedBroker = request.getfixturevalue("tls_embedded")
        assert mq.grpc_endpoint is not None
        return Cluster("embedded", mq.namesrv_addr, mq.grpc_endpoint)
    rmq: RealRocketMQ = request.getfixturevalue("tls_real")
    return Cluster("real", rmq.namesrv_addr, rmq.grpc_endpoint, rmq)


@pytest.fixture()
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses of the clients' retry loop (client.retry._sleep, their only wait before asking
    again), recorded instead of slept: a refused or misconfigured connection fails on its first
    attempt, with none (a count, where a bound on the time taken could fail on a busy machine)."""
    pauses: list[float] = []
    monkeypatch.setattr(retry, "_sleep", pauses.append)
    return pauses


def _tls_opts(pki: Pki, **extra: str) -> dict[str, str]:
    return {"tls": "true", "tlsCaFile": pki.ca, **extra}


def _bodies(df) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(bytes(r.body).decode() for r in df.select("body").collect())


# -- Spark over TLS -------------------------------------------------------------------------


def _refused(client, call, error: type[Exception], match: str) -> None:  # type: ignore[no-untyped-def]
    """``call(client)`` raises ``error`` matching ``match``; the client is closed either way."""
    try:
        with pytest.raises(error, match=match):
            call(client)
    finally:
        client.close()


def test_spark_batch_write_and_read_over_remoting_tls(spark, cluster: Cluster, pki: Pki, tmp_path: Path) -> None:
    topic = cluster.create_topic(f"TLS_RT_{cluster.kind.upper()}", TlsConfig(ca_file=pki.ca))
    opts = {"namesrvAddr": cluster.namesrv_addr, "topic": topic, **_tls_opts(pki)}
    rows = [(f"m{i}",) for i in range(40)]
    spark.createDataFrame(rows, "body STRING").write.mode("append").format("rocketmq").options(**opts).save()
    assert cluster.settles_at(topic, TlsConfig(ca_file=pki.ca), len(rows)) == len(rows)
    back = spark.read.format("rocketmq").options(**opts).load()
    assert _bodies(back) == sorted(r[0] for r in rows)
    # a stream with a consumer group: its offsets are read from and committed to the broker over TLS
    group = f"tls_etl_{cluster.kind}"
    q = (spark.readStream.format("rocketmq").options(**opts).option("consumerGroup", group)
         .option("startingOffsets", "earliest").load().selectExpr("CAST(body AS STRING) AS body")
         .writeStream.format("memory").queryName(f"tls_stream_{cluster.kind}").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert spark.table(f"tls_stream_{cluster.kind}").count() == len(rows)
    c = RemotingClient(cluster.namesrv_addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca)))
    try:
        queues = c.message_queues(topic)

        def committed() -> int:
            return sum(v or 0 for v in c.query_consumer_offsets(group, queues).values())

        wait_for(lambda: committed() == len(rows), lambda: f"{committed()} of {len(rows)} offsets committed")
    finally:
        c.close()


def test_spark_write_over_grpc_tls(spark, cluster: Cluster, pki: Pki) -> None:
    """The writer over gRPC (the embedded broker's endpoint; the real proxy's), read back over
    remoting TLS (released proxies serve no pulls over gRPC) and, on the embedded broker, gRPC."""
    topic = cluster.create_topic(f"TLS_GRPC_{cluster.kind.upper()}", TlsConfig(ca_file=pki.ca))
    rows = [(f"g{i}",) for i in range(20)]
    (spark.createDataFrame(rows, "body STRING").write.mode("append").format("rocketmq")
     .options(endpoints=cluster.grpc_endpoint, topic=topic, **_tls_opts(pki)).save())
    assert cluster.settles_at(topic, TlsConfig(ca_file=pki.ca), len(rows)) == len(rows)
    back = spark.read.format("rocketmq").options(namesrvAddr=cluster.namesrv_addr, topic=topic, **_tls_opts(pki))
    assert _bodies(back.load()) == sorted(r[0] for r in rows)
    if cluster.kind == "embedded":
        over_grpc = spark.read.format("rocketmq").options(endpoints=cluster.grpc_endpoint, topic=topic,
                                                          **_tls_opts(pki)).load()
        assert _bodies(over_grpc) == sorted(r[0] for r in rows)


# -- refusals -----------------------------------------------------------------------------------


def test_plaintext_client_is_refused_at_once_saying_tls_is_required(spark, cluster: Cluster,
                                                                    pauses: list[float]) -> None:
    c = RemotingClient(cluster.namesrv_addr)
    try:
        with pytest.raises(TlsError, match=r"requires TLS.*set tls=true") as ei:
            c.topic_list()
    finally:
        c.close()
    assert cluster.namesrv_addr in str(ei.value)
    _refused(connect((), endpoints=cluster.grpc_endpoint),
             lambda c: c.message_queues("TLS_ANY"), TlsError,
             r"requires TLS.*set tls=true")
    assert pauses == []
    with pytest.raises(Exception, match=r"requires TLS") as ei:
        spark.read.format("rocketmq").options(namesrvAddr=cluster.namesrv_addr, topic="TLS_ANY").load().collect()
    assert "set tls=true" in str(ei.value)


def test_untrusted_certificate_fails_verification_naming_tls_ca_file(cluster: Cluster, pki: Pki,
                                                                     pauses: list[float]) -> None:
    for tls in (TlsConfig(ca_file=pki.other_ca), TlsConfig()):  # another CA; the system's (knows no test CA)
        _refused(RemotingClient(cluster.namesrv_addr, ClientConfig(tls=tls)),
                 lambda c: c.topic_list(), TlsError,
                 r"certificate verify failed.*set tlsCaFile")
        assert pauses == []
    _refused(connect((), endpoints=cluster.grpc_endpoint, tls=TlsConfig(ca_file=pki.other_ca)),
             lambda c: c.message_queues("TLS_ANY"), TlsError,
             r"certificate verify failed.*tlsCaFile")


def test_a_certificate_for_another_name_fails_hostname_verification(pki: Pki) -> None:
    with EmbeddedBroker(tls=ServerTls(pki.wrong_name_cert, pki.wrong_name_key)) as mq:
        assert mq.grpc_endpoint is not None
        _refused(RemotingClient(mq.namesrv_addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca))),
                 lambda c: c.topic_list(), TlsError,
                 r"does not name the host.*tlsVerifyHostname=false")
        _refused(connect((), endpoints=mq.grpc_endpoint, tls=TlsConfig(ca_file=pki.ca)),
                 lambda c: c.message_queues("TLS_ANY"), TlsError,
                 r"certificate verify failed")
        # the operator's way out over remoting: the CA still verifies the chain
        lax = RemotingClient(mq.namesrv_addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca, verify_hostname=False)))
        try:
            assert isinstance(lax.topic_list(), list)
        finally:
            lax.close()
        with pytest.raises(OptionError, match="tlsVerifyHostname"):
            connect((), endpoints=mq.grpc_endpoint, tls=TlsConfig(ca_file=pki.ca, verify_hostname=False))


def test_tls_client_against_a_plaintext_broker_says_it_does_not_speak_tls(pki: Pki, pauses: list[float]) -> None:
    with EmbeddedBroker() as mq:
        assert mq.grpc_endpoint is not None
        _refused(RemotingClient(mq.namesrv_addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca))),
                 lambda c: c.topic_list(), TlsError,
                 r"does not speak TLS.*set tls=false")
        _refused(connect((), endpoints=mq.grpc_endpoint, tls=TlsConfig(ca_file=pki.ca)),
                 lambda c: c.message_queues("TLS_ANY"), TlsError,
                 r"TLS handshake failed.*set tls=false")
        assert pauses == []


def test_mutual_tls_on_the_embedded_broker(spark, pki: Pki) -> None:
    with EmbeddedBroker(tls=ServerTls(pki.server_cert, pki.server_key, client_ca_file=pki.ca)) as mq:
        assert mq.grpc_endpoint is not None
        _refused(RemotingClient(mq.namesrv_addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca))),
                 lambda c: c.topic_list(), TlsError,
                 r"tlsCertFile and tlsKeyFile")
        _refused(connect((), endpoints=mq.grpc_endpoint, tls=TlsConfig(ca_file=pki.ca)),
                 lambda c: c.message_queues("TLS_ANY"), TlsError,
                 r"tlsCertFile")
        mine = TlsConfig(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
        g = connect((), endpoints=mq.grpc_endpoint, tls=mine)
        try:
            assert g.message_queues("TLS_MTLS_GRPC")
        finally:
            g.close()
        opts = {"namesrvAddr": mq.namesrv_addr, "topic": "TLS_MTLS",
                **_tls_opts(pki, tlsCertFile=pki.client_cert, tlsKeyFile=pki.client_key)}
        spark.createDataFrame([("a",), ("b",)], "body STRING").write.mode("append").format("rocketmq") \
            .options(**opts).save()
        assert _bodies(spark.read.format("rocketmq").options(**opts).load()) == ["a", "b"]


def test_mutual_tls_on_apache_rocketmq(spark, pki: Pki, tls_real: RealRocketMQ) -> None:
    # the name server and broker ask for a client certificate (tls.server.need.client.auth):
    # the client offers its own, signed by the CA they trust, and reads and writes as ever
    mine = _tls_opts(pki, tlsCertFile=pki.client_cert, tlsKeyFile=pki.client_key)
    real = Cluster("real", tls_real.namesrv_addr, tls_real.grpc_endpoint, tls_real)
    topic = real.create_topic("TLS_MTLS_REAL", TlsConfig(ca_file=pki.ca))
    opts = {"namesrvAddr": tls_real.namesrv_addr, "topic": topic, **mine}
    spark.createDataFrame([("a",), ("b",)], "body STRING").write.mode("append").format("rocketmq") \
        .options(**opts).save()
    assert real.settles_at(topic, TlsConfig(ca_file=pki.ca), 2) == 2
    assert _bodies(spark.read.format("rocketmq").options(**opts).load()) == ["a", "b"]
    # (a certificate of another CA is not refused under "optional": a Java TLS server that only
    # asks for one takes a certificate that does not verify as none, so refusals are seen with
    # "require" only, which the embedded broker's mutual TLS test covers)


def test_a_broker_registers_over_tls_with_a_name_server_of_another_process(pki: Pki, tmp_path: Path) -> None:
    """The broker's own connections (REGISTER_BROKER to the name servers of --namesrv) speak TLS
    too: ``namesrv`` and ``broker --namesrv`` as two processes, both TLS only."""
    server_tls = ["--tls-cert-file", pki.server_cert, "--tls-key-file", pki.server_key]
    ns = subprocess.Popen([*CLI, "namesrv", "--port", "0", *server_tls], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    broker = None
    try:
        assert ns.stdout is not None
        addr = json.loads(ns.stdout.readline())["namesrv"]
        broker = subprocess.Popen([*CLI, "broker", "--data-dir", str(tmp_path / "data"), "--namesrv", addr,
                                   "--broker-port", "0", "--grpc-port", "-1", *server_tls, "--tls-ca-file", pki.ca],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert broker.stdout is not None
        broker_addr = json.loads(broker.stdout.readline())["broker"]
        c = RemotingClient(addr, ClientConfig(tls=TlsConfig(ca_file=pki.ca)))
        try:
            wait_for(lambda: c.cluster_brokers().get("broker-a") == broker_addr,
                     lambda: f"broker-a at {broker_addr} in the name server's list {c.cluster_brokers()}")
        finally:
            c.close()
    finally:
        for proc in (broker, ns):
            if proc is not None:
                proc.terminate()
                proc.wait(30)


# -- the command line ------------------------------------------------------------------------


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_cli_over_tls_and_its_plaintext_refusal(cluster: Cluster, pki: Pki) -> None:
    topic = f"TLS_CLI_{cluster.kind.upper()}"
    tls = ["--tls", "--tls-ca-file", pki.ca]
    made = _run("topic", "create", topic, "--queues", "2", "-n", cluster.namesrv_addr, *tls)
    assert made.returncode == 0, made.stderr
    if cluster.real is not None:
        cluster.real.topic_route_ready(topic)
    sent = _run("produce", "-t", topic, "--count", "5", "-n", cluster.namesrv_addr, *tls)
    assert sent.returncode == 0, sent.stderr
    assert cluster.settles_at(topic, TlsConfig(ca_file=pki.ca), 5) == 5
    plain = _run("topic", "list", "-n", cluster.namesrv_addr)
    assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1, plain.stderr
    assert "requires TLS" in plain.stderr and "--tls" in plain.stderr
    missing = _run("topic", "list", "-n", cluster.namesrv_addr, "--tls", "--tls-ca-file", "/nonexistent/ca.pem")
    assert missing.returncode == 2 and "--tls-ca-file /nonexistent/ca.pem: no such file" in missing.stderr


def test_cli_broker_serves_tls(pki: Pki, tmp_path: Path) -> None:
    proc = subprocess.Popen([*CLI, "broker", "--data-dir", str(tmp_path / "data"), "--namesrv-port", "0",
                             "--broker-port", "0", "--grpc-port", "0", "--tls-cert-file", pki.server_cert,
                             "--tls-key-file", pki.server_key], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["tls"] is True
        listed = _run("topic", "list", "-n", first["namesrv"], "--tls", "--tls-ca-file", pki.ca)
        assert listed.returncode == 0, listed.stderr
        g = connect((), endpoints=first["grpc"], tls=TlsConfig(ca_file=pki.ca))
        try:
            assert g.message_queues("TLS_CLI_BROKER")
        finally:
            g.close()
    finally:
        proc.terminate()
        proc.wait(30)
    bad = _run("broker", "--data-dir", str(tmp_path / "d2"), "--tls-cert-file", pki.server_cert)
    assert bad.returncode == 2 and "--tls-key-file is missing" in bad.stderr
