"""Every invalid reader/writer option (and writer column) fails with an error that names the
option, the value given and what is accepted (the options are documented in docs/options.md,
the errors in rocketmq_spark/errors.py).

Pure unit tests: no Spark session, no broker, no sockets. The option tables are checked
against the parsers' own lists of known names, so a new option without an invalid-value
case here makes ``test_every_*_option_has_an_invalid_case`` fail.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from rocketmq_spark.errors import OptionError, RocketMQSparkError
from rocketmq_spark.sink import options as sink_options
from rocketmq_spark.sink.options import WriterOptions, check_columns
from rocketmq_spark.source import options as source_options
from rocketmq_spark.source.options import ReaderOptions

NS = "127.0.0.1:9876"
READER_BASE = {"namesrvAddr": NS, "topic": "t", "consumerGroup": "g"}
WRITER_BASE = {"namesrvAddr": NS, "topic": "t"}
AK = "AK-visible-access-key"
SK = "SK-must-never-leak-4f1c"
TOKEN = "TOKEN-must-never-leak-9b2e"

#: Remove the key from the base options.
DROP = object()


def _with(base: Mapping[str, str], overrides: Mapping[str, object]) -> dict[str, str]:
    out = dict(base)
    for key, value in overrides.items():
        if value is DROP:
            out.pop(key, None)
        else:
            assert isinstance(value, str)
            out[key] = value
    return out


def _assert_names(exc: OptionError, option: str, value: object, accepted: str) -> None:
    """The error is the project's, and its message names option, value and what is accepted."""
    msg = str(exc)
    assert isinstance(exc, RocketMQSparkError) and isinstance(exc, ValueError)
    assert exc.option == option, msg
    assert exc.value == value, msg
    assert option in msg, msg
    assert repr(value) in msg, msg
    assert accepted in msg, msg


#: a file that exists (the TLS options check only that a path names one)
HERE = __file__
MISSING_PEM = "/nonexistent/ca.pem"
#: the TLS options, the same for the reader and the writer (rocketmq_spark.options.tls_config):
#: (option the error names, overrides, value the error shows, word of what is accepted)
TLS_CASES: list[tuple[str, dict[str, object], object, str]] = [
    ("tls", {"tls": "maybe"}, "maybe", "true or false"),
    ("tlsCaFile", {"tls": "true", "tlsCaFile": MISSING_PEM}, MISSING_PEM, "no such file"),
    ("tlsCaFile", {"tls": "true", "tlsCaFile": " "}, " ", "the path of a PEM file of CA certificates"),
    ("tlsCaFile", {"tlsCaFile": HERE}, HERE, "accepted only with tls=true"),
    ("tlsCertFile", {"tls": "true", "tlsKeyFile": HERE}, None, "must be given together"),
    ("tlsCertFile", {"tls": "true", "tlsCertFile": MISSING_PEM, "tlsKeyFile": HERE}, MISSING_PEM, "no such file"),
    ("tlsKeyFile", {"tls": "true", "tlsCertFile": HERE}, None, "must be given together"),
    ("tlsKeyFile", {"tls": "true", "tlsCertFile": HERE, "tlsKeyFile": MISSING_PEM}, MISSING_PEM, "no such file"),
    ("tlsVerifyHostname", {"tls": "true", "tlsVerifyHostname": "perhaps"}, "perhaps", "true or false"),
    ("tlsVerifyHostname", {"tlsVerifyHostname": "false"}, "false", "accepted only with tls=true"),
]


# -- reader ------------------------------------------------------------------------------

