"""The latency suite's steady producer for RocketMQ, in a process of its own (so it shares no GIL
with the Spark driver's foreachBatch sink):

    python -m benchmarks._paced --namesrv HOST:PORT --topic T --queues 1 --rate 1000 --seconds 20

It creates the topic (``--queues`` queues) and waits until its route is known, prints
``{"ready": true}``, waits for a line on stdin, then sends for ``--seconds`` on a fixed schedule:
message ``k`` is due at ``t0 + k / rate``. Each turn of its loop sends every message due by then
in one request (one message at low rates, a few at high ones), round-robin over the queues, with
:class:`~rocketmq_spark.client.RemotingClient` (sync sends: the next turn starts after the
broker's answer). Every body starts with its send time, microseconds since the epoch as 16
ASCII digits (:func:`body`), taken just before its request goes out. At the end it prints one
JSON line: messages sent, the achieved rate and how far behind the schedule it fell at worst.

The Kafka producer (``_paced_kafka/PacedKafkaProducer.java``) keeps the same schedule and body.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, encode_properties

__all__ = ["TS_DIGITS", "body", "main"]

#: the send time at the head of every body: microseconds since the epoch, zero-padded
TS_DIGITS = 16
#: messages per request at most (a turn that fell far behind sends the backlog in several)
MAX_BATCH = 256


def body(sent_us: int, size: int) -> bytes:
    """A ``size``-byte body (at least TS_DIGITS) that starts with ``sent_us`` in ASCII digits."""
    head = f"{sent_us:0{TS_DIGITS}d}".encode()
    return head + b"x" * max(0, size - len(head))


def now_us() -> int:
    return time.time_ns() // 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._paced", description=__doc__.splitlines()[0])
    p.add_argument("--namesrv", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--rate", type=float, required=True, help="messages per second")
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--body-size", type=int, default=100)
    a = p.parse_args(argv)
    c = RemotingClient(a.namesrv)
    try:
        c.create_topic(a.topic, a.queues)
        deadline = time.monotonic() + 60
        qs = c.message_queues(a.topic, refresh=True)
        while len(qs) < a.queues and time.monotonic() < deadline:
            time.sleep(0.2)
            qs = c.message_queues(a.topic, refresh=True)
        if len(qs) < a.queues:
            raise RuntimeError(f"{a.topic}: {len(qs)} of {a.queues} queues routed after 60 s")
        prefix = uuid.uuid4().hex[:16].upper()
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()
        total = int(a.rate * a.seconds)
        sent = turns = 0
        worst_lag_s = 0.0
        t0 = time.perf_counter()
        while sent < total:
            now = time.perf_counter()
            due = min(total, int((now - t0) * a.rate) + 1) - sent
            if due <= 0:
                time.sleep(max(0.0, t0 + sent / a.rate - now))
                continue
            worst_lag_s = max(worst_lag_s, now - (t0 + sent / a.rate))
            k = min(due, MAX_BATCH)
            ts = now_us()
            b = body(ts, a.body_size)
            entries = [BatchEntry(b, encode_properties({"KEYS": f"k{j}", "UNIQ_KEY": f"{prefix}{j:016X}"}))
                       for j in range(sent, sent + k)]
            c.send_batch(qs[turns % len(qs)], entries)
            sent += k
            turns += 1
        elapsed = time.perf_counter() - t0
        print(json.dumps({"sent": sent, "turns": turns, "elapsed_s": round(elapsed, 3),
                          "achieved_per_s": round(sent / elapsed, 1),
                          "worst_lag_ms": round(worst_lag_s * 1000, 2)}), flush=True)
        return 0
    finally:
        c.close()


if __name__ == "__main__":
    sys.exit(main())
