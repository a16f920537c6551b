"""RocketMQ's classic remoting protocol: frames, codes, message records, routes.

Pure codec: no sockets and no pyspark here.
"""

from .codes import LanguageCode, RequestCode, ResponseCode, SysFlag, TransactionType
from .frame import (
    DEFAULT_MAX_FRAME,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    RemotingCommand,
    decode_frame,
    read_frame_length,
)
from .message import (
    BatchEntry,
    EncodedBatch,
    MessageRecord,
    PropertyKey,
    decode_batch,
    decode_properties,
    decode_record,
    decode_records,
    encode_batch,
    encode_properties,
    encode_record,
    iter_records,
    java_string_hash,
    offset_msg_id,
    parse_offset_msg_id,
    subscribed_tags,
)
from .route import BrokerData, QueueData, TopicRouteData, loads_lenient

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "BatchEntry",
    "EncodedBatch",
    "BrokerData",
    "LanguageCode",
    "MessageRecord",
    "PropertyKey",
    "QueueData",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "SysFlag",
    "TopicRouteData",
    "TransactionType",
    "decode_batch",
    "decode_frame",
    "decode_properties",
    "decode_record",
    "decode_records",
    "encode_batch",
    "encode_properties",
    "encode_record",
    "iter_records",
    "java_string_hash",
    "loads_lenient",
    "offset_msg_id",
    "parse_offset_msg_id",
    "read_frame_length",
    "subscribed_tags",
]
