"""Malformed remoting frames for the broker fuzz tests, from a seeded generator (the same seed
gives the same frames, so a failure can be replayed with its seed and index).

Two families:

* ``framed``: a well-framed command (correct length prefix and header) whose content is
  wrong: every request code the broker and name server know plus unknown ones, header fields
  with non-numeric, negative, huge, empty or non-ASCII values, missing fields, bodies that are
  random bytes or a valid message batch with bytes flipped. The broker must answer each one
  (or drop a oneway one) and keep the connection.
* ``broken``: the framing itself is wrong: golden frames (from ``fixtures/remoting-frames.jsonl``)
  with bytes flipped, cut or appended, length prefixes under 4 or over the cap, header
  lengths past the frame, unknown serialize types, JSON headers that are not objects or hold
  the wrong types, random bytes. The broker may answer with an error and closes only that
  connection.
"""

from __future__ import annotations

import json
import os
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from rocketmq_spark.codec import BatchEntry, encode_batch, encode_properties
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import SERIALIZE_JSON, SERIALIZE_ROCKETMQ, RemotingCommand

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

#: Fuzz opaques stay below this; the tests' own probes use opaques above it.
OPAQUE_LIMIT = 1 << 30

FIELDS = (
    "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis",
    "subscription", "expressionType", "consumerGroup", "group", "producerGroup", "timestamp", "bornTimestamp",
    "flag", "properties", "reconsumeTimes", "batch", "readQueueNums", "writeQueueNums", "perm",
    "topicFilterType", "topicSysFlag", "order", "commitLogOffset", "tranStateTableOffset", "transactionId",
    "commitOrRollback", "brokerName", "brokerAddr", "clusterName", "brokerId", "haServerAddr",
    "msgId", "offset", "isForce", "defaultTopic", "defaultTopicQueueNums", "unitMode", "maxReconsumeTimes",
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n",
    "AccessKey", "Signature", "SecurityToken", "compressed", "bodyCrc32", "",
)
# The fuzzer's topics and groups: never the names the tests check the store with.
TOPICS = ("FuzzT0", "FuzzT1", "FuzzT2", "TBW102", "RMQ_SYS_TRANS_HALF_TOPIC", "%RETRY%FuzzG", "", " ",
          "a" * 200, "bad/name", "\u00e9t\u00e9", "FuzzT\x00", "SCHEDULE_TOPIC_XXXX")
GROUPS = ("FuzzG", "", "CID_ONSAPI_OWNER", "\u4e2d", "g" * 300)
NUMBERS = ("0", "1", "-1", "2", "7", "1024", "1025", "65535", "2147483647", "2147483648", "-2147483649",
           "9223372036854775807", "9223372036854775808", "-9223372036854775809", "1" + "0" * 40,
           "", "abc", " 1", "1 ", "0x10", "1e3", "1.5", "NaN", "true", "null", "\x00", "\u0661")
STRINGS = ("", "x", "TagA", "TagA || TagB", "*", "SQL92", "\x01\x02", "\u0000", "\ud7ff", "{", "]",
           "KEYS\x01k\x02TAGS\x01t\x02", "\x01\x02\x01", "UNIQ_KEY\x01" + "F" * 64 + "\x02",
           "TRAN_MSG\x01true\x02PGROUP\x01FuzzG\x02", "DELAY\x0118\x02", "__STARTDELIVERTIME\x0199999999999999\x02",
           "127.0.0.1:1", "256.0.0.1:99999", "[::1]:x", "s" * 5000)

KNOWN_CODES = tuple(int(c) for c in RequestCode) + (0, 1, 9999, -1, 32767, -32768)


@dataclass(frozen=True, slots=True)
class FuzzFrame:
    index: int
    kind: str  # a short name of how it was made
    data: bytes
    framed: bool  # True: well framed, the broker must keep the connection
    oneway: bool = False