#: (option the error names, overrides of READER_BASE, stream?, value the error shows, word of
#: what is accepted). Missing options show the value None.
READER_CASES: list[tuple[str, dict[str, object], bool, object, str]] = [
    # namesrvAddr / endpoints
    ("namesrvAddr", {"namesrvAddr": DROP}, True, None, "required"),
    ("namesrvAddr", {"namesrvAddr": ""}, True, None, "required"),
    ("namesrvAddr", {"namesrvAddr": "nohostport"}, True, "nohostport", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:"}, True, "h:", "host:port"),
    ("namesrvAddr", {"namesrvAddr": ":9876"}, True, ":9876", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:port"}, True, "h:port", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:1;broken"}, True, "h:1;broken", "host:port"),
    ("namesrvAddr", {"namesrvAddr": ";"}, True, ";", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:0"}, True, "h:0", "1-65535"),
    ("namesrvAddr", {"namesrvAddr": "h:65536"}, True, "h:65536", "1-65535"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": "nohostport"}, True, "nohostport", "host:port"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": ";"}, True, ";", "host:port"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": "h:70000"}, True, "h:70000", "1-65535"),
    ("endpoints", {"endpoints": "h:8081"}, True, "h:8081", "either namesrvAddr"),
    # topic
    ("topic", {"topic": DROP}, True, None, "required"),
    ("topic", {"topic": ""}, True, None, "comma-separated"),
    ("topic", {"topic": " , "}, True, " , ", "comma-separated"),
    # namespace: RocketMQ's name characters but '%' (it separates the namespace from the name);
    # a topic that no longer fits once wrapped names its wire name
    ("namespace", {"namespace": "a%b"}, True, "a%b", "not '%'"),
    ("namespace", {"namespace": "rmq_sys_x"}, True, "rmq_sys_x", "rmq_sys_"),
    ("namespace", {"namespace": "n" * 65}, True, "n" * 65, "at most 64"),
    ("topic", {"namespace": "ns", "topic": "t" * 126}, True, "t" * 126, "'ns%t"),
    # consumerGroup: streams need one; blank is not a group
    ("consumerGroup", {"consumerGroup": DROP}, True, None, "required"),
    ("consumerGroup", {"consumerGroup": "  "}, True, "  ", "required"),
    # startingOffsets
    ("startingOffsets", {"startingOffsets": "sometime"}, True, "sometime", "earliest"),
    ("startingOffsets", {"startingOffsets": "{not json"}, True, "{not json", "JSON"),
    ("startingOffsets", {"startingOffsets": "[1, 2]"}, True, "[1, 2]", "JSON"),
    ("startingOffsets", {"startingOffsets": '{"other":{"broker-a:0":1}}'}, True,
     '{"other":{"broker-a:0":1}}', "topics of the option topic"),
    ("startingOffsets", {"startingOffsets": '{"t":[1]}'}, True, '{"t":[1]}', "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a":1}}'}, True, '{"t":{"broker-a":1}}', "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{":0":1}}'}, True, '{"t":{":0":1}}', "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a:x":1}}'}, True, '{"t":{"broker-a:x":1}}', "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a:0":-3}}'}, True, '{"t":{"broker-a:0":-3}}', "-2"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a:0":"42"}}'}, True, '{"t":{"broker-a:0":"42"}}',
     "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a:0":1.5}}'}, True, '{"t":{"broker-a:0":1.5}}',
     "broker-a:0"),
    ("startingOffsets", {"startingOffsets": '{"t":{"broker-a:0":true}}'}, True, '{"t":{"broker-a:0":true}}',
     "broker-a:0"),
    ("startingOffsets", {"consumerGroup": DROP, "startingOffsets": "group"}, False, "group", "consumerGroup"),
    # startingTimestamp
    ("startingTimestamp", {"startingTimestamp": "yesterday"}, True, "yesterday", "epoch milliseconds"),
    ("startingTimestamp", {"startingTimestamp": "2024-13-01"}, True, "2024-13-01", "ISO-8601"),
    ("startingTimestamp", {"startingTimestamp": "1.5e12"}, True, "1.5e12", "epoch milliseconds"),
    ("startingTimestamp", {"startingTimestamp": "--5"}, True, "--5", "epoch milliseconds"),
    ("startingTimestamp", {"startingTimestamp": " "}, True, " ", "epoch milliseconds"),
    # consumeFromWhere
    ("consumeFromWhere", {"consumeFromWhere": "middle"}, True, "middle", "earliest or latest"),
    ("consumeFromWhere", {"consumeFromWhere": "group"}, False, "group", "earliest or latest"),
    ("consumeFromWhere", {"consumeFromWhere": ""}, True, "", "earliest or latest"),
    # endingOffsets: batch only
    ("endingOffsets", {"endingOffsets": "latest"}, True, "latest", "only by batch reads"),
    ("endingOffsets", {"endingOffsets": "earliest"}, False, "earliest", "latest or JSON"),
    ("endingOffsets", {"endingOffsets": "{bad"}, False, "{bad", "latest or JSON"),
    ("endingOffsets", {"endingOffsets": '{"other":{"broker-a:0":5}}'}, False, '{"other":{"broker-a:0":5}}',
     "topics of the option topic"),
    ("endingOffsets", {"endingOffsets": '{"t":{"broker-a":5}}'}, False, '{"t":{"broker-a":5}}', "broker-a:0"),
    # positive integers
    ("maxMessagesPerTrigger", {"maxMessagesPerTrigger": "0"}, True, "0", "positive integer"),
    ("maxMessagesPerTrigger", {"maxMessagesPerTrigger": "-1"}, True, "-1", "positive integer"),
    ("maxMessagesPerTrigger", {"maxMessagesPerTrigger": "ten"}, True, "ten", "positive integer"),
    ("maxMessagesPerTrigger", {"maxMessagesPerTrigger": "1.5"}, True, "1.5", "positive integer"),
    ("minPartitions", {"minPartitions": "0"}, False, "0", "positive integer"),
    ("minPartitions", {"minPartitions": "-4"}, False, "-4", "positive integer"),
    ("minPartitions", {"minPartitions": "many"}, False, "many", "positive integer"),
    ("minMessagesPerPartition", {"minMessagesPerPartition": "-1"}, False, "-1", "0 or more"),
    ("minMessagesPerPartition", {"minMessagesPerPartition": "lots"}, True, "lots", "whole number"),
    ("maxRecordsPerPartition", {"maxRecordsPerPartition": "0"}, False, "0", "positive integer"),
    ("maxRecordsPerPartition", {"maxRecordsPerPartition": "1e5"}, True, "1e5", "positive integer"),
    # message trace
    ("traceEnabled", {"traceEnabled": "maybe"}, True, "maybe", "true or false"),
    ("traceTopic", {"traceTopic": "T"}, True, "T", "give traceEnabled=true too"),
    ("traceTopic", {"traceEnabled": "true", "traceTopic": "a b"}, False, "a b", "letters, digits"),
    # pacing: streams only; the delay with a minimum
    ("minMessagesPerTrigger", {"minMessagesPerTrigger": "0"}, True, "0", "positive integer"),
    ("minMessagesPerTrigger", {"minMessagesPerTrigger": "100"}, False, "100", "only by streaming reads"),
    ("maxTriggerDelay", {"maxTriggerDelay": "5s"}, True, "5s", "give minMessagesPerTrigger too"),
    ("maxTriggerDelay", {"minMessagesPerTrigger": "10", "maxTriggerDelay": "soon"}, True, "soon", "15m"),
    ("maxTriggerDelay", {"minMessagesPerTrigger": "10", "maxTriggerDelay": "5 weeks"}, True, "5 weeks", "ms, s, m"),
    ("maxTriggerDelay", {"minMessagesPerTrigger": "10", "maxTriggerDelay": "-5s"}, True, "-5s", "whole number"),
    ("maxTriggerDelay", {"minMessagesPerTrigger": "10", "maxTriggerDelay": "1.5s"}, True, "1.5s", "whole number"),
    ("maxTriggerDelay", {"maxTriggerDelay": "5s"}, False, "5s", "only by streaming reads"),
    ("subExpressionType", {"subExpressionType": "REGEX"}, True, "REGEX", "TAG (subExpression names tags) or SQL92"),
    ("subExpressionType", {"subExpressionType": "SQL92", "namesrvAddr": DROP, "endpoints": "127.0.0.1:8081",
                           "subExpression": "a > 1"}, True, "SQL92", "need namesrvAddr"),
    ("subExpression", {"subExpressionType": "SQL92"}, True, None, "an SQL92 expression over message properties"),
    ("subExpression", {"subExpressionType": "sql92", "subExpression": "a >"}, False, "a >",
     "not an SQL92 filter RocketMQ accepts"),
    ("subExpression", {"subExpressionType": "SQL92", "subExpression": "a LIKE 'x%'"}, True, "a LIKE 'x%'",
     "ignores the rest"),
    ("subscribePattern", {"topic": DROP, "subscribePattern": "orders-("}, True, "orders-(", "regular expression"),
    ("subscribePattern", {"subscribePattern": "orders-.*"}, False, "orders-.*", "not both"),
    ("startingOffsetsByTimestamp", {"startingOffsetsByTimestamp": "yesterday"}, True, "yesterday",
     "epoch milliseconds"),
    ("startingOffsetsByTimestamp", {"startingOffsetsByTimestamp": '{"t":{"broker-a:0":-1}}'}, True,
     '{"t":{"broker-a:0":-1}}', "time -1 of queue"),
    ("startingOffsetsByTimestamp", {"startingOffsetsByTimestamp": '{"u":{"broker-a:0":5}}'}, False,
     '{"u":{"broker-a:0":5}}', "topics of the option topic"),
    ("startingOffsetsByTimestampStrategy", {"startingOffsetsByTimestampStrategy": "skip"}, True, "skip",
     "error (a queue with no message"),
    ("endingOffsetsByTimestamp", {"endingOffsetsByTimestamp": '{"t":{"broker-a:0":5}}'}, True,
     '{"t":{"broker-a:0":5}}', "only by batch reads"),
    ("endingOffsetsByTimestamp", {"endingOffsetsByTimestamp": '{"t":{"b":5}}'}, False, '{"t":{"b":5}}',
     "broker:queueId"),
    ("maxBytesPerTrigger", {"maxBytesPerTrigger": "0"}, True, "0", "positive whole number of bytes"),
    ("maxBytesPerTrigger", {"maxBytesPerTrigger": "64 parsecs"}, True, "64 parsecs", "k, m or g"),
    ("maxBytesPerTrigger", {"maxBytesPerTrigger": "1.5m"}, True, "1.5m", "64m"),
    ("maxBytesPerTrigger", {"maxBytesPerTrigger": "64m"}, False, "64m", "only by streaming reads"),
    ("maxBytesPerTrigger", {"namesrvAddr": DROP, "endpoints": "127.0.0.1:8081", "maxBytesPerTrigger": "64m"}, True,
     "64m", "use namesrvAddr"),
    ("pullBatchSize", {"pullBatchSize": "0"}, True, "0", "positive integer"),
    ("pullBatchSize", {"pullBatchSize": "-3"}, True, "-3", "positive integer"),
    ("pullBatchSize", {"pullBatchSize": "big"}, True, "big", "positive integer"),
    ("pullBatchSize", {"pullBatchSize": ""}, True, "", "positive integer"),
    ("brokerDownTimeoutMs", {"brokerDownTimeoutMs": "0"}, True, "0", "positive integer"),
    ("brokerDownTimeoutMs", {"brokerDownTimeoutMs": "-1"}, True, "-1", "positive integer"),
    ("brokerDownTimeoutMs", {"brokerDownTimeoutMs": "30s"}, True, "30s", "positive integer"),
    # booleans
    ("commitOffsets", {"commitOffsets": "maybe"}, True, "maybe", "true or false"),
    ("commitOffsets", {"commitOffsets": ""}, True, "", "true or false"),
    ("commitOffsets", {"commitOffsets": "2"}, True, "2", "true or false"),
    ("failOnDataLoss", {"failOnDataLoss": "maybe"}, True, "maybe", "true or false"),
    ("failOnDataLoss", {"failOnDataLoss": "off"}, False, "off", "true or false"),
    ("allowSharedGroup", {"allowSharedGroup": "maybe"}, True, "maybe", "true or false"),
    ("allowSharedGroup", {"allowSharedGroup": "y"}, True, "y", "true or false"),
    ("onOffsetReset", {"onOffsetReset": "skip"}, True, "skip", "follow, fail, ignore"),
    ("onOffsetReset", {"onOffsetReset": ""}, True, "", "follow, fail, ignore"),
    ("includeRetryTopic", {"includeRetryTopic": "maybe"}, True, "maybe", "true or false"),
    ("filterPushdown", {"filterPushdown": "maybe"}, False, "maybe", "true or false"),
    ("endingTimestamp", {"endingTimestamp": "yesterday"}, False, "yesterday", "epoch milliseconds or an ISO-8601"),
    ("endingTimestamp", {"endingTimestamp": "1700000000000"}, True, "1700000000000", "only by batch reads"),
    ("includeRetryTopic", {"includeRetryTopic": "true", "consumerGroup": DROP}, False, "true",
     "needs the option consumerGroup"),
    # credentials: accessKey and secretKey go together; the token needs both
    ("accessKey", {"secretKey": SK}, True, None, "must be given together"),
    ("accessKey", {"accessKey": "  ", "secretKey": SK}, True, None, "must be given together"),
    ("secretKey", {"accessKey": AK}, True, None, "must be given together"),
    ("secretKey", {"accessKey": AK, "secretKey": ""}, False, None, "must be given together"),
    ("securityToken", {"securityToken": TOKEN}, True, "***", "together with accessKey and secretKey"),
    *((option, overrides, True, value, accepted) for option, overrides, value, accepted in TLS_CASES),
]

