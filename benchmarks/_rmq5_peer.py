"""The official RocketMQ 5 Python SDK (PyPI rocketmq-python-client) timed against a gRPC
endpoint, for ``benchmarks.peers``. Run as a subprocess: the SDK registers the apache.rocketmq.v2
descriptors in protobuf's default pool (a second copy in one process clashes) and starts its
own threads.

    python -m benchmarks._rmq5_peer send ENDPOINT TOPIC COUNT BODY_SIZE
    python -m benchmarks._rmq5_peer receive ENDPOINT TOPIC GROUP COUNT TIMEOUT_S

The last stdout line is ``RESULT {json}``: messages, elapsed_s (the loop only, client start-up
excluded), startup_s, cpu_s of this process during the loop.
"""

from __future__ import annotations

import json
import sys
import time

from ._cpu import Clock


def send(endpoint: str, topic: str, count: int, body_size: int) -> dict[str, float]:
    from rocketmq import ClientConfiguration, Credentials, Message, Producer

    t0 = time.perf_counter()
    producer = Producer(ClientConfiguration(endpoint, Credentials()), (topic,))
    producer.startup()
    startup = time.perf_counter() - t0
    body = b"p" * body_size
    try:
        with Clock() as loop:
            for i in range(count):
                msg = Message()
                msg.topic = topic
                msg.body = body
                msg.tag = "peer"
                msg.keys = f"k{i}"
                producer.send(msg)
    finally:
        producer.shutdown()
    return {"messages": count, "elapsed_s": loop.wall, "startup_s": startup, "cpu_s": loop.cpu}


def receive(endpoint: str, topic: str, group: str, count: int, timeout_s: float) -> dict[str, float]:
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        SimpleConsumer,
    )

    t0 = time.perf_counter()
    consumer = SimpleConsumer(ClientConfiguration(endpoint, Credentials()), group, {topic: FilterExpression()},
                              await_duration=2)
    consumer.startup()
    startup = time.perf_counter() - t0
    got = 0
    deadline = time.monotonic() + timeout_s
    try:
        with Clock() as loop:
            while got < count and time.monotonic() < deadline:
                for m in consumer.receive(32, 15) or []:
                    consumer.ack(m)
                    got += 1
    finally:
        consumer.shutdown()
    return {"messages": got, "elapsed_s": loop.wall, "startup_s": startup, "cpu_s": loop.cpu}


def main(argv: list[str]) -> int:
    if argv[1] == "send":
        out = send(argv[2], argv[3], int(argv[4]), int(argv[5]))
    elif argv[1] == "receive":
        out = receive(argv[2], argv[3], argv[4], int(argv[5]), float(argv[6]))
    else:
        sys.stderr.write(f"unknown mode {argv[1]!r}: send or receive\n")
        return 2
    sys.stdout.write("\nRESULT " + json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
