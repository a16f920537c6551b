"""A streaming query in its consumer group: checked once (no other consumers unless
allowSharedGroup; the brokers know the group before its offsets are committed), then an
online consumer of it on its brokers (``mqadmin consumerConnection`` lists it; 4.x brokers push
it their offset resets), until it stops."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..client.membership import GroupPresence, QueueStatus, ResetNotice, crashed_member
from ..errors import ConnectionFailedError, GroupInUseError, RocketMQSparkError
from ..model import MessageQueue
from .context import QueryContext

log = logging.getLogger(__name__)

__all__ = ["Membership"]


class Membership:
    """One query's presence in its consumer group."""

    def __init__(self, ctx: QueryContext, running_info: Callable[[], dict[MessageQueue, QueueStatus]]) -> None:
        self.ctx = ctx
        self._running_info = running_info
        self._checked = False
        self._member: GroupPresence | None = None
        self._joined = False
        #: brokers told of the group (see _make_known)
        self._known: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_member"] = None
        state["_joined"] = False
        return state

    def check(self) -> None:
        """Once per query, of every broker serving the topics: fail when other clients consume
        in the group (their commits would interleave with Spark's), unless allowSharedGroup
        (remoting only: gRPC has no consumer-list call; members of gone processes of this host are
        passed, see :func:`~..client.membership.crashed_member`); and make sure the brokers know the
        group before its offsets are committed (see :meth:`_make_known`)."""
        o = self.ctx.options
        if self._checked or not o.consumer_group:
            return
        self._checked = True
        if not o.allow_shared_group:
            self._refuse_other_consumers(o.consumer_group)
        if o.commit_offsets:
            self._make_known(o.consumer_group)

    @property
    def checked(self) -> bool:
        """Whether :meth:`check` ran."""
        return self._checked

    def _refuse_other_consumers(self, group: str) -> None:
        others = self.ctx.client.group_consumers(group, self.ctx.topics)
        if others is None:
            log.info("consumer group %s: online consumers cannot be listed over gRPC; not checked", group)
            return
        live: dict[str, list[str]] = {}
        for broker, ids in sorted(others.items()):
            for cid in ids:
                if crashed_member(cid):
                    log.warning("consumer group %s: broker %s still lists %s, of a process of this host that is gone "
                                "(a crash it did not see): passed", group, broker, cid)
                else:
                    live.setdefault(broker, []).append(cid)
        if live:
            listed = "; ".join(f"{b}: {', '.join(ids)}" for b, ids in sorted(live.items()))
            raise GroupInUseError(
                f"consumer group {group!r} has online consumers ({listed}); their offset commits would interleave "
                f"with this query's. Use a consumerGroup of its own, or set allowSharedGroup=true to accept that (a "
                f"driver of this group that crashed on another host where a broker could not see it stays listed "
                f"there for up to 2 minutes)")

    def _make_known(self, group: str) -> None:
        """Brokers refuse offset commits of a consumer group they do not know and create one
        only on a consumer's heartbeat or pull (autoCreateSubscriptionGroup), its retry topic
        %RETRY%<group> (which mqadmin consumerProgress needs) only on a heartbeat. A broker
        whose queues get no data would never see either, so each broker is told of the group
        once (:meth:`BrokerClient.make_group_known`: the query does not stay listed as an online
        consumer); where the broker does not create groups that fails at once with
        :class:`GroupNotFoundError` naming the group."""
        client = self.ctx.client
        for topic in self.ctx.topics:
            for mq in client.message_queues(topic):
                if mq.broker in self._known:
                    continue
                self._known.add(mq.broker)
                try:
                    client.make_group_known(group, mq, self.ctx.subscriptions)
                except ConnectionFailedError as exc:  # its queues wait for it (see Availability)
                    log.warning("consumer group %s not checked on broker %s: %s", group, mq.broker, exc)

    def join(self) -> None:
        """Once per streaming query with a consumerGroup: become an online consumer of it on
        its brokers (after the shared-group check, which would otherwise see this query)."""
        o = self.ctx.options
        if self._joined or not o.consumer_group:
            return
        self._joined = True
        try:
            self._member = self.ctx.client.join_group(o.consumer_group, self.ctx.member_subscriptions,
                                                      self._running_info, expression_type=o.sub_type)
        except RocketMQSparkError as exc:  # presence is for the tools: reading goes on without it
            log.warning("consumer group %s: not registered as an online consumer: %s", o.consumer_group, exc)

    def topics_added(self) -> None:
        """subscribePattern matched new topics (:attr:`.QueryContext.topics` grew): brokers of
        theirs are told of the group, and the query, an online consumer, rejoins subscribing
        them too."""
        o = self.ctx.options
        if not o.consumer_group:
            return
        if self._checked and o.commit_offsets:
            self._make_known(o.consumer_group)
        if self._joined:
            self.leave()
            self._joined = False
            self.join()

    def leave(self) -> None:
        if self._member is not None:
            self._member.close()
            self._member = None

    def take_resets(self) -> list[ResetNotice]:
        """The offset resets brokers pushed since the last call (RESET_CONSUMER_CLIENT_OFFSET)."""
        return self._member.take_resets() if self._member is not None else []
