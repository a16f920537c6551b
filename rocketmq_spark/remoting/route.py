"""TopicRouteData and the lenient JSON that Java brokers write.

Java's fastjson writes integer map keys unquoted (``{"brokerAddrs":{0:"host:port"}}``);
:func:`loads_lenient` quotes them before parsing. We always write standard JSON,
which every client accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProtocolError

__all__ = [
    "PERM_READ",
    "PERM_WRITE",
    "BrokerData",
    "QueueData",
    "TopicRouteData",
    "loads_lenient",
    "refused_queues_text",
]

PERM_READ = 4
PERM_WRITE = 2
MASTER_ID = 0


def refused_queues_text(topic: str, perms: set[int], *, writable: bool) -> str:
    """Why no queue of ``topic`` can be written to (or read), given the permissions (4 read /
    2 write bits) its queues have on every broker: ``topic 'T' cannot be read: its queues'
    permission is write-only (2) on every broker``. Both transports' clients say it alike."""
    kinds = {6: "read-write", 4: "read-only", 2: "write-only", 0: "none"}
    listed = "/".join(sorted(f"{kinds.get(p & 6, '?')} ({p})" for p in perms))
    return (f"topic {topic!r} cannot be {'written to' if writable else 'read'}: its queues' permission is "
            f"{listed} on every broker")

# queue numbers a route may announce per broker (Java brokers default to 4 or 8 and admins
# rarely pass 1024); more is a damaged answer, not a topic to build millions of partitions for
_MAX_QUEUES = 65535


def _quote_bare_keys(text: str) -> str:
    """Quote bare integer object keys outside strings: ``{0:"a"}`` -> ``{"0":"a"}``."""
    out: list[str] = []
    i = 0
    n = len(text)
    in_str = False
    expect_key = False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_str = False
            i += 1
            continue
        if c == '"':
            in_str = True
            expect_key = False
        elif c in "{,":
            expect_key = True
        elif expect_key and (c.isdigit() or c == "-"):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append('"' + text[i:j] + '"')
                i = j
                expect_key = False
                continue
            expect_key = False
        elif not c.isspace():
            expect_key = False
        out.append(c)
        i += 1
    return "".join(out)


def loads_lenient(data: bytes | str) -> Any:
    """Parse JSON as Java RocketMQ components write it (bare integer keys allowed)."""
    try:
        text = bytes(data).decode() if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"malformed JSON body: not UTF-8 ({exc})") from None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json.loads(_quote_bare_keys(text))
    except ValueError as exc:
        raise ProtocolError(f"malformed JSON body: {exc}") from None


@dataclass(frozen=True, slots=True)
class QueueData:
    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = PERM_READ | PERM_WRITE
    topic_sys_flag: int = 0

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)


@dataclass(frozen=True, slots=True)
class BrokerData:
    broker_name: str
    broker_addrs: dict[int, str]
    cluster: str = "DefaultCluster"

    @property
    def master_addr(self) -> str | None:
        return self.broker_addrs.get(MASTER_ID)


@dataclass(frozen=True, slots=True)
class TopicRouteData:
    queue_datas: tuple[QueueData, ...]
    broker_datas: tuple[BrokerData, ...]
    filter_server_table: dict[str, Any] = field(default_factory=dict)

    def broker_addr(self, broker_name: str) -> str | None:
        """The master's address of group ``broker_name`` (None: not in the route, or its master is not)."""
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return b.master_addr
        return None

    def any_addr(self, broker_name: str) -> str | None:
        """The address of the master of group ``broker_name``, else of its slave with the lowest id."""
        for b in self.broker_datas:
            if b.broker_name == broker_name and b.broker_addrs:
                return b.broker_addrs[min(b.broker_addrs)]
        return None

    def to_json(self) -> bytes:
        obj = {
            "brokerDatas": [
                {
                    "brokerAddrs": {str(k): v for k, v in sorted(b.broker_addrs.items())},
                    "brokerName": b.broker_name,
                    "cluster": b.cluster,
                }
                for b in self.broker_datas
            ],
            "filterServerTable": self.filter_server_table,
            "queueDatas": [
                {
                    "brokerName": q.broker_name,
                    "perm": q.perm,
                    "readQueueNums": q.read_queue_nums,
                    "topicSysFlag": q.topic_sys_flag,
                    "writeQueueNums": q.write_queue_nums,
                }
                for q in self.queue_datas
            ],
        }
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> TopicRouteData:
        obj = loads_lenient(data)
        if not isinstance(obj, dict):
            raise ProtocolError(f"malformed TopicRouteData: a JSON {type(obj).__name__}, not an object")
        try:
            queues = tuple(
                QueueData(
                    broker_name=str(q["brokerName"]),
                    read_queue_nums=int(q.get("readQueueNums", 0)),
                    write_queue_nums=int(q.get("writeQueueNums", 0)),
                    perm=int(q.get("perm", PERM_READ | PERM_WRITE)),
                    topic_sys_flag=int(q.get("topicSysFlag", 0)),
                )
                for q in obj.get("queueDatas") or []
            )
            brokers = tuple(
                BrokerData(
                    broker_name=str(b["brokerName"]),
                    broker_addrs={int(k): str(v) for k, v in (b.get("brokerAddrs") or {}).items()},
                    cluster=str(b.get("cluster", "")),
                )
                for b in obj.get("brokerDatas") or []
            )
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"malformed TopicRouteData: {exc}") from None
        for q in queues:
            if not (0 <= q.read_queue_nums <= _MAX_QUEUES and 0 <= q.write_queue_nums <= _MAX_QUEUES):
                raise ProtocolError(f"malformed TopicRouteData: broker {q.broker_name} has read/write queue numbers "
                                    f"{q.read_queue_nums}/{q.write_queue_nums} (0..{_MAX_QUEUES} are accepted)")
        return cls(queue_datas=queues, broker_datas=brokers, filter_server_table=obj.get("filterServerTable") or {})
