"""ACL refusals as errors: what an ACL 2.0 broker checks per request (:func:`request_needs`, read
from 5.5.0's authorization context builder) and the error a NO_PERMISSION answer becomes, naming
the user (the access key, never a secret), the resource and the action; never retried."""

from __future__ import annotations

import json

import pytest

from rocketmq_spark.client.retry import ClientConfig, retrying
from rocketmq_spark.errors import (
    AccessDeniedError,
    AuthenticationError,
    AuthorizationError,
    BrokerError,
    NoPermissionError,
    broker_error,
)
from rocketmq_spark.remoting.acl import request_needs
from rocketmq_spark.remoting.codes import RequestCode

PULL = request_needs(RequestCode.PULL_MESSAGE, {"topic": "T", "consumerGroup": "G"})


def test_request_needs_follow_the_brokers_table() -> None:
    assert PULL == [("Topic:T", ("Sub",)), ("Group:G", ("Sub",))]
    assert request_needs(RequestCode.SEND_MESSAGE_V2, {"b": "T"}) == [("Topic:T", ("Pub",))]
    assert request_needs(RequestCode.GET_MAX_OFFSET, {"topic": "T"}) == [("Topic:T", ("Get",))]
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
