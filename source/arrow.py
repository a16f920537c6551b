"""The row schema and the decoding of pulled record bytes into Arrow RecordBatches.

The Arrow form matches what Spark expects for the schema exactly (string, int32,
timestamp[us, tz=UTC], list<string>, map<string,string>, all nullable).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

import pyarrow as pa

from ..remoting.message import MAGIC_V2, SYSTEM_PROPERTY_KEYS

__all__ = ["ARROW_SCHEMA", "SCHEMA_DDL", "decode_to_batch"]

SCHEMA_DDL = (
    "topic STRING, broker STRING, queueId INT, queueOffset BIGINT, messageId STRING, tag STRING, "
    "keys ARRAY<STRING>, body BINARY, properties MAP<STRING,STRING>, bornTimestamp TIMESTAMP, "
    "storeTimestamp TIMESTAMP, bornHost STRING, storeHost STRING"
)

_TS = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("broker", pa.string()),
    pa.field("queueId", pa.int32()),
    pa.field("queueOffset", pa.int64()),
    pa.field("messageId", pa.string()),
    pa.field("tag", pa.string()),
    pa.field("keys", pa.list_(pa.field("element", pa.string()))),
    pa.field("body", pa.binary()),
    pa.field("properties", pa.map_(pa.string(), pa.string())),
    pa.field("bornTimestamp", _TS),
    pa.field("storeTimestamp", _TS),
    pa.field("bornHost", pa.string()),
    pa.field("storeHost", pa.string()),
])

_HEAD = struct.Struct(">iiiiiqqiq")  # size, magic, crc, queueId, flag, queueOffset, physOffset, sysFlag, bornTs
_Q = struct.Struct(">q")
_I = struct.Struct(">i")
_H = struct.Struct(">h")


def _host(buf: bytes, p: int, v6: bool) -> tuple[str, int]:
    if v6:
        import ipaddress

        ip = ipaddress.IPv6Address(buf[p : p + 16])
        (port,) = _I.unpack_from(buf, p + 16)
        return f"[{ip}]:{port}", p + 20
    (port,) = _I.unpack_from(buf, p + 4)
    return f"{buf[p]}.{buf[p + 1]}.{buf[p + 2]}.{buf[p + 3]}:{port}", p + 8


def decode_to_batch(chunks: Iterable[bytes], broker: str, end: int | None = None) -> pa.RecordBatch:
    """Decode record bytes (pull bodies) into one RecordBatch; records at/after ``end`` are dropped."""
    topics: list[str] = []
    qids: list[int] = []
    qoffs: list[int] = []
    ids: list[str] = []
    tags: list[str | None] = []
    keys: list[list[str] | None] = []
    bodies: list[bytes] = []
    props: list[list[tuple[str, str]]] = []
    born_ts: list[int] = []
    store_ts: list[int] = []
    born_hosts: list[str] = []
    store_hosts: list[str] = []
    head = _HEAD.unpack_from
    host_cache: dict[bytes, str] = {}
    for buf in chunks:
        p = 0
        n = len(buf)
        while p < n:
            size, magic, _crc, qid, _flag, qoff, phys, sys_flag, bts = head(buf, p)
            q = p + 48
            if sys_flag & 0x10:
                born, q = _host(buf, q, True)
            else:
                key = buf[q : q + 8]
                born = host_cache.get(key) or host_cache.setdefault(key, _host(buf, q, False)[0])
                q += 8
            (sts,) = _Q.unpack_from(buf, q)
            q += 8
            if sys_flag & 0x20:
                store_raw = buf[q : q + 20]
                q += 20
            else:
                store_raw = buf[q : q + 8]
                q += 8
            store = host_cache.get(store_raw)
            if store is None:
                store = host_cache.setdefault(store_raw, _host(store_raw, 0, bool(sys_flag & 0x20))[0])
            q += 12  # reconsumeTimes, preparedTransactionOffset
            (blen,) = _I.unpack_from(buf, q)
            q += 4
            body = buf[q : q + blen]
            q += blen
            if magic == MAGIC_V2:
                (tlen,) = _H.unpack_from(buf, q)
                q += 2
            else:
                tlen = buf[q]
                q += 1
            topic = buf[q : q + tlen].decode()
            q += tlen
            (plen,) = _H.unpack_from(buf, q)
            q += 2
            raw_props = buf[q : q + plen].decode()
            p += size
            if end is not None and qoff >= end:
                continue
            if sys_flag & 0x1:
                body = zlib.decompress(body)
            user: list[tuple[str, str]] = []
            tag = None
            key_list = None
            uniq = None
            for item in raw_props.split("\x02"):
                if not item:
                    continue
                k, _, v = item.partition("\x01")
                if k == "TAGS":
                    tag = v
                elif k == "KEYS":
                    key_list = [x for x in v.split(" ") if x]
                elif k == "UNIQ_KEY":
                    uniq = v
                elif k not in SYSTEM_PROPERTY_KEYS:
                    user.append((k, v))
            if uniq is None:
                uniq = store_raw.hex().upper() + _Q.pack(phys).hex().upper()
            topics.append(topic)
            qids.append(qid)
            qoffs.append(qoff)
            ids.append(uniq)
            tags.append(tag)
            keys.append(key_list if key_list is not None else [])
            bodies.append(body)
            props.append(user)
            born_ts.append(bts * 1000)
            store_ts.append(sts * 1000)
            born_hosts.append(born)
            store_hosts.append(store)
    n = len(topics)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(topics, pa.string()),
            pa.array([broker] * n, pa.string()),
            pa.array(qids, pa.int32()),
            pa.array(qoffs, pa.int64()),
            pa.array(ids, pa.string()),
            pa.array(tags, pa.string()),
            pa.array(keys, ARROW_SCHEMA.field("keys").type),
            pa.array(bodies, pa.binary()),
            pa.array(props, ARROW_SCHEMA.field("properties").type),
            pa.array(born_ts, _TS),
            pa.array(store_ts, _TS),
            pa.array(born_hosts, pa.string()),
            pa.array(store_hosts, pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )
