"""Reader options (documented in docs/options.md, "Reading"), parsed once into a frozen dataclass.

Keys are case-insensitive; unknown keys and invalid values raise :class:`OptionError`
naming the option, the value and what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from ..client import Credentials
from ..codec.schema import ARROW_SCHEMA, RETRY_FIELDS
from ..errors import OptionError
from ..names import retry_topic
from ..namespaces import wrap
from ..offsets import Offsets, OffsetsFormatError
from ..options import (
    CREDENTIAL_OPTIONS,
    TLS_OPTIONS,
    TRACE_OPTIONS,
    byte_size,
    canonical_options,
    credentials,
    duration_ms,
    endpoint_list,
    group_name,
    namespace,
    namesrv_list,
    non_negative_int,
    parse_bool,
    positive_int,
    tls_config,
    topic_name,
    trace_topic,
)
from ..tls import TlsConfig
from .patterns import matching_topics

__all__ = ["ReaderOptions", "asked_columns"]

_NAMES = (
    "namesrvAddr", "endpoints", "topic", "subscribePattern", "consumerGroup", "subExpression", "subExpressionType",
    "startingOffsets",
    "startingTimestamp", "consumeFromWhere", "endingOffsets", "maxMessagesPerTrigger", "commitOffsets",
    "failOnDataLoss", "minPartitions", "minMessagesPerPartition", "pullBatchSize", "allowSharedGroup",
    "brokerDownTimeoutMs", "onOffsetReset", "includeRetryTopic", "filterPushdown", "endingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingOffsetsByTimestamp",
    "minMessagesPerTrigger", "maxTriggerDelay", "maxRecordsPerPartition", "maxBytesPerTrigger",
    *CREDENTIAL_OPTIONS, *TLS_OPTIONS, *TRACE_OPTIONS,
    "namespace",
)
#: minMessagesPerPartition's default: about what a Python task reads in the time Spark takes to
#: start one, so packing never leaves a core idle that a task of its own would have used well
MIN_MESSAGES_PER_PARTITION = 10_000
#: maxTriggerDelay's default (Kafka's): how long a batch waits for minMessagesPerTrigger messages
MAX_TRIGGER_DELAY = "15m"
#: values of onOffsetReset: a reset of the group's offsets while the query runs is followed by
#: its next batch, stops it, or is overwritten by its next commit
ON_OFFSET_RESET = ("follow", "fail", "ignore")
#: Spark passes these for file-like sources; harmless here.
_HIDDEN = ("path",)


def _timestamp(name: str, raw: str) -> int:
    """Epoch millis or ISO-8601 (naive means UTC) -> epoch millis."""
    v = raw.strip()
    digits = v.removeprefix("-")
    if digits.isascii() and digits.isdigit():
        return int(v)
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(name, raw, "accepted: epoch milliseconds or an ISO-8601 date-time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


class _Reads:
    """The topics a query reads, to check the topics of startingOffsets/endingOffsets against:
    those named, or those a subscribePattern matches (by the name a user knows)."""

    def __init__(self, topics: tuple[str, ...], pattern: str | None, ns: str) -> None:
        self.topics, self.pattern, self.ns = topics, pattern, ns

    def __contains__(self, topic: object) -> bool:
        if topic in self.topics:
            return True
        return (self.pattern is not None and isinstance(topic, str)
                and bool(matching_topics(self.pattern, [topic], self.ns)))

    def describe(self) -> str:
        named = f"topics of the option topic {list(self.topics)}"
        return f"topics the option subscribePattern {self.pattern!r} matches" if self.pattern else named


def _offsets_json(name: str, raw: str, topics: _Reads, keywords: str, ns: str = "") -> Offsets:
    """The offsets of option ``name``; its topics are the user's names (or already wrapped in
    namespace ``ns``), the result's are the wire names of ``topics``."""
    shape = 'JSON like {"topic":{"broker-a:0":42}} (-2 = earliest, -1 = latest)'
    try:
        offsets = Offsets.from_json(raw, special=True)
    except OffsetsFormatError as exc:
        if exc.queue_key is None:
            raise OptionError(name, raw, f"accepted: {keywords} or {shape}") from None
        raise OptionError(name, raw, f"{exc}; accepted: {shape}") from None
    return _of_topics_read(name, raw, offsets, topics, ns)


