"""ACL refusals as errors: what an ACL 2.0 broker checks per request (:func:`request_needs`, read
from 5.5.0's authorization context builder) and the error a NO_PERMISSION answer becomes, naming
the user (the access key, never a secret), the resource and the action; never retried."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from rocketmq_spark.client.grpc_client import GrpcClient, _status_error
from rocketmq_spark.client.retry import ClientConfig, retrying
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.errors import (
    AccessDeniedError,
    AuthenticationError,
    AuthorizationError,
    BrokerError,
    NoPermissionError,
    broker_error,
)
from rocketmq_spark.proto import pb, pb_grpc
from rocketmq_spark.remoting.acl import Credentials, grpc_needs, request_needs
from rocketmq_spark.remoting.codes import RequestCode

PULL = request_needs(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"})


def test_request_needs_follow_the_brokers_table() -> None:
    assert PULL == [("Topic:T", ("Sub",)), ("Group:G", ("Sub",))]
    assert request_needs(RequestCode.SEND_MESSAGE_V2, {"b": "T"}) == [("Topic:T", ("Pub",))]
    assert request_needs(RequestCode.GET_MAX_OFFSET, {"topic": "T"}) == [("Topic:T", ("Get",))]
    assert request_needs(RequestCode.QUERY_MESSAGE, {"topic": "T", "key": "k"}) == [("Topic:T", ("Sub", "Get"))]
    assert request_needs(RequestCode.QUERY_CONSUMER_OFFSET, {"topic": "T", "consumerGroup": "G"}) == [
        ("Topic:T", ("Sub", "Get")), ("Group:G", ("Sub", "Get"))]
    assert request_needs(RequestCode.UPDATE_CONSUMER_OFFSET, {"topic": "T", "consumerGroup": "G"})[1] == (
        "Group:G", ("Sub", "Update"))
    # a retry topic is checked as its group; a field not given comes as the type alone
    assert request_needs(RequestCode.SEND_MESSAGE_V2, {"b": "%RETRY%G"}) == [("Group:G", ("Sub",))]
    assert request_needs(RequestCode.PULL_MESSAGE, {"topic": "T"})[1] == ("Group:", ("Sub",))
    body = json.dumps({"consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [
        {"topic": "T"}, {"topic": "%RETRY%G"}]}], "producerDataSet": [{"groupName": "P"}]}).encode()
    assert request_needs(RequestCode.HEART_BEAT, None, body) == [("Group:G", ("Sub",)), ("Topic:T", ("Sub",))]
    assert request_needs(RequestCode.HEART_BEAT, None, b"not json") == []
    assert request_needs(RequestCode.GET_BROKER_CLUSTER_INFO, {}) == []  # name servers check nothing


def _refusal(remark: str, user: str | None = "alice",
             needs: list[tuple[str, tuple[str, ...]]] = PULL) -> BrokerError:
    return broker_error(16, remark, address="127.0.0.1:10911", operation="pull of T/broker-a:0", user=user,
                        needs=needs)


@pytest.mark.parametrize(("remark", "resource", "action"), [
    ("User:alice has no permission to access Group:G from 127.0.0.1, no matched policies.", "Group:G", "Sub"),
    ("User:alice has no permission to access Topic:T from 10.0.0.7, the decision is deny.", "Topic:T", "Sub"),
    # a resource the request did not name in full (the pull's group): its type gives the action
    ("User:alice has no permission to access Group:other from 127.0.0.1, no matched policies.", "Group:other",
     "Sub"),
])
def test_a_policy_refusal_is_an_authorization_error_naming_who_what_and_which_action(
        remark: str, resource: str, action: str) -> None:
    needs = PULL if resource != "Group:other" else request_needs(RequestCode.PULL_MESSAGE, {"topic": "T"})
    e = _refusal(remark, needs=needs)
    assert isinstance(e, AuthorizationError) and isinstance(e, NoPermissionError)
    assert (e.user, e.resource, e.action, e.reason, e.retriable) == ("alice", resource, action, remark, False)
    text = str(e)
    assert f"user 'alice' may not {action} on {resource}" in text and remark in text
    assert f"mqadmin createAcl -s User:alice -r {resource} -a {action} -d Allow" in text
    assert "pull of T/broker-a:0 at 127.0.0.1:10911" in text and "code 16" in text


@pytest.mark.parametrize(("remark", "user", "hint"), [
    ("check signature failed.", "alice", "is the secret key right?"),
    ("User:mallory is not found.", "mallory", "no such user"),
    ("User:alice is disabled.", "alice", "disabled"),
    ("username cannot be null.", None, "set the options accessKey and secretKey"),
    ("request code 11: signature mismatch for AccessKey 'alice' (wrong secret key?)", "alice", ""),  # embedded
    ("request code 11 is not signed (missing extFields AccessKey, Signature); this broker has ACL on", None,
     "accessKey and secretKey"),
])
def test_an_unknown_user_or_bad_signature_is_an_authentication_error(remark: str, user: str | None,
                                                                     hint: str) -> None:
    e = _refusal(remark, user=user)
    assert isinstance(e, AuthenticationError)
    assert (e.user, e.resource, e.action) == (user, "Topic:T and Group:G", "Sub")
    text = str(e)
    assert remark in text and hint in text and "Sub on Topic:T and Group:G" in text
    assert (f"user {user!r}" if user else "an unsigned request") in text


def test_other_refusals_stay_plain_and_other_codes_are_untouched() -> None:
    e = _refusal("the topic[T] pulling message is forbidden")  # a queue permission, not ACL
    assert type(e) is NoPermissionError and not isinstance(e, AccessDeniedError)
    assert type(broker_error(16, "User:alice has no permission to access Topic:T from x, no", address="a",
                             operation="o")) is NoPermissionError  # no request described: as before
    assert not isinstance(broker_error(17, "check signature failed.", address="a", operation="o", user="alice",
                                       needs=PULL), AccessDeniedError)


def test_a_refusal_is_not_retried() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise _refusal("check signature failed.")

    with pytest.raises(AuthenticationError):
        retrying(refused, ClientConfig(retries=5))
    assert calls == [1]


# -- over gRPC: a 5.x proxy's refusals ------------------------------------------------------
# 5.5.0's proxy answers every ACL 2.0 refusal with status UNAUTHORIZED (40100) and the words an
# ACL 2.0 broker puts in its remark; FORBIDDEN (40300) is a topic's queue permission.


def _topic(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def test_grpc_needs_follow_the_proxys_table() -> None:
    send = pb.SendMessageRequest(messages=[pb.Message(topic=_topic("T"))])
    assert grpc_needs("SendMessage", send) == [("Topic:T", ("Pub",))]
    assert grpc_needs("SendMessage", pb.SendMessageRequest()) == []
    assert grpc_needs("EndTransaction", pb.EndTransactionRequest(topic=_topic("T"))) == [("Topic:T", ("Pub",))]
    assert grpc_needs("QueryRoute", pb.QueryRouteRequest(topic=_topic("T"))) == [("Topic:T", ("Pub", "Sub"))]
    mq = pb.MessageQueue(topic=_topic("T"))
    group = pb.Resource(name="G")
    both = [("Group:G", ("Sub",)), ("Topic:T", ("Sub",))]
    assert grpc_needs("ReceiveMessage", pb.ReceiveMessageRequest(group=group, message_queue=mq)) == both
    assert grpc_needs("PullMessage", pb.PullMessageRequest(group=group, message_queue=mq)) == both
    assert grpc_needs("AckMessage", pb.AckMessageRequest(group=group, topic=_topic("T"))) == both
    assert grpc_needs("QueryAssignment", pb.QueryAssignmentRequest(group=group, topic=_topic("T"))) == both
    # a consumer's heartbeat is checked against its group, a producer's against nothing
    assert grpc_needs("Heartbeat", pb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=group)) == [
        ("Group:G", ("Sub",))]
    assert grpc_needs("Heartbeat", pb.HeartbeatRequest(client_type=pb.PRODUCER)) == []
    assert grpc_needs("NotifyClientTermination", pb.NotifyClientTerminationRequest()) == []
    settings = pb.TelemetryCommand(settings=pb.Settings(publishing=pb.Publishing(topics=[_topic("P")])))
    assert grpc_needs("Telemetry", settings) == [("Topic:P", ("Pub",))]
    assert grpc_needs("QueryOffset", pb.QueryOffsetRequest(message_queue=mq)) == [("Topic:T", ("Get",))]
    assert grpc_needs("UpdateOffset", pb.UpdateOffsetRequest(group=group, message_queue=mq))[1] == (
        "Group:G", ("Sub", "Update"))


def _grpc_refusal(code: int, message: str, user: str | None = "alice",
                  needs: list[tuple[str, tuple[str, ...]]] | None = None) -> BrokerError:
    return _status_error(pb.Status(code=code, message=message), address="127.0.0.1:8081",
                         operation="send to T/broker-a:0", user=user,
                         needs=[("Topic:T", ("Pub",))] if needs is None else needs)


def test_a_proxys_refusals_become_the_remoting_ones() -> None:
    e = _grpc_refusal(pb.UNAUTHORIZED, "User:alice has no permission to access Topic:T from 127.0.0.1, "
                                       "no matched policies.")
    assert isinstance(e, AuthorizationError) and isinstance(e, NoPermissionError)
    assert (e.user, e.resource, e.action, e.code, e.retriable) == ("alice", "Topic:T", "Pub", 40100, False)
    assert "user 'alice' may not Pub on Topic:T: User:alice has no permission" in str(e)
    assert "send to T/broker-a:0 at 127.0.0.1:8081" in str(e)
    a = _grpc_refusal(pb.UNAUTHORIZED, "check signature failed.")
    assert isinstance(a, AuthenticationError) and (a.user, a.resource, a.action) == ("alice", "Topic:T", "Pub")
    assert "the proxy did not authenticate user 'alice' for Pub on Topic:T" in str(a)
    assert "is the secret key right?" in str(a)
    u = _grpc_refusal(pb.UNAUTHORIZED, "username cannot be null.", user=None)
    assert isinstance(u, AuthenticationError) and u.user is None and "an unsigned request" in str(u)
    # a queue permission, a message the ACL does not word, and no call described: as before
    assert type(_grpc_refusal(pb.FORBIDDEN, "no writable queue")) is NoPermissionError
    assert type(_grpc_refusal(pb.UNAUTHORIZED, "topic is null.")) is NoPermissionError
    bare = _status_error(pb.Status(code=pb.UNAUTHORIZED, message="check signature failed."), address="a",
                         operation="o")
    assert type(bare) is NoPermissionError


class _AclProxy(pb_grpc.MessagingServiceServicer):
    """A proxy with ACL on, as 5.5.0 answers: a route for every topic, and every send refused."""

    def __init__(self) -> None:
        self.sends = 0
        self.port = 0

    def QueryRoute(self, request, context):  # noqa: N802 (gRPC method name)
        mq = pb.MessageQueue(topic=request.topic, permission=pb.READ_WRITE, broker=pb.Broker(name="broker-x"))
        mq.broker.endpoints.addresses.add(host="127.0.0.1", port=self.port)
        return pb.QueryRouteResponse(status=pb.Status(code=pb.OK), message_queues=[mq])

    def SendMessage(self, request, context):  # noqa: N802
        self.sends += 1
        who = dict(context.invocation_metadata()).get("authorization", "")
        assert "Credential=alice," in who and "S3cret" not in who
        return pb.SendMessageResponse(status=pb.Status(code=pb.UNAUTHORIZED, message=(
            f"User:alice has no permission to access Topic:{request.messages[0].topic.name} from 127.0.0.1, "
            "no matched policies.")))

    def Heartbeat(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "check signature failed.")

    def Telemetry(self, request_iterator, context):  # noqa: N802
        for cmd in request_iterator:  # settings refused in a status command, as the 5.5.0 proxy does
            topic = cmd.settings.publishing.topics[0].name
            yield pb.TelemetryCommand(status=pb.Status(code=pb.UNAUTHORIZED, message=(
                f"User:alice has no permission to access Topic:{topic} from 127.0.0.1, no matched policies.")))


@pytest.fixture()
def acl_proxy() -> Iterator[_AclProxy]:
    """:class:`_AclProxy` served on 127.0.0.1 (its ``port`` set) for the test."""
    proxy = _AclProxy()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_MessagingServiceServicer_to_server(proxy, server)
    proxy.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield proxy
    finally:
        server.stop(0)


def test_a_grpc_client_raises_the_refusal_naming_the_user_and_sends_it_once(acl_proxy: _AclProxy) -> None:
    proxy = acl_proxy
    c = GrpcClient(f"127.0.0.1:{proxy.port}", ClientConfig(retries=5, credentials=Credentials("alice", "S3cret-x")))
    try:
        mq = c.message_queues("T", writable=True)[0]
        with pytest.raises(AuthorizationError) as ei:
            c.send_batch(mq, [BatchEntry(b"x")])
        assert (ei.value.user, ei.value.resource, ei.value.action) == ("alice", "Topic:T", "Pub")
        assert proxy.sends == 1 and "S3cret" not in str(ei.value)
        # a gRPC status (not the proxy's own) with the same words: the same error kinds
        with pytest.raises(AuthenticationError) as hi:
            c.heartbeat_consumer("G", f"127.0.0.1:{proxy.port}")
        assert (hi.value.user, hi.value.resource, hi.value.action) == ("alice", "Group:G", "Sub")
    finally:
        c.close()


def test_a_producers_refused_telemetry_settings_fail_its_start_naming_the_refusal(acl_proxy: _AclProxy) -> None:
    # (a transactional producer over gRPC opens Telemetry first: its refusal was ignored, and the
    # start waited the request timeout for settings that never came)
    c = GrpcClient(f"127.0.0.1:{acl_proxy.port}", ClientConfig(request_timeout_s=30,
                                                           credentials=Credentials("alice", "S3cret-x")))
    try:
        with pytest.raises(AuthorizationError) as ei:
            c.start_producer("pg", ["T"])
        assert (ei.value.user, ei.value.resource, ei.value.action) == ("alice", "Topic:T", "Pub")
        assert "S3cret" not in str(ei.value) and c._telemetry is None  # a later start tries again
    finally:
        c.close()
