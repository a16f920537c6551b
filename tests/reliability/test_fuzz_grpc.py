"""Bad input at the embedded broker's gRPC endpoint: requests of every MessagingService method
filled with random field values from the protobuf descriptors (edge numbers, unknown enum
values, odd names, random bytes, nested messages half set), and plain garbage bytes that
do not parse as the request at all.

Each call must end with a status the endpoint chose (a v2 ``Status`` in the response or a
gRPC status such as INVALID_ARGUMENT), never UNKNOWN (an exception escaped a handler), and
the endpoint keeps serving a well-behaved client; the reference messages stay as they were.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from rocketmq_spark import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.proto import pb

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

SEED = 5_2026
SERVICE = "apache.rocketmq.v2.MessagingService"
REF_TOPIC = "GrpcFuzzReference"
INTS = (0, 1, -1, 2, 7, 1023, 1 << 31, -(1 << 31), (1 << 31) - 1, (1 << 63) - 1, -(1 << 63))
STRINGS = ("", "FuzzT0", REF_TOPIC + "x", "TBW102", "%RETRY%g", "a" * 300, "bad/name", "\u00e9", "\x00", "*",
           "broker-a", "127.0.0.1:1", "SQL92", "TagA || TagB", "g")


def _fill(msg: Any, rnd: random.Random, depth: int = 0) -> Any:
    for field in msg.DESCRIPTOR.fields:
        if rnd.random() < 0.35:
            continue
        n = rnd.randrange(0, 3) if field.is_repeated else 1
        for _ in range(n):
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                if depth >= 4:
                    continue
                if field.message_type.GetOptions().map_entry:
                    getattr(msg, field.name)[rnd.choice(STRINGS)] = rnd.choice(STRINGS)
                    continue
                target = getattr(msg, field.name).add() if field.is_repeated \
                    else getattr(msg, field.name)
                _fill(target, rnd, depth + 1)
                if not field.is_repeated:
                    target.SetInParent()
                continue
            value = _value(field, rnd)
            if value is None:
                continue
            if field.is_repeated:
                getattr(msg, field.name).append(value)
            else:
                setattr(msg, field.name, value)
    return msg


def _value(field: FieldDescriptor, rnd: random.Random) -> Any:
    t = field.type
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return max(-(1 << 31), min((1 << 31) - 1, rnd.choice(INTS)))
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return rnd.choice(INTS)
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return abs(rnd.choice(INTS)) % (1 << 32)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return abs(rnd.choice(INTS)) % (1 << 64)
    if t == FieldDescriptor.TYPE_BOOL:
        return rnd.random() < 0.5
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rnd.choice((0.0, -1.0, 1e300, float("nan")))
    if t == FieldDescriptor.TYPE_STRING:
        return rnd.choice(STRINGS)
    if t == FieldDescriptor.TYPE_BYTES:
        return rnd.randbytes(rnd.randrange(0, 64))
    if t == FieldDescriptor.TYPE_ENUM:
        values = [v.number for v in field.enum_type.values]
        # unknown numbers too: open enums keep them
        return rnd.choice(values + [99, -5])
    return None


@pytest.fixture()
def grpc_broker(tmp_path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path / "store")) as mq:
        yield mq


def test_fuzzed_grpc_requests_are_answered_and_the_endpoint_keeps_serving(grpc_broker: EmbeddedBroker,
                                                                          soak: bool) -> None:
    rounds = 20_000 if soak else 2_000
    rnd = random.Random(SEED)
    client = RemotingClient(grpc_broker.namesrv_addr)
    channel = grpc.insecure_channel(grpc_broker.grpc_endpoint)
    try:
        client.create_topic(REF_TOPIC, 2)
        qs = client.message_queues(REF_TOPIC, refresh=True)
        for q in qs:
            client.send_batch(q, [BatchEntry(b"ref-%d-%d" % (q.queue_id, i)) for i in range(20)])
        methods = pb.DESCRIPTOR.services_by_name["MessagingService"].methods
        statuses: dict[str, int] = {}
        unknown: list[str] = []
        for i in range(rounds):
            m = rnd.choice(methods)
            request_cls = getattr(pb, m.input_type.name)
            response_cls = getattr(pb, m.output_type.name)
            garbage = rnd.random() < 0.15
            req = rnd.randbytes(rnd.randrange(1, 80)) if garbage else _fill(request_cls(), rnd).SerializeToString()
            path = f"/{SERVICE}/{m.name}"
            try:
                if m.client_streaming:
                    call = channel.stream_stream(path, request_serializer=None, response_deserializer=None)
                    got = list(call(iter([req]), timeout=2))
                elif m.server_streaming:
                    call = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
                    got = list(call(req, timeout=5))
                else:
                    call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
                    got = [call(req, timeout=5)]
                for raw in got:
                    response_cls.FromString(raw)  # what the endpoint answers parses as the response
                key = f"{m.name} OK"
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.DEADLINE_EXCEEDED and (m.client_streaming or m.server_streaming):
                    key = f"{m.name} held open"  # Telemetry, long polls: the client hangs up
                else:
                    key = f"{m.name} {code.name}"
                    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE,
                                grpc.StatusCode.DEADLINE_EXCEEDED):
                        unknown.append(f"#{i} {m.name} {'garbage' if garbage else 'fuzzed'}: {code.name} "
                                       f"{exc.details()} request={req[:200]!r}")
            statuses[key] = statuses.get(key, 0) + 1
        assert not unknown, f"{len(unknown)} calls ended without a status the endpoint chose: " + "; ".join(unknown[:5])
        assert sum(statuses.values()) == rounds
        logging.getLogger(__name__).info("%d gRPC calls fuzzed: %s", rounds, dict(sorted(statuses.items())))
        # still serving, over gRPC and remoting, and the reference messages are as they were
        route = pb.QueryRouteRequest()
        route.topic.name = REF_TOPIC
        ok = channel.unary_unary(f"/{SERVICE}/QueryRoute", request_serializer=pb.QueryRouteRequest.SerializeToString,
                                 response_deserializer=pb.QueryRouteResponse.FromString)(route, timeout=5)
        assert ok.status.code == pb.OK and len(ok.message_queues) == 2
        for q in qs:
            assert client.max_offset(q) == 20
            assert [m.payload() for m in decode_records(client.pull(q, 0, 64).body)] == [
                b"ref-%d-%d" % (q.queue_id, i) for i in range(20)]
    finally:
        channel.close()
        client.close()