def _of_topics_read(name: str, raw: str, given: Offsets, topics: _Reads, ns: str) -> Offsets:
    """``given`` (per queue, by the user's topic names) with the wire names of namespace ``ns``;
    an OptionError for a topic the query does not read."""
    if ns:
        given = Offsets((replace(mq, topic=wrap(ns, mq.topic)), v) for mq, v in given.items())
    for topic in given.topics:
        if topic not in topics:
            raise OptionError(name, raw, f"topic {topic!r} is not read; accepted: {topics.describe()}")
    return given


@dataclass(frozen=True)
class ReaderOptions:
    namesrv_addr: tuple[str, ...]
    endpoints: str | None
    #: the topics named (option topic; with includeRetryTopic the group's retry topic too); with
    #: subscribePattern, the topics it matches are read besides (see .patterns)
    topics: tuple[str, ...]
    consumer_group: str | None
    sub_expression: str
    starting: str  # group | earliest | latest | json
    starting_json: Offsets | None
    starting_timestamp: int | None
    consume_from_where: str  # earliest | latest
    ending: str  # latest | json
    ending_json: Offsets | None
    max_messages_per_trigger: int | None
    commit_offsets: bool
    fail_on_data_loss: bool
    min_partitions: int | None
    pull_batch_size: int
    allow_shared_group: bool
    #: How long (ms) a broker's queues may stay unreachable or out of the routes while the
    #: other queues are read on; then the query fails naming the broker.
    broker_down_timeout_ms: int
    #: ACL access key / secret key (options accessKey, secretKey, securityToken); the repr masks the secret.
    credentials: Credentials | None = None
    #: what a running query does when its group's offsets are reset: follow | fail | ignore
    on_offset_reset: str = "follow"
    #: the group's retry topic is read too (the last of ``topics``), and rows carry retryTopic
    #: and reconsumeTimes (option includeRetryTopic)
    include_retry_topic: bool = False
    #: the row columns a user-given schema asks for, in its order (None: the whole schema)
    columns: tuple[str, ...] | None = None
    #: batch reads take the filters Spark pushes down to read less (filterPushdown; Spark needs
    #: spark.sql.python.filterPushdown.enabled=true for a reader that does)
    filter_pushdown: bool = False
    #: batch reads: each queue up to its first message stored at or after this (epoch ms)
    ending_timestamp: int | None = None
    #: TLS of every connection (options tls, tlsCaFile, tlsCertFile, tlsKeyFile, tlsVerifyHostname)
    tls: TlsConfig | None = None
    #: the namespace (option namespace; "" for none): ``topics`` and ``consumer_group`` are the
    #: names as they travel, wrapped in it (see rocketmq_spark.namespaces); rows name the user's
    namespace: str = ""
    #: a batch's queue ranges are packed into partitions of about this many messages (fewer
    #: tasks for small batches, see .packing); 0: one partition per queue
    min_messages_per_partition: int = MIN_MESSAGES_PER_PARTITION
    #: streams: a batch waits for this many new messages (None: never waits), but no longer than
    #: ``max_trigger_delay_ms`` (see .pacing)
    min_messages_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    #: a queue range of more messages is split into partitions of at most this many (None: not split)
    max_records_per_partition: int | None = None
    #: streams: at most this many bytes of stored messages per batch (one message at least; None: no cap)
    max_bytes_per_trigger: int | None = None
    #: a regular expression: the topics of the name servers' list it matches are read, looked up
    #: at every trigger (option subscribePattern; None: just ``topics``)
    topic_pattern: str | None = None
    #: how sub_expression filters: TAG (tags) or SQL92 (message properties, filtered by the broker)
    sub_type: str = "TAG"
    #: each named queue starts at its first message stored at or after its time (epoch ms;
    #: option startingOffsetsByTimestamp; startingTimestamp wins over it)
    starting_by_timestamp: Offsets | None = None
    #: a queue of starting_by_timestamp with no message at or after its time: "error" or "latest"
    starting_by_timestamp_strategy: str = "error"
    #: batch reads: each named queue up to its first message stored at or after its time
    #: (option endingOffsetsByTimestamp; endingTimestamp wins over it)
    ending_by_timestamp: Offsets | None = None
    #: read tasks send trace records (SubBefore, SubAfter) of what they read to this topic (as
    #: it travels; options traceEnabled, traceTopic); None: no tracing
    trace_topic: str | None = None

    @property
    def subscriptions(self) -> dict[str, str]:
        """topic -> tag expression of the named topics, as consumers tell brokers what they read."""
        return {t: self.sub_expression for t in self.topics}

    @classmethod
    def parse(cls, options: Mapping[str, str], *, stream: bool) -> ReaderOptions:
        opts = canonical_options(options, _NAMES, hidden=_HIDDEN)
        _check_read_kind(opts, stream)
        namesrv, endpoints = _transport(opts)
        ns = namespace(opts.get("namespace"))
        topics, group, include_retry = _topics_and_group(opts, endpoints, ns)
        pattern = _pattern(opts, endpoints)
        read = _Reads(topics, pattern, ns)
        starting, starting_json = _starting(opts, read, group, stream, ns)
        ending, ending_json = _ending(opts, read, stream, ns)
        cfw = opts.get("consumeFromWhere", "latest" if stream else "earliest").strip().lower()
        if cfw not in ("earliest", "latest"):
            raise OptionError("consumeFromWhere", opts["consumeFromWhere"], "accepted: earliest or latest")
        on_reset = opts.get("onOffsetReset", "follow").strip().lower()
        if on_reset not in ON_OFFSET_RESET:
            raise OptionError("onOffsetReset", opts["onOffsetReset"], f"accepted: {', '.join(ON_OFFSET_RESET)}")
        ts = opts.get("startingTimestamp")
        ending_ts = opts.get("endingTimestamp")
        max_per = opts.get("maxMessagesPerTrigger")
        min_parts = opts.get("minPartitions")
        per_part = opts.get("minMessagesPerPartition", str(MIN_MESSAGES_PER_PARTITION))
        min_per, delay = _pacing(opts, stream)
        max_records = opts.get("maxRecordsPerPartition")
        max_bytes = _max_bytes(opts, stream, endpoints)
        sub_type = _sub_type(opts, endpoints)
        start_ts_json = opts.get("startingOffsetsByTimestamp")
        end_ts_json = opts.get("endingOffsetsByTimestamp")
        strategy = opts.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise OptionError("startingOffsetsByTimestampStrategy", opts["startingOffsetsByTimestampStrategy"],
                              "accepted: error (a queue with no message at or after its time fails the query) or "
                              "latest (it starts at its latest offset)")
        return cls(
            namesrv_addr=namesrv,
            endpoints=endpoints,
            topics=topics,
            consumer_group=group,
            sub_expression=opts.get("subExpression", "*").strip() or "*",
            starting=starting,
            starting_json=starting_json,
            starting_timestamp=_timestamp("startingTimestamp", ts) if ts else None,
            consume_from_where=cfw,
            ending=ending,
            ending_json=ending_json,
            max_messages_per_trigger=positive_int("maxMessagesPerTrigger", max_per) if max_per else None,
            commit_offsets=parse_bool("commitOffsets", opts.get("commitOffsets", "true")),
            fail_on_data_loss=parse_bool("failOnDataLoss", opts.get("failOnDataLoss", "true")),
            min_partitions=positive_int("minPartitions", min_parts) if min_parts else None,
            pull_batch_size=positive_int("pullBatchSize", opts.get("pullBatchSize", "1024")),
            allow_shared_group=parse_bool("allowSharedGroup", opts.get("allowSharedGroup", "false")),
            broker_down_timeout_ms=positive_int("brokerDownTimeoutMs", opts.get("brokerDownTimeoutMs", "30000")),
            credentials=credentials(opts),
            on_offset_reset=on_reset,
            include_retry_topic=include_retry,
            filter_pushdown=parse_bool("filterPushdown", opts.get("filterPushdown", "false")),
            ending_timestamp=_timestamp("endingTimestamp", ending_ts) if ending_ts else None,
            tls=tls_config(opts),
            namespace=ns,
            min_messages_per_partition=non_negative_int("minMessagesPerPartition", per_part),
            min_messages_per_trigger=min_per,
            max_trigger_delay_ms=delay,
            max_records_per_partition=positive_int("maxRecordsPerPartition", max_records) if max_records else None,
            max_bytes_per_trigger=max_bytes,
            topic_pattern=pattern,
            sub_type=sub_type,
            starting_by_timestamp=(_timestamps_json("startingOffsetsByTimestamp", start_ts_json, read, ns)
                                   if start_ts_json is not None else None),
            starting_by_timestamp_strategy=strategy,
            ending_by_timestamp=(_timestamps_json("endingOffsetsByTimestamp", end_ts_json, read, ns)
                                 if end_ts_json is not None else None),
            trace_topic=trace_topic(opts, endpoints, ns),
        )


