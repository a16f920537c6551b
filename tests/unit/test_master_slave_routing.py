"""Where reads, offsets and sends go in a broker group with a slave (issue 32), without a broker:
the member choice of the Java client's findBrokerAddressInSubscribe / InPublish, the failover past
a master that just failed, the route rules (a group whose master is gone is still read, not
written), the offset store writing a group's offsets again once they go to another member, and
sends following a master that a controller (controller mode) elected in place of a dead one."""

from __future__ import annotations

import pytest

from rocketmq_spark.checkpoints import BrokerOffsetStore
from rocketmq_spark.client import routes
from rocketmq_spark.client.retry import ClientConfig
from rocketmq_spark.client.routes import NameServers
from rocketmq_spark.errors import ConnectionFailedError
from rocketmq_spark.model import MessageQueue
from rocketmq_spark.remoting.route import BrokerData, QueueData, TopicRouteData

MASTER, SLAVE, OTHER = "127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:2000"


def _route(a_members: dict[int, str]) -> TopicRouteData:
    return TopicRouteData(queue_datas=(QueueData("a", 2, 2), QueueData("b", 2, 2)),
                          broker_datas=(BrokerData("a", a_members), BrokerData("b", {0: OTHER})))


class _Names(NameServers):
    """Name servers whose route lookups answer ``self.now`` (counted), no sockets."""

    def __init__(self, route: TopicRouteData) -> None:
        super().__init__(["127.0.0.1:9876"], ClientConfig(), lambda addr, op: None)  # type: ignore[arg-type,return-value]
        self.now = route
        self.lookups = 0

    def route(self, topic: str, *, refresh: bool = False) -> TopicRouteData:
        self.lookups += 1
        route = self.now
        self.routes[topic] = (0.0, route)
        for b in route.broker_datas:
            self.members[b.broker_name] = dict(b.broker_addrs)
            if b.master_addr:
                self.broker_addrs[b.broker_name] = b.master_addr
            else:
                self.broker_addrs.pop(b.broker_name, None)
        return route


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(routes.time, "monotonic", lambda: now[0])
    return now


def test_reads_go_to_the_master_then_to_the_slave_once_the_route_has_no_master_and_back(clock) -> None:
    names = _Names(_route({0: MASTER, 1: SLAVE}))
    names.route("T")
    assert names.read_addr("a", "T") == MASTER
    names.now = _route({1: SLAVE})  # the name server dropped the crashed master
    names.note_failed(MASTER)
    assert names.read_addr("a", "T") == SLAVE
    with pytest.raises(ConnectionFailedError, match="no route"):
        names.broker_addr("a")  # sends: masters only
    names.now = _route({0: MASTER, 1: SLAVE})  # it is back
    lookups = names.lookups
    clock[0] += routes.RECHECK_S / 2
    assert names.read_addr("a", "T") == SLAVE and names.lookups == lookups  # asked again every RECHECK_S
    clock[0] += routes.FAILOVER_S
    assert names.read_addr("a", "T") == MASTER
    assert names.broker_addr("a") == MASTER


def test_a_master_that_just_failed_is_passed_over_while_still_in_the_route(clock) -> None:
    names = _Names(_route({0: MASTER, 1: SLAVE}))
    names.route("T")
    names.note_failed(MASTER)
    assert names.read_addr("a", "T") == SLAVE
    lookups = names.lookups
    assert names.read_addr("a", "T") == SLAVE and names.lookups == lookups  # not a lookup per read
    clock[0] += routes.FAILOVER_S
    assert names.read_addr("a", "T") == MASTER
    names.note_failed(SLAVE)
    names.note_failed(MASTER)
    assert names.read_addr("a", "T") == MASTER  # every member failed: the master is asked again


def test_a_suggested_slave_id_is_followed_and_a_missing_one_falls_back() -> None:
    names = _Names(_route({0: MASTER, 1: SLAVE}))
    names.route("T")
    assert names.read_addr("a", "T", broker_id=1) == SLAVE
    assert names.read_addr("a", "T", broker_id=7) == MASTER  # neither 7 nor 8: the master
    names.now = _route({0: MASTER, 2: "127.0.0.1:1002"})
    names.route("T")
    assert names.read_addr("a", "T", broker_id=1) == "127.0.0.1:1002"  # id+1, as the Java client


def test_a_group_without_its_master_is_read_but_not_written() -> None:
    names = _Names(_route({1: SLAVE}))
    readable = names.message_queues("T")
    writable = names.message_queues("T", writable=True)
    assert {m.broker for m in readable} == {"a", "b"}
    assert {m.broker for m in writable} == {"b"}
    assert _route({1: SLAVE}).any_addr("a") == SLAVE and _route({1: SLAVE}).broker_addr("a") is None


class _Homes:
    """An offset client that records what was written, and where the group's offsets go."""

    def __init__(self) -> None:
        self.home = {"a": MASTER}
        self.writes: list[dict[MessageQueue, int]] = []

    def offsets_home(self, broker: str) -> str | None:
        return self.home.get(broker)

    def query_consumer_offset(self, group, mq):  # type: ignore[no-untyped-def]
        return None

    def query_consumer_offsets(self, group, mqs):  # type: ignore[no-untyped-def]
        return dict.fromkeys(mqs)

    def update_consumer_offsets(self, group, offsets):  # type: ignore[no-untyped-def]
        self.writes.append(dict(offsets))
        return {}


