"""Offset resets of the group while a query reads it, found and followed.

A reset is the broker's offset for the group differing from what this query last wrote there
(:meth:`Resets.find`), with one exception: an offset found lower after the broker restarted
(commits it lost in the restart, written again). Where only the broker knows, its own signal
is taken: 4.x brokers push RESET_CONSUMER_CLIENT_OFFSET (:mod:`.membership`); a 5.x broker
ignores the group's commits while a server-side reset waits for its next pull, answering them
"Offset has been previously reset" (:meth:`Resets.write`). The next batch follows what was
found (:meth:`Resets.follow`: onOffsetReset follow, fail or ignore), and a restarted query
compares the broker's offsets with its checkpoint once (:meth:`Resets.adopt`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..client.retry import bounded
from ..errors import OffsetResetError, RocketMQSparkError
from ..model import MessageQueue
from ..offsets import GroupAtPlanning
from .availability import REPROBE_BUDGET_S, Availability
from .commits import Commits, QueueOffsets
from .context import QueryContext
from .data_loss import DataLoss
from .membership import Membership

log = logging.getLogger(__name__)

__all__ = ["Resets"]


class Resets:
    """The resets of one query's group, found and followed."""

    def __init__(self, ctx: QueryContext, availability: Availability, commits: Commits, data_loss: DataLoss,
                 membership: Membership) -> None:
        self.ctx = ctx
        self.availability = availability
        self.commits = commits
        self.data_loss = data_loss
        self.membership = membership
        #: resets seen and not yet applied: queue -> (new offset, where it came from)
        self.noted: dict[MessageQueue, tuple[int, str]] = {}
        #: True once the broker's offsets were compared with this run's first offsets
        self.synced = False
        #: a new query (its first offsets planned in this run): the group's offsets it finds are its own
        self.fresh = False
        #: queues whose offset on the broker this run has read once (a restarted query compares
        #: each with its checkpoint at that first look, see _earlier_at_restart)
        self._looked: set[MessageQueue] = set()
        #: broker -> when it started (epoch ms), as it said at the query's last look (see _boot_now)
        self._boots: dict[str, int] = {}
        #: the group's offsets at the planning of the batch a restarted query starts from (adopt)
        self._at_planning: GroupAtPlanning | None = None
        #: broker -> its connection epoch when find last read the group's offsets there
        self._offsets_read_over: dict[str, tuple[str, int] | None] = {}

    def started(self) -> None:
        """A new query (no checkpoint): the group's offsets are its own from here on."""
        self.synced = True
        self.fresh = True

    def write(self, offsets: QueueOffsets) -> bool:
        """Write ``offsets`` as the group's (:meth:`.Commits.write`). A write a broker ignored
        because a server-side reset of the queue waits for the group's next pull is that reset,
        noted (True returned): the broker holds the reset offset until then."""
        waiting = self.commits.write(offsets)
        if not waiting:
            return False
        try:
            with bounded(REPROBE_BUDGET_S):
                held = self.ctx.store.read_many(waiting)
        except RocketMQSparkError as why:
            log.warning("group %s: resets wait on the brokers of %s, their offsets not readable now (the next "
                        "trigger compares them): %s", self.ctx.options.consumer_group, waiting, why)
            held = {}
        for mq in waiting:
            off = held.get(mq)
            if off is not None:
                self.note(mq, off, f"the broker ignored the query's commit of {offsets.get(mq)}: a "
                                   f"server-side reset to {off} waits for the group's next pull")
        return any(mq in self.noted for mq in waiting)

    def find(self, expected: QueueOffsets, *, read: bool = True, fail: bool = True) -> None:
        """Note the resets of the group's offsets since the last look: those brokers pushed
        (RESET_CONSUMER_CLIENT_OFFSET), and, with ``read``, queues whose offset on the broker is
        not the one this query last wrote or read there (a 5.x broker's server-side reset, an
        operator's direct write). ``expected`` are the offsets the query stands at (a batch's end).
        A broker that does not answer is compared later; with ``fail`` it may fail the query
        (see :meth:`.Availability.ask`)."""
        group = self.ctx.options.consumer_group
        if not group:
            return
        for notice in self.membership.take_resets():
            for mq, off in notice.offsets.items():
                when = "now" if notice.timestamp_ms < 0 else f"timestamp {notice.timestamp_ms}"
                self.note(mq, off, f"RESET_CONSUMER_CLIENT_OFFSET from {notice.broker_addr} ({when})")
        if not read or not self.ctx.options.commit_offsets or self.ctx.options.allow_shared_group:
            return  # not asked, or the group's offsets are not this query's alone to compare
        mqs = sorted(mq for mq in expected if mq not in self.noted)
        if not mqs:
            return
        held = self.availability.ask(mqs, self.ctx.store.read_many, fail=fail)  # a down broker's: compared later
        reconnected = self._reconnected_since_read({mq.broker for mq in held})
        # whether each broker reached anew restarted (its boot time; None: it does not say)
        restarted = {broker: self._restarted_since(broker) for broker in reconnected}
        for broker in {mq.broker for mq in held} - reconnected:
            if broker not in self._boots:
                self._boot_now(broker)
        behind: QueueOffsets = {}  # queues the broker holds below the checkpoint at this run's first look
        for mq in mqs:
            if mq in held:
                self._compare(mq, held[mq], expected[mq], mq.broker in reconnected and
                              restarted.get(mq.broker) is not False, behind)
        self.synced = True
        if behind:
            # the checkpoint's offsets go to the broker now: Spark processed everything below
            # them and commits a batch only when the next one starts, so a driver killed after
            # its last batch left the broker behind for good when no new message came (the
            # driver-kill test: 3,250 of 3,750 on every queue after the final AvailableNow run)
            self.write(behind)

    def _compare(self, mq: MessageQueue, now_held: int | None, expected: int, restarted: bool,
                 behind: QueueOffsets) -> None:
        """The group's offset of ``mq`` on the broker (``now_held``) against what the query last
        wrote or read there: a reset is noted, a lost offset or a lost commit answer taken as
        such. ``expected``: where the query stands; ``restarted``: the broker was reached over a
        new connection since the last read, and did not say it kept running; ``behind`` gets a
        queue a restarted query finds behind its checkpoint (written by the caller)."""
        group = self.ctx.options.consumer_group
        st = self.commits.status_of(mq)
        first = not self.fresh and mq not in self._looked  # this run's first look at a restart
        self._looked.add(mq)
        if now_held is None:
            if st.committed >= 0:  # the broker lost an offset it took (see BrokerOffsetStore.commit)
                self.ctx.store.forget(mq)
                self.data_loss.doubt(mq)  # as a broker that lost its store does: compare the queue's mark
                st.committed = -1  # written again by the next commit
            return
        if st.committed < 0:
            st.committed = now_held
            if first and now_held > expected:
                # the broker holds a later offset than the checkpoint: never one this query
                # wrote (it commits what its checkpoint holds): a reset while it was stopped
                self.note(mq, now_held, f"the group's offset on the broker ({now_held}) is past the "
                                        f"checkpoint's ({expected}): reset while the query was stopped")
            elif first and now_held < expected:
                why = self._earlier_at_restart(mq, now_held, expected)
                if why is None:
                    behind[mq] = expected
                else:
                    self.note(mq, now_held, why)
            return
        if now_held == st.committed:
            return
        if now_held in self.commits.unsure.get(mq, ()):
            # a commit of this query whose answer was lost: the broker applied it
            log.info("%s: group %s's offset on the broker is %d, a commit of this query whose answer was lost, "
                     "not a reset", mq, group, now_held)
            st.committed = now_held
            del self.commits.unsure[mq]
            return
        if now_held < st.committed and restarted:
            # lower, read over a new connection: the broker restarted (or was reached anew)
            # since the last read. A broker killed before it flushed its consumer offsets
            # (every 5 s on Apache RocketMQ) comes back with an older one, which a query
            # restarted meanwhile never wrote itself: followed as a reset, its Parquet output
            # got 620 rows twice (the fault suite, seed 2912). The next commit writes this
            # query's offset again; a reset made while the broker restarted goes unseen
            log.warning("%s: group %s's offset on broker %s is %d after it was reached anew, not %d: taken for "
                        "commits the broker lost in a restart, not a reset; the next commit writes the query's "
                        "offset again", mq, group, mq.broker, now_held, st.committed)
            st.committed = now_held
            self.ctx.store.forget(mq)
            return
        self.note(mq, now_held, f"the group's offset on the broker changed from {st.committed} to "
                                f"{now_held} (a server-side reset or a direct write)")

    def note(self, mq: MessageQueue, offset: int, why: str) -> None:
        """A reset of ``mq`` to ``offset``, followed by the next batch (see :meth:`follow`): no
        write of the query's, a retried one included, overwrites it meanwhile."""
        self.noted[mq] = (offset, why)
        store = self.ctx.opened_store
        if store is not None:
            store.forget(mq)
        self.commits.unsure.pop(mq, None)

    def _boot_now(self, broker: str) -> int | None:
        """When ``broker`` started, as it says now (asked once per connection); None when it does
        not say or does not answer. Noted as the broker's boot time the query knows."""
        try:
            with bounded(REPROBE_BUDGET_S):
                boot = self.ctx.client.broker_boot_ms(broker)
        except RocketMQSparkError as exc:
            log.debug("boot time of broker %s not known: %s", broker, exc)
            return None
        if boot is not None:
            self._boots[broker] = boot
        return boot

    def _restarted_since(self, broker: str) -> bool | None:
        """Whether ``broker`` restarted since the query last asked (its boot time changed); None
        when that is not known (the broker or the transport does not say)."""
        then = self._boots.get(broker)
        now = self._boot_now(broker)
        if then is None or now is None:
            return None
        return now != then

    def adopt(self, at: GroupAtPlanning | None) -> None:
        """The group's offsets on the brokers when the batch ``start`` ends was planned, from
        Spark's offset log (see :data:`~rocketmq_spark.offsets.GROUP_KEY`): a restarted query
        compares them at its first look (see :meth:`_earlier_at_restart`)."""
        if not self.fresh and at is not None and self._at_planning is None:
            self._at_planning = at

    def _earlier_at_restart(self, mq: MessageQueue, now_held: int, expected: int) -> str | None:
        """At a restart's first look the broker holds ``now_held`` for ``mq``, below the
        checkpoint's ``expected``: a reset made while the query was stopped (returned: why), or
        an offset the query wrote itself (None: the query reads on from its checkpoint and writes
        it). It wrote the ones the offset log's last batch names (the previous batch's end, what the
        broker held then); a broker that restarted since may hold an older one (its last commits
        lost), and where that cannot be known (a checkpoint written before this, the gRPC
        transport) the checkpoint wins, logged."""
        group = self.ctx.options.consumer_group
        at = self._at_planning
        own = at.held.get(mq) if at is not None else None
        if own is not None and now_held in own:
            if self._reset_pending(mq, now_held, expected):
                return (f"the broker answered the group's pull at {expected} with a reset to {now_held} (a server-side "
                        f"reset made while the query was stopped)")
            log.info("%s: group %s holds %d on the broker, the checkpoint %d: the query stopped before it wrote its "
                     "last batch's end (or a reset to exactly that offset the broker keeps no trace of); the query "
                     "reads on from the checkpoint and writes its offset there", mq, group, now_held, expected)
            return None
        then = at.boot.get(mq.broker) if at is not None else None
        now = self._boot_now(mq.broker) if then is not None else None
        if own is not None and then is not None and now == then:
            return (f"the group's offset on the broker ({now_held}) is before the checkpoint's ({expected}) and not "
                    f"one the query wrote ({', '.join(map(str, own))}), on a broker that has not restarted since: "
                    f"reset while the query was stopped")
        log.info("%s: group %s holds %d on the broker, the checkpoint %d: commits the broker lost in a restart, or a "
                 "reset to an earlier time made while the query was stopped; %s, so the query reads on from the "
                 "checkpoint and writes its offset there", mq, group, now_held, expected,
                 "the broker restarted since" if then is not None and now is not None else
                 "the two cannot be told apart here")
        return None

    def _reset_pending(self, mq: MessageQueue, offset: int, at: int) -> bool:
        """Whether ``mq``'s broker has a server-side reset of the group to ``offset`` waiting for
        its next pull (5.x brokers and the embedded one: the pull is answered PULL_OFFSET_MOVED
        with the reset offset, once). The group's pull at ``at`` asks; a broker without such
        resets answers it as any pull."""
        try:
            with bounded(REPROBE_BUDGET_S):
                res = self.ctx.client.pull(mq, at, 1, group=self.ctx.options.consumer_group or "",
                                           subscription=self.ctx.options.sub_expression,
                                           expression_type=self.ctx.options.sub_type)
        except RocketMQSparkError as exc:
            log.info("%s: not asked whether a reset waits on the broker: %s", mq, exc)
            return False
        return (res.status == "OFFSET_ILLEGAL" and res.next_offset == offset != at
                and 0 <= res.min_offset <= at <= res.max_offset)

    def at_planning(self, prev: QueueOffsets, end: QueueOffsets, restarted: Iterable[MessageQueue]
                          ) -> GroupAtPlanning | None:
        """What a batch's offsets keep of the group (see :meth:`adopt`): per queue of
        ``end``, the offsets the broker may hold from the query's writes until the next batch is
        planned (what it holds as the query knows it, those whose write failed since, which it may
        have applied, and ``prev``, the previous batch's end, that Spark's commit may still
        write), and the boot time of each broker."""
        o = self.ctx.options
        if not o.consumer_group or not o.commit_offsets or o.allow_shared_group:
            return None
        skip = set(restarted)
        held: dict[MessageQueue, tuple[int, ...]] = {}
        for mq in end:
            offs = {self.commits.status_of(mq).committed, *self.commits.unsure.get(mq, ())}
            if mq in prev and mq not in skip:
                offs.add(prev[mq])
            held[mq] = tuple(sorted(o for o in offs if o >= 0))
        boot = {b: self._boots[b] for b in {mq.broker for mq in end} if b in self._boots}
        return GroupAtPlanning({mq: o for mq, o in held.items() if o}, boot)

    def _reconnected_since_read(self, brokers: Iterable[str]) -> set[str]:
        """Brokers of ``brokers`` the client reached over another connection than at the
        previous read of the group's offsets (restarted, or reached anew after a fault); notes
        the connection of this read."""
        out: set[str] = set()
        for broker in brokers:
            epoch = self.ctx.client.connection_epoch(broker)
            if broker in self._offsets_read_over and self._offsets_read_over[broker] != epoch:
                out.add(broker)
            self._offsets_read_over[broker] = epoch
        return out

    def follow(self, start: QueueOffsets) -> QueueOffsets:
        """Apply the resets noted (see :meth:`find`) to the next batch's ``start``, as
        onOffsetReset says: follow (the batch starts each reset queue at its new offset; returned,
        they go into the batch's offsets, so a restart replays the same ranges), fail, or
        ignore. Either way the broker's hold on a reset queue is released (a pull of the group),
        so the query's later commits are taken."""
        if not self.noted:
            return {}
        # a pushed reset names every queue of its topic; those this query does not read are not its
        resets = {mq: v for mq, v in self.noted.items() if mq in start}
        self.noted = {}
        if not resets:
            return {}
        group = self.ctx.options.consumer_group or ""
        how = self.ctx.options.on_offset_reset
        if how == "fail":
            listed = "; ".join(f"{mq}: {start.get(mq, '?')} -> {off} ({why})"
                               for mq, (off, why) in sorted(resets.items()))
            raise OffsetResetError(
                f"the offsets of consumer group {group!r} were reset while this query reads it ({listed}); "
                f"onOffsetReset=fail stops the query. Restart it to read from the reset offsets (startingOffsets="
                f"group on a new checkpoint), or set onOffsetReset=follow or ignore")
        followed: QueueOffsets = {}
        for mq, (off, why) in sorted(resets.items()):
            self._release(mq, off)
            self.ctx.store.forget(mq)
            st = self.commits.status_of(mq)
            if how == "ignore":
                log.warning("%s: consumer group %s's offset was reset to %d (%s); onOffsetReset=ignore: the query "
                            "reads on from %d and its next commit overwrites the reset", mq, group, off, why,
                            start[mq])
                st.committed = off  # the broker holds it until the next commit
                continue
            log.warning("%s: consumer group %s's offset was reset from %d to %d (%s); the next batch reads the "
                        "queue from %d", mq, group, start[mq], off, why, off)
            self.commits.restart(mq, off)
            st.committed = off
            followed[mq] = off
        return followed

    def _release(self, mq: MessageQueue, offset: int) -> None:
        """A pull of the group at the queue takes a 5.x broker's pending server-side reset
        (it ignores the group's commits of the queue until then); elsewhere an empty read."""
        try:
            self.ctx.client.pull(mq, offset, 1, group=self.ctx.options.consumer_group or "",
                                 subscription=self.ctx.options.sub_expression,
                                 expression_type=self.ctx.options.sub_type)
        except RocketMQSparkError as exc:
            log.info("%s: reset not released on the broker (its commits may be ignored until the next "
                     "pull of the group): %s", mq, exc)