#: options that only a stream (spark.readStream) or only a batch read (spark.read) takes
_STREAM_ONLY = ("minMessagesPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger")
_BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


def _check_read_kind(opts: Mapping[str, str], stream: bool) -> None:
    """OptionError for an option the other kind of read takes."""
    for name in _BATCH_ONLY if stream else _STREAM_ONLY:
        if name in opts:
            raise OptionError(name, opts[name], "accepted only by batch reads (spark.read); a stream ends with its "
                              "trigger" if stream else "accepted only by streaming reads (spark.readStream): a batch "
                              "read reads what is there")


def _pacing(opts: Mapping[str, str], stream: bool) -> tuple[int | None, int]:
    """(minMessagesPerTrigger or None, maxTriggerDelay in ms): streams only; the delay bounds the
    minimum's wait, so it is given with it."""
    min_raw, delay_raw = opts.get("minMessagesPerTrigger"), opts.get("maxTriggerDelay")
    if delay_raw is not None and min_raw is None:
        raise OptionError("maxTriggerDelay", delay_raw, "bounds how long a batch waits for minMessagesPerTrigger "
                          "messages: give minMessagesPerTrigger too")
    min_per = positive_int("minMessagesPerTrigger", min_raw) if min_raw is not None else None
    return min_per, duration_ms("maxTriggerDelay", delay_raw if delay_raw is not None else MAX_TRIGGER_DELAY)


