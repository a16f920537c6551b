"""Namespace naming rules (the Java client's NamespaceUtil, as setNamespace applies them) and
where the options and the gRPC transport apply them."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from rocketmq_spark.client import ClientConfig
from rocketmq_spark.client.grpc_client import stamp_namespace, wire_name
from rocketmq_spark.errors import OptionError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.namespaces import is_system_resource, namespace_of, namespace_problem, unwrap, unwrap_columns, wrap
from rocketmq_spark.options import namespace
from rocketmq_spark.proto import pb
from rocketmq_spark.proto.messages import name_resource
from rocketmq_spark.sink.options import WriterOptions
from rocketmq_spark.source.options import ReaderOptions

NS = "127.0.0.1:9876"


@pytest.mark.parametrize("name, wire, user", [
    ("orders", "prod%orders", "orders"),
    ("%RETRY%billing", "%RETRY%prod%billing", "%RETRY%billing"),
    ("%DLQ%billing", "%DLQ%prod%billing", "%DLQ%billing"),
    ("prod%orders", "prod%orders", "orders"),  # already in the namespace: left as it is
    ("%RETRY%prod%billing", "%RETRY%prod%billing", "%RETRY%billing"),
    ("TBW102", "TBW102", "TBW102"),  # system topics and groups are the same in every namespace
    ("SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX"),
    ("rmq_sys_TRACE", "rmq_sys_TRACE", "rmq_sys_TRACE"),
    ("CID_RMQ_SYS_TRANS", "CID_RMQ_SYS_TRANS", "CID_RMQ_SYS_TRANS"),
    ("", "", ""),
])
def test_wrap_and_unwrap_follow_the_java_clients_rules(name: str, wire: str, user: str) -> None:
    assert wrap("prod", name) == wire
    assert unwrap("prod", wire) == user


def test_without_a_namespace_names_are_as_given() -> None:
    assert wrap("", "orders") == "orders" and unwrap("", "prod%orders") == "prod%orders"


def test_unwrap_leaves_another_namespaces_names() -> None:
    assert unwrap("prod", "test%orders") == "test%orders"
    assert unwrap("prod", "%RETRY%test%g") == "%RETRY%test%g"
    assert unwrap("prod", "production%orders") == "production%orders"  # a prefix is not a namespace


def test_namespace_of_a_wire_name() -> None:
    assert namespace_of("prod%orders") == "prod"
    assert namespace_of("%RETRY%prod%g") == "prod"
    assert namespace_of("orders") == "" and namespace_of("TBW102") == ""
    assert is_system_resource("OFFSET_MOVED_EVENT") and not is_system_resource("prod%OFFSET_MOVED_EVENT")


@pytest.mark.parametrize("bad", ["a%b", "with space", "rmq_sys_x", "CID_RMQ_SYS_x", "x" * 65, "ünï"])
def test_bad_namespaces_are_refused_naming_what_is_accepted(bad: str) -> None:
    assert namespace_problem(bad)
    with pytest.raises(OptionError) as info:
        namespace(bad)
    assert info.value.option == "namespace" and "accepted: letters, digits" in str(info.value)


def test_blank_namespace_is_none() -> None:
    assert namespace(None) == namespace("  ") == ""
    assert namespace(" prod|eu-1 ") == "prod|eu-1"


def test_reader_options_carry_the_wire_names() -> None:
    opts = ReaderOptions.parse({"namesrvAddr": NS, "topic": "a, b", "consumerGroup": "g", "namespace": "prod",
                                "includeRetryTopic": "true",
                                "startingOffsets": '{"a":{"broker-a:0":3},"prod%b":{"broker-a:1":4}}'}, stream=True)
    assert opts.namespace == "prod"
    assert opts.topics == ("prod%a", "prod%b", "%RETRY%prod%g")
    assert opts.consumer_group == "prod%g"
    assert opts.starting_json is not None
    assert dict(opts.starting_json) == {MessageQueue("prod%a", "broker-a", 0): 3,
                                        MessageQueue("prod%b", "broker-a", 1): 4}


def test_reader_options_without_namespace_are_unchanged() -> None:
    opts = ReaderOptions.parse({"namesrvAddr": NS, "topic": "a", "consumerGroup": "g"}, stream=True)
    assert (opts.namespace, opts.topics, opts.consumer_group) == ("", ("a",), "g")


def test_writer_options_carry_the_wire_names() -> None:
    opts = WriterOptions.parse({"namesrvAddr": NS, "topic": "t", "namespace": "prod", "delivery": "send-back",
                                "consumerGroup": "g", "producerGroup": "p"})
    assert (opts.topic, opts.send_back_group, opts.producer_group, opts.namespace) == (
        "prod%t", "prod%g", "prod%p", "prod")


def test_rows_name_the_users_topics() -> None:
    batch = pa.RecordBatch.from_pydict({
        "topic": ["prod%orders", "%RETRY%prod%g", "%DLQ%prod%g", "test%orders", None],
        "retryTopic": ["prod%orders", None, "prod%x", None, None],
        "body": [b"1", b"2", b"3", b"4", b"5"]})
    out = unwrap_columns(batch, "prod")
    assert out.column(0).to_pylist() == ["orders", "%RETRY%g", "%DLQ%g", "test%orders", None]
    assert out.column(1).to_pylist() == ["orders", None, "x", None, None]
    assert out.schema == batch.schema and out.column(2) == batch.column(2)
    assert unwrap_columns(batch, "") is batch


def test_client_config_keeps_the_namespace_through_pickling_and_copies() -> None:
    cfg = ClientConfig(namespace="prod")
    assert pickle.loads(pickle.dumps(cfg)).namespace == "prod"
    assert ClientConfig().with_namespace("x").namespace == "x"
    assert cfg.with_credentials(None).namespace == "prod"


def test_grpc_requests_name_the_namespace_in_every_resource() -> None:
    req = pb.ReceiveMessageRequest()
    req.group.name = "prod%g"
    req.message_queue.topic.name = "prod%t"
    req.message_queue.broker.name = "broker-a"
    stamp_namespace(req, "prod")
    assert req.group.resource_namespace == req.message_queue.topic.resource_namespace == "prod"
    assert req.group.name == "prod%g"  # the name stays the wire name (5.2+ proxies read only it)
    settings = pb.Settings()
    settings.publishing.topics.add(name="prod%a")
    settings.publishing.topics.add(name="prod%b")
    cmd = pb.TelemetryCommand(settings=settings)
    stamp_namespace(cmd, "prod")
    assert [t.resource_namespace for t in cmd.settings.publishing.topics] == ["prod", "prod"]
    msg = pb.Message(body=b"x")
    msg.topic.name = "prod%t"
    msg.user_properties["k"] = "v"  # map fields are passed over
    stamp_namespace(msg, "prod")
    assert msg.topic.resource_namespace == "prod" and dict(msg.user_properties) == {"k": "v"}


def test_proxy_style_resources_round_trip_to_wire_names() -> None:
    """The embedded broker hands names out as a 5.x proxy does (namespace apart); the client
    joins them back into the name brokers keep."""
    for wire in ("prod%orders", "%RETRY%prod%g", "orders", "TBW102"):
        res = pb.Resource()
        name_resource(res, wire)
        assert wire_name(res) == wire
    res = pb.Resource()
    name_resource(res, "prod%orders")
    assert (res.resource_namespace, res.name) == ("prod", "orders")
