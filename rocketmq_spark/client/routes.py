"""The name servers a remoting client asks: route lookups (cached for ``route_refresh_s``; while
the name servers do not answer, a known route serves, as the Java client does), the broker
addresses the routes give, the cluster's brokers. One name server down is tolerated: they are
asked in turn from a random one.

Masters and slaves: a broker group (one broker name) has a master (brokerId 0) and may have
slaves (brokerId 1, 2, ...). Sends go to the master only (the Java client's
findBrokerAddressInPublish). Reads and the group's offsets go where the Java consumer sends
them (findBrokerAddressInSubscribe with onlyThisBroker=false): to the broker id the last pull's
answer suggested (suggestWhichBrokerId; the master unless the broker says otherwise), else to the
master, else, when the route has no master (the name server drops a master whose connection
closed: a crash, a stop), to a slave. Unlike the Java client, which learns of a dead master only
at its next route poll (every 30 s), a master whose connection just failed is passed over for
:data:`FAILOVER_S` and the route is asked again at once (at most every :data:`RECHECK_S`), and
while reads go to a slave the route is asked again every :data:`RECHECK_S`, so they move back
to the master within seconds of its return."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import (
    BrokerError,
    ConnectionFailedError,
    NoPermissionError,
    ProtocolError,
    RocketMQSparkError,
    TopicNotFoundError,
    broker_error,
)
from ..model import MessageQueue
from ..names import AUTO_CREATE_TOPIC
from ..remoting.acl import request_needs
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import RemotingCommand
from ..remoting.route import MASTER_ID, TopicRouteData, refused_queues_text
from .connection import RemotingConnection
from .retry import ClientConfig, bounded, retrying
from .tables import object_body

log = logging.getLogger(__name__)

__all__ = ["NameServers"]

#: queues a topic created on send gets (the send's defaultTopicQueueNums)
DEFAULT_TOPIC_QUEUE_NUMS = 4
#: a broker address whose connection failed is passed over for reads this long (seconds) when
#: its group has another member to read from
FAILOVER_S = 5.0
#: the route of a topic whose reads go to a slave (or whose master just failed) is asked again
#: at most this often (seconds)
RECHECK_S = 2.0


class NameServers:
    """Route lookups and broker addresses for one remoting client (see the module's docstring)."""

    def __init__(self, addrs: Sequence[str], config: ClientConfig,
                 conn: Callable[[str, str], RemotingConnection]) -> None:
        self.addrs = list(addrs)
        self.config = config
        self._conn = conn
        #: topic -> (when it was looked up, its route)
        self.routes: dict[str, tuple[float, TopicRouteData]] = {}
        #: broker name -> master address, as the latest listing or route gave it
        self.broker_addrs: dict[str, str] = {}
        #: broker name -> {broker id: address} of its group, as the latest route of it gave it
        self.members: dict[str, dict[int, str]] = {}
        #: address -> when a connection to it or a request over one last failed (monotonic)
        self._failed: dict[str, float] = {}
        #: topic -> when its route was last asked for because of a failover (monotonic)
        self._rechecked: dict[str, float] = {}
        #: broker name -> the address reads of it went to last (see read_addr)
        self.read_addrs: dict[str, str] = {}
        self._index = random.randrange(len(self.addrs))
        #: (since when, until when) the name servers are not asked while a known route serves
        self._down: tuple[float, float] | None = None

    @property
    def current(self) -> str:
        """The name server asked first (the one that answered last)."""
        return self.addrs[self._index]

    def forget(self, topic: str) -> None:
        """The topic's route is looked up afresh next time (it was just created or changed)."""
        self.routes.pop(topic, None)

    def invoke(self, cmd: RemotingCommand, operation: str,
                        ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """Ask name servers in turn (starting from a random one); one down is tolerated."""
        last: Exception | None = None
        n = len(self.addrs)
        for i in range(n):
            addr = self.addrs[(self._index + i) % n]
            try:
                resp = self._conn(addr, operation).invoke(
                    RemotingCommand(cmd.code, ext_fields=cmd.ext_fields, body=cmd.body),
                    self.config.request_timeout_s, operation)
            except ConnectionFailedError as exc:
                last = exc
                continue
            self._index = (self._index + i) % n
            if resp.code not in ok:  # a 5.x proxy serving as name server checks ACL 2.0 on routes
                creds = self.config.credentials
                raise broker_error(resp.code, resp.remark, address=addr, operation=operation,
                                   user=creds.access_key if creds is not None else None,
                                   needs=request_needs(cmd.code, cmd.ext_fields, cmd.body))
            return resp
        assert last is not None
        raise last

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        """The topic's route from the name servers, cached for ``route_refresh_s`` seconds
        unless ``refresh``; TopicNotFoundError when they have none. When they do not answer, or
        answer "no route" while they list no broker at all (just restarted), and the topic's route
        is known, the known route is returned (see :meth:`_cached_route`); a first lookup
        retries (bounded) and raises ConnectionFailedError."""
        cached = self.routes.get(topic)
        now = time.monotonic()
        if cached and not refresh and now - cached[0] < self.config.route_refresh_s:
            return cached[1]
        if cached and self._down is not None and now < self._down[1]:
            return cached[1]  # the name servers did not answer lately: see _cached_route
        cmd = RemotingCommand(RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": topic})
        operation = f"route lookup of topic {topic!r}"

        def lookup() -> RemotingCommand:
            try:
                return self.invoke(cmd, operation)
            except TopicNotFoundError as exc:
                if not self._lists_no_broker():
                    raise
                # a name server just restarted knows no topic until the brokers register again
                # (every registerNameServerPeriod, 30 s by default): not ready, as one that does
                # not answer, rather than a topic that does not exist
                raise ConnectionFailedError(exc.address, operation, "the name server lists no broker yet (restarted? "
                                            f"brokers register again within 30 s): {exc.remark}") from None

        try:
            if cached is None:
                resp = retrying(lookup, self.config)
            else:  # one round of the name servers: the route known serves meanwhile
                resp = lookup()
        except ConnectionFailedError as exc:
            if cached is None:
                raise
            return self._cached_route(topic, cached, exc)
        except BrokerError:  # an answer all the same
            self._answered()
            raise
        self._answered()
        if not resp.body:
            raise TopicNotFoundError(ResponseCode.TOPIC_NOT_EXIST, f"empty route for topic {topic!r}",
                                     address=self.addrs[self._index], operation="route lookup")
        route = TopicRouteData.from_json(resp.body)
        self.routes[topic] = (now, route)
        for b in route.broker_datas:
            if b.broker_addrs:
                self.members[b.broker_name] = dict(b.broker_addrs)
            if b.master_addr:
                was = self.broker_addrs.get(b.broker_name)
                if was is not None and was != b.master_addr:
                    log.warning("broker %s's master is %s now (was %s): sends go there", b.broker_name,
                                b.master_addr, was)
                self.broker_addrs[b.broker_name] = b.master_addr
            elif b.broker_addrs:  # its master is gone (a slave is left): sends cannot go there now
                self.broker_addrs.pop(b.broker_name, None)
        return route

    def cluster_brokers(self) -> dict[str, str]:
        """Broker name -> master address of every broker group the name servers know with a master."""
        out: dict[str, str] = {}
        for name, members in self.cluster_members().items():
            addr = members.get(MASTER_ID)
            if addr:
                self.broker_addrs[name] = addr
                out[name] = addr
        return out

    def cluster_members(self) -> dict[str, dict[int, str]]:
        """Broker name -> {broker id: address} of every broker group the name servers know (the
        master has id 0; a group whose master is down lists only its slaves)."""
        resp = retrying(lambda: self.invoke(
            RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), "cluster info"), self.config)
        table = object_body(resp.body, "cluster info").get("brokerAddrTable", {}) if resp.body else {}
        if not isinstance(table, dict):
            raise ProtocolError("cluster info: brokerAddrTable is not an object")
        out: dict[str, dict[int, str]] = {}
        for name, data in sorted(table.items()):
            addrs = (data.get("brokerAddrs") or {}) if isinstance(data, dict) else None
            if not isinstance(addrs, dict):
                raise ProtocolError(f"cluster info: broker {name!r} has no brokerAddrs object")
            try:
                members = {int(k): str(v) for k, v in addrs.items() if v}
            except ValueError:
                raise ProtocolError(f"cluster info: broker {name!r} has a broker id that is not a number: "
                                    f"{sorted(addrs)!r}") from None
            if members:
                out[str(name)] = members
        return out

    def cluster_names(self) -> set[str]:
        """The names of the clusters and broker groups the name servers know: brokers create a
        topic of each name (clusterTopicEnable, brokerTopicEnable), which the topic list shows."""
        resp = retrying(lambda: self.invoke(
            RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), "cluster info"), self.config)
        body = object_body(resp.body, "cluster info") if resp.body else {}
        names: set[str] = set()
        for key in ("brokerAddrTable", "clusterAddrTable"):
            table = body.get(key)
            if isinstance(table, dict):
                names.update(str(k) for k in table)
        return names

    def _lists_no_broker(self) -> bool:
        """Whether the name servers list no broker at all (:meth:`cluster_brokers`, one attempt;
        False when that cannot be told)."""
        try:
            with bounded(0.0):
                return not self.cluster_brokers()
        except RocketMQSparkError:
            return False

    def _cached_route(self, topic: str, cached: tuple[float, TopicRouteData],
                      exc: ConnectionFailedError) -> TopicRouteData:
        """The name servers did not answer a route lookup of a topic whose route is known: as the
        Java client does, the known route serves (brokers keep serving while name servers are
        down), and the name servers are asked again only after ``route_refresh_s``, so each
        lookup does not wait for them."""
        now = time.monotonic()
        first = self._down is None
        since = now if self._down is None else self._down[0]
        self._down = (since, now + self.config.route_refresh_s)
        log.log(logging.WARNING if first else logging.INFO,
                "%s; using the route of topic %s known since %.0fs ago, asking the name servers again in %.0fs",
                exc, topic, now - cached[0], self.config.route_refresh_s)
        return cached[1]

    def _answered(self) -> None:
        if self._down is not None:
            log.warning("the name servers %s answer again (after %.0fs)", ";".join(self.addrs),
                        time.monotonic() - self._down[0])
            self._down = None

    def remember_broker_addr(self, broker: str, addr: str) -> None:
        """Requests for ``broker`` go to ``addr`` (e.g. the address the planner's route gave a
        read task) without a route lookup, until a route lookup says otherwise."""
        self.broker_addrs.setdefault(broker, addr)

    def message_queues(self, topic: str, *, refresh: bool = False, writable: bool = False) -> list[MessageQueue]:
        """The topic's readable queues, or with ``writable`` the ones to send to. A producer
        (``writable``) of a topic the name servers do not know uses the route of the brokers'
        auto-create topic TBW102, as the Java producer does: a broker with
        autoCreateTopicEnable then creates the topic on the first send."""
        try:
            route = self.route(topic, refresh=refresh)
        except TopicNotFoundError:
            if not writable:
                raise
            route = self._auto_create_route(topic)
        out: list[MessageQueue] = []
        refused: set[int] = set()
        for q in route.queue_datas:
            # a producer sends to masters only; a consumer reads a group that has a slave left
            if (route.broker_addr(q.broker_name) if writable else route.any_addr(q.broker_name)) is None:
                continue
            if writable:
                if q.writable:
                    out.extend(MessageQueue(topic, q.broker_name, i) for i in range(q.write_queue_nums))
                else:
                    refused.add(q.perm)
            elif q.readable:
                out.extend(MessageQueue(topic, q.broker_name, i) for i in range(q.read_queue_nums))
            else:
                refused.add(q.perm)
        if not out and refused:
            raise NoPermissionError(ResponseCode.NO_PERMISSION, refused_queues_text(topic, refused, writable=writable),
                                    address=self.addrs[self._index], operation=f"route of topic {topic!r}")
        return sorted(out)

    def _auto_create_route(self, topic: str) -> TopicRouteData:
        try:
            base = self.route(AUTO_CREATE_TOPIC)
        except TopicNotFoundError:
            raise TopicNotFoundError(ResponseCode.TOPIC_NOT_EXIST,
                                     f"no route for topic {topic!r}, and its brokers do not create topics on a send "
                                     f"(no {AUTO_CREATE_TOPIC} route: autoCreateTopicEnable is off); create it first",
                                     address=self.addrs[self._index],
                                     operation=f"route lookup of topic {topic!r}") from None
        queues = tuple(replace(q, write_queue_nums=min(q.write_queue_nums, DEFAULT_TOPIC_QUEUE_NUMS),
                               read_queue_nums=min(q.read_queue_nums, DEFAULT_TOPIC_QUEUE_NUMS))
                       for q in base.queue_datas if q.writable)
        route = replace(base, queue_datas=queues)
        # asked again soon: the real route shows once a broker has created the topic
        self.routes[topic] = (time.monotonic() - self.config.route_refresh_s + 1.0, route)
        log.info("topic %s has no route yet: sending with the route of %s (%d brokers); the broker creates it",
                 topic, AUTO_CREATE_TOPIC, len(queues))
        return route

    def broker_addr(self, broker: str, topic: str | None = None) -> str:
        """The master address of ``broker`` (looked up in ``topic``'s route when not known yet).
        A master whose connection failed less than :data:`FAILOVER_S` ago is looked up again in
        ``topic``'s route (at most every :data:`RECHECK_S`): a group in controller mode elects
        another member within a second of its master's crash, and it registers as the master
        (brokerId 0) at its own address; the Java client would send to the dead address until
        its next route poll (30 s).

        A broker that is in no route now cannot be reached: :class:`ConnectionFailedError`. Name
        servers drop a broker's routes as soon as its connection to them closes (a restart,
        a crash), so this is what a broker that is down looks like before it registers again."""
        addr = self.broker_addrs.get(broker)
        if addr is not None and topic is not None and self._failing(addr):
            self._recheck(topic)
            addr = self.broker_addrs.get(broker)
        if addr is None and topic is not None:
            try:
                self.route(topic, refresh=True)
            except TopicNotFoundError as exc:
                raise ConnectionFailedError(broker, f"routing topic {topic!r}",
                                            f"the topic has no route now: {exc.remark}") from None
            addr = self.broker_addrs.get(broker)
        if addr is None:
            raise ConnectionFailedError(broker, "routing",
                                        "it is in no route the name servers give now (stopped or restarting?)")
        return addr

    # -- reads: master or slave ------------------------------------------------------------

    def note_failed(self, addr: str) -> None:
        """A connection to ``addr`` could not be opened, or a request over it got no answer."""
        self._failed[addr] = time.monotonic()

    def note_answered(self, addr: str) -> None:
        """``addr`` answered a request."""
        if self._failed.pop(addr, None) is not None:
            log.info("%s answers again", addr)

    def _failing(self, addr: str) -> bool:
        since = self._failed.get(addr)
        return since is not None and time.monotonic() - since < FAILOVER_S

    def read_addr(self, broker: str, topic: str | None = None, broker_id: int = MASTER_ID) -> str:
        """Where a read of ``broker``'s queues (a pull, offsets, the group's offsets) goes now:
        member ``broker_id`` of its group (a slave id that is not there: the next one, as the Java
        client does), else the master, else the slave with the lowest id; a member whose
        connection failed less than :data:`FAILOVER_S` ago is passed over while the group has
        another. While the pick is not the master, ``topic``'s route is asked again (at most
        every :data:`RECHECK_S`), so reads move back once the master is in it again.

        A group whose route is not known here (a read task given its address by the planner)
        reads from that address until it fails. Raises ConnectionFailedError when no member of
        the group is in a route (see :meth:`broker_addr`)."""
        members = self.members.get(broker)
        if members is None:
            addr = self.broker_addrs.get(broker)
            if addr is not None and (topic is None or not self._failing(addr)):
                return addr
            if topic is not None:
                self._recheck(topic)
            members = self.members.get(broker)
            if members is None:
                return self.broker_addr(broker, topic)
        addr = self._pick(members, broker_id)
        if topic is not None and (addr is None or addr != members.get(MASTER_ID) or self._failing(addr)):
            self._recheck(topic)
            addr = self._pick(self.members.get(broker, {}), broker_id)
        if addr is None:
            raise ConnectionFailedError(broker, "routing",
                                        "no member of its group is in the routes the name servers give now "
                                        "(stopped or restarting?)")
        last = self.read_addrs.get(broker)
        if last != addr:
            self.read_addrs[broker] = addr
            if last is not None:
                kind = "master" if addr == self.members.get(broker, {}).get(MASTER_ID) else "slave"
                log.warning("reads of broker %s go to its %s %s now (were going to %s)", broker, kind, addr, last)
        return addr

    def _pick(self, members: dict[int, str], broker_id: int) -> str | None:
        """findBrokerAddressInSubscribe(broker_id, onlyThisBroker=false), members that just failed last."""
        order: list[int] = []
        if broker_id in members:
            order.append(broker_id)
        elif broker_id != MASTER_ID and broker_id + 1 in members:
            order.append(broker_id + 1)
        order += sorted(k for k in members if k not in order)  # the master (0) first
        alive = [members[k] for k in order if not self._failing(members[k])]
        return alive[0] if alive else (members[order[0]] if order else None)

    def _recheck(self, topic: str) -> None:
        """``topic``'s route asked again, at most every :data:`RECHECK_S` (faults: the known one serves)."""
        now = time.monotonic()
        if now - self._rechecked.get(topic, 0.0) < RECHECK_S:
            return
        self._rechecked[topic] = now
        try:
            with bounded(0.0):
                self.route(topic, refresh=True)
        except RocketMQSparkError as exc:
            log.debug("route of topic %s not asked again: %s", topic, exc)
