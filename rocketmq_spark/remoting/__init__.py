"""RocketMQ's classic remoting protocol: frames, request/response codes, routes (the message
records they carry are :mod:`rocketmq_spark.codec`). No sockets and no pyspark here.
"""

from .codes import LanguageCode, RequestCode, ResponseCode
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
from .route import BrokerData, QueueData, TopicRouteData, loads_lenient

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "BrokerData",
    "LanguageCode",
    "QueueData",
    "RemotingCommand",
    "RequestCode",
    "ResponseCode",
    "TopicRouteData",
    "decode_frame",
    "loads_lenient",
    "read_frame_length",
]
