"""Resets are followed in every state of a running query (issue 30), and the broker holds the
query's exact offsets at every trigger, idle ones included.

Each test resets the group as an operator would (``rocketmq-spark reset-offset``'s request, or
``mqadmin resetOffsetByTime`` on Apache RocketMQ) and counts every row the query wrote: a reset
to an earlier time reads the messages after it exactly once more, a later one skips what lies
before it, one to now reads nothing again."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from test_offset_reset import _bodies, _reset, _send, _start, _wait_for

from brokers import settles_at, wait_until
from real_rocketmq import RealCluster
from rocketmq_spark import EmbeddedCluster
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import RemotingCommand

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")


def _halves(client: RemotingClient, topic: str, n: int) -> int:
    """``n`` messages a* on the topic's first queue, then ``n`` b* spread over all its queues,
    stored later; returns a time between them (ms): one past the last a*'s store time, at or
    before the first b*'s. A reset to that time lands on a batch's start for every queue but
    the first (offset 0 there), as in the issue."""
    first = client.message_queues(topic)[0]
    for i in range(n):
        client.send_batch(first, [BatchEntry(f"a{i}".encode())])
    assert settles_at(client, topic, n) == n
    last_a = client.store_time_at(first, n - 1)  # the broker's clock: the store times a reset searches
    assert last_a is not None
    cut = last_a + 1
    while int(time.time() * 1000) < cut:  # b* are stored at or after the cut, a* all before it
        time.sleep(0.001)
    _send(client, topic, "b", n)
    return cut


def _offsets(client: RemotingClient, group: str, topic: str) -> list[int | None]:
    return [client.query_consumer_offset(group, m) for m in client.message_queues(topic)]


class _Sink:
    """A foreachBatch sink in this process: every row any run of a query wrote (a restarted
    query adds to the same count; the memory sink cannot restart)."""

    def __init__(self) -> None:
        self.rows: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, df, _batch_id: int) -> None:  # type: ignore[no-untyped-def]
        got = [r.body for r in df.selectExpr("CAST(body AS STRING) AS body").collect()]
        with self._lock:
            self.rows.update(got)

    def counts(self) -> Counter[str]:
        with self._lock:
            return Counter(self.rows)


def _query(spark, transport, topic: str, group: str, ck: str, sink: _Sink, *, available_now: bool = False,
           **opts: str):  # type: ignore[no-untyped-def]
    reader = (spark.readStream.format("rocketmq").options(**transport.options).option("topic", topic)
              .option("consumerGroup", group).option("startingOffsets", "earliest"))
    for k, v in opts.items():
        reader = reader.option(k, v)
    w = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", ck)
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="300 milliseconds")
    return w.start()


def _run_available_now(spark, transport, topic: str, group: str, ck: str, sink: _Sink) -> None:  # type: ignore[no-untyped-def]
    q = _query(spark, transport, topic, group, ck, sink, available_now=True)
    assert q.awaitTermination(120), "the AvailableNow run did not end"
    assert q.exception() is None, q.exception()


def _mqadmin_lags(broker, group: str, topic: str) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """queueId -> broker offset - consumer offset, from ``mqadmin consumerProgress``."""
    out: dict[int, int] = {}
    for line in broker.real.mqadmin("consumerProgress", "-g", group).splitlines():
        cols = line.split()
        if cols and cols[0] == topic:
            out[int(cols[2])] = int(cols[3]) - int(cols[4])
    return out


# -- caught up and idle: the scenario -------------------------------------------


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_query_idle_after_one_batch_follows_a_reset_to_a_time_inside_it(spark, broker, client, transport,
                                                                          tmp_path) -> None:
    _idle_after_one_batch(spark, broker, client, transport, tmp_path, "client")


@pytest.mark.brokers("real")
@pytest.mark.transports(real=("remoting",))
def test_a_query_idle_after_one_batch_follows_mqadmin_reset_offset_by_time(spark, broker, client, transport,
                                                                           tmp_path) -> None:
    _idle_after_one_batch(spark, broker, client, transport, tmp_path, "mqadmin")


def _idle_after_one_batch(spark, broker, client, transport, tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    """The issue's scenario: everything was read by the first batch, the query idles, and the
    reset lands on that batch's start for one queue at least. The broker must hold the batch's
    end while the query idles, and the reset must re-read exactly the second half, once."""
    topic = broker.create_topic(transport(f"RESET_IDLE_{how.upper()}"), queues=2)
    group = transport(f"g_reset_idle_{how}")
    cut = _halves(client, topic, 50)
    q = _start(spark, transport, topic, group, str(tmp_path / "ck"))
    try:
        _wait_for(q, lambda: sum(_bodies(spark, group).values()) == 100, "the 100 messages")
        # idle now: the batch's end must be on the broker without another batch
        ends = [75, 25]  # 50 a* and 25 b* on the first queue, 25 b* on the second
        _wait_for(q, lambda: _offsets(client, group, topic) == ends,
                  lambda: f"the group's offsets while the query idles: {_offsets(client, group, topic)} "
                          f"(want {ends})", timeout_s=30)
        if broker.is_real:  # what an operator looks at: no lag for a query that read everything
            assert _mqadmin_lags(broker, group, topic) == {0: 0, 1: 0}
        _reset(broker, client, group, topic, cut, how)
        want = Counter({f"a{i}": 1 for i in range(50)} | {f"b{i}": 2 for i in range(50)})
        _wait_for(q, lambda: _bodies(spark, group) == want,
                  lambda: f"b* read once more after the reset: read {_bodies(spark, group) - want} more, "
                          f"{want - _bodies(spark, group)} missing; the group holds "
                          f"{_offsets(client, group, topic)}; last progress {q.lastProgress}",
                  timeout_s=60)
        # and the query goes on: what comes next is read once
        _send(client, topic, "c", 4)
        want.update({f"c{i}": 1 for i in range(4)})
        _wait_for(q, lambda: _bodies(spark, group) == want, "the messages after the reset, once")
        assert wait_until(lambda: _offsets(client, group, topic) == [77, 27], 30, 0.2), \
            _offsets(client, group, topic)
    finally:
        q.stop()


# -- mid-backlog under maxMessagesPerTrigger ---------------------------------------------


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_query_mid_backlog_follows_a_reset_to_a_later_time_and_skips_what_lies_before(
        spark, broker, client, transport, tmp_path) -> None:
    topic = broker.create_topic(transport("RESET_BACKLOG"), queues=2)
    group = transport("g_reset_backlog")
    cut = _halves(client, topic, 50)
    gate, held = threading.Event(), threading.Event()
    sink = _Sink()

    def gated(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        sink(df, batch_id)
        if batch_id == 0:  # the first batch waits until the test has reset the group
            held.set()
            gate.wait(60)

    q = _query(spark, transport, topic, group, str(tmp_path / "ck"), gated, maxMessagesPerTrigger="10")  # type: ignore[arg-type]
    try:
        assert held.wait(90), f"the first batch did not come: {q.exception()}"
        first = sink.counts()
        assert sum(first.values()) == 10 and set(first) <= {f"a{i}" for i in range(50)} | {f"b{i}" for i in range(50)}
        _reset(broker, client, group, topic, cut, "client")  # later than the first batch on the first queue
        gate.set()
        # from the reset on, each queue is read from its reset offset: the first queue skips the
        # a* it had not read, the second reads again the b* the first batch read there
        want = first + Counter({f"b{i}": 1 for i in range(50)})
        _wait_for(q, lambda: sink.counts() == want,
                  lambda: f"after the reset: read {sink.counts() - want} more, {want - sink.counts()} missing; the "
                          f"group holds {_offsets(client, group, topic)}; last progress {q.lastProgress}")
        assert wait_until(lambda: _offsets(client, group, topic) == [75, 25], 30, 0.2), _offsets(client, group, topic)
    finally:
        gate.set()
        q.stop()


# -- between AvailableNow runs, and right after a driver restart -------------------------


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_reset_between_available_now_runs_is_followed_by_the_next_run(spark, broker, client, transport,
                                                                       tmp_path) -> None:
    _between_runs(spark, broker, client, transport, tmp_path, "client")


@pytest.mark.brokers("real")
@pytest.mark.transports(real=("remoting",))
def test_an_mqadmin_reset_between_available_now_runs_is_followed_by_the_next_run(spark, broker, client, transport,
                                                                                tmp_path) -> None:
    _between_runs(spark, broker, client, transport, tmp_path, "mqadmin")


def _between_runs(spark, broker, client, transport, tmp_path, how: str) -> None:  # type: ignore[no-untyped-def]
    """A scheduled job: each AvailableNow run reads what came since the last. The operator
    resets the group to a time inside the last run (its start, on the second queue): the next
    run reads the second half once more, then the one after reads only what is new."""
    topic = broker.create_topic(transport(f"RESET_RUNS_{how.upper()}"), queues=2)
    group = transport(f"g_reset_runs_{how}")
    cut = _halves(client, topic, 50)
    ck, sink = str(tmp_path / "ck"), _Sink()
    _run_available_now(spark, transport, topic, group, ck, sink)
    want = Counter({f"a{i}": 1 for i in range(50)} | {f"b{i}": 1 for i in range(50)})
    assert sink.counts() == want
    assert _offsets(client, group, topic) == [75, 25]  # the run's end, on the broker when it ends
    _reset(broker, client, group, topic, cut, how)
    assert _offsets(client, group, topic) == [50, 0]
    _run_available_now(spark, transport, topic, group, ck, sink)
    want.update({f"b{i}": 1 for i in range(50)})
    assert sink.counts() == want, f"read {sink.counts() - want} more, {want - sink.counts()} missing"
    assert _offsets(client, group, topic) == [75, 25]
    _send(client, topic, "c", 2)
    _run_available_now(spark, transport, topic, group, ck, sink)
    want.update({"c0": 1, "c1": 1})
    assert sink.counts() == want


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_a_query_just_restarted_on_its_checkpoint_follows_a_reset_to_now(spark, broker, client, transport,
                                                                         tmp_path) -> None:
    """A driver restarted (a new query on the same checkpoint) is reset to now while its first
    batch runs: the rest of the backlog is skipped, nothing is read again, and what comes after
    is read once."""
    topic = broker.create_topic(transport("RESET_RESTART"), queues=2)
    group = transport("g_reset_restart")
    _send(client, topic, "a", 20)
    ck, sink = str(tmp_path / "ck"), _Sink()
    _run_available_now(spark, transport, topic, group, ck, sink)
    _send(client, topic, "b", 6)
    gate, held, calls = threading.Event(), threading.Event(), []

    def gated(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        sink(df, batch_id)
        calls.append(batch_id)
        if len(calls) == 1:  # the restarted query's first batch waits for the reset
            held.set()
            gate.wait(60)

    q = _query(spark, transport, topic, group, ck, gated, maxMessagesPerTrigger="1")  # type: ignore[arg-type]
    try:
        assert held.wait(90), f"the restarted query's first batch did not come: {q.exception()}"
        _reset(broker, client, group, topic, int(time.time() * 1000) + 1, "client")
        gate.set()
        _send(client, topic, "c", 4)
        want = Counter({f"a{i}": 1 for i in range(20)} | {f"c{i}": 1 for i in range(4)})
        # one b* read by the first batch; the reset skips the other five
        _wait_for(q, lambda: sink.counts() - Counter({f"b{i}": 1 for i in range(6)}) == want,
                  lambda: f"after the reset: {sink.counts()}")
        got = sink.counts()
        assert sum(v for k, v in got.items() if k.startswith("b")) == 1 and max(got.values()) == 1, got
        assert wait_until(lambda: _offsets(client, group, topic) == [15, 15], 30, 0.2), _offsets(client, group, topic)
    finally:
        gate.set()
        q.stop()


# -- queues added to the topic --------------------------------------------------------


@pytest.mark.transports(embedded=("remoting",), real=("remoting",))
def test_queues_added_to_the_topic_are_read_and_reset_with_the_others(spark, broker, client, transport,
                                                                     tmp_path) -> None:
    topic = broker.create_topic(transport("RESET_GROWN"), queues=2)
    group = transport("g_reset_grown")
    _send(client, topic, "a", 10)
    sink = _Sink()
    q = _query(spark, transport, topic, group, str(tmp_path / "ck"), sink)
    try:
        _wait_for(q, lambda: sum(sink.counts().values()) == 10, "a*")
        broker.create_topic(topic, queues=4)  # two more queues
        assert wait_until(lambda: len(client.message_queues(topic, refresh=True)) == 4, 30, 0.2)
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        _send(client, topic, "b", 8)  # two on each queue, the new ones included
        _wait_for(q, lambda: sum(sink.counts().values()) == 18, lambda: f"b*: {sink.counts()}")
        _wait_for(q, lambda: _offsets(client, group, topic) == [7, 7, 2, 2],
                  lambda: f"the group's offsets: {_offsets(client, group, topic)}", timeout_s=30)
        _reset(broker, client, group, topic, cut, "client")
        want = Counter({f"a{i}": 1 for i in range(10)} | {f"b{i}": 2 for i in range(8)})
        _wait_for(q, lambda: sink.counts() == want,
                  lambda: f"b* once more: read {sink.counts() - want} more, {want - sink.counts()} missing")
    finally:
        q.stop()


# -- one broker of two down -----------------------------------------------------------


class _TwoBrokers:
    """A cluster of two broker groups, ``broker-a`` and ``broker-b``: the embedded one (in this
    process) or Apache RocketMQ, the session's ``real_cluster`` (a name server, broker-a a
    master with a slave, broker-b; no proxy), shared with test_cluster.py and the master/slave
    tests as those share it: broker-b, killed here, is started again before the test ends."""

    def __init__(self, kind: str, real: RealCluster | None = None) -> None:
        self.kind = kind
        if real is None:
            self.embedded: EmbeddedCluster | None = EmbeddedCluster(brokers=2)
            self.embedded.__enter__()
            self.namesrv_addr = self.embedded.namesrv_addr
            self.addrs = dict(self.embedded.broker_addrs)
            return
        self.embedded = None
        self.real = real
        self.namesrv_addr = real.namesrv_addr
        self.addrs = {name: real.addr(name) for name in ("broker-a", "broker-b")}

    def crash_b(self) -> None:
        if self.embedded is not None:
            self.embedded.stop_broker("broker-b", unregister=False)  # still in the routes
        else:
            self.real.kill("broker-b")

    def start_b(self) -> None:
        if self.embedded is not None:
            self.embedded.start_broker("broker-b")
        else:
            self.real.start_member("broker-b")

    def close(self) -> None:
        if self.embedded is not None:
            self.embedded.__exit__(None, None, None)
        elif self.real.member("broker-b").pid("broker") is None:  # the test failed while it was down
            self.real.start_member("broker-b")


@pytest.fixture(params=["embedded", "real"])
def two_brokers(request: pytest.FixtureRequest) -> Iterator[_TwoBrokers]:
    real = request.getfixturevalue("real_cluster") if request.param == "real" else None
    cl = _TwoBrokers(request.param, real)
    try:
        yield cl
    finally:
        cl.close()


def test_a_reset_while_one_broker_of_two_is_down_is_followed_on_the_other(spark, two_brokers, tmp_path) -> None:
    cl = two_brokers
    c = RemotingClient(cl.namesrv_addr)
    topic, group = "RESET_DOWN", "g_reset_down"
    sink = _Sink()
    q = None
    try:
        c.create_topic(topic, queues=4)  # on both brokers
        assert wait_until(lambda: len(c.message_queues(topic, refresh=True)) == 8, 60, 0.5), "the topic's route"
        _send(c, topic, "a", 8)  # one on each of the 8 queues (4 per broker)
        time.sleep(0.05)
        cut = int(time.time() * 1000)
        time.sleep(0.05)
        _send(c, topic, "b", 8)
        q = (spark.readStream.format("rocketmq").option("namesrvAddr", cl.namesrv_addr).option("topic", topic)
             .option("consumerGroup", group).option("startingOffsets", "earliest")
             .option("brokerDownTimeoutMs", "180000").load()
             .writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="300 milliseconds").start())
        _wait_for(q, lambda: sum(sink.counts().values()) == 16, "a* and b*")
        qs = c.message_queues(topic)
        a_qs = [m for m in qs if m.broker == "broker-a"]
        _wait_for(q, lambda: all(c.query_consumer_offset(group, m) == 2 for m in qs),
                  lambda: f"the group's offsets: {[c.query_consumer_offset(group, m) for m in qs]}", timeout_s=30)
        cl.crash_b()
        # an operator's reset reaches the broker that is up (mqadmin asks each broker in turn)
        c.invoke(cl.addrs["broker-a"], RemotingCommand(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext_fields={
            "topic": topic, "group": group, "timestamp": str(cut), "isForce": "true"}), "reset broker-a")
        # broker-a's b* once more while broker-b is down, then what comes to broker-a once
        want = Counter({f"a{i}": 1 for i in range(8)} | {f"b{i}": 1 for i in range(8)})
        want.update({f"b{i}": 1 for i in range(8) if qs[i % 8].broker == "broker-a"})
        _wait_for(q, lambda: sink.counts() == want,
                  lambda: f"broker-a after the reset: read {sink.counts() - want} more, {want - sink.counts()} "
                          f"missing", timeout_s=90)
        for i, m in enumerate(a_qs):
            c.send_batch(m, [BatchEntry(f"c{i}".encode())])
        want.update({f"c{i}": 1 for i in range(4)})
        _wait_for(q, lambda: sink.counts() == want, lambda: f"c* on broker-a: {sink.counts() - want} more, "
                                                            f"{want - sink.counts()} missing", timeout_s=60)
        cl.start_b()
        for i, m in enumerate(m for m in qs if m.broker == "broker-b"):
            c.send_batch(m, [BatchEntry(f"d{i}".encode())])
        want.update({f"d{i}": 1 for i in range(4)})
        _wait_for(q, lambda: sink.counts() == want, lambda: f"broker-b back: {sink.counts() - want} more, "
                                                            f"{want - sink.counts()} missing", timeout_s=120)
        _wait_for(q, lambda: [c.query_consumer_offset(group, m) for m in qs] == [3] * 8,
                  lambda: f"the group's offsets at the end: {[c.query_consumer_offset(group, m) for m in qs]}",
                  timeout_s=30)
    finally:
        if q is not None:
            q.stop()
        c.close()
