"""``progress`` (a consumer group's offsets and lag per queue, as mqadmin consumerProgress)
and ``reset-offset`` (a group's offsets by time, as mqadmin resetOffsetByTime)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import RocketMQSparkError
from ..model import MessageQueue
from .common import (
    CliError,
    Parser,
    fmt_time,
    group_arg,
    is_system_topic,
    iso_utc,
    make_client,
    namesrv_of,
    print_json,
    require_topic,
    table,
    timestamp_arg,
    topic_arg,
)

log = logging.getLogger(__name__)


def add_commands(sub: argparse._SubParsersAction[Parser], client: Parser, js: Parser) -> None:
    g = sub.add_parser("progress", parents=[client, js],
                       help="a consumer group's offsets and lag per queue (mqadmin consumerProgress)")
    g.add_argument("-g", "--group", required=True, type=group_arg)
    g.add_argument("-t", "--topic", type=topic_arg,
                   help="only this topic (default: every topic the group has offsets on)")
    g.set_defaults(func=_cmd_progress)

    r = sub.add_parser("reset-offset", parents=[client, js],
                       help="set a group's offsets to the first message at/after a time (mqadmin resetOffsetByTime)")
    r.add_argument("-g", "--group", required=True, type=group_arg)
    r.add_argument("-t", "--topic", required=True, type=topic_arg)
    r.add_argument("--timestamp", required=True, type=timestamp_arg,
                   help="epoch milliseconds, ISO-8601 (local time unless it has a zone), 'now', 'earliest' "
                        "or 'latest'")
    r.add_argument("--dry-run", action="store_true", help="print the plan (current -> new offset), write nothing")
    r.set_defaults(func=_cmd_reset_offset)


@dataclass(slots=True)
class QueueProgress:
    """One queue of a group, as mqadmin consumerProgress shows it."""

    queue: MessageQueue
    broker_offset: int  # max offset
    consumer_offset: int | None  # None: the group never committed this queue
    min_offset: int
    last_timestamp: int | None  # store time of the last consumed message

    @property
    def lag(self) -> int:
        start = self.consumer_offset if self.consumer_offset is not None else self.min_offset
        return max(0, self.broker_offset - start)

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.queue.topic, "broker": self.queue.broker, "queueId": self.queue.queue_id,
                "brokerOffset": self.broker_offset, "consumerOffset": self.consumer_offset, "lag": self.lag,
                "lastTimestamp": self.last_timestamp, "lastTime": iso_utc(self.last_timestamp)}


def group_progress(client: Any, group: str, topic: str | None, namesrv: str) -> list[QueueProgress]:
    """Per queue: broker (max) offset, ``group``'s offset, lag, last consumed store time.

    Without ``topic``, every non-system topic on which the group has committed an offset.
    A group with no offset at all is a :class:`CliError` (most often a misspelled name).
    """
    if topic is not None:
        require_topic(client, topic, namesrv)
        topics = [topic]
    else:
        topics = [t for t in client.topic_list() if not is_system_topic(t)]
    out: list[QueueProgress] = []
    for t in topics:
        queues = client.message_queues(t)
        offsets = client.query_consumer_offsets(group, queues)
        if all(v is None for v in offsets.values()):
            continue
        ranges = client.offset_ranges(queues)
        for mq in queues:
            (lo, hi), off = ranges[mq], offsets[mq]
            last = client.store_time_at(mq, off - 1) if off is not None and off - 1 >= lo else None
            out.append(QueueProgress(mq, hi, off, lo, last))
    if not out:
        where = f"topic {topic!r}" if topic else f"any topic on {namesrv}"
        raise CliError(f"consumer group {group!r} has no committed offsets on {where}: check the group name "
                       "(it is case-sensitive) or let a consumer commit first")
    return out


def _online_consumers(client: Any, group: str) -> int:
    ids: set[str] = set()
    for addr in client.cluster_brokers().values():
        try:
            ids.update(client.consumer_ids(group, addr))
        except RocketMQSparkError as exc:
            log.debug("consumer list of %s at %s unavailable: %s", group, addr, exc)
    return len(ids)


def progress_table(rows: Sequence[QueueProgress], *, indent: str = "") -> str:
    return table(["TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "LAST TIME"],
                  [[r.queue.topic, r.queue.broker, r.queue.queue_id, r.broker_offset, r.consumer_offset, r.lag,
                    fmt_time(r.last_timestamp)] for r in rows], indent=indent)


def _cmd_progress(args: argparse.Namespace) -> int:
    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        rows = group_progress(client, args.group, args.topic, ns)
        online = _online_consumers(client, args.group)
    finally:
        client.close()
    total = sum(r.lag for r in rows)
    topics = sorted({r.queue.topic for r in rows})
    if args.json:
        print_json({"group": args.group, "topics": topics, "onlineConsumers": online, "totalLag": total,
                     "queues": [r.to_json() for r in rows]})
        return 0
    print(f"consumer group {args.group}: {len(topics)} topic(s), {len(rows)} queues, total lag {total:,}, "
          f"{online} online consumer(s)")
    print(progress_table(rows))
    return 0


# -- reset-offset -----------------------------------------------------------------------


def _cmd_reset_offset(args: argparse.Namespace) -> int:
    ns = namesrv_of(args)
    ts = args.timestamp
    client = make_client(ns, args)
    try:
        require_topic(client, args.topic, ns)
        queues = client.message_queues(args.topic, refresh=True)
        current = client.query_consumer_offsets(args.group, queues)
        maxes = client.max_offsets(queues) if ts < 0 else {}
        plan = [{"broker": mq.broker, "queueId": mq.queue_id, "current": current[mq],
                 "new": maxes[mq] if ts < 0 else client.search_offset(mq, ts)} for mq in queues]
        if not args.dry_run:
            online = _online_consumers(client, args.group)
            written = client.reset_offset_by_timestamp(args.group, args.topic, ts)
            for row in plan:
                got = written.get(MessageQueue(args.topic, row["broker"], row["queueId"]))
                if got is not None:
                    row["new"] = got
    finally:
        client.close()
    when = ("the latest offsets" if ts < 0 else "the earliest offsets" if ts == 0
            else f"the first message at/after {fmt_time(ts)} ({ts})")
    if args.json:
        out = {"group": args.group, "topic": args.topic, "timestamp": ts, "dryRun": args.dry_run, "queues": plan}
        if not args.dry_run:
            out["notifiedConsumers"] = online
        print_json(out)
        return 0
    verb = "would reset" if args.dry_run else "reset"
    print(f"{verb} group {args.group} on topic {args.topic} to {when}:")
    print(table(["BROKER", "QUEUE", "CURRENT OFFSET", "", "NEW OFFSET"],
                 [[r["broker"], r["queueId"], r["current"], "->", r["new"]] for r in plan], indent="  "))
    if args.dry_run:
        print("dry run: nothing was written; run again without --dry-run to apply it")
    else:
        print(f"done: {len(plan)} queues written; {online} online consumer(s) of {args.group} move there (on a 5.x "
              "broker at their next pull of each queue, a 4.x broker tells them at once). A running Spark query "
              "stops with an error naming the reset; its checkpoint keeps its own offsets: the group's offsets "
              "apply to a query started on a new checkpoint")
    return 0
