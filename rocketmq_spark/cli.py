"""The ``rocketmq-spark`` command line.

Only this module configures logging. Errors a user can act on print one line; the
traceback only with ``--verbose``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence

from .errors import RocketMQSparkError

log = logging.getLogger(__name__)

__all__ = ["main"]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        logging.getLogger("py4j").setLevel(logging.WARNING)


def _add_broker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", help="where the store lives (default: ~/.rocketmq-spark/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind and advertise (default 127.0.0.1)")
    p.add_argument("--namesrv-port", type=int, default=9876, help="name server port, 0 = ephemeral (default 9876)")
    p.add_argument("--broker-port", type=int, default=10911, help="broker port, 0 = ephemeral (default 10911)")
    p.add_argument("--flush", choices=("async", "sync"), default="async",
                   help="sync: a send succeeds only once fsynced (default async)")
    p.add_argument("--broker-name", default="broker-a")
    p.add_argument("--no-auto-create", action="store_true", help="refuse unknown topics instead of creating them")
    p.add_argument("--max-pull-messages", type=int, default=None,
                   help="cap on messages per pull (a real broker serves 32)")


def _cmd_broker(args: argparse.Namespace) -> int:
    from .broker.broker import BrokerConfig
    from .broker.server import BrokerServer

    data_dir = args.data_dir or os.path.join(os.path.expanduser("~"), ".rocketmq-spark", "broker")
    os.makedirs(data_dir, exist_ok=True)
    extra = {}
    if args.max_pull_messages:
        extra["max_pull_messages"] = args.max_pull_messages
    config = BrokerConfig(data_dir=data_dir, host=args.host, flush=args.flush, broker_name=args.broker_name,
                          auto_create_topics=not args.no_auto_create, **extra)
    server = BrokerServer(config, namesrv_port=args.namesrv_port, broker_port=args.broker_port)

    async def run() -> None:
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # One machine-readable line first (tools and tests parse it), then a human one.
        sys.stdout.write(json.dumps({"namesrv": server.namesrv_addr, "broker": server.broker_addr,
                                     "brokerName": config.broker_name, "dataDir": data_dir}) + "\n")
        sys.stdout.write(f"name server listening on {server.namesrv_addr}\n"
                         f"broker {config.broker_name} listening on {server.broker_addr}\n"
                         f"data in {data_dir}; Ctrl-C to stop\n")
        sys.stdout.flush()
        await stop.wait()
        await server.stop()

    asyncio.run(run())
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """Start a broker, produce sample orders, read them back, commit the group's offsets."""
    from .broker.server import EmbeddedBroker
    from .client.remoting import RemotingClient
    from .remoting.message import BatchEntry, decode_records, encode_properties

    topic, group, n = args.topic, args.group, args.messages
    with tempfile.TemporaryDirectory(prefix="rocketmq-spark-demo-") as tmp, EmbeddedBroker(tmp) as mq:
        print(f"embedded broker up: name server {mq.namesrv_addr}, broker {mq.broker_addr}")
        client = RemotingClient(mq.namesrv_addr)
        try:
            queues = client.message_queues(topic)
            t0 = time.monotonic()
            batch: dict[int, list[BatchEntry]] = {}
            for i in range(n):
                order = {"orderId": i, "customer": f"c{i % 7}", "amount": round(10 + (i * 37 % 900) / 10, 2)}
                props = encode_properties({"TAGS": "paid" if i % 3 else "refund", "KEYS": f"order-{i}"})
                batch.setdefault(i % len(queues), []).append(BatchEntry(json.dumps(order).encode(), props))
            for qi, entries in batch.items():
                for k in range(0, len(entries), 256):
                    client.send_batch(queues[qi], entries[k : k + 256])
            print(f"produced {n} orders to {topic} over {len(queues)} queues in {time.monotonic() - t0:.2f}s")
            totals: dict[str, float] = {}
            count = 0
            for q in queues:
                start = client.query_consumer_offset(group, q) or 0
                end = client.max_offset(q)
                off = start
                while off < end:
                    res = client.pull(q, off, 1024)
                    for rec in decode_records(res.body):
                        order = json.loads(rec.payload())
                        tag = rec.tags or "-"
                        totals[tag] = totals.get(tag, 0.0) + order["amount"]
                        count += 1
                    off = res.next_offset
                client.update_consumer_offset(group, q, off)
            print(f"consumed {count} orders as group {group}; committed offsets:")
            for q in queues:
                print(f"  {q.key:<14} consumer offset {client.query_consumer_offset(group, q):>7}"
                      f"  max offset {client.max_offset(q):>7}")
            print("amount by tag:")
            for tag, amount in sorted(totals.items()):
                print(f"  {tag:<8} {amount:12.2f}")
            if count != n:
                print(f"error: consumed {count} of {n} orders", file=sys.stderr)
                return 1
        finally:
            client.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rocketmq-spark", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="run the embedded name server + broker in the foreground")
    _add_broker_args(b)
    b.set_defaults(func=_cmd_broker)
    d = sub.add_parser("demo", help="the main job on an embedded broker: produce, consume, commit")
    d.add_argument("--topic", default="orders")
    d.add_argument("--group", default="demo-etl")
    d.add_argument("--messages", type=int, default=10_000)
    d.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    try:
        return int(args.func(args) or 0)
    except RocketMQSparkError as exc:
        if args.verbose:
            raise
        print(f"rocketmq-spark: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if args.verbose:
            raise
        print(f"rocketmq-spark: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