def _max_bytes(opts: Mapping[str, str], stream: bool, endpoints: str | None) -> int | None:
    """maxBytesPerTrigger in bytes: streams over remoting (the sizes come from the brokers'
    consume queues, which the 5.x gRPC protocol does not serve)."""
    raw = opts.get("maxBytesPerTrigger")
    if raw is None:
        return None
    if endpoints:
        raise OptionError("maxBytesPerTrigger", raw, "the message sizes come from the brokers' consume queues, which "
                          "the gRPC protocol (endpoints) does not serve: use namesrvAddr")
    return byte_size("maxBytesPerTrigger", raw)


def _sub_type(opts: Mapping[str, str], endpoints: str | None) -> str:
    """subExpressionType: TAG, or SQL92 with subExpression a property filter (checked here: an
    Apache RocketMQ broker given one it cannot compile filters nothing, silently)."""
    raw = opts.get("subExpressionType", "TAG")
    kind = raw.strip().upper()
    if kind not in ("TAG", "SQL92"):
        raise OptionError("subExpressionType", raw, "accepted: TAG (subExpression names tags) or SQL92 "
                          "(subExpression filters by message properties, e.g. a > 5 AND region IN ('eu','us'))")
    if kind == "SQL92":
        expr = opts.get("subExpression", "").strip()
        if not expr or expr == "*":
            raise OptionError("subExpression", opts.get("subExpression"), "with subExpressionType=SQL92: an SQL92 "
                              "expression over message properties, e.g. a > 5 AND region IN ('eu','us')")
        if endpoints:
            raise OptionError("subExpressionType", raw, "SQL92 reads need namesrvAddr: released gRPC proxies do not "
                              "serve pulls")
        from ..codec.sql92 import Sql92Error, compile_sql92  # only SQL92 reads need the parser

        try:
            tail = compile_sql92(expr).ignored_tail
        except Sql92Error as exc:
            raise OptionError("subExpression", opts["subExpression"], f"not an SQL92 filter RocketMQ accepts: {exc}; "
                              "accepted: comparisons (=, <>, <, <=, >, >=), BETWEEN, IN, IS NULL, AND, OR, NOT "
                              "over property names, 'strings' and numbers") from None
        if tail:
            raise OptionError("subExpression", opts["subExpression"], f"RocketMQ's parser stops before {tail!r} and "
                              "ignores the rest (a broker would filter by what comes before it alone); accepted: one "
                              "expression: comparisons (=, <>, <, <=, >, >=), BETWEEN, IN, IS NULL, AND, OR, NOT")
    return kind


