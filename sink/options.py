"""Writer options and input columns (documented in docs/options.md, "Writing"), checked before
anything is sent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from ..client import BrokerClient, Credentials, connect
from ..errors import OptionError
from ..options import (
    CREDENTIAL_OPTIONS,
    TLS_OPTIONS,
    TRACE_OPTIONS,
    canonical_options,
    credentials,
    endpoint_list,
    group_name,
    namespace,
    namesrv_list,
    parse_bool,
    positive_int,
    tls_config,
    topic_name,
    trace_topic,
)
from ..tls import TlsConfig

__all__ = ["WriterOptions", "check_columns"]

_NAMES = ("namesrvAddr", "endpoints", "topic", "producerGroup", "delivery", "maxBatchMessages", "maxBatchBytes",
          "maxMessageSize", "compressThreshold", "consumerGroup", "maxReconsumeTimes", "errorColumn",
          "failOnDataLoss", *CREDENTIAL_OPTIONS, *TLS_OPTIONS, *TRACE_OPTIONS,
          "namespace")
_DELIVERIES = ("at-least-once", "exactly-once", "send-back")
#: Set by Spark for streaming writes (the exactly-once record lives under it), and for file-like sinks.
_HIDDEN = ("checkpointLocation", "path")


@dataclass(frozen=True)
class WriterOptions:
    namesrv_addr: tuple[str, ...]
    endpoints: str | None
    topic: str | None
    producer_group: str
    exactly_once: bool
    max_batch_messages: int
    max_batch_bytes: int
    max_message_size: int
    compress_threshold: int
    checkpoint_location: str | None
    #: ACL access key / secret key (options accessKey, secretKey, securityToken); the repr masks the secret.
    credentials: Credentials | None = None
    #: delivery=send-back: rows as read are given back to this consumer group (its retry topic)
    send_back_group: str | None = None
    #: send-back: reconsume times after which a message goes to the group's dead-letter topic
    max_reconsume_times: int = 16
    #: send-back: a STRING column whose value (why the row failed) the message carries as a property
    error_column: str = "error"
    #: exactly-once: a replay that cannot write again rows whose half messages a broker lost
    #: (the source lost them too, or the query is not deterministic) fails the query (True), or
    #: ends the batch without them, logged (False)
    fail_on_data_loss: bool = True
    #: TLS of every connection (options tls, tlsCaFile, tlsCertFile, tlsKeyFile, tlsVerifyHostname)
    tls: TlsConfig | None = None
    #: the namespace (option namespace; "" for none): ``topic``, ``producer_group`` and
    #: ``send_back_group`` are the names as they travel, wrapped in it; a row's topic column
    #: names the user's topic, wrapped before it is sent (see rocketmq_spark.namespaces)
    namespace: str = ""
    #: tasks send a Pub trace record of each message they send to this topic (as it travels;
    #: options traceEnabled, traceTopic); None: no tracing
    trace_topic: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriterOptions:
        opts = canonical_options(options, _NAMES, hidden=_HIDDEN)
        ns = opts.get("namesrvAddr")
        endpoints = opts.get("endpoints")
        if ns and endpoints:
            raise OptionError("endpoints", endpoints,
                              "give either namesrvAddr (remoting) or endpoints (gRPC), not both")
        if not ns and not endpoints:
            raise OptionError("namesrvAddr", None, "required (name server list host:port;host:port) unless "
                              "endpoints (gRPC host:port) is given")
        namesrv = namesrv_list(ns) if ns else ()
        space = namespace(opts.get("namespace"))
        delivery = opts.get("delivery", "at-least-once").strip().lower()
        if delivery not in _DELIVERIES:
            raise OptionError("delivery", opts["delivery"], f"accepted: {', '.join(_DELIVERIES)}")
        group = (opts.get("consumerGroup") or "").strip() or None
        if delivery == "send-back":
            if group is None:
                raise OptionError("consumerGroup", None, "delivery=send-back gives rows back to a consumer group: "
                                  "required (the group that read them)")
            group = group_name("consumerGroup", group, space)
            if endpoints:
                raise OptionError("endpoints", endpoints, "delivery=send-back gives messages back with "
                                  "CONSUMER_SEND_MSG_BACK, which only the remoting protocol has: use namesrvAddr")
        elif group is not None or "maxReconsumeTimes" in opts:
            key = "consumerGroup" if group is not None else "maxReconsumeTimes"
            raise OptionError(key, opts[key], "only delivery=send-back takes it")
        most = opts.get("maxReconsumeTimes", "16").strip()
        if not most.isdigit() or int(most) > 10_000:
            raise OptionError("maxReconsumeTimes", opts["maxReconsumeTimes"],
                              "accepted: a whole number 0..10000 (default 16, as RocketMQ's consumers)")
        if "failOnDataLoss" in opts and delivery != "exactly-once":
            raise OptionError("failOnDataLoss", opts["failOnDataLoss"], "only delivery=exactly-once takes it (what a "
                              "replay does with rows a broker lost before their commit)")
        fail_on_data_loss = parse_bool("failOnDataLoss", opts.get("failOnDataLoss", "true"))
        producer_group = opts.get("producerGroup", "rocketmq-spark-producer")
        if not producer_group.strip():
            raise OptionError("producerGroup", producer_group, "accepted: a non-empty producer group name "
                              "(default rocketmq-spark-producer)")
        producer_group = group_name("producerGroup", producer_group, space)
        topic_raw = (opts.get("topic") or "").strip()
        return cls(
            namesrv_addr=namesrv,
            endpoints=";".join(endpoint_list(endpoints)) if endpoints else None,
            # blank counts as not given
            topic=topic_name("topic", opts["topic"], topic_raw, space) if topic_raw else None,
            producer_group=producer_group,
            exactly_once=delivery == "exactly-once",
            max_batch_messages=positive_int("maxBatchMessages", opts.get("maxBatchMessages", "512")),
            max_batch_bytes=positive_int("maxBatchBytes", opts.get("maxBatchBytes", str(1024 * 1024))),
            max_message_size=positive_int("maxMessageSize", opts.get("maxMessageSize", str(4 * 1024 * 1024))),
            compress_threshold=positive_int("compressThreshold", opts.get("compressThreshold", "4096")),
            checkpoint_location=_local_checkpoint(opts.get("checkpointLocation"), delivery == "exactly-once"),
            credentials=credentials(opts),
            send_back_group=group if delivery == "send-back" else None,
            max_reconsume_times=int(most),
            error_column=(opts.get("errorColumn") or "error").strip() or "error",
            fail_on_data_loss=fail_on_data_loss,
            tls=tls_config(opts),
            namespace=space,
            trace_topic=trace_topic(opts, endpoints, space),
        )

    def connect(self, *, endpoints: bool = True) -> BrokerClient:
        """A client of the writer's brokers: its credentials, TLS and namespace; over gRPC when
        the options give ``endpoints`` (unless ``endpoints=False``: a remoting-only call)."""
        return connect(self.namesrv_addr, self.endpoints if endpoints else None, credentials=self.credentials,
                       tls=self.tls, namespace=self.namespace)

    @property
    def send_back(self) -> bool:
        return self.send_back_group is not None


def _local_checkpoint(location: str | None, exactly_once: bool) -> str | None:
    """exactly-once keeps its record of each batch's transactions under checkpointLocation with
    plain file I/O on the driver: a URI of another file system (hdfs:, s3a:, ...) would become a
    relative local directory and the record would not follow the query to another driver."""
    if location and exactly_once:
        scheme, sep, _ = location.partition("://")
        if sep and scheme.lower() != "file" and scheme.isalnum():
            raise OptionError("checkpointLocation", location,
                              "delivery=exactly-once keeps its transaction record there with local file I/O: "
                              "accepted: a local or mounted path, or a file: URI")
    return location


_ACCEPTED: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "body": ((BinaryType, StringType), "BINARY or STRING"),
    "topic": ((StringType,), "STRING"),
    "tag": ((StringType,), "STRING"),
    "keys": ((ArrayType, StringType), "ARRAY<STRING> or STRING"),
    "properties": ((MapType,), "MAP<STRING,STRING>"),
    "messageGroup": ((StringType,), "STRING"),
    "deliveryTimestamp": ((TimestampType, TimestampNTZType), "TIMESTAMP"),
}


#: what delivery=send-back needs of each row: where the reader found it
_SEND_BACK_COLUMNS: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "topic": ((StringType,), "STRING"),
    "broker": ((StringType,), "STRING"),
    "queueId": ((IntegerType, LongType), "INT"),
    "queueOffset": ((LongType, IntegerType), "BIGINT"),
}


def check_columns(schema: StructType, options: WriterOptions) -> list[str]:
    """The message columns present; raises naming the column and the accepted types."""
    fields = {f.name: f.dataType for f in schema.fields}
    if options.send_back:
        for name, (types, text) in _SEND_BACK_COLUMNS.items():
            if name not in fields:
                raise OptionError(f"column {name}", None, "delivery=send-back gives rows back as the reader read "
                                  f"them: required, {text} (columns topic, broker, queueId, queueOffset)")
            if not isinstance(fields[name], types):
                raise OptionError(f"column {name}", fields[name].simpleString(), f"accepted type: {text}")
        err = fields.get(options.error_column)
        if err is not None and not isinstance(err, StringType):
            raise OptionError(f"column {options.error_column}", err.simpleString(), "accepted type: STRING")
        return list(_SEND_BACK_COLUMNS) + ([options.error_column] if err is not None else [])
    if "body" not in fields:
        raise OptionError("column body", None, "required: a BINARY or STRING column named body")
    used = []
    for name, dtype in fields.items():
        spec = _ACCEPTED.get(name)
        if spec is None:
            continue  # other columns are not sent
        types, text = spec
        ok = isinstance(dtype, types)
        if ok and isinstance(dtype, ArrayType):
            ok = isinstance(dtype.elementType, StringType)
        if ok and isinstance(dtype, MapType):
            ok = isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType)
        if not ok:
            raise OptionError(f"column {name}", dtype.simpleString(), f"accepted type: {text}")
        used.append(name)
    if "topic" not in fields and not options.topic:
        raise OptionError("topic", None, "required: the option topic or a STRING column named topic")
    return used
