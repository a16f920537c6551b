"""The store time a mark compares, read from a pull's answer by either protocol's client, in a
process that never imports pandas for it (Spark starts the planning process anew for every query)."""

from __future__ import annotations

import subprocess
import sys
import zlib

from rocketmq_spark.client.grpc_client import GrpcClient
from rocketmq_spark.client.remoting import RemotingClient
from rocketmq_spark.codec.record import SysFlag, encode_record
from rocketmq_spark.model import PullResult
from rocketmq_spark.proto import pb

store_time_in = RemotingClient.store_time_in


def _records(*offsets: int) -> bytes:
    return b"".join(encode_record(topic="t", queue_id=0, queue_offset=o, body=b"b",
                                  store_timestamp=1_700_000_000_000 + o) for o in offsets)


def test_the_store_time_of_the_message_at_the_offset_in_records() -> None:
    res = PullResult("FOUND", 13, 0, 20, _records(10, 11, 12))
    assert store_time_in(res, 11) == 1_700_000_000_011
    assert store_time_in(res, 13) is None  # not in the answer
    assert store_time_in(PullResult("NO_NEW_MSG", 11, 0, 11), 11) is None


def test_the_store_time_behind_ipv6_hosts_and_a_compressed_body() -> None:
    body = zlib.compress(b"b" * 5000)
    recs = b"".join(encode_record(topic="t", queue_id=0, queue_offset=o, body=body, sys_flag=SysFlag.COMPRESSED,
                                  born_host="[::1]:7000", store_host="[fe80::2]:10911",
                                  store_timestamp=1_700_000_000_000 + o) for o in (4, 5))
    assert store_time_in(PullResult("FOUND", 6, 0, 6, recs), 5) == 1_700_000_000_005


def test_the_store_time_of_the_message_at_the_offset_over_grpc() -> None:
    with_time = pb.Message()
    with_time.system_properties.queue_offset = 7
    with_time.system_properties.store_timestamp.seconds = 1_700_000_000
    with_time.system_properties.store_timestamp.nanos = 250_000_000
    without = pb.Message()
    without.system_properties.queue_offset = 8
    res = PullResult("FOUND", 9, -1, -1, messages=(with_time, without))
    assert GrpcClient.store_time_in(res, 7) == 1_700_000_000_250
    assert GrpcClient.store_time_in(res, 8) is None


def test_comparing_a_mark_imports_no_pandas() -> None:
    code = ("import sys; from rocketmq_spark.codec.record import encode_record; "
            "from rocketmq_spark.model import PullResult; from rocketmq_spark.client.remoting import RemotingClient; "
            "body = encode_record(topic='t', queue_id=0, queue_offset=3, body=b'b', store_timestamp=5); "
            "assert RemotingClient.store_time_in(PullResult('FOUND', 4, 0, 4, body), 3) == 5; "
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
