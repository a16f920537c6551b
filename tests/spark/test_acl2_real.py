"""ACL 2.0 on Apache RocketMQ 5.5.0 (the newest release: ``real_rocketmq.NEWEST``), authentication
and authorization on, one broker and its proxy (ACL 2.0 on too, cluster mode) for the module.

The allow/deny table, through Spark (batch read, an AvailableNow stream with a consumer group,
batch write), the command line and the offset committer. User ``alice`` may Sub and Get topic
IN in group G and Pub (and Get) topic OUT, and is explicitly denied group DENIED (a Deny policy). Every
refusal fails at once (a hang guard: well within :data:`FAST_S`) with an error naming the user,
the resource and the action; the secrets appear in no log, repr, error or Spark plan.

Over gRPC (``endpoints``, the proxy): a batch write as alice lands; a read passes the proxy's route
check and stops at the pulls released proxies do not serve; a write to IN (no Pub), a wrong secret,
an unknown user and an unsigned call are refused the same way, from the proxy's UNAUTHORIZED.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from brokers import settles_at, skip_or_fail
from real_rocketmq import NEWEST, RealRocketMQ, acl2_broker_conf, acl2_proxy_conf, java_available, provision
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.cli import main as cli_main
from rocketmq_spark.client import ClientConfig, Credentials, GrpcClient, RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.errors import AccessDeniedError, AuthenticationError, AuthorizationError
from rocketmq_spark.remoting.frame import RemotingCommand
from rocketmq_spark.source.options import ReaderOptions
from rocketmq_spark.source.queue_range import QueueRange

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.reliability]

ADMIN = ("rmq-admin", "Adm1n-S3cret-5f0e")
ALICE, ALICE_SECRET = "alice", "Al1ce-S3cret-9b2c"
SECRETS = (ADMIN[1], ALICE_SECRET, "Wr0ng-S3cret-41d7", "Mall0ry-S3cret-c3")
IN, OUT, GROUP, DENIED = "ACL2_IN", "ACL2_OUT", "acl2-etl", "acl2-denied"
SEEDED = 24
#: a refusal must come well within this (a hang guard, not a performance figure)
FAST_S = 30.0


@pytest.fixture(scope="module")
def rmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRocketMQ]:
    missing = java_available()
    if missing:
        skip_or_fail(f"the real Apache RocketMQ cannot run here: {missing}")
    rmq = RealRocketMQ(provision(NEWEST), tmp_path_factory.mktemp("rocketmq-acl2"), version=NEWEST, proxy=True,
                       auto_create_topics=False, broker_config=acl2_broker_conf(ADMIN), admin_credentials=ADMIN,
                       proxy_config=acl2_proxy_conf(ADMIN), client_config=ClientConfig(credentials=Credentials(*ADMIN)))
    rmq.start()
    try:
        # the user with the admin tool (it signs with $ROCKETMQ_HOME/conf/tools.yml: the harness's
        # admin_credentials); its policies in one request (mqadmin createAcl sends one per resource
        # list and decision, and each of its JVMs costs seconds)
        rmq.mqadmin("createUser", "-b", rmq.broker_addr, "-u", ALICE, "-p", ALICE_SECRET)
        admin = RemotingClient(rmq.namesrv_addr, credentials=Credentials(*ADMIN))
        try:  # the admin is a super user: it may change policies, create topics and send anywhere
            _create_acl(admin, rmq.broker_addr, f"User:{ALICE}", [
                (f"Topic:{IN}", ["Sub", "Get"], "Allow"), (f"Group:{GROUP}", ["Sub", "Get"], "Allow"),
                # Get on OUT too: a read of it passes the planner and is refused at the tasks' pulls
                (f"Topic:{OUT}", ["Pub", "Get"], "Allow"), (f"Group:{DENIED}", ["Sub", "Get"], "Deny")])
            for topic in (IN, OUT):
                admin.create_topic(topic, 2)
            rmq.topic_route_ready(IN)
            rmq.topic_route_ready(OUT)
            qs = admin.message_queues(IN)
            for i in range(SEEDED):
                admin.send_batch(qs[i % len(qs)], [BatchEntry(b"in-%d" % i)])
        finally:
            admin.close()
        yield rmq
    finally:
        rmq.stop(grace_s=5)


def _create_acl(admin: RemotingClient, broker: str, subject: str, entries: list[tuple[str, list[str], str]]) -> None:
    """AUTH_CREATE_ACL (3006), as mqadmin createAcl sends it (header ``subject``, an AclInfo JSON
    body), with every (resource, actions, decision) entry at once; merged into the subject's policy."""
    body = {"subject": subject, "policies": [{"policyType": "Custom", "entries": [
        {"resource": r, "actions": a, "decision": d} for r, a, d in entries]}]}
    admin.invoke(broker, RemotingCommand(3006, ext_fields={"subject": subject}, body=json.dumps(body).encode()),
                 f"create the policies of {subject}")