def _pattern(opts: Mapping[str, str], endpoints: str | None) -> str | None:
    """subscribePattern: a regular expression (Python's re, matched against whole topic names);
    remoting only (the topic list comes from the name servers)."""
    raw = opts.get("subscribePattern")
    if raw is None:
        return None
    if endpoints:
        raise OptionError("subscribePattern", raw, "the topic list comes from the name servers, which the gRPC "
                          "protocol (endpoints) does not reach: use namesrvAddr")
    if not raw.strip():
        raise OptionError("subscribePattern", raw, "accepted: a regular expression matched against whole topic "
                          "names, e.g. orders-.*")
    try:
        re.compile(raw)
    except re.error as exc:
        raise OptionError("subscribePattern", raw, f"not a regular expression ({exc}); accepted: a regular "
                          "expression matched against whole topic names, e.g. orders-.*") from None
    return raw


def _transport(opts: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """(name servers, gRPC endpoints): exactly one of namesrvAddr and endpoints."""
    ns = opts.get("namesrvAddr")
    endpoints = opts.get("endpoints")
    if not ns and not endpoints:
        raise OptionError("namesrvAddr", None, "required (name server list host:port;host:port) "
                          "unless endpoints is given")
    namesrv = namesrv_list(ns) if ns else ()
    if endpoints:
        if ns:
            raise OptionError("endpoints", endpoints, "give either namesrvAddr (remoting) or endpoints (gRPC), "
                              "not both")
        endpoints = ";".join(endpoint_list(endpoints))
    return namesrv, endpoints


def _topics_and_group(opts: Mapping[str, str], endpoints: str | None, ns: str = ""
                      ) -> tuple[tuple[str, ...], str | None, bool]:
    """(topics, consumer group, includeRetryTopic): the topics with the group's retry topic when
    includeRetryTopic asks for it; names as they travel (wrapped in namespace ``ns``)."""
    topic_raw = opts.get("topic", "")
    topics = tuple(topic_name("topic", topic_raw, t.strip(), ns) for t in topic_raw.split(",") if t.strip())
    pattern = opts.get("subscribePattern")
    if pattern is not None and "topic" in opts:
        raise OptionError("subscribePattern", pattern, "give either topic (named topics) or subscribePattern (the "
                          "topics a regular expression matches), not both")
    if not topics and pattern is None:
        raise OptionError("topic", topic_raw or None, "required: one topic or a comma-separated list (or the option "
                          "subscribePattern)")
    group_raw = opts.get("consumerGroup")
    group = group_raw if group_raw and group_raw.strip() else None  # blank counts as not given
    if group is not None:
        group = group_name("consumerGroup", group, ns)
    include_retry = parse_bool("includeRetryTopic", opts.get("includeRetryTopic", "false"))
    if include_retry:
        if not group:
            raise OptionError("includeRetryTopic", opts["includeRetryTopic"], "reads the consumer group's retry "
                              "topic: needs the option consumerGroup")
        if endpoints:
            raise OptionError("includeRetryTopic", opts["includeRetryTopic"], "its columns come from the "
                              "records' bytes, which the gRPC protocol does not carry: use namesrvAddr")
        if retry_topic(group) not in topics:
            topics = (*topics, retry_topic(group))
    return topics, group, include_retry


def _timestamps_json(name: str, raw: str, topics: _Reads, ns: str = "") -> Offsets:
    """A JSON of epoch-millisecond times per queue (startingOffsetsByTimestamp and
    endingOffsetsByTimestamp): the shape of startingOffsets, a time instead of an offset."""
    shape = 'JSON like {"topic":{"broker-a:0":1767225600000}}: epoch milliseconds (0 or more) per queue'
    try:
        times = Offsets.from_json(raw)
    except OffsetsFormatError as exc:
        detail = str(exc).replace("offset ", "time ", 1) if exc.queue_key else ""
        raise OptionError(name, raw, f"{detail + '; ' if detail else ''}accepted: {shape}") from None
    return _of_topics_read(name, raw, times, topics, ns)


def _starting(opts: Mapping[str, str], topics: _Reads, group: str | None, stream: bool, ns: str = ""
              ) -> tuple[str, Offsets | None]:
    """(startingOffsets: group, earliest, latest or json; the offsets when json). A stream needs
    a consumerGroup (its offsets are kept for it), and so does startingOffsets=group."""
    starting_raw = opts.get("startingOffsets", "group" if group else "earliest")
    low = starting_raw.strip().lower()
    starting_json = None
    if low in ("group", "earliest", "latest"):
        starting = low
    else:
        starting_json = _offsets_json("startingOffsets", starting_raw, topics, "group, earliest, latest", ns)
        starting = "json"
    if stream and not group:
        raise OptionError("consumerGroup", opts.get("consumerGroup") or None,
                          "required for streaming reads (offsets are kept for it on the broker)")
    if starting == "group" and not group:
        raise OptionError("startingOffsets", starting_raw, "group needs the option consumerGroup")
    return starting, starting_json


def _ending(opts: Mapping[str, str], topics: _Reads, stream: bool, ns: str = ""
            ) -> tuple[str, Offsets | None]:
    """(endingOffsets: latest or json; the offsets when json): batch reads only."""
    ending_raw = opts.get("endingOffsets", "latest")
    if ending_raw.strip().lower() == "latest":
        return "latest", None
    return "json", _offsets_json("endingOffsets", ending_raw, topics, "latest", ns)


def asked_columns(asked: StructType, retry_columns: bool = False) -> tuple[str, ...] | None:
    """The columns a user-given schema (``.schema(...)``) asks for: any of the row schema's
    fields (with ``retry_columns``, retryTopic and reconsumeTimes too), in any order, each with
    its type; None when it is the whole schema in its order. OptionError naming the field and
    the accepted ones otherwise."""
    full = {f.name: f.dataType for f in (_RETRY_ROW if retry_columns else _ROW).fields}
    names = tuple(f.name for f in asked.fields)
    for f in asked.fields:
        want = full.get(f.name)
        if want is None:
            raise OptionError("schema", f.name, f"unknown field; accepted: any of {', '.join(full)} (each once, "
                              "with the type the full schema gives it)")
        if f.dataType != want:
            got = f.dataType.simpleString()
            raise OptionError("schema", f"{f.name} {got}", f"field {f.name} has type {want.simpleString().upper()}")
    if len(set(names)) != len(names):
        raise OptionError("schema", ", ".join(names), "each field at most once")
    if not names:
        raise OptionError("schema", "", f"at least one field of {', '.join(full)}")
    return None if names == tuple(full) else names


#: the row schema as Spark types, from the decoder's Arrow schema (with and without the retry columns)
_ROW = from_arrow_schema(ARROW_SCHEMA)
_RETRY_ROW = from_arrow_schema(pa.schema([*ARROW_SCHEMA, *RETRY_FIELDS]))