def golden_frames() -> list[bytes]:
    out = []
    with open(os.path.join(FIXTURES, "remoting-frames.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("raw_hex"):
                out.append(bytes.fromhex(rec["raw_hex"]))
    return out


def _field_value(rnd: random.Random) -> str:
    r = rnd.random()
    if r < 0.45:
        return rnd.choice(NUMBERS)
    if r < 0.7:
        return rnd.choice(STRINGS)
    if r < 0.8:
        return rnd.choice(TOPICS)
    if r < 0.85:
        return rnd.choice(GROUPS)
    return "".join(chr(rnd.randrange(0, 0x2FF)) for _ in range(rnd.randrange(0, 12)))


def _body(rnd: random.Random) -> bytes:
    r = rnd.random()
    if r < 0.35:
        return b""
    if r < 0.6:
        return rnd.randbytes(rnd.randrange(1, 512))
    if r < 0.85:
        entries = [BatchEntry(rnd.randbytes(rnd.randrange(0, 64)),
                              encode_properties({"TAGS": "t", "KEYS": "k"}) if rnd.random() < 0.5 else "")
                   for _ in range(rnd.randrange(1, 5))]
        raw = bytearray(encode_batch(entries))
        for _ in range(rnd.randrange(0, 4)):
            if raw:
                raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        if rnd.random() < 0.3:
            del raw[rnd.randrange(len(raw) + 1):]
        return bytes(raw)
    # JSON-ish bodies (heart beats, register broker, lock batch)
    return rnd.choice((b"{}", b"[]", b"null", b'{"topicConfigTable":{"a":1}}', b'{"mqSet":[{"topic":1}]}',
                       b'{"consumerDataSet":[{"groupName":null}],"clientID":7}', b"{\"a\":", b"\xff\xfe"))


def framed_frame(rnd: random.Random, index: int) -> FuzzFrame:
    code = rnd.choice(KNOWN_CODES)
    ext = {rnd.choice(FIELDS): _field_value(rnd) for _ in range(rnd.randrange(0, 10))}
    if rnd.random() < 0.6:  # aim at real handlers: their main fields present, one of them bad
        ext.setdefault("topic", rnd.choice(TOPICS))
        ext.setdefault("queueId", rnd.choice(NUMBERS[:8]))
    oneway = rnd.random() < 0.05
    cmd = RemotingCommand(code=code, opaque=rnd.randrange(OPAQUE_LIMIT), flag=2 if oneway else 0,
                          ext_fields=ext, body=_body(rnd),
                          remark=rnd.choice((None, "", "r", "\u2603")),
                          language=rnd.choice(("JAVA", "CPP", "PYTHON", "GO", "NODE_JS")),
                          version=rnd.choice((0, 121, 435, -1, 32767)),
                          serialize_type=rnd.choice((SERIALIZE_JSON, SERIALIZE_ROCKETMQ)))
    return FuzzFrame(index, f"framed code {code}", cmd.encode(), True, oneway)


def _with_prefix(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def broken_frame(rnd: random.Random, index: int, goldens: list[bytes], max_frame: int) -> FuzzFrame:
    r = rnd.random()
    if r < 0.3:
        raw = bytearray(rnd.choice(goldens))
        for _ in range(rnd.randrange(1, 6)):
            raw[rnd.randrange(len(raw))] = rnd.randrange(256)
        kind = "golden with bytes flipped"
        # keep the prefix right half of the time so the header decoder is what meets the damage
        if rnd.random() < 0.5:
            raw[:4] = struct.pack(">I", len(raw) - 4)
    elif r < 0.4:
        raw = bytearray(rnd.choice(goldens))
        raw = raw[: rnd.randrange(1, len(raw))]
        kind = "golden cut short"
    elif r < 0.5:
        raw = bytearray(rnd.choice(goldens)) + rnd.randbytes(rnd.randrange(1, 64))
        kind = "golden with bytes appended"
    elif r < 0.6:
        length = rnd.choice((0, 1, 2, 3, max_frame + 1, 0x7FFFFFFF, 0xFFFFFFFF))
        raw = bytearray(struct.pack(">I", length) + rnd.randbytes(rnd.randrange(0, 32)))
        kind = f"length prefix {length}"
    elif r < 0.7:
        hlen = rnd.choice((0, 1, 0xFFFFFF, 100000))
        payload = struct.pack(">I", (rnd.choice((0, 1)) << 24) | hlen) + rnd.randbytes(rnd.randrange(0, 40))
        raw = bytearray(_with_prefix(payload))
        kind = f"header length {hlen}"
    elif r < 0.78:
        header = b'{"code":10}'
        payload = struct.pack(">I", (rnd.randrange(2, 256) << 24) | len(header)) + header
        raw = bytearray(_with_prefix(payload))
        kind = "unknown serialize type"
    elif r < 0.9:
        header = rnd.choice((
            b"[]", b"null", b"1", b'"x"', b"{", b'{"code":"ten"}', b'{"code":null}', b'{"code":1e400}',
            b'{"code":10,"opaque":"x"}', b'{"code":10,"extFields":[]}', b'{"code":10,"extFields":{"a":{}}}',
            b'{"code":10,"flag":-1,"opaque":99999999999999999999}', b'{"code":10,"language":7}',
            b'{"code":10,"remark":[1]}', b"\xff\xfe\x00", b'{"code":10,"extFields":{"a":"\\ud800"}}',
            b'{"code":' + b"9" * 5000 + b"}",
        ))
        payload = struct.pack(">I", len(header)) + header
        raw = bytearray(_with_prefix(payload))
        kind = "JSON header of the wrong shape"
    else:
        payload = rnd.randbytes(rnd.randrange(4, 300))
        raw = bytearray(_with_prefix(payload))
        kind = "random bytes"
    return FuzzFrame(index, kind, bytes(raw), False)


def frames(seed: int, count: int, max_frame: int, framed_share: float = 0.6) -> Iterator[FuzzFrame]:
    rnd = random.Random(seed)
    goldens = [g for g in golden_frames() if len(g) > 8]
    for i in range(count):
        if rnd.random() < framed_share:
            yield framed_frame(rnd, i)
        else:
            yield broken_frame(rnd, i, goldens, max_frame)
