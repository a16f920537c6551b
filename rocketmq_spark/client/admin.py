"""Admin calls of the classic protocol: what RocketMQ's ``mqadmin`` does and a reader or
writer does not (create topics and consumer groups; list topics, brokers and a broker's topic
configs; reset a group's offsets to a time; ask a consumer for its running info), for the CLI,
tools and tests.

:class:`RemotingAdmin` is a base class of :class:`~.remoting.RemotingClient`, so a tool makes an
admin call on the client it already has: the calls here build the requests and read the
answers, the client carries them (its connections, name servers and routes). None of these
calls is part of the :class:`~.contract.BrokerClient` contract.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import ProtocolError
from ..model import MessageQueue
from ..names import AUTO_CREATE_TOPIC
from ..remoting.codes import RequestCode, ResponseCode
from ..remoting.frame import RemotingCommand
from ..remoting.route import TopicRouteData, loads_lenient
from .retry import ClientConfig, retrying
from .routes import NameServers
from .tables import object_body, parse_offset_table, parse_running_info

__all__ = ["RemotingAdmin"]


class RemotingAdmin:
    """The admin calls of :class:`~.remoting.RemotingClient`. What they use of the client is
    declared first (the client defines each; these stand-ins raise NotImplementedError)."""

    config: ClientConfig
    #: route lookups (a topic created here is looked up afresh)
    names: NameServers

    def invoke(self, address: str, cmd: RemotingCommand, operation: str,
               timeout_s: float | None = None, *, ok: tuple[int, ...] = (ResponseCode.SUCCESS,),
               started: float | None = None) -> RemotingCommand:
        raise NotImplementedError

    def _invoke_namesrv(self, cmd: RemotingCommand, operation: str,
                        ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        raise NotImplementedError

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        raise NotImplementedError

    def cluster_brokers(self) -> dict[str, str]:
        raise NotImplementedError

    def create_topic(self, topic: str, queues: int = 4, *, broker_addr: str | None = None, perm: int = 6,
                     message_type: str | None = None) -> None:
        """Creates (or updates) ``topic`` on every broker (or ``broker_addr``). ``message_type``
        (NORMAL, FIFO, DELAY, TRANSACTION or MIXED) sets its ``message.type`` attribute: a 5.x
        proxy takes only messages of the topic's type (NORMAL when unset)."""
        addrs = [broker_addr] if broker_addr else self.broker_addrs()
        ext = {"topic": topic, "defaultTopic": AUTO_CREATE_TOPIC, "readQueueNums": str(queues),
               "writeQueueNums": str(queues), "perm": str(perm), "topicFilterType": "SINGLE_TAG",
               "topicSysFlag": "0", "order": "false"}
        if message_type:
            ext["attributes"] = f"+message.type={message_type}"
        for addr in addrs:
            self.invoke(addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, ext_fields=ext),
                        f"create topic {topic!r}")
        self.names.forget(topic)

    def create_group(self, group: str, *, broker_addr: str | None = None) -> None:
        """Creates consumer group ``group`` on every broker (or ``broker_addr``): brokers refuse
        offset commits of a group they do not know, and create one by themselves only on its
        first pull or heartbeat, with autoCreateSubscriptionGroup on (mqadmin updateSubGroup).
        The body names the group only: brokers give every other setting its default."""
        body = json.dumps({"groupName": group}).encode()
        for addr in [broker_addr] if broker_addr else self.broker_addrs():
            self.invoke(addr, RemotingCommand(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body),
                        f"create consumer group {group!r}")

    def broker_addrs(self) -> list[str]:
        """The master address of every broker the name servers know, by broker name."""
        return list(self.cluster_brokers().values())

    def topic_list(self) -> list[str]:
        """Every topic the name servers know, sorted."""
        resp = retrying(lambda: self._invoke_namesrv(
            RemotingCommand(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), "topic list"), self.config)
        obj = loads_lenient(resp.body)
        topics = obj.get("topicList", []) if isinstance(obj, dict) else None
        if not isinstance(topics, list):
            raise ProtocolError(f"malformed topic list from the name server: {bytes(resp.body[:200])!r}")
        return sorted(str(t) for t in topics)

    def consumer_running_info(self, group: str, client_id: str, broker_addr: str) -> dict[MessageQueue, dict[str, Any]]:
        """GET_CONSUMER_RUNNING_INFO through a broker the consumer is connected to (the broker
        asks the consumer): its queues and what it says of each (ProcessQueueInfo: a Spark
        query reports the end of its last planned batch as cachedMsgMaxOffset and what it has
        processed as cachedMsgMinOffset)."""
        resp = self.invoke(broker_addr, RemotingCommand(RequestCode.GET_CONSUMER_RUNNING_INFO, ext_fields={
            "consumerGroup": group, "clientId": client_id, "jstackEnable": "false"}),
            f"running info of consumer {client_id} of group {group!r}")
        return parse_running_info(resp.body)

    def topic_configs(self, broker_addr: str) -> dict[str, dict[str, Any]]:
        """GET_ALL_TOPIC_CONFIG (21): the broker's topic table, topic -> its config
        (``readQueueNums``, ``writeQueueNums``, ``perm``, ...)."""
        resp = self.invoke(broker_addr, RemotingCommand(RequestCode.GET_ALL_TOPIC_CONFIG), "topic config list")
        if not resp.body:
            return {}
        table = object_body(resp.body, f"topic config list at {broker_addr}").get("topicConfigTable") or {}
        if not isinstance(table, dict):
            raise ProtocolError(f"topic config list at {broker_addr}: topicConfigTable is not an object")
        return {str(k): dict(v) for k, v in table.items() if isinstance(v, dict)}

    def reset_offset_by_timestamp(self, group: str, topic: str, timestamp_ms: int, *,
                                  force: bool = True) -> dict[MessageQueue, int]:
        """INVOKE_BROKER_TO_RESET_OFFSET (222) on every broker serving ``topic``: each queue's
        offset of ``group`` becomes the first offset stored at/after ``timestamp_ms`` (the max
        offset when none, or when ``timestamp_ms`` is -1). The brokers also tell the group's
        connected consumers. Returns the offsets the brokers set."""
        route = self.route(topic, refresh=True)
        out: dict[MessageQueue, int] = {}
        for b in route.broker_datas:
            addr = b.master_addr
            if not addr:
                continue
            resp = self.invoke(addr, RemotingCommand(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext_fields={
                "topic": topic, "group": group, "timestamp": str(timestamp_ms),
                "isForce": "true" if force else "false"}), f"reset offsets of group {group!r} on topic {topic!r}")
            out.update(parse_offset_table(resp.body, default_broker=b.broker_name))
        return out
