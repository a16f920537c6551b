"""TLS settings as options give them: parsed once, pickled to the executors with the task's
partition and the client config, files read where a connection opens (a missing one is a
TlsError naming the option). No sockets, no Spark session."""

from __future__ import annotations

import pickle

import pytest

from rocketmq_spark.client import ClientConfig
from rocketmq_spark.errors import TlsError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.options import tls_config
from rocketmq_spark.source.options import ReaderOptions
from rocketmq_spark.source.queue_range import QueueRange
from rocketmq_spark.tls import TlsConfig

HERE = __file__


def test_tls_is_off_unless_asked_and_its_settings_parse() -> None:
    assert tls_config({}) is None
    assert tls_config({"tls": "false"}) is None
    assert tls_config({"tls": "true"}) == TlsConfig()
    got = tls_config({"tls": "TRUE", "tlsCaFile": HERE, "tlsCertFile": HERE, "tlsKeyFile": HERE,
                      "tlsVerifyHostname": "false"})
    assert got == TlsConfig(ca_file=HERE, cert_file=HERE, key_file=HERE, verify_hostname=False)


def test_reader_options_are_case_insensitive_and_reach_the_task_partition() -> None:
    o = ReaderOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "TLS": "true", "tlscafile": HERE},
                            stream=False)
    assert o.tls == TlsConfig(ca_file=HERE)
    part = QueueRange(MessageQueue("t", "broker-a", 0), 0, 10, o.namesrv_addr, None, "", "*", 32, True, tls=o.tls)
    assert pickle.loads(pickle.dumps(part)).tls == TlsConfig(ca_file=HERE)


def test_client_config_pickles_its_tls_and_copies_keep_it() -> None:
    cfg = ClientConfig(tls=TlsConfig(ca_file=HERE))
    assert pickle.loads(pickle.dumps(cfg)).tls == TlsConfig(ca_file=HERE)
    assert cfg.with_credentials(None).tls == TlsConfig(ca_file=HERE)
    assert ClientConfig().with_tls(TlsConfig()).tls == TlsConfig()
    old = ClientConfig()
    state = old.__getstate__()
    del state["tls"]  # a config pickled before TLS existed
    fresh = ClientConfig.__new__(ClientConfig)
    fresh.__setstate__(state)
    assert fresh.tls is None


def test_a_file_gone_by_the_time_a_connection_opens_names_the_option(tmp_path) -> None:
    gone = str(tmp_path / "ca.pem")
    with pytest.raises(TlsError, match=r"tlsCaFile=.*ca\.pem.*no such file.*every Spark executor"):
        TlsConfig(ca_file=gone).context("127.0.0.1:9876")
    not_pem = tmp_path / "junk.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(TlsError, match=r"tlsCaFile=.*holds no PEM certificate"):
        TlsConfig(ca_file=str(not_pem)).context("127.0.0.1:9876")


def test_cert_and_key_go_together() -> None:
    with pytest.raises(ValueError, match="both or neither"):
        TlsConfig(cert_file=HERE)


def test_the_committer_takes_the_querys_tls_options_by_the_same_rules() -> None:
    from rocketmq_spark.checkpoints.committer import RocketMQOffsetCommitter
    from rocketmq_spark.errors import OptionError

    c = RocketMQOffsetCommitter("127.0.0.1:9876", "g", tls=True, tls_ca_file=HERE, tls_verify_hostname=False)
    try:
        assert c.client.config.tls == TlsConfig(ca_file=HERE, verify_hostname=False)
    finally:
        c.client.close()
    with pytest.raises(OptionError, match="tlsCaFile.*accepted only with tls=true"):
        RocketMQOffsetCommitter("127.0.0.1:9876", "g", tls_ca_file=HERE)
