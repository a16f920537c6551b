"""Drives the official RocketMQ 5 Python SDK (PyPI rocketmq-python-client) against a gRPC
endpoint. Tests run it as a subprocess: the SDK registers the apache.rocketmq.v2
descriptors in protobuf's default pool and starts its own threads and logging.

    python rmq5_peer.py produce ENDPOINT TOPIC      stdin: JSON list of {body, tag, keys, props, group}
                                                    stdout: JSON list of message ids
    python rmq5_peer.py consume ENDPOINT TOPIC GROUP COUNT TIMEOUT_S
                                                    stdout: JSON list of the messages received (acked)
"""

from __future__ import annotations

import json
import sys
import time


def produce(endpoint: str, topic: str) -> list[str]:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    specs = json.load(sys.stdin)
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    ids = []
    try:
        for spec in specs:
            msg = Message()
            msg.topic = topic
            msg.body = spec["body"].encode()
            if spec.get("tag"):
                msg.tag = spec["tag"]
            for key in spec.get("keys", []):
                msg.keys = key
            for k, v in spec.get("props", {}).items():
                msg.add_property(k, v)
            if spec.get("group"):
                msg.message_group = spec["group"]
            ids.append(producer.send(msg).message_id)
    finally:
        producer.shutdown()
    return ids


def consume(endpoint: str, topic: str, group: str, count: int, timeout_s: float) -> list[dict[str, object]]:
    from rocketmq import ClientConfiguration, Credentials, FilterExpression, SimpleConsumer

    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression()},
                              await_duration=2)
    consumer.startup()
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            for m in consumer.receive(32, 15) or []:
                got.append({"body": m.body.decode(errors="replace"), "tag": m.tag, "keys": sorted(m.keys),
                            "props": dict(m.properties), "messageId": m.message_id, "group": m.message_group,
                            "attempt": m.delivery_attempt})
                consumer.ack(m)
    finally:
        consumer.shutdown()
    return got


def main(argv: list[str]) -> int:
    if argv[1] == "produce":
        out: object = produce(argv[2], argv[3])
    elif argv[1] == "consume":
        out = consume(argv[2], argv[3], argv[4], int(argv[5]), float(argv[6]))
    else:
        print(f"unknown mode {argv[1]!r}", file=sys.stderr)
        return 2
    sys.stdout.write("\nRESULT " + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