def test_the_offset_store_writes_a_groups_offsets_again_once_they_go_to_another_member() -> None:
    client = _Homes()
    store = BrokerOffsetStore(client, "g")
    a0, a1 = MessageQueue("t", "a", 0), MessageQueue("t", "a", 1)
    store.commit({a0: 5, a1: 7})
    client.writes.clear()
    client.home["a"] = SLAVE  # the master died: commits go to the slave
    store.commit({a0: 6, a1: 7})
    assert {k: v for w in client.writes for k, v in w.items()} == {a0: 6, a1: 7}  # a1 too: the slave lacks it
    client.writes.clear()
    store.commit({a0: 6, a1: 7})
    assert client.writes == []  # nothing moved, same member
    client.home["a"] = MASTER  # back: the master still holds what it had before it died
    store.commit({a0: 6, a1: 7})
    assert {k: v for w in client.writes for k, v in w.items()} == {a0: 6, a1: 7}


def test_a_slave_that_does_not_know_the_topic_yet_is_waited_for_not_a_missing_topic() -> None:
    """A slave copies its master's topics once a minute: its TOPIC_NOT_EXIST while the master is down
    is a member that cannot serve yet (ridden out as a broker that is down), where the same
    answer from a master is a topic that is not there."""
    from concurrent.futures import Future

    from rocketmq_spark.client.remoting import RemotingClient
    from rocketmq_spark.errors import TopicNotFoundError
    from rocketmq_spark.remoting.codes import ResponseCode
    from rocketmq_spark.remoting.frame import RemotingCommand

    def answer() -> Future[RemotingCommand]:
        fut: Future[RemotingCommand] = Future()
        fut.set_result(RemotingCommand(ResponseCode.TOPIC_NOT_EXIST, remark="topic[T] not exist, apply first please!"))
        return fut

    c = RemotingClient("127.0.0.1:9876")
    try:
        mq = MessageQueue("T", "a", 0)
        c.names.members["a"] = {1: SLAVE}  # the master is gone from the route
        c.names.read_addrs["a"] = SLAVE
        with pytest.raises(ConnectionFailedError, match="slave does not know topic 'T' yet") as info:
            c.pull_result(mq, answer())
        assert not isinstance(info.value, TopicNotFoundError)
        c.names.members["a"] = {0: MASTER, 1: SLAVE}
        c.names.broker_addrs["a"] = MASTER
        c.names.read_addrs["a"] = MASTER
        with pytest.raises(TopicNotFoundError):
            c.pull_result(mq, answer())
    finally:
        c.close()


# -- controller mode: the master elected in place of a dead one is another member ---------------


def test_sends_follow_the_member_elected_master_once_the_old_master_failed(clock) -> None:
    # controller ids: the master registers as 0, the other member under its own id (2 here)
    names = _Names(_route({0: MASTER, 2: SLAVE}))
    names.route("T")
    assert names.broker_addr("a", "T") == MASTER
    names.now = _route({0: SLAVE})  # the controller elected the other member
    lookups = names.lookups
    assert names.broker_addr("a", "T") == MASTER and names.lookups == lookups  # no failure seen: no lookup
    names.note_failed(MASTER)
    assert names.broker_addr("a", "T") == SLAVE and names.lookups == lookups + 1
    assert names.read_addr("a", "T") == SLAVE  # reads and the group's offsets too
    names.now = _route({0: SLAVE, 1: MASTER})  # the old master back, under its controller id, a slave now
    clock[0] += routes.FAILOVER_S
    names.route("T")  # the next route poll
    assert names.broker_addr("a", "T") == SLAVE
    assert names.read_addr("a", "T") == SLAVE and names.read_addr("a", "T", broker_id=1) == MASTER


def test_a_failed_master_is_looked_up_at_most_every_recheck_period(clock) -> None:
    names = _Names(_route({0: MASTER, 1: SLAVE}))
    names.route("T")
    names.note_failed(MASTER)  # a crash the name server has not seen yet: still the master
    lookups = names.lookups
    assert names.broker_addr("a", "T") == MASTER and names.lookups == lookups + 1
    assert names.broker_addr("a", "T") == MASTER and names.lookups == lookups + 1  # not a lookup per send
    assert names.broker_addr("a") == MASTER  # no topic to look up: the address known


def test_a_send_retried_after_its_master_failed_goes_to_the_elected_member(clock, monkeypatch) -> None:
    from rocketmq_spark.client import retry
    from rocketmq_spark.client.remoting import RemotingClient
    from rocketmq_spark.codec import BatchEntry
    from rocketmq_spark.remoting.frame import RemotingCommand

    monkeypatch.setattr(retry, "_sleep", lambda s: None)
    c = RemotingClient("127.0.0.1:9876")
    names = c.names = _Names(_route({0: MASTER, 2: SLAVE}))
    names.route("T")
    names.now = _route({0: SLAVE})  # elected as the old master died
    tried: list[str] = []

    def once(addr, cmd, operation, timeout, ok):  # type: ignore[no-untyped-def]
        tried.append(addr)
        if addr == MASTER:
            names.note_failed(addr)  # as RemotingClient._invoke_once does
            raise ConnectionFailedError(addr, operation, "connection refused")
        return RemotingCommand(0, ext_fields={"msgId": "M1", "queueOffset": "7", "queueId": "0"})

    monkeypatch.setattr(c, "_invoke_once", once)
    try:
        sent = c.send_batch(MessageQueue("T", "a", 0), [BatchEntry(b"x")])
        assert tried == [MASTER, SLAVE] and [s.queue_offset for s in sent] == [7]
        tried.clear()
        assert c.end_transaction("a", producer_group="p", commit_log_offset=1, queue_offset=7, msg_id="M1",
                                 commit=True, topic="T")
        assert tried == [SLAVE]
    finally:
        c.close()
