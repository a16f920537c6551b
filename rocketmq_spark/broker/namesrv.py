"""Name server: topic routes, topic list, broker registration.

Brokers register (REGISTER_BROKER from another process, or a direct call in-process) and
repeat it as a heartbeat; one silent for ``broker_timeout_s`` drops out of every route,
and UNREGISTER_BROKER takes it out at once. A route miss auto-creates the topic (when
allowed) on the live brokers: through the in-process callback, or over the network.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..names import AUTO_CREATE_TOPIC, topic_problem
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import RemotingCommand
from ..remoting.route import BrokerData, QueueData, TopicRouteData
from .connection import Connection, HandlerResult
from .outbound import request

log = logging.getLogger(__name__)

__all__ = ["BrokerRegistration", "NameServer"]


@dataclass(slots=True)
class BrokerRegistration:
    """A broker as the name server knows it: address and the topics it serves."""

    broker_name: str
    broker_addr: str
    cluster: str
    topics: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # read, write, perm
    last_seen: float = field(default_factory=time.monotonic)
    #: In-process brokers can create topics on a route miss (auto-create).
    create_topic: Callable[[str], bool] | None = None


class NameServer:
    """Handles GET_ROUTEINFO_BY_TOPIC, GET_ALL_TOPIC_LIST_FROM_NAMESERVER, REGISTER_BROKER."""

    def __init__(self, *, auto_create_topics: bool = True, broker_timeout_s: float = 120.0,
                 default_queue_nums: int = 4) -> None:
        self.brokers: dict[str, BrokerRegistration] = {}
        self.auto_create_topics = auto_create_topics
        self.broker_timeout_s = broker_timeout_s
        self.default_queue_nums = default_queue_nums
        #: the client context of the requests it sends brokers of other processes (TLS when set)
        self.outbound_tls: ssl.SSLContext | None = None
        self.handlers = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self.get_route,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self.get_topic_list,
            RequestCode.REGISTER_BROKER: self.register_broker,
            RequestCode.UNREGISTER_BROKER: self.unregister_broker,
            RequestCode.GET_BROKER_CLUSTER_INFO: self.get_cluster_info,
        }

    def register(self, reg: BrokerRegistration) -> None:
        reg.last_seen = time.monotonic()
        prev = self.brokers.get(reg.broker_name)
        if prev is None or prev.broker_addr != reg.broker_addr:
            log.info("broker %s registered at %s (cluster %s)", reg.broker_name, reg.broker_addr, reg.cluster)
        self.brokers[reg.broker_name] = reg

    def unregister(self, broker_name: str) -> None:
        if self.brokers.pop(broker_name, None) is not None:
            log.info("broker %s unregistered", broker_name)

    def _live(self) -> list[BrokerRegistration]:
        now = time.monotonic()
        live = []
        for b in list(self.brokers.values()):
            if now - b.last_seen < self.broker_timeout_s:
                live.append(b)
            else:
                log.warning("broker %s at %s sent no heartbeat for %.0fs: removed from routes",
                            b.broker_name, b.broker_addr, now - b.last_seen)
                del self.brokers[b.broker_name]
        return live

    def route(self, topic: str) -> TopicRouteData | None:
        queues, brokers = [], []
        for b in sorted(self._live(), key=lambda r: r.broker_name):
            t = b.topics.get(topic)
            if t is None:
                continue
            read, write, perm = t
            queues.append(QueueData(b.broker_name, read, write, perm))
            brokers.append(BrokerData(b.broker_name, {0: b.broker_addr}, b.cluster))
        if not queues:
            return None
        return TopicRouteData(tuple(queues), tuple(brokers))

    def dispatch(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        handler = self.handlers.get(req.code)  # type: ignore[call-overload]
        if handler is None:
            return req.response_to(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark=f"request code {req.code} is not supported by the name server",
            )
        return handler(conn, req)

    def get_route(self, conn: Connection, req: RemotingCommand) -> HandlerResult:
        topic = req.ext_fields.get("topic", "")
        route = self.route(topic)
        if route is None and self.auto_create_topics and topic and not topic_problem(topic):
            live = self._live()
            created = False
            for b in live:  # in-process brokers: every one of them, like a cluster-wide create
                if b.create_topic is not None:
                    created = b.create_topic(topic) or created
            remote = [b for b in live if b.create_topic is None]
            if remote:
                return self._create_remotely(req, topic, remote)
            if created:
                route = self.route(topic)
        return self._route_response(req, topic, route)

    def _route_response(self, req: RemotingCommand, topic: str, route: TopicRouteData | None) -> RemotingCommand:
        if route is None:
            return req.response_to(
                ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {topic}",
            )
        return req.response_to(ResponseCode.SUCCESS, body=route.to_json())

    async def _create_remotely(self, req: RemotingCommand, topic: str,
                               brokers: list[BrokerRegistration]) -> RemotingCommand:
        """Create ``topic`` on brokers of other processes (UPDATE_AND_CREATE_TOPIC), then answer
        the route; their next registration confirms the queues."""
        n = self.default_queue_nums
        for b in brokers:
            cmd = RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, opaque=1, ext_fields={
                "topic": topic, "defaultTopic": AUTO_CREATE_TOPIC, "readQueueNums": str(n), "writeQueueNums": str(n),
                "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})
            try:
                resp = await request(b.broker_addr, cmd, tls=self.outbound_tls)
            except (OSError, TimeoutError) as exc:
                log.warning("auto-create of topic %s on broker %s at %s failed: %s", topic, b.broker_name,
                            b.broker_addr, exc)
                continue
            if resp.code == ResponseCode.SUCCESS:
                b.topics.setdefault(topic, (n, n, 6))
            else:
                log.warning("broker %s refused to create topic %s: %s", b.broker_name, topic, resp.remark)
        return self._route_response(req, topic, self.route(topic))

    def get_topic_list(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        topics = sorted({t for b in self._live() for t in b.topics})
        return req.response_to(body=json.dumps({"topicList": topics}).encode())

    def get_cluster_info(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        live = self._live()
        clusters: dict[str, list[str]] = {}
        for b in live:
            clusters.setdefault(b.cluster, []).append(b.broker_name)
        body = {
            "brokerAddrTable": {
                b.broker_name: {"cluster": b.cluster, "brokerName": b.broker_name,
                                "brokerAddrs": {"0": b.broker_addr}}
                for b in live
            },
            "clusterAddrTable": clusters,
        }
        return req.response_to(body=json.dumps(body).encode())

    def register_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """REGISTER_BROKER from a broker in another process (repeated as its heartbeat)."""
        ext = req.ext_fields
        name = ext.get("brokerName", "")
        addr = ext.get("brokerAddr", "")
        if not name or not addr:
            return req.response_to(ResponseCode.SYSTEM_ERROR,
                                   remark="REGISTER_BROKER needs brokerName and brokerAddr")
        topics: dict[str, tuple[int, int, int]] = {}
        if req.body:
            try:
                obj = json.loads(req.body)
                table = (obj.get("topicConfigSerializeWrapper") or obj).get("topicConfigTable") or {}
                for t, cfg in table.items():
                    topics[t] = (int(cfg.get("readQueueNums", 4)), int(cfg.get("writeQueueNums", 4)),
                                 int(cfg.get("perm", 6)))
            except (ValueError, AttributeError, TypeError) as exc:
                return req.response_to(ResponseCode.SYSTEM_ERROR,
                                       remark=f"REGISTER_BROKER body is not a topic config table: {exc}")
        prev = self.brokers.get(name)
        self.register(BrokerRegistration(name, addr, ext.get("clusterName", "DefaultCluster"), topics,
                                         create_topic=prev.create_topic if prev else None))
        return req.response_to(ext_fields={"haServerAddr": "", "masterAddr": addr})

    def unregister_broker(self, conn: Connection, req: RemotingCommand) -> RemotingCommand:
        """UNREGISTER_BROKER: a broker stopping cleanly leaves the routes at once."""
        name = req.ext_fields.get("brokerName", "")
        reg = self.brokers.get(name)
        if reg is not None and reg.broker_addr == req.ext_fields.get("brokerAddr", reg.broker_addr):
            self.unregister(name)
        return req.response_to()