@pytest.fixture()
def admin(rmq: RealRocketMQ) -> Iterator[RemotingClient]:
    c = RemotingClient(rmq.namesrv_addr, credentials=Credentials(*ADMIN))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(autouse=True)
def no_secret_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test: the library logs at DEBUG, and no secret is in what it logged."""
    caplog.set_level(logging.DEBUG, logger="rocketmq_spark")
    yield
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert not [s for s in SECRETS if s in text]


def _opts(rmq: RealRocketMQ, topic: str, *, user: str = ALICE, secret: str | None = ALICE_SECRET,
          **more: str) -> dict[str, str]:
    out = {"namesrvAddr": rmq.namesrv_addr, "topic": topic, **more}
    if secret is not None:
        out.update(accessKey=user, secretKey=secret)
    return out


def _count(client: RemotingClient, topic: str) -> int:
    return sum(hi - lo for lo, hi in client.offset_ranges(client.message_queues(topic, refresh=True)).values())


def _refused(action: Callable[[], Any]) -> str:
    """What ``action`` failed with (its whole text), after asserting it failed fast."""
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        action()
    took = time.monotonic() - t0
    assert took < FAST_S, f"a refusal took {took:.1f}s: a retry loop or a hang"
    text = str(ei.value)
    assert not [s for s in SECRETS if s in text], text[-2000:]
    return text


# -- allowed ------------------------------------------------------------------------------


def test_batch_read_and_write_as_a_user_with_just_those_rights(spark, rmq: RealRocketMQ, admin) -> None:
    df = spark.read.format("rocketmq").options(**_opts(rmq, IN, consumerGroup=GROUP,
                                                       startingOffsets="earliest")).load()
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == sorted(b"in-%d" % i for i in range(SEEDED))
    before = _count(admin, OUT)
    rows = spark.createDataFrame([(f"out-{i}",) for i in range(10)], "body STRING")
    rows.write.mode("append").format("rocketmq").options(**_opts(rmq, OUT)).save()
    assert settles_at(admin, OUT, before + 10) == before + 10


def test_stream_commits_the_groups_offsets_and_the_committer_its_last_batch(spark, rmq: RealRocketMQ, admin,
                                                                             tmp_path: Path) -> None:
    committer = RocketMQOffsetCommitter(rmq.namesrv_addr, GROUP, topics=[IN], access_key=ALICE,
                                        secret_key=ALICE_SECRET)
    spark.streams.addListener(committer)
    try:
        q = (spark.readStream.format("rocketmq").options(**_opts(rmq, IN, consumerGroup=GROUP,
                                                                 startingOffsets="earliest")).load()
             .writeStream.format("memory").queryName("acl2_stream").trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
        assert q.awaitTermination(120) and q.exception() is None
        assert spark.table("acl2_stream").count() == SEEDED
        progress = q.lastProgress.json if q.lastProgress is not None else ""
        assert progress and not [s for s in SECRETS if s in progress]
        buf = io.StringIO()
        with redirect_stdout(buf):
            q.explain(True)
        assert buf.getvalue() and not [s for s in SECRETS if s in buf.getvalue()]
        qs = admin.message_queues(IN)
        ends = {mq: hi for mq, (_lo, hi) in admin.offset_ranges(qs).items()}
        deadline = time.monotonic() + 30  # the listener runs on Spark's listener bus thread
        while admin.query_consumer_offsets(GROUP, qs) != ends and time.monotonic() < deadline:
            time.sleep(0.1)
        assert admin.query_consumer_offsets(GROUP, qs) == ends  # the group's offsets, on the broker
        assert {lag.messages_behind for lag in committer.lag.values()} == {0}  # measured as alice (Get)
        committer.commit({qs[0]: 5})  # and written as alice (Sub on the group and the topic)
        assert committer.committed[qs[0]] == 5 and admin.query_consumer_offset(GROUP, qs[0]) == 5
        committer.commit({qs[0]: ends[qs[0]]})
        assert admin.query_consumer_offset(GROUP, qs[0]) == ends[qs[0]]
    finally:
        spark.streams.removeListener(committer)
        committer.client.close()


def test_cli_reads_progress_and_produces_as_the_user(rmq: RealRocketMQ, admin, capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROCKETMQ_SECRET_KEY", ALICE_SECRET)  # the variable keeps it off the command line
    ns = ["-n", rmq.namesrv_addr, "--access-key", ALICE]
    before = _count(admin, OUT)
    assert cli_main(["produce", "-t", OUT, "-c", "5", *ns]) == 0
    assert settles_at(admin, OUT, before + 5) == before + 5
    capsys.readouterr()
    assert cli_main(["progress", "-g", GROUP, "-t", IN, "--json", *ns]) == 0
    out = capsys.readouterr()
    assert IN in out.out and not [s for s in SECRETS if s in out.out + out.err]


# -- denied -------------------------------------------------------------------------------


def _read(spark, rmq: RealRocketMQ, topic: str, group: str, **kw: Any) -> Callable[[], Any]:
    return lambda: spark.read.format("rocketmq").options(
        **_opts(rmq, topic, consumerGroup=group, startingOffsets="earliest", **kw)).load().collect()


@pytest.mark.parametrize(("case", "kind", "user", "resource", "actions"), [
    ("topic not allowed", AuthorizationError, ALICE, f"Topic:{OUT}", ("may not Sub on",)),  # in a task's pull
    ("group not allowed", AuthorizationError, ALICE, "Group:acl2-other", ("Sub", "Get")),
    ("group denied", AuthorizationError, ALICE, f"Group:{DENIED}", ("Sub", "Get")),
    ("wrong secret", AuthenticationError, ALICE, f"Topic:{IN}", ("Get",)),
    ("unknown user", AuthenticationError, "mallory", f"Topic:{IN}", ("Get",)),
    ("no credentials", AuthenticationError, None, f"Topic:{IN}", ("Get",)),
])
def test_a_refused_read_fails_at_once_naming_user_resource_and_action(
        spark, rmq: RealRocketMQ, case: str, kind: type[AccessDeniedError], user: str | None, resource: str,
        actions: tuple[str, ...]) -> None:
    topic, group, kw = IN, GROUP, {}
    if case == "topic not allowed":
        topic = OUT
    elif case == "group not allowed":
        group = "acl2-other"
    elif case == "group denied":
        group = DENIED
    spark_user, secret = {"wrong secret": (ALICE, SECRETS[2]), "unknown user": ("mallory", SECRETS[3]),
                          "no credentials": (ALICE, None)}.get(case, (ALICE, ALICE_SECRET))
    text = _refused(_read(spark, rmq, topic, group, user=spark_user, secret=secret, **kw))
    assert kind.__name__ in text, text[-3000:]
    assert resource in text and any(a in text for a in actions), text[-3000:]
    assert (f"'{user}'" in text) if user else "unsigned" in text, text[-3000:]
    if case == "group denied":
        assert "the decision is deny" in text
    if case == "no credentials":
        assert "accessKey" in text and "secretKey" in text  # what to set


def test_a_refused_write_fails_at_once_naming_user_topic_and_pub(spark, rmq: RealRocketMQ, admin) -> None:
    before = _count(admin, IN)
    rows = spark.createDataFrame([("never",)], "body STRING")
    text = _refused(lambda: rows.write.mode("append").format("rocketmq").options(**_opts(rmq, IN)).save())
    assert "AuthorizationError" in text and f"user '{ALICE}' may not Pub on Topic:{IN}" in text, text[-3000:]
    assert "attempts" not in text  # not retried
    assert _count(admin, IN) == before


def test_a_refused_stream_fails_at_once(spark, rmq: RealRocketMQ, tmp_path: Path) -> None:
    q = (spark.readStream.format("rocketmq").options(**_opts(rmq, IN, consumerGroup="acl2-other")).load()
         .writeStream.format("memory").queryName("acl2_refused").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        q.awaitTermination(FAST_S)
    assert time.monotonic() - t0 < FAST_S and not q.isActive
    assert "AuthorizationError" in str(ei.value) and "Group:acl2-other" in str(ei.value)


def test_cli_and_committer_refusals_name_user_resource_and_action(rmq: RealRocketMQ, admin, capsys,
                                                                  monkeypatch) -> None:
    monkeypatch.setenv("ROCKETMQ_SECRET_KEY", ALICE_SECRET)
    t0 = time.monotonic()
    assert cli_main(["produce", "-t", IN, "-c", "1", "-n", rmq.namesrv_addr, "--access-key", ALICE]) == 2
    err = capsys.readouterr().err.strip()
    assert time.monotonic() - t0 < FAST_S
    assert len(err.splitlines()) == 1 and f"user '{ALICE}' may not Pub on Topic:{IN}" in err, err
    mq = admin.message_queues(IN)[0]
    committer = RocketMQOffsetCommitter(rmq.namesrv_addr, "acl2-other", access_key=ALICE, secret_key=ALICE_SECRET,
                                        measure_lag=False)
    try:
        text = _refused(lambda: committer.commit({mq: 1}))
        assert f"user '{ALICE}' may not Sub or Update on Group:acl2-other" in text, text
        assert not committer.store.pending  # not kept for a retry
    finally:
        committer.client.close()
    assert admin.query_consumer_offset("acl2-other", mq) is None


def test_errors_carry_the_user_resource_and_action_as_attributes(rmq: RealRocketMQ) -> None:
    c = RemotingClient(rmq.namesrv_addr, credentials=Credentials(ALICE, ALICE_SECRET))
    try:
        mq = c.message_queues(OUT)[0]
        with pytest.raises(AuthorizationError) as ei:
            c.pull(mq, 0, 1, group=GROUP)
        e = ei.value
        assert (e.user, e.resource, e.action, e.code) == (ALICE, f"Topic:{OUT}", "Sub", 16)
        assert "no matched policies" in e.reason
    finally:
        c.close()
    bad = RemotingClient(rmq.namesrv_addr, credentials=Credentials(ALICE, SECRETS[2]))
    try:
        with pytest.raises(AuthenticationError) as ai:
            bad.max_offset(bad.message_queues(IN)[0])
        assert (ai.value.user, ai.value.resource, ai.value.action) == (ALICE, f"Topic:{IN}", "Get")
        assert "check signature failed" in ai.value.reason
    finally:
        bad.close()


# -- over gRPC: the proxy checks every call ------------------------------------------------
# The module's proxy has ACL 2.0 on too (real_rocketmq.acl2_proxy_conf): it authenticates and
# authorizes each gRPC call itself, with the users and policies the broker keeps, and answers a
# refusal with status UNAUTHORIZED and the same words as a broker's remark.


def _grpc_opts(rmq: RealRocketMQ, topic: str, *, user: str = ALICE, secret: str | None = ALICE_SECRET
               ) -> dict[str, str]:
    out = {"endpoints": rmq.grpc_endpoint, "topic": topic}
    if secret is not None:
        out.update(accessKey=user, secretKey=secret)
    return out


def test_grpc_batch_write_as_a_user_allowed_to_pub_and_reads_refused_by_what_the_proxy_serves(
        spark, rmq: RealRocketMQ, admin) -> None:
    before = _count(admin, OUT)
    rows = spark.createDataFrame([(f"grpc-{i}",) for i in range(6)], "body STRING")
    rows.write.mode("append").format("rocketmq").options(**_grpc_opts(rmq, OUT)).save()
    assert settles_at(admin, OUT, before + 6) == before + 6
    # a read passes the proxy's ACL (the route: Pub or Sub on the topic), then meets a call released
    # proxies do not serve: not an ACL error, and it says how to read (over remoting)
    text = _refused(lambda: spark.read.format("rocketmq").options(**_grpc_opts(rmq, IN)).load().collect())
    assert "does not implement" in text and "namesrvAddr" in text and "AccessDenied" not in text, text[-3000:]
    assert "Authorization" not in text and "Authentication" not in text, text[-3000:]


@pytest.mark.parametrize(("case", "kind", "user", "resource", "action", "words"), [
    ("topic not allowed", AuthorizationError, ALICE, f"Topic:{IN}", "Pub", "no matched policies"),
    ("wrong secret", AuthenticationError, ALICE, f"Topic:{OUT}", "Pub or Sub", "check signature failed"),
    ("unknown user", AuthenticationError, "mallory", f"Topic:{OUT}", "Pub or Sub", "mallory is not found"),
])
def test_a_refused_grpc_write_fails_at_once_naming_user_resource_and_action(
        spark, rmq: RealRocketMQ, admin, case: str, kind: type[AccessDeniedError], user: str, resource: str,
        action: str, words: str) -> None:
    topic = IN if case == "topic not allowed" else OUT
    secret = {"wrong secret": SECRETS[2], "unknown user": SECRETS[3]}.get(case, ALICE_SECRET)
    before = _count(admin, topic)
    rows = spark.createDataFrame([("never",)], "body STRING")
    text = _refused(lambda: rows.write.mode("append").format("rocketmq")
                    .options(**_grpc_opts(rmq, topic, user=user, secret=secret)).save())
    assert kind.__name__ in text and words in text, text[-3000:]
    if kind is AuthorizationError:
        assert f"user '{user}' may not {action} on {resource}" in text, text[-3000:]
    else:
        assert f"the proxy did not authenticate user '{user}' for {action} on {resource}" in text, text[-3000:]
    assert "attempts" not in text  # not retried
    assert _count(admin, topic) == before


def test_grpc_refusals_carry_the_user_resource_and_action_as_attributes(rmq: RealRocketMQ) -> None:
    c = GrpcClient(rmq.grpc_endpoint, ClientConfig(credentials=Credentials(ALICE, ALICE_SECRET)))
    try:
        with pytest.raises(AuthorizationError) as ei:  # Deny on the group: a consumer's heartbeat needs Sub
            c.heartbeat_consumer(DENIED, rmq.grpc_endpoint)
        e = ei.value
        assert (e.user, e.resource, e.action, e.code) == (ALICE, f"Group:{DENIED}", "Sub", 40100)
        assert "the decision is deny" in e.reason
        with pytest.raises(AuthorizationError) as ri:  # a topic alice has no policy for: not even its route
            c.message_queues("ACL2_NONE", refresh=True)
        assert (ri.value.resource, ri.value.action) == ("Topic:ACL2_NONE", "Pub or Sub")
    finally:
        c.close()
    unsigned = GrpcClient(rmq.grpc_endpoint)
    try:
        text = _refused(lambda: unsigned.message_queues(IN))
        with pytest.raises(AuthenticationError) as ui:
            unsigned.message_queues(IN)
        assert (ui.value.user, ui.value.resource) == (None, f"Topic:{IN}")
        assert "unsigned" in text and "accessKey" in text and "secretKey" in text, text
    finally:
        unsigned.close()


# -- secrets ------------------------------------------------------------------------------


def test_secrets_stay_out_of_reprs_and_spark_plans(spark, rmq: RealRocketMQ, admin, tmp_path: Path) -> None:
    opts = _opts(rmq, IN, consumerGroup=GROUP, startingOffsets="earliest")
    creds = Credentials(ALICE, ALICE_SECRET, "T0ken-" + ALICE_SECRET)
    parsed = ReaderOptions.parse(opts, stream=False)
    qr = QueueRange(RemotingClient(rmq.namesrv_addr).message_queues(IN)[0], 0, 1, (rmq.namesrv_addr,), None, GROUP,
                    "*", 32, True, credentials=creds)
    texts = [repr(creds), str(creds), repr(ClientConfig(credentials=creds)), repr(parsed), str(parsed), repr(qr)]
    assert pickle.loads(pickle.dumps(qr)).credentials == creds  # still shipped to the executors
    df = spark.read.format("rocketmq").options(**opts).load()
    for extended in (False, True):
        buf = io.StringIO()
        with redirect_stdout(buf):
            df.explain(extended)
        texts.append(buf.getvalue())
    texts.append(df._jdf.queryExecution().toString())
    stream = spark.readStream.format("rocketmq").options(**opts).load()
    buf = io.StringIO()
    with redirect_stdout(buf):
        stream.explain(True)
    texts.append(buf.getvalue())
    # a stream into the other topic: the writer's plan and the progress that describes source and sink
    before = _count(admin, OUT)
    q = (stream.select("body").writeStream.format("rocketmq").options(**_opts(rmq, OUT))
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    assert settles_at(admin, OUT, before + SEEDED) == before + SEEDED
    buf = io.StringIO()
    with redirect_stdout(buf):
        q.explain(True)
    texts += [buf.getvalue(), q.lastProgress.json if q.lastProgress is not None else ""]
    assert all(texts) and ALICE in texts[0]
    leaked = [t for t in texts if any(s in t for s in SECRETS)]
    assert not leaked, leaked
