"""ACL 1.0 request signing: the signature rule (golden vectors computed here with hmac/hashlib/
base64), a signed client against a broker with ACL on (every operation, the pipelined ones
included), refusals (unsigned, unknown key, wrong secret) answered NO_PERMISSION without retries
and without closing the connection, and secrets kept out of logs, reprs and errors."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import pickle
from collections.abc import Iterator

import pytest

from rocketmq_spark import EmbeddedBroker
from rocketmq_spark.broker.config import BrokerConfig
from rocketmq_spark.client import ClientConfig, Credentials, RemotingClient, connect
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.errors import AuthenticationError, NoPermissionError, OptionError
from rocketmq_spark.remoting.acl import sign_request, verify_request
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import RemotingCommand

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

AK = "rocketmq2"
SK = "S3cr3t-Sk-6c1f"  # distinctive: searched for in logs and reprs
TOKEN = "T0ken-9f2e"
BROKER_LOG = "rocketmq_spark.broker.remoting_service"  # where the broker logs a refused request


def _hmac_b64(secret: str, content: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), content, hashlib.sha1).digest()).decode()


# -- the signature rule ---------------------------------------------------------------


def test_signature_golden_vector_header_only() -> None:
    cmd = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "TopicTest", "queueId": "3"})
    sign_request(cmd, Credentials(AK, SK))
    # keys sorted: AccessKey < queueId < topic (uppercase sorts first); values only, no body
    content = b"rocketmq2" + b"3" + b"TopicTest"
    assert cmd.ext_fields["AccessKey"] == AK
    assert cmd.ext_fields["Signature"] == _hmac_b64(SK, content)
    assert "SecretKey" not in cmd.ext_fields and SK not in cmd.encode().decode("utf-8", "replace")


def test_signature_golden_vector_with_token_body_and_utf8() -> None:
    body = b"\x00\x01hello\xff"
    cmd = RemotingCommand(RequestCode.SEND_MESSAGE_V2, body=body,
                          ext_fields={"b": "Topic", "a": "PG", "i": "KEYS\x01k\u00e9y\x02"})
    sign_request(cmd, Credentials(AK, SK, TOKEN))
    # AccessKey, SecurityToken, a, b, i; then the body bytes
    content = (AK + TOKEN + "PG" + "Topic" + "KEYS\x01k\u00e9y\x02").encode("utf-8") + body
    assert cmd.ext_fields["SecurityToken"] == TOKEN
    assert cmd.ext_fields["Signature"] == _hmac_b64(SK, content)
    # a literal, so a change of the rule cannot hide behind the helper above
    literal = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields={"topic": "T", "queueId": "0"})
    sign_request(literal, Credentials("AK", "SK"))
    assert literal.ext_fields["Signature"] == _hmac_b64("SK", b"AK0T")


def test_signature_survives_the_wire_in_both_header_encodings() -> None:
    for serialize in (0, 1):
        cmd = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields={"topic": "T", "queueId": "1"},
                              body=b"x", serialize_type=serialize)
        sign_request(cmd, Credentials(AK, SK))
        decoded = RemotingCommand.decode(cmd.encode()[4:])
        assert verify_request(decoded, {AK: SK}) is None
        assert "mismatch" in (verify_request(decoded, {AK: "other"}) or "")
        decoded.ext_fields["topic"] = "U"  # tampered
        assert "mismatch" in (verify_request(decoded, {AK: SK}) or "")


def test_signing_does_not_touch_the_callers_dict() -> None:
    ext = {"topic": "T"}
    cmd = RemotingCommand(RequestCode.GET_MAX_OFFSET, ext_fields=ext)
    sign_request(cmd, Credentials(AK, SK))
    assert ext == {"topic": "T"}
    first = cmd.ext_fields["Signature"]
    sign_request(cmd, Credentials(AK, SK))  # re-signing (a retry) gives the same signature
    assert cmd.ext_fields["Signature"] == first


# -- against a broker with ACL on -------------------------------------------------------


@pytest.fixture(scope="module")
def acl_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(grpc_port=None, acl={AK: SK, "other": "other-secret"}) as mq:
        yield mq


def test_a_query_by_message_id_is_signed_with_its_flag_but_by_old_clients() -> None:
    # QUERY_MESSAGE's _UNIQUE_KEY_QUERY is no header field: clients up to 4.9.3 (request version
    # <= 399) signed the header's fields only, newer ones every extField; brokers check each so
    cmd = RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields={"topic": "T", "key": "k", "_UNIQUE_KEY_QUERY": "true"})
    sign_request(cmd, Credentials(AK, SK))
    assert verify_request(RemotingCommand.decode(cmd.encode()[4:]), {AK: SK}) is None
    old = RemotingCommand(RequestCode.QUERY_MESSAGE, ext_fields={"topic": "T", "key": "k"}, version=399)
    sign_request(old, Credentials(AK, SK))
    old.ext_fields["_UNIQUE_KEY_QUERY"] = "true"
    assert verify_request(RemotingCommand.decode(old.encode()[4:]), {AK: SK}) is None
    old.version = 435  # a newer client's request signed without the flag is refused
    assert "mismatch" in (verify_request(RemotingCommand.decode(old.encode()[4:]), {AK: SK}) or "")


@pytest.fixture()
def signed(acl_broker: EmbeddedBroker) -> Iterator[RemotingClient]:
    c = RemotingClient(acl_broker.namesrv_addr, credentials=Credentials(AK, SK))
    try:
        yield c
    finally:
        c.close()


def test_signed_client_does_everything(signed: RemotingClient, topic: str) -> None:
    signed.create_topic(topic, 2)
    qs = signed.message_queues(topic, refresh=True)
    assert len(qs) == 2
    r = signed.send(qs[0], b"one", "TAGS\x01a\x02")
    assert r.queue_offset == 0
    signed.send_batch(qs[1], [BatchEntry(b"b%d" % i) for i in range(5)])
    res = signed.pull(qs[1], 0, 32)
    assert [m.payload() for m in decode_records(res.body)] == [b"b%d" % i for i in range(5)]
    assert signed.max_offset(qs[1]) == 5 and signed.min_offset(qs[1]) == 0
    assert signed.search_offset(qs[1], 0) == 0
    # the pipelined paths (send_many) and the topic stats request
    assert signed.max_offsets(qs) == {qs[0]: 1, qs[1]: 5}
    assert signed.min_offsets(qs) == {qs[0]: 0, qs[1]: 0}
    assert signed.offset_ranges(qs) == {qs[0]: (0, 1), qs[1]: (0, 5)}
    signed.create_group("g_acl")
    assert signed.update_consumer_offsets("g_acl", {qs[0]: 1, qs[1]: 4}) == {}
    assert signed.query_consumer_offsets("g_acl", qs) == {qs[0]: 1, qs[1]: 4}
    signed.update_consumer_offset("g_acl", qs[1], 5)
    assert signed.query_consumer_offset("g_acl", qs[1]) == 5
    assert signed.consumer_ids("g_acl", signed.broker_addr(qs[0].broker)) == []
    assert topic in signed.topic_configs(signed.broker_addr(qs[0].broker))
    # QUERY_MESSAGE, by key and by message id (signed with its _UNIQUE_KEY_QUERY flag)
    signed.send(qs[0], b"keyed", "KEYS\x01k1\x02UNIQ_KEY\x01U-acl\x02")
    assert [m.body for m in signed.query_messages(topic, "k1")] == [b"keyed"] == [
        m.body for m in signed.query_messages(topic, "U-acl", unique=True)]


def test_offset_committer_listener_signs_its_commits(acl_broker: EmbeddedBroker, signed: RemotingClient,
                                                    topic: str, caplog: pytest.LogCaptureFixture) -> None:
    from rocketmq_spark import RocketMQOffsetCommitter

    signed.create_topic(topic, 2)
    signed.create_group("g_listener")
    qs = signed.message_queues(topic, refresh=True)
    good = RocketMQOffsetCommitter(acl_broker.namesrv_addr, "g_listener", topics=[topic], measure_lag=False,
                                   access_key=AK, secret_key=SK)
    try:
        good.commit({qs[0]: 3, qs[1]: 7})
        assert good.committed == {qs[0]: 3, qs[1]: 7}
        assert signed.query_consumer_offsets("g_listener", qs) == {qs[0]: 3, qs[1]: 7}
    finally:
        good.client.close()
    # a wrong secret: the commit is refused and raised at once (the next would be refused alike),
    # not kept for a retry, the secret never shown
    bad = RocketMQOffsetCommitter(acl_broker.namesrv_addr, "g_listener", topics=[topic], measure_lag=False,
                                  access_key=AK, secret_key="wrong-" + SK)
    try:
        with caplog.at_level(logging.WARNING), pytest.raises(AuthenticationError) as ei:
            bad.commit({qs[0]: 9})
        assert bad.committed == {} and bad.store.pending == {}
        assert ei.value.user == AK and "Group:g_listener" in ei.value.resource and "Update" in ei.value.action
        assert "signature mismatch" in str(ei.value) and SK not in str(ei.value) + caplog.text
        assert signed.query_consumer_offset("g_listener", qs[0]) == 3
    finally:
        bad.client.close()
    # the committer's credentials follow the options' rules: the error names the missing option
    with pytest.raises(ValueError, match="accessKey and secretKey must be given together") as ei:
        RocketMQOffsetCommitter(acl_broker.namesrv_addr, "g", access_key=AK)
    assert SK not in str(ei.value)


def test_security_token_is_signed_and_accepted(acl_broker: EmbeddedBroker, topic: str) -> None:
    c = RemotingClient(acl_broker.namesrv_addr, ClientConfig(credentials=Credentials(AK, SK, TOKEN)))
    try:
        c.create_topic(topic, 1)
        assert c.max_offset(c.message_queues(topic, refresh=True)[0]) == 0
    finally:
        c.close()


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == BROKER_LOG and "refused request" in r.getMessage()]


@pytest.mark.parametrize("creds, why", [
    (None, "not signed"),
    (Credentials(AK, "wrong-secret"), "signature mismatch"),
    (Credentials("nobody", SK), "unknown"),
], ids=["unsigned", "wrong_secret", "unknown_key"])
def test_bad_clients_get_no_permission_once_and_the_broker_keeps_serving(
        acl_broker: EmbeddedBroker, signed: RemotingClient, topic: str, caplog: pytest.LogCaptureFixture,
        creds: Credentials | None, why: str) -> None:
    signed.create_topic(topic, 2)
    qs = signed.message_queues(topic, refresh=True)
    bad = RemotingClient(acl_broker.namesrv_addr, ClientConfig(retries=5, credentials=creds))
    caplog.set_level(logging.WARNING, logger=BROKER_LOG)
    try:
        # the name server does not check signatures: routes resolve
        assert bad.message_queues(topic, refresh=True) == qs
        with pytest.raises(NoPermissionError) as ei:
            bad.max_offset(qs[0])
        err = ei.value
        assert err.code == 16 and not err.retriable
        assert err.address == acl_broker.broker_addr and f"max offset of {qs[0]}" in err.operation
        assert why in err.remark and why in str(err)
        assert len(_refusals(caplog)) == 1, "a refused request must not be retried"
        with pytest.raises(NoPermissionError, match="create topic"):
            bad.create_topic(topic, 2)
        with pytest.raises(NoPermissionError, match="send to"):
            bad.send(qs[0], b"x")
        with pytest.raises(NoPermissionError, match="pull of"):
            bad.pull(qs[0], 0)
        # pipelined: every queue's request is refused, none retried
        caplog.clear()
        with pytest.raises(NoPermissionError, match="max offset"):
            bad.max_offsets(qs)
        failures = bad.update_consumer_offsets("g_bad", {q: 1 for q in qs})
        assert set(failures) == set(qs) and all(isinstance(e, NoPermissionError) for e in failures.values())
        assert len(_refusals(caplog)) == 2 * len(qs)
        with pytest.raises(NoPermissionError):
            bad.offset_ranges(qs)  # stats refused, then the per-queue fallback refused too
        # the connection stays open, and a good client is served meanwhile
        assert not bad.connection(acl_broker.broker_addr).closed
        signed.send(qs[0], b"good")
        assert signed.max_offset(qs[0]) == 1
        assert signed.query_consumer_offset("g_bad", qs[0]) is None
    finally:
        bad.close()
    for r in _refusals(caplog):
        assert SK not in r and "wrong-secret" not in r


def test_check_back_answer_is_signed(acl_broker: EmbeddedBroker, signed: RemotingClient,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """END_TRANSACTION answering a check-back goes out through reply(): it must be signed too.
    A synchronous request after it on the same connection proves the broker has read it."""
    caplog.set_level(logging.WARNING, logger=BROKER_LOG)
    addr = acl_broker.broker_addr
    end = {"producerGroup": "PG", "tranStateTableOffset": "0", "commitLogOffset": "0", "commitOrRollback": "12",
           "fromTransactionCheck": "1", "msgId": "X", "transactionId": "X"}
    conn = signed.connection(addr)
    conn.reply(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=dict(end), flag=2))
    signed.invoke(addr, RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG), "barrier")
    assert _refusals(caplog) == []
    unsigned = RemotingClient(acl_broker.namesrv_addr)
    try:
        unsigned.connection(addr).reply(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=dict(end), flag=2))
        with pytest.raises(NoPermissionError):
            unsigned.invoke(addr, RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG), "barrier")
        assert len(_refusals(caplog)) == 2 and "request code 37" in _refusals(caplog)[0]
    finally:
        unsigned.close()


def test_signed_client_pickles_with_its_credentials(acl_broker: EmbeddedBroker, signed: RemotingClient,
                                                    topic: str) -> None:
    signed.create_topic(topic, 1)
    copy = pickle.loads(pickle.dumps(signed))
    try:
        assert copy.config.credentials == Credentials(AK, SK)
        assert copy.max_offset(copy.message_queues(topic)[0]) == 0
    finally:
        copy.close()
    via_connect = connect(acl_broker.namesrv_addr, credentials=Credentials(AK, SK))
    try:
        assert via_connect.max_offset(via_connect.message_queues(topic)[0]) == 0
    finally:
        via_connect.close()


def test_broker_without_acl_ignores_signatures(broker: EmbeddedBroker, topic: str) -> None:
    c = RemotingClient(broker.namesrv_addr, credentials=Credentials(AK, SK))
    try:
        c.create_topic(topic, 1)
        c.send(c.message_queues(topic, refresh=True)[0], b"x")
    finally:
        c.close()


# -- secrets stay secret ------------------------------------------------------------------


def test_secrets_never_logged(acl_broker: EmbeddedBroker, topic: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    good = RemotingClient(acl_broker.namesrv_addr, credentials=Credentials(AK, SK, TOKEN))
    bad = RemotingClient(acl_broker.namesrv_addr, ClientConfig(retries=1, credentials=Credentials(AK, "wrong-secret")))
    try:
        good.create_topic(topic, 1)
        q = good.message_queues(topic, refresh=True)[0]
        good.send(q, b"x")
        good.pull(q, 0)
        good.max_offsets([q])
        with pytest.raises(NoPermissionError) as ei:
            bad.max_offset(q)
        assert "wrong-secret" not in str(ei.value) and SK not in str(ei.value)
    finally:
        good.close()
        bad.close()
    assert caplog.records, "DEBUG logging was captured"
    assert SK not in caplog.text and TOKEN not in caplog.text and "wrong-secret" not in caplog.text


def test_secrets_never_in_reprs_or_option_errors() -> None:
    from rocketmq_spark.sink.options import WriterOptions
    from rocketmq_spark.source.options import ReaderOptions

    creds = Credentials(AK, SK, TOKEN)
    cfg = ClientConfig(credentials=creds)
    reader = ReaderOptions.parse({"namesrvaddr": "127.0.0.1:9876", "topic": "t", "ACCESSKEY": AK, "secretkey": SK,
                                  "securityToken": TOKEN}, stream=False)
    writer = WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "accessKey": AK, "secretKey": SK})
    assert reader.credentials == creds and writer.credentials == Credentials(AK, SK)
    broker_cfg = BrokerConfig(data_dir="/nonexistent", acl={AK: SK})
    for obj in (creds, cfg, reader, writer, broker_cfg):
        for text in (repr(obj), str(obj)):
            assert SK not in text and TOKEN not in text, text
    assert AK in repr(creds) and "***" in repr(creds)
    with pytest.raises(OptionError, match="accessKey") as ei:
        ReaderOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "secretKey": SK}, stream=False)
    assert "secretKey" in str(ei.value) and SK not in str(ei.value)
    with pytest.raises(OptionError, match="secretKey") as ei:
        WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "accessKey": AK})
    assert "accessKey" in str(ei.value)
    with pytest.raises(OptionError) as ei:  # a misspelt secret option is not echoed either
        WriterOptions.parse({"namesrvAddr": "127.0.0.1:9876", "topic": "t", "secret_key": SK})
    assert SK not in str(ei.value)


# -- a third-party signer: the node client ali-ons ----------------------------------------


@pytest.mark.interop
def test_alions_signed_sends_are_accepted(acl_broker: EmbeddedBroker, signed: RemotingClient, topic: str,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """ali-ons signs remoting requests (lib/channel.js beforeRequest: AccessKey, OnsChannel and
    the header fields, sorted; HMAC-SHA1 over the values and the body, Base64): our verifier
    must accept its signatures, and refuse them under a wrong secret."""
    import json
    import os
    import shutil
    import subprocess

    from alions_support import ensure_alions

    alions = ensure_alions()
    node = shutil.which("node")
    assert node is not None
    signed.create_topic(topic, 2)
    caplog.set_level(logging.WARNING, logger=BROKER_LOG)

    def run(secret: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ALIONS_ACCESS_KEY": AK, "ALIONS_SECRET_KEY": secret}
        return subprocess.run([node, str(alions / "acl_send.js"), acl_broker.namesrv_addr, topic, "3"], cwd=alions,
                              env=env, capture_output=True, text=True, timeout=60, check=False)

    ok = run(SK)
    assert ok.returncode == 0, f"ali-ons signed send failed; stderr:\n{ok.stderr}"
    results = [json.loads(line) for line in ok.stdout.splitlines() if line.strip()]
    assert [r["status"] for r in results] == ["SEND_OK"] * 3
    assert _refusals(caplog) == [], "ali-ons' signatures were refused"
    qs = signed.message_queues(topic, refresh=True)
    assert sum(signed.max_offsets(qs).values()) == 3
    bad = run("wrong-secret")
    assert bad.returncode != 0
    assert any("signature mismatch" in r for r in _refusals(caplog))


# -- gRPC (RocketMQ 5 MQv2-HMAC-SHA1 metadata) ----------------------------------------------


def test_grpc_auth_metadata_golden_vector() -> None:
    from rocketmq_spark.remoting.acl import grpc_auth_metadata, verify_grpc_metadata

    meta = dict(grpc_auth_metadata(Credentials(AK, SK, TOKEN), "20240102T030405Z"))
    hexsig = hmac.new(SK.encode(), b"20240102T030405Z", hashlib.sha1).hexdigest()
    assert meta["authorization"] == (f"MQv2-HMAC-SHA1 Credential={AK}, SignedHeaders=x-mq-date-time, "
                                     f"Signature={hexsig}")
    assert meta["x-mq-session-token"] == TOKEN
    meta["x-mq-date-time"] = "20240102T030405Z"
    assert verify_grpc_metadata(meta, {AK: SK}) is None
    # other SDKs' shapes: upper-case hex, Credential=<ak>/<region>/Rocketmq
    other = {"x-mq-date-time": "20240102T030405Z", "authorization": (
        f"MQv2-HMAC-SHA1 Credential={AK}/cn/Rocketmq, SignedHeaders=x-mq-date-time, Signature={hexsig.upper()}")}
    assert verify_grpc_metadata(other, {AK: SK}) is None
    assert "mismatch" in (verify_grpc_metadata(other, {AK: "x"}) or "")
    assert "not signed" in (verify_grpc_metadata({}, {AK: SK}) or "")


def test_grpc_signed_client_is_served_and_unsigned_refused(topic: str) -> None:
    from rocketmq_spark.client.grpc_client import GrpcClient

    with EmbeddedBroker(acl={AK: SK}) as mq:
        assert mq.grpc_endpoint is not None
        admin = RemotingClient(mq.namesrv_addr, credentials=Credentials(AK, SK))
        good = GrpcClient(mq.grpc_endpoint, ClientConfig(credentials=Credentials(AK, SK)))
        bad = GrpcClient(mq.grpc_endpoint, ClientConfig(retries=1, credentials=Credentials(AK, "wrong-secret")))
        unsigned = GrpcClient(mq.grpc_endpoint, ClientConfig(retries=1))
        try:
            admin.create_topic(topic, 1)
            q = good.message_queues(topic)[0]
            good.send(q, b"over-grpc")
            assert good.max_offset(q) == 1
            for c, why in ((bad, "signature mismatch"), (unsigned, "not signed")):
                with pytest.raises(NoPermissionError, match=why) as ei:
                    c.message_queues(topic)
                assert "wrong-secret" not in str(ei.value)
            assert good.max_offset(q) == 1
        finally:
            for c in (admin, good, bad, unsigned):
                c.close()


# -- command line ---------------------------------------------------------------------------


def test_cli_signs_with_flags_or_env_and_parses_broker_acl(acl_broker: EmbeddedBroker, topic: str, tmp_path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from rocketmq_spark.cli import CliError, _acl_table, build_parser, main

    ns = acl_broker.namesrv_addr
    monkeypatch.delenv("ROCKETMQ_ACCESS_KEY", raising=False)
    monkeypatch.delenv("ROCKETMQ_SECRET_KEY", raising=False)
    assert main(["topic", "create", topic, "-n", ns, "--access-key", AK, "--secret-key", SK]) == 0
    assert main(["topic", "describe", topic, "-n", ns]) == 2  # unsigned: refused, one line
    err = capsys.readouterr().err
    assert "not signed" in err and "--access-key" in err
    monkeypatch.setenv("ROCKETMQ_ACCESS_KEY", AK)
    monkeypatch.setenv("ROCKETMQ_SECRET_KEY", SK)
    assert main(["topic", "describe", topic, "-n", ns, "--json"]) == 0
    monkeypatch.setenv("ROCKETMQ_SECRET_KEY", "wrong-secret")
    assert main(["topic", "describe", topic, "-n", ns]) == 2
    assert "signature mismatch" in capsys.readouterr().err
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"fromfile": "file-secret"}))
    args = build_parser().parse_args(["broker", "--acl", f"{AK}:{SK}", "--acl", "b:c:d", "--acl-file", str(keys)])
    assert _acl_table(args) == {AK: SK, "b": "c:d", "fromfile": "file-secret"}
    with pytest.raises(CliError) as ei:
        _acl_table(build_parser().parse_args(["broker", "--acl", f"{SK}"]))
    assert SK not in str(ei.value)