#: Options that accept any string, so they have no invalid value to test.
READER_FREE_FORM = {
    # a tag expression: "*", "TagA || TagB"; empty means "*". The broker filters by it.
    "subExpression",
}


def _shown(overrides: Mapping[str, object]) -> str:
    return ",".join(f"{k}={'<dropped>' if v is DROP else v}" for k, v in overrides.items())


def _case_id(case: tuple[str, dict[str, object], bool, object, str]) -> str:
    return f"{case[0]}-{'stream' if case[2] else 'batch'}-{_shown(case[1])}"


@pytest.mark.parametrize("base, stream", [(READER_BASE, True), (READER_BASE, False)])
def test_reader_base_options_are_valid(base: dict[str, str], stream: bool) -> None:
    """Guards the table: each case fails because of its override, not because of the base."""
    opts = ReaderOptions.parse(base, stream=stream)
    assert opts.topics == ("t",) and opts.namesrv_addr == (NS,)


@pytest.mark.parametrize("option, overrides, stream, value, accepted", READER_CASES,
                         ids=[_case_id(c) for c in READER_CASES])
def test_invalid_reader_option_names_option_value_and_accepted(
        option: str, overrides: dict[str, object], stream: bool, value: object, accepted: str) -> None:
    with pytest.raises(OptionError) as info:
        ReaderOptions.parse(_with(READER_BASE, overrides), stream=stream)
    _assert_names(info.value, option, value, accepted)


