"""``topic create|list|describe``."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from ..errors import BrokerError
from .common import (
    PROG,
    CliError,
    Parser,
    fmt_time,
    is_system_topic,
    iso_utc,
    make_client,
    namesrv_of,
    positive_int_arg,
    print_json,
    require_topic,
    table,
    topic_arg,
)

log = logging.getLogger(__name__)


def add_commands(sub: argparse._SubParsersAction[Parser], client: Parser, js: Parser) -> None:
    t = sub.add_parser("topic", help="create, list or describe topics")
    tsub = t.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    tc = tsub.add_parser("create", parents=[client], help="create (or update) a topic on every broker")
    tc.add_argument("name", type=topic_arg)
    tc.add_argument("-q", "--queues", type=positive_int_arg, default=4, help="read and write queues (default 4)")
    tc.add_argument("--broker", help="only on this broker (name, e.g. broker-a)")
    tc.add_argument("--perm", choices=("rw", "r", "w"), default="rw", help="permissions (default rw)")
    tc.set_defaults(func=_cmd_topic_create)
    tl = tsub.add_parser("list", parents=[client, js], help="topics with their queues per broker")
    tl.add_argument("-a", "--all", action="store_true", help="include system topics (TBW102, %%RETRY%%...)")
    tl.set_defaults(func=_cmd_topic_list)
    td = tsub.add_parser("describe", parents=[client, js], help="a topic's queues with min/max offsets per broker")
    td.add_argument("name", type=topic_arg)
    td.set_defaults(func=_cmd_topic_describe)


def _perm_text(perm: int) -> str:
    return ("R" if perm & 4 else "-") + ("W" if perm & 2 else "-")


def _cmd_topic_create(args: argparse.Namespace) -> int:
    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        brokers = client.cluster_brokers()
        if args.broker:
            if args.broker not in brokers:
                known = ", ".join(sorted(brokers)) or "none"
                raise CliError(f"broker {args.broker!r} is not registered on {ns} (brokers: {known}): "
                               "pass one of them to --broker")
            brokers = {args.broker: brokers[args.broker]}
        if not brokers:
            raise CliError(f"the name server {ns} knows no broker: start one with `{PROG} broker`")
        existed = args.name in client.topic_list()
        perm = {"rw": 6, "r": 4, "w": 2}[args.perm]
        for addr in brokers.values():
            client.create_topic(args.name, args.queues, broker_addr=addr, perm=perm)
        verb = "updated" if existed else "created"
        print(f"{verb} topic {args.name} with {args.queues} queues ({_perm_text(perm)}) on "
              + ", ".join(f"{n} ({a})" for n, a in brokers.items()))
    finally:
        client.close()
    return 0


def _cmd_topic_list(args: argparse.Namespace) -> int:
    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        names = client.topic_list()
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for broker, addr in client.cluster_brokers().items():
            try:
                configs = client.topic_configs(addr)
            except BrokerError as exc:  # a broker without code 21: names only
                log.debug("topic configs of %s unavailable: %s", broker, exc)
                continue
            for topic, cfg in sorted(configs.items()):
                if topic not in names:
                    continue
                seen.add(topic)
                rows.append({"topic": topic, "broker": broker, "readQueues": int(cfg.get("readQueueNums", 0)),
                             "writeQueues": int(cfg.get("writeQueueNums", 0)), "perm": int(cfg.get("perm", 6))})
        rows += [{"topic": t, "broker": None, "readQueues": None, "writeQueues": None, "perm": None}
                 for t in names if t not in seen]
        if not args.all:
            rows = [r for r in rows if not is_system_topic(r["topic"])]
        rows.sort(key=lambda r: (r["topic"], r["broker"] or ""))
        if args.json:
            print_json(rows)
            return 0
        if not rows:
            print(f"no topics on {ns} yet: create one with `{PROG} topic create NAME`")
            return 0
        print(table(["TOPIC", "BROKER", "READ QUEUES", "WRITE QUEUES", "PERM"],
                     [[r["topic"], r["broker"], r["readQueues"], r["writeQueues"],
                       None if r["perm"] is None else _perm_text(r["perm"])] for r in rows]))
    finally:
        client.close()
    return 0


def _cmd_topic_describe(args: argparse.Namespace) -> int:
    from ..checkpoints.progress import StoreTimes  # the server commands load none of the Spark side

    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        require_topic(client, args.name, ns)
        route = client.route(args.name, refresh=True)
        queues = client.message_queues(args.name)
        rows: list[dict[str, Any]] = []  # as --json prints them
        ranges = client.offset_ranges(queues)
        times = StoreTimes(client)  # a user that may not Sub the library's group: times unknown
        for mq in queues:
            lo, hi = ranges[mq]
            last = times.at(mq, hi - 1) if hi > lo else None
            rows.append({"broker": mq.broker, "queueId": mq.queue_id, "minOffset": lo, "maxOffset": hi,
                         "messages": hi - lo, "lastStoreTimestamp": last, "lastStoreTime": iso_utc(last)})
        brokers: list[dict[str, Any]] = [
            {"broker": q.broker_name, "address": route.broker_addr(q.broker_name), "readQueues": q.read_queue_nums,
             "writeQueues": q.write_queue_nums, "perm": q.perm} for q in route.queue_datas]
        if args.json:
            print_json({"topic": args.name, "brokers": brokers, "queues": rows})
            return 0
        total = sum(r["messages"] for r in rows)
        print(f"topic {args.name}: {len(rows)} readable queues on {len(brokers)} broker(s), {total:,} messages")
        for b in brokers:
            print(f"  {b['broker']} at {b['address']}: read {b['readQueues']}, write {b['writeQueues']}, "
                  f"perm {_perm_text(b['perm'])}")
        print(table(["BROKER", "QUEUE", "MIN OFFSET", "MAX OFFSET", "MESSAGES", "LAST STORE TIME"],
                     [[r["broker"], r["queueId"], r["minOffset"], r["maxOffset"], r["messages"],
                       fmt_time(r["lastStoreTimestamp"])] for r in rows]))
    finally:
        client.close()
    return 0
