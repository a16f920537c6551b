"""The inputs a new user tries first, at every entry point, as one table (on both brokers).

Each row is an entry point (batch/stream reader, batch/stream writer, the committer listener, a
CLI command) with one input, and what it must give: a number of rows or messages, or an error at
once whose message names what was wrong and what is accepted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from brokers import settles_at
from rocketmq_spark import RocketMQOffsetCommitter
from rocketmq_spark.broker import EmbeddedBroker
from rocketmq_spark.client import RemotingClient

pytestmark = [pytest.mark.spark, pytest.mark.integration]

BROKERS = ("embedded", "real")
CLI = [sys.executable, "-m", "rocketmq_spark.cli"]
DEAD = "127.0.0.1:1"  # nothing listens there


@dataclass
class Ctx:
    spark: Any
    broker: Any
    client: RemotingClient
    tmp: Any

    @property
    def ns(self) -> str:
        return self.broker.namesrv_addr  # type: ignore[no-any-return]

    def topic(self, name: str, **kw: Any) -> str:
        return self.broker.create_topic(f"FFM_{name}", **kw)  # type: ignore[no-any-return]

    def read(self, **opts: str) -> int:
        r = self.spark.read.format("rocketmq").option("namesrvAddr", opts.pop("namesrvAddr", self.ns))
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load().count()  # type: ignore[no-any-return]

    def stream(self, **opts: str) -> int:
        r = self.spark.readStream.format("rocketmq").option("namesrvAddr", self.ns)
        for k, v in opts.items():
            r = r.option(k, v)
        name = f"ffm_{abs(hash(tuple(sorted(opts.items())))) % 10**8}"
        q = (r.load().writeStream.format("memory").queryName(name)
             .option("checkpointLocation", str(self.tmp / name)).trigger(availableNow=True).start())
        q.awaitTermination(120)
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        return self.spark.sql(f"select * from {name}").count()  # type: ignore[no-any-return]

    def write(self, rows: list[tuple[Any, ...]], ddl: str, mode: str = "append", **opts: str) -> int:
        w = self.spark.createDataFrame(rows, ddl).write.mode(mode).format("rocketmq").option("namesrvAddr", self.ns)
        for k, v in opts.items():
            w = w.option(k, v)
        w.save()
        topic = opts.get("topic")
        return settles_at(self.client, topic, len(rows)) if topic else 0

    def cli(self, *args: str) -> str:
        res = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
        lines = res.stderr.strip().splitlines()
        if res.returncode != 2 or len(lines) != 1 or "Traceback" in res.stderr:
            raise AssertionError(f"not a one-line error (exit {res.returncode}): {res.stderr}")
        raise RuntimeError(lines[0])


def _empty_batch(c: Ctx) -> int:
    return c.read(topic=c.topic("EMPTY_B"))


def _empty_stream(c: Ctx) -> int:
    return c.stream(topic=c.topic("EMPTY_S"), consumerGroup="g_ffm_empty")


def _missing_topic(c: Ctx) -> int:
    if c.broker.is_real:  # a real name server routes no unknown topic
        return c.read(topic="FFM_NEVER_CREATED")
    with EmbeddedBroker(auto_create_topics=False) as strict:  # the embedded one creates it unless told not to
        return c.read(namesrvAddr=strict.namesrv_addr, topic="FFM_NEVER_CREATED")


def _unicode(c: Ctx) -> int:
    topic = c.topic("UNICODE")
    c.write([("body-ü", "标签", ["键", "clé"], {"ключ": "значение"})],
            "body STRING, tag STRING, keys ARRAY<STRING>, properties MAP<STRING,STRING>", topic=topic)
    rows = (c.spark.read.format("rocketmq").option("namesrvAddr", c.ns).option("topic", topic)
            .option("subExpression", "标签").load().collect())
    assert [(bytes(r.body).decode(), r.tag, r.keys, r.properties) for r in rows] == [
        ("body-ü", "标签", ["键", "clé"], {"ключ": "значение"})]
    return len(rows)


def _write_only_topic(c: Ctx) -> int:
    return c.read(topic=c.topic("WRITE_ONLY", perm=2))


def _read_only_topic(c: Ctx) -> int:
    return c.write([("x",)], "body STRING", topic=c.topic("READ_ONLY", perm=4))


def _write_only_topic_grpc(c: Ctx) -> int:
    topic = c.topic("WRITE_ONLY_G", perm=2)
    return c.spark.read.format("rocketmq").option("endpoints", c.broker.grpc_endpoint).option("topic", topic) \
        .load().count()  # type: ignore[no-any-return]


def _read_only_topic_grpc(c: Ctx) -> int:
    topic = c.topic("READ_ONLY_G", perm=4)
    c.spark.createDataFrame([("x",)], "body STRING").write.mode("append").format("rocketmq") \
        .option("endpoints", c.broker.grpc_endpoint).option("topic", topic).save()
    return 1


def _ending_past_the_end(c: Ctx) -> int:
    topic = c.topic("ENDING", queues=1)
    c.write([("a",), ("b",)], "body STRING", topic=topic)
    return c.read(topic=topic, endingOffsets=f'{{"{topic}":{{"broker-a:0":999}}}}')


def _committer(group: str, topics: list[str] | None = None) -> Callable[[Ctx], int]:
    def run(c: Ctx) -> int:
        RocketMQOffsetCommitter(c.ns, group, topics=topics).client.close()
        return 0
    return run


@dataclass
class Case:
    entry: str  # the entry point and the input
    run: Callable[[Ctx], int]
    expect: int | str  # rows or messages, or a regex the error's message must match
    #: the input never reaches the broker under test (a dead name server): the case runs once, on
    #: the embedded target (the write waits out its client's whole retry budget, 30 s, each run)
    broker_free: bool = False


NAME_RULE = r"may contain only letters, digits, '%', '\|', '_' and '-'"
CASES = [
    Case("batch read: an empty topic", _empty_batch, 0),
    Case("stream read: an empty topic", _empty_stream, 0),
    Case("batch read: a topic that does not exist", _missing_topic, r"FFM_NEVER_CREATED.*(No topic route|not exist)"),
    Case("batch read: topic a.b", lambda c: c.read(topic="a.b"), rf"topic='a.b'.*{NAME_RULE}"),
    Case("stream read: consumerGroup with a space",
         lambda c: c.stream(topic=c.topic("GROUPNAME"), consumerGroup="my group"), rf"consumerGroup.*{NAME_RULE}"),
    Case("batch read: a misspelt option", lambda c: c.read(topic=c.topic("SPELL"), startingOffset="earliest"),
         r"startingoffset='earliest'.*did you mean startingOffsets\?"),
    Case("batch read: endingOffsets past the queue's end", _ending_past_the_end,
         r"endingOffsets.*broker-a:0: 999.*holds offsets \[0, 2\)"),
    Case("batch read: a write-only topic", _write_only_topic, r"FFM_WRITE_ONLY.*cannot be read.*write-only \(2\)"),
    Case("batch read over gRPC: a write-only topic", _write_only_topic_grpc,
         r"FFM_WRITE_ONLY_G.*cannot be read.*write-only \(2\)"),
    Case("batch read: a dead name server", lambda c: c.read(namesrvAddr=DEAD, topic="T"), r"127\.0\.0\.1:1",
         broker_free=True),
    Case("batch write: an empty DataFrame", lambda c: c.write([], "body STRING", topic=c.topic("EMPTY_W")), 0),
    Case("batch write: save mode overwrite",
         lambda c: c.write([("x",)], "body STRING", mode="overwrite", topic=c.topic("OVERWRITE")),
         r"mode='overwrite'.*cannot be overwritten.*append"),
    Case("batch write: option topic a.b", lambda c: c.write([("x",)], "body STRING", topic="a.b"),
         rf"topic='a.b'.*{NAME_RULE}"),
    Case("batch write: column topic a.b",
         lambda c: c.write([("x", "a.b")], "body STRING, topic STRING"), rf"column topic.*a\.b.*{NAME_RULE}"),
    Case("batch write: producerGroup with a dot",
         lambda c: c.write([("x",)], "body STRING", topic=c.topic("PGROUP"), producerGroup="p.g"),
         rf"producerGroup.*{NAME_RULE}"),
    Case("batch write: a null body", lambda c: c.write([(None,)], "body STRING", topic=c.topic("NULLBODY")),
         r"column body.*body is null"),
    Case("batch write: a body over maxMessageSize",
         lambda c: c.write([("x" * 2000,)], "body STRING", topic=c.topic("BIGBODY"), maxMessageSize="1000"),
         r"column body.*2000 bytes.*maxMessageSize=1000"),
    Case("batch write: keys of type INT", lambda c: c.write([("x", 1)], "body STRING, keys INT", topic="T"),
         r"column keys.*ARRAY<STRING> or STRING"),
    Case("batch write: a read-only topic", _read_only_topic, r"FFM_READ_ONLY.*cannot be written to.*read-only \(4\)"),
    Case("batch write over gRPC: a read-only topic", _read_only_topic_grpc,
         r"FFM_READ_ONLY_G.*cannot be written to.*read-only \(4\)"),
    Case("batch write: a dead name server",
         lambda c: c.write([("x",)], "body STRING", namesrvAddr=DEAD, topic="T"), r"127\.0\.0\.1:1",
         broker_free=True),
    Case("batch write: unicode tag, keys and properties, read back by tag", _unicode, 1),
    Case("stream write: delivery exactly-once without a checkpoint",
         lambda c: (c.spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS body")
                    .writeStream.format("rocketmq").option("namesrvAddr", c.ns).option("topic", "T")
                    .option("delivery", "exactly-once").start()),
         r"checkpointLocation"),
    Case("committer listener: group with a space", _committer("my group"), rf"consumer_group.*{NAME_RULE}"),
    Case("committer listener: topic a.b", _committer("g", ["a.b"]), rf"topics.*{NAME_RULE}"),
    Case("cli produce: topic a.b", lambda c: c.cli("produce", "-t", "a.b", "--count", "1", "-n", c.ns),
         rf"--topic: 'a.b'.*{NAME_RULE}"),
    Case("cli progress: group with a space", lambda c: c.cli("progress", "-g", "my group", "-n", c.ns),
         rf"--group: 'my group'.*{NAME_RULE}"),
    Case("cli reset-offset: topic a.b",
         lambda c: c.cli("reset-offset", "-g", "g", "-t", "a.b", "--timestamp", "now", "-n", c.ns),
         rf"--topic: 'a.b'.*{NAME_RULE}"),
    Case("cli topic describe: a topic that does not exist",
         lambda c: c.cli("topic", "describe", "FFM_NOT_THERE", "-n", c.ns), r"FFM_NOT_THERE.*does not exist"),
]


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.brokers("embedded")) if c.broker_free else c
                                  for c in CASES], ids=[c.entry for c in CASES])
def test_first_inputs_at_every_entry_point(case: Case, spark, broker, client, tmp_path) -> None:
    ctx = Ctx(spark, broker, client, tmp_path)
    if isinstance(case.expect, int):
        assert case.run(ctx) == case.expect
        return
    with pytest.raises(Exception) as err:  # noqa: PT011 (Spark wraps our errors: the message is the contract)
        case.run(ctx)
    message = str(err.value)
    assert re.search(case.expect, message, re.S), f"{case.entry}: {message[:2000]}"
    assert "AssertionError" not in message, message[:2000]