def test_every_reader_option_has_an_invalid_case() -> None:
    known = set(source_options._NAMES)
    tested = {case[0] for case in READER_CASES}
    assert tested <= known, f"cases for options the reader does not know: {tested - known}"
    untested = known - tested - READER_FREE_FORM
    assert not untested, f"reader options with no invalid-value case in READER_CASES: {sorted(untested)}"
    assert READER_FREE_FORM <= known


def test_reader_option_names_are_case_insensitive_in_errors_too() -> None:
    """A lower-cased key is reported under its canonical spelling."""
    with pytest.raises(OptionError) as info:
        ReaderOptions.parse(_with(READER_BASE, {"maxmessagespertrigger": "0"}), stream=True)
    _assert_names(info.value, "maxMessagesPerTrigger", "0", "positive integer")


def test_ending_offsets_error_does_not_advertise_group_or_earliest_keywords() -> None:
    """endingOffsets accepts `latest` or JSON only; its error must not list the startingOffsets words."""
    with pytest.raises(OptionError) as info:
        ReaderOptions.parse(_with(READER_BASE, {"endingOffsets": "earliest"}), stream=False)
    assert "group" not in info.value.accepted
    assert "accepted: latest or JSON" in info.value.accepted


@pytest.mark.parametrize("typo, meant", [
    ("startingOffset", "startingOffsets"),
    ("maxMessagePerTrigger", "maxMessagesPerTrigger"),
    ("consumer_group", "consumerGroup"),
    ("namesrv", "namesrvAddr"),
    ("colour", None),
])
def test_unknown_reader_option_is_rejected_naming_it_and_the_known_names(typo: str, meant: str | None) -> None:
    with pytest.raises(OptionError) as info:
        ReaderOptions.parse(_with(READER_BASE, {typo: "x"}), stream=True)
    _assert_names(info.value, typo, "x", "unknown option")
    msg = str(info.value)
    for name in source_options._NAMES:  # the accepted list is spelt out in full
        assert repr(name) in msg, name
    if meant is not None:
        assert repr(meant) in msg
    assert "'path'" not in msg  # a hidden option (set by Spark) is accepted but not advertised


