"""``progress`` (a consumer group's offsets and lag per queue, as mqadmin consumerProgress)
and ``reset-offset`` (a group's offsets by time, as mqadmin resetOffsetByTime)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import NoPermissionError, RocketMQSparkError, TopicNotFoundError
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

if TYPE_CHECKING:
    from ..checkpoints.progress import QueueProgress
    from ..client import RemotingClient

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


def progress_rows(client: RemotingClient, group: str, topic: str | None, namesrv: str) -> list[QueueProgress]:
    """The group's progress per queue (:func:`~rocketmq_spark.checkpoints.progress.group_progress`)
    on ``topic``, or without it on every non-system topic where the group committed an offset.

    A group with no offset at all is a :class:`CliError` (most often a misspelled name).
    """
    from ..checkpoints.progress import group_progress

    if topic is not None:
        require_topic(client, topic, namesrv)
        topics = [topic]
    else:
        topics = [t for t in client.topic_list() if not is_system_topic(t) and _readable(client, t)]
    rows = group_progress(client, group, topics)
    if not rows:
        where = f"topic {topic!r}" if topic else f"any topic on {namesrv}"
        raise CliError(f"consumer group {group!r} has no committed offsets on {where}: check the group name "
                       "(it is case-sensitive) or let a consumer commit first")
    return rows


def _readable(client: Any, topic: str) -> bool:
    """Whether a topic the name servers list can be read now (looking for a group's topics among
    them all): one without a route yet, or whose queues are write-only, holds nothing to show and
    must not fail the command."""
    try:
        client.message_queues(topic)
    except (TopicNotFoundError, NoPermissionError) as exc:
        log.info("topic %s left out: %s", topic, exc)
        return False
    return True


@dataclass(frozen=True)
class ConsumerView:
    """What an online consumer of the group says of one queue (GET_CONSUMER_RUNNING_INFO): a
    Spark query, the end of its last planned batch and what it has processed (next-offsets,
    -1 when not known yet)."""

    client_id: str
    planned: int
    processed: int


def _online(client: RemotingClient, group: str, topics: Sequence[str]) -> dict[str, str]:
    """The group's online consumers on the brokers serving ``topics``: client id -> a broker
    it is connected to."""
    return {cid: broker for broker, ids in sorted((client.group_consumers(group, topics) or {}).items())
            for cid in ids}


def _views(client: RemotingClient, group: str, topics: Sequence[str], online: Mapping[str, str]
           ) -> dict[MessageQueue, list[ConsumerView]]:
    """Per queue, what the ``online`` consumers report; one that does not answer is logged
    and left out."""
    out: dict[MessageQueue, list[ConsumerView]] = {}
    for cid, broker in sorted(online.items()):
        try:
            queues = client.consumer_running_info(group, cid, client.broker_addr(broker))
        except RocketMQSparkError as exc:
            log.warning("running info of consumer %s of group %s: %s", cid, group, exc)
            continue
        for mq, info in queues.items():
            if mq.topic in topics:
                out.setdefault(mq, []).append(ConsumerView(cid, int(info.get("cachedMsgMaxOffset", -1)),
                                                           int(info.get("cachedMsgMinOffset", -1))))
    return out


def _row_json(r: QueueProgress, views: Sequence[ConsumerView]) -> dict[str, Any]:
    return {"topic": r.queue.topic, "broker": r.queue.broker, "queueId": r.queue.queue_id,
            "brokerOffset": r.max_offset, "consumerOffset": r.consumer_offset, "lag": r.lag,
            "lastTimestamp": r.last_store_time, "lastTime": iso_utc(r.last_store_time),
            "consumers": [{"clientId": v.client_id, "planned": v.planned, "processed": v.processed} for v in views]}


def _seen(views: Sequence[ConsumerView], field: str) -> str:
    """What the online consumers report of a queue ("-" when none does; "?" when not known yet)."""
    values = [getattr(v, field) for v in views]
    return ", ".join("?" if x < 0 else str(x) for x in values) or "-"


def progress_table(rows: Sequence[QueueProgress], views: Mapping[MessageQueue, Sequence[ConsumerView]] | None = None,
                   *, indent: str = "") -> str:
    """The progress rows; with ``views``, also what the online consumers (a running Spark
    query) have planned and processed of each queue."""
    if views is None:
        return table(["TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "LAST TIME"],
                     [[r.queue.topic, r.queue.broker, r.queue.queue_id, r.max_offset, r.consumer_offset, r.lag,
                       fmt_time(r.last_store_time)] for r in rows], indent=indent)
    return table(["TOPIC", "BROKER", "QUEUE", "BROKER OFFSET", "CONSUMER OFFSET", "LAG", "PLANNED", "PROCESSED",
                  "LAST TIME"],
                 [[r.queue.topic, r.queue.broker, r.queue.queue_id, r.max_offset, r.consumer_offset, r.lag,
                   _seen(views.get(r.queue, ()), "planned"), _seen(views.get(r.queue, ()), "processed"),
                   fmt_time(r.last_store_time)] for r in rows], indent=indent)


def _cmd_progress(args: argparse.Namespace) -> int:
    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        rows = progress_rows(client, args.group, args.topic, ns)
        topics = sorted({r.queue.topic for r in rows})
        online = _online(client, args.group, topics)
        views = _views(client, args.group, topics, online)
    finally:
        client.close()
    total = sum(r.lag for r in rows)
    if args.json:
        print_json({"group": args.group, "topics": topics, "onlineConsumers": len(online), "totalLag": total,
                     "queues": [_row_json(r, views.get(r.queue, ())) for r in rows]})
        return 0
    print(f"consumer group {args.group}: {len(topics)} topic(s), {len(rows)} queues, total lag {total:,}, "
          f"{len(online)} online consumer(s)")
    print(progress_table(rows, views if online else None))
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
        new: dict[MessageQueue, int | None]
        if args.dry_run:  # what the brokers would set: the same search by time
            new = dict(client.max_offsets(queues)) if ts < 0 else {mq: client.search_offset(mq, ts) for mq in queues}
        else:  # what they set, as they answered (a queue they did not name was not written)
            told = sorted(_online(client, args.group, [args.topic]))
            written = client.reset_offset_by_timestamp(args.group, args.topic, ts)
            new = {mq: written.get(mq) for mq in queues}
        plan: list[dict[str, Any]] = [{"broker": mq.broker, "queueId": mq.queue_id, "current": current[mq],
                                       "new": new[mq]} for mq in queues]
    finally:
        client.close()
    when = ("the latest offsets" if ts < 0 else "the earliest offsets" if ts == 0
            else f"the first message at/after {fmt_time(ts)} ({ts})")
    if args.json:
        out = {"group": args.group, "topic": args.topic, "timestamp": ts, "dryRun": args.dry_run, "queues": plan}
        if not args.dry_run:
            out["notifiedConsumers"] = len(told)
            out["consumerIds"] = told
        print_json(out)
        return 0
    verb = "would reset" if args.dry_run else "reset"
    print(f"{verb} group {args.group} on topic {args.topic} to {when}:")
    print(table(["BROKER", "QUEUE", "CURRENT OFFSET", "", "NEW OFFSET"],
                 [[r["broker"], r["queueId"], r["current"], "->", "-" if r["new"] is None else r["new"]]
                  for r in plan], indent="  "))
    if args.dry_run:
        print("dry run: nothing was written; run again without --dry-run to apply it")
    else:
        print(f"done: {sum(r['new'] is not None for r in plan)} queues written; {len(told)} online consumer(s) of "
              f"{args.group} move there (on a 5.x "
              "broker at their next pull of each queue, a 4.x broker tells them at once). A Spark query of the group "
              "follows the reset with its next batch, or at its restart if it is stopped (onOffsetReset=follow, its "
              "default)")
        for cid in told:
            print(f"  told: {cid}")
    return 0