def test_hidden_reader_option_path_is_accepted() -> None:
    assert ReaderOptions.parse(_with(READER_BASE, {"path": "/anything"}), stream=True).topics == ("t",)


# -- writer options ----------------------------------------------------------------------

BODY_ONLY = StructType([StructField("body", BinaryType())])

#: (option the error names, overrides of WRITER_BASE, value the error shows, word of what is
#: accepted). Options are parsed, then checked against a schema with only a body column.
WRITER_CASES: list[tuple[str, dict[str, object], object, str]] = [
    ("namesrvAddr", {"namesrvAddr": DROP}, None, "required"),
    ("namesrvAddr", {"namesrvAddr": "nohostport"}, "nohostport", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:1,h2"}, "h:1,h2", "host:port"),
    ("namesrvAddr", {"namesrvAddr": ";"}, ";", "host:port"),
    ("namesrvAddr", {"namesrvAddr": "h:99999"}, "h:99999", "1-65535"),
    ("endpoints", {"endpoints": "h:8081"}, "h:8081", "either namesrvAddr"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": "nohostport"}, "nohostport", "host:port"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": ";"}, ";", "host:port"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": "h:0"}, "h:0", "1-65535"),
    # no topic option and no topic column
    ("topic", {"topic": DROP}, None, "STRING column named topic"),
    ("topic", {"topic": ""}, None, "STRING column named topic"),
    ("topic", {"topic": "   "}, None, "STRING column named topic"),
    ("namespace", {"namespace": "bad ns"}, "bad ns", "not '%'"),
    ("producerGroup", {"producerGroup": ""}, "", "non-empty"),
    ("traceEnabled", {"traceEnabled": "2"}, "2", "true or false"),
    ("traceTopic", {"traceTopic": "T"}, "T", "give traceEnabled=true too"),
    ("traceTopic", {"namesrvAddr": DROP, "endpoints": "h:8081", "traceEnabled": "true"}, "RMQ_SYS_TRACE_TOPIC",
     "refuse sends to system topics"),
    ("producerGroup", {"producerGroup": "  "}, "  ", "non-empty"),
    ("delivery", {"delivery": "maybe"}, "maybe", "at-least-once, exactly-once, send-back"),
    ("delivery", {"delivery": "exactly_once"}, "exactly_once", "at-least-once, exactly-once, send-back"),
    ("delivery", {"delivery": "at-most-once"}, "at-most-once", "at-least-once, exactly-once, send-back"),
    ("delivery", {"delivery": ""}, "", "at-least-once, exactly-once, send-back"),
    ("maxBatchMessages", {"maxBatchMessages": "0"}, "0", "positive integer"),
    ("maxBatchMessages", {"maxBatchMessages": "-1"}, "-1", "positive integer"),
    ("maxBatchMessages", {"maxBatchMessages": "lots"}, "lots", "positive integer"),
    ("maxBatchBytes", {"maxBatchBytes": "0"}, "0", "positive integer"),
    ("maxBatchBytes", {"maxBatchBytes": "1MB"}, "1MB", "positive integer"),
    ("maxMessageSize", {"maxMessageSize": "-4"}, "-4", "positive integer"),
    ("maxMessageSize", {"maxMessageSize": "4.5"}, "4.5", "positive integer"),
    ("compressThreshold", {"compressThreshold": "0"}, "0", "positive integer"),
    ("compressThreshold", {"compressThreshold": "4k"}, "4k", "positive integer"),
    ("accessKey", {"secretKey": SK}, None, "must be given together"),
    ("secretKey", {"accessKey": AK}, None, "must be given together"),
    ("securityToken", {"securityToken": TOKEN}, "***", "together with accessKey and secretKey"),
    ("consumerGroup", {"delivery": "send-back"}, None, "required (the group that read them)"),
    ("consumerGroup", {"delivery": "send-back", "consumerGroup": "bad group"}, "bad group", "RocketMQ's rule"),
    ("consumerGroup", {"consumerGroup": "g"}, "g", "only delivery=send-back takes it"),
    ("maxReconsumeTimes", {"delivery": "send-back", "consumerGroup": "g", "maxReconsumeTimes": "-1"}, "-1",
     "a whole number 0..10000"),
    ("maxReconsumeTimes", {"maxReconsumeTimes": "3"}, "3", "only delivery=send-back takes it"),
    ("failOnDataLoss", {"failOnDataLoss": "false"}, "false", "only delivery=exactly-once takes it"),
    ("failOnDataLoss", {"delivery": "exactly-once", "checkpointLocation": "/tmp/ck", "failOnDataLoss": "maybe"},
     "maybe", "true or false"),
    ("endpoints", {"namesrvAddr": DROP, "endpoints": "h:8081", "delivery": "send-back", "consumerGroup": "g"},
     "h:8081", "only the remoting protocol has"),
    *TLS_CASES,
]

#: Writer options that accept any string.
WRITER_FREE_FORM: set[str] = {"errorColumn"}  # any column name (a missing column carries no error)


def _writer_case_id(case: tuple[str, dict[str, object], object, str]) -> str:
    return f"{case[0]}-{_shown(case[1])}"


def test_writer_base_options_are_valid() -> None:
    opts = WriterOptions.parse(WRITER_BASE)
    assert opts.topic == "t" and opts.namesrv_addr == (NS,) and not opts.exactly_once
    assert check_columns(BODY_ONLY, opts) == ["body"]


@pytest.mark.parametrize("option, overrides, value, accepted", WRITER_CASES,
                         ids=[_writer_case_id(c) for c in WRITER_CASES])
def test_invalid_writer_option_names_option_value_and_accepted(
        option: str, overrides: dict[str, object], value: object, accepted: str) -> None:
    with pytest.raises(OptionError) as info:
        check_columns(BODY_ONLY, WriterOptions.parse(_with(WRITER_BASE, overrides)))
    _assert_names(info.value, option, value, accepted)


def test_every_writer_option_has_an_invalid_case() -> None:
    known = set(sink_options._NAMES)
    tested = {case[0] for case in WRITER_CASES}
    assert tested <= known, f"cases for options the writer does not know: {tested - known}"
    untested = known - tested - WRITER_FREE_FORM
    assert not untested, f"writer options with no invalid-value case in WRITER_CASES: {sorted(untested)}"


@pytest.mark.parametrize("typo, meant", [
    ("tpoic", "topic"),
    ("deliverySemantics", "delivery"),
    ("maxBatchMessage", "maxBatchMessages"),
])
def test_unknown_writer_option_is_rejected_naming_it_and_the_known_names(typo: str, meant: str) -> None:
    with pytest.raises(OptionError) as info:
        WriterOptions.parse(_with(WRITER_BASE, {typo: "x"}))
    _assert_names(info.value, typo, "x", "unknown option")
    assert repr(meant) in str(info.value)
    assert "checkpointLocation" not in str(info.value)  # hidden: set by Spark, not advertised


def test_hidden_writer_option_checkpoint_location_is_kept() -> None:
    opts = WriterOptions.parse(_with(WRITER_BASE, {"checkpointlocation": "/tmp/cp"}))
    assert opts.checkpoint_location == "/tmp/cp"


# -- writer columns ----------------------------------------------------------------------

def _schema(**cols: DataType) -> StructType:
    return StructType([StructField(name, dtype) for name, dtype in cols.items()])


#: (column, schema, type the error shows, accepted types)
COLUMN_CASES: list[tuple[str, StructType, object, str]] = [
    ("body", _schema(value=BinaryType()), None, "BINARY or STRING"),
    ("body", _schema(Body=BinaryType()), None, "BINARY or STRING"),
    ("body", _schema(body=IntegerType()), "int", "BINARY or STRING"),
    ("body", _schema(body=ArrayType(BinaryType())), "array<binary>", "BINARY or STRING"),
    ("topic", _schema(body=BinaryType(), topic=IntegerType()), "int", "STRING"),
    ("tag", _schema(body=BinaryType(), tag=BinaryType()), "binary", "STRING"),
    ("keys", _schema(body=BinaryType(), keys=IntegerType()), "int", "ARRAY<STRING> or STRING"),
    ("keys", _schema(body=BinaryType(), keys=ArrayType(IntegerType())), "array<int>", "ARRAY<STRING> or STRING"),
    ("properties", _schema(body=BinaryType(), properties=StringType()), "string", "MAP<STRING,STRING>"),
    ("properties", _schema(body=BinaryType(), properties=MapType(StringType(), IntegerType())),
     "map<string,int>", "MAP<STRING,STRING>"),
    ("properties", _schema(body=BinaryType(), properties=MapType(IntegerType(), StringType())),
     "map<int,string>", "MAP<STRING,STRING>"),
    ("messageGroup", _schema(body=BinaryType(), messageGroup=LongType()), "bigint", "STRING"),
    ("deliveryTimestamp", _schema(body=BinaryType(), deliveryTimestamp=LongType()), "bigint", "TIMESTAMP"),
    ("deliveryTimestamp", _schema(body=BinaryType(), deliveryTimestamp=StringType()), "string", "TIMESTAMP"),
]


def test_send_back_needs_where_each_row_was_read() -> None:
    opts = WriterOptions.parse(_with(WRITER_BASE, {"delivery": "send-back", "consumerGroup": "g"}))
    read = _schema(topic=StringType(), broker=StringType(), queueId=IntegerType(), queueOffset=LongType())
    assert check_columns(read, opts) == ["topic", "broker", "queueId", "queueOffset"]
    assert check_columns(_schema(**dict((f.name, f.dataType) for f in read.fields), error=StringType()),
                         opts)[-1] == "error"
    with pytest.raises(OptionError) as info:
        check_columns(BODY_ONLY, opts)
    _assert_names(info.value, "column topic", None, "columns topic, broker, queueId, queueOffset")
    with pytest.raises(OptionError) as info:
        check_columns(_schema(**dict((f.name, f.dataType) for f in read.fields), error=IntegerType()), opts)
    _assert_names(info.value, "column error", "int", "STRING")


@pytest.mark.parametrize("column, schema, shown, accepted", COLUMN_CASES,
                         ids=[f"{c[0]}-{c[1].simpleString()}" for c in COLUMN_CASES])
def test_invalid_writer_column_names_column_type_and_accepted(
        column: str, schema: StructType, shown: object, accepted: str) -> None:
    with pytest.raises(OptionError) as info:
        check_columns(schema, WriterOptions.parse(WRITER_BASE))
    _assert_names(info.value, f"column {column}", shown, accepted)


def test_every_writer_column_has_a_wrong_type_case() -> None:
    known = set(sink_options._ACCEPTED)
    wrong_type = {c[0] for c in COLUMN_CASES if c[2] is not None}
    assert wrong_type == known, f"columns with no wrong-type case: {sorted(known - wrong_type)}"


def test_all_writer_columns_with_accepted_types_pass() -> None:
    schema = _schema(body=StringType(), topic=StringType(), tag=StringType(), keys=ArrayType(StringType()),
                     properties=MapType(StringType(), StringType()), messageGroup=StringType(),
                     deliveryTimestamp=TimestampNTZType(), extra=IntegerType())
    used = check_columns(schema, WriterOptions.parse(_with(WRITER_BASE, {"topic": DROP})))
    assert used == ["body", "topic", "tag", "keys", "properties", "messageGroup", "deliveryTimestamp"]
    assert check_columns(_schema(body=BinaryType(), keys=StringType(), deliveryTimestamp=TimestampType()),
                         WriterOptions.parse(WRITER_BASE)) == ["body", "keys", "deliveryTimestamp"]


# -- secrets -----------------------------------------------------------------------------

def _all_text(exc: BaseException) -> str:
    """Message, repr, args and the formatted traceback with its chained causes."""
    return "\n".join([str(exc), repr(exc), repr(exc.args), *traceback.format_exception(exc)])


READER_CREDS = {**READER_BASE, "accessKey": AK, "secretKey": SK, "securityToken": TOKEN}
WRITER_CREDS = {**WRITER_BASE, "accessKey": AK, "secretKey": SK, "securityToken": TOKEN}

SECRET_CASES: list[tuple[str, str, dict[str, object]]] = [
    # (reader|writer, option the error names, overrides of the *_CREDS options)
    ("reader", "accessKey", {"accessKey": DROP}),
    ("reader", "securityToken", {"accessKey": DROP, "secretKey": DROP}),
    ("reader", "secretKy", {"secretKey": DROP, "secretKy": SK}),
    ("reader", "security_token", {"securityToken": DROP, "security_token": TOKEN}),
    ("reader", "pullBatchSize", {"pullBatchSize": "zero"}),
    ("reader", "startingOffsets", {"startingOffsets": "{bad"}),
    ("writer", "accessKey", {"accessKey": DROP}),
    ("writer", "securityToken", {"accessKey": DROP, "secretKey": DROP}),
    ("writer", "secret_key", {"secretKey": DROP, "secret_key": SK}),
    ("writer", "delivery", {"delivery": "maybe"}),
    ("writer", "maxBatchBytes", {"maxBatchBytes": "-1"}),
]


@pytest.mark.parametrize("side, option, overrides", SECRET_CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in SECRET_CASES])
def test_option_errors_never_contain_the_secret_key_or_token(
        side: str, option: str, overrides: dict[str, object]) -> None:
    with pytest.raises(OptionError) as info:
        if side == "reader":
            ReaderOptions.parse(_with(READER_CREDS, overrides), stream=True)
        else:
            WriterOptions.parse(_with(WRITER_CREDS, overrides))
    assert info.value.option == option
    text = _all_text(info.value)
    assert SK not in text and TOKEN not in text, text


def test_missing_half_of_the_key_pair_is_named_without_echoing_the_other() -> None:
    with pytest.raises(OptionError) as info:
        ReaderOptions.parse(_with(READER_BASE, {"secretKey": SK}), stream=True)
    msg = str(info.value)
    assert "accessKey" in msg and "secretKey is set" in msg and SK not in msg
    with pytest.raises(OptionError) as info:
        WriterOptions.parse(_with(WRITER_BASE, {"accessKey": AK}))
    assert "secretKey" in str(info.value) and "accessKey is set" in str(info.value)


def test_valid_credentials_parse_and_their_repr_masks_the_secret() -> None:
    reader = ReaderOptions.parse(READER_CREDS, stream=True)
    writer = WriterOptions.parse(WRITER_CREDS)
    for opts in (reader, writer):
        assert opts.credentials is not None and opts.credentials.access_key == AK
        assert SK not in repr(opts) and TOKEN not in repr(opts)


@pytest.mark.parametrize("location, ok", [
    ("/tmp/ck", True), ("file:///tmp/ck", True), ("file:/tmp/ck", True), ("relative/ck", True),
    ("hdfs://nn:8020/ck", False), ("s3a://bucket/ck", False),
])
def test_exactly_once_takes_a_local_checkpoint_location_only(location: str, ok: bool) -> None:
    # its transaction record is plain files on the driver: an hdfs:// location became a local
    # directory named "hdfs:", and the record did not follow the query to another driver
    opts = _with(WRITER_BASE, {"delivery": "exactly-once", "checkpointLocation": location})
    if ok:
        assert WriterOptions.parse(opts).checkpoint_location == location
        return
    with pytest.raises(OptionError) as info:
        WriterOptions.parse(opts)
    _assert_names(info.value, "checkpointLocation", location, "a local or mounted path, or a file: URI")
    assert WriterOptions.parse(_with(WRITER_BASE, {"checkpointLocation": location})).checkpoint_location == location
