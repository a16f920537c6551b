"""``produce``: generated messages or JSON lines, round-robin over the topic's queues, in
batches, with a progress bar on a terminal."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from ..errors import TopicNotFoundError
from .common import PROG, CliError, Parser, make_client, namesrv_of, positive_int_arg, topic_arg

if TYPE_CHECKING:
    from ..client.remoting import RemotingClient
    from ..codec import BatchEntry

_MAX_BATCH_MESSAGES = 128
_MAX_BATCH_BYTES = 1 << 20


def add_commands(sub: argparse._SubParsersAction[Parser], client: Parser) -> None:
    p = sub.add_parser("produce", parents=[client], help="send generated messages or JSON lines from a file/stdin",
                       description="Send messages, round-robin over the topic's queues, with a progress bar "
                                   "on stderr (when it is a terminal). JSON lines: one object per line with "
                                   "body (string, or any JSON value sent as JSON text), tag, keys (string or "
                                   "list), properties (object).")
    p.add_argument("-t", "--topic", required=True, type=topic_arg)
    p.add_argument("-c", "--count", type=positive_int_arg, default=None, help="messages to generate (default 1000)")
    p.add_argument("-s", "--size", type=positive_int_arg, default=None, help="body bytes per generated message (256)")
    p.add_argument("--tags", default="TagA,TagB", help="tags of generated messages, cycled (default TagA,TagB; "
                                                       "'' for none)")
    p.add_argument("--key-prefix", default="key-", help="generated keys: PREFIX<i> (default key-; '' for none)")
    p.add_argument("-f", "--file", help="JSON-lines file to send ('-' = stdin)")
    p.add_argument("--batch", type=positive_int_arg, default=_MAX_BATCH_MESSAGES,
                   help=f"messages per batch send (default {_MAX_BATCH_MESSAGES})")
    p.set_defaults(func=_cmd_produce)


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """A plain-text progress bar on a TTY: ``\\r[#####     ] 5000/10000 12,345 msg/s``.

    Drawn only when the stream is a terminal (at most every ``interval_s``); otherwise
    silent, and the caller prints a summary line. ``total=None``: a counter and a rate.
    """

    def __init__(self, total: int | None, *, unit: str = "msg", stream: IO[str] | None = None,
                 width: int = 30, interval_s: float = 0.1) -> None:
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.interval_s = interval_s
        self.enabled = _isatty(self.stream)
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_len = 0

    def render(self, done: int) -> str:
        rate = done / max(time.monotonic() - self.t0, 1e-6)
        if self.total:
            filled = min(self.width, self.width * done // self.total)
            return f"[{'#' * filled}{' ' * (self.width - filled)}] {done}/{self.total} {rate:,.0f} {self.unit}/s"
        return f"{done} {self.unit} {rate:,.0f} {self.unit}/s"

    def update(self, done: int, *, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw < self.interval_s:
            return
        self._last_draw = now
        text = self.render(done)
        pad = max(0, self._last_len - len(text))
        self._last_len = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def close(self, done: int) -> None:
        if self.enabled:
            self.update(done, force=True)
            self.stream.write("\n")
            self.stream.flush()



@dataclass(slots=True)
class Message:
    body: bytes
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: dict[str, str] | None = None


class _UniqKeys:
    """Client message ids (UNIQ_KEY): 32 hex digits, unique per producer run."""

    def __init__(self) -> None:
        self.prefix = os.urandom(11).hex().upper()
        self.seq = 0

    def next(self) -> str:
        self.seq += 1
        return f"{self.prefix}{self.seq:010X}"


def _entry(msg: Message, uniq: _UniqKeys) -> BatchEntry:
    from ..codec import BatchEntry, encode_properties

    props: dict[str, str] = dict(msg.properties or {})
    if msg.tag:
        props["TAGS"] = msg.tag
    keys = " ".join(k for k in msg.keys if k)
    if keys:
        props["KEYS"] = keys
    props["UNIQ_KEY"] = uniq.next()
    return BatchEntry(msg.body, encode_properties(props))


def send_messages(client: RemotingClient, topic: str, messages: Iterable[Message], total: int | None,
                   *, batch_size: int = _MAX_BATCH_MESSAGES) -> tuple[int, int, int, float]:
    """Send message i to writable queue i mod n (round-robin, as producers do), in batches of up
    to ``batch_size`` messages / 1 MiB per queue, drawing a progress bar.

    Returns (messages, body bytes, queues, seconds).
    """
    queues = client.message_queues(topic, writable=True)
    if not queues:
        raise CliError(f"topic {topic!r} has no writable queue: recreate it with `{PROG} topic create {topic}`")
    uniq = _UniqKeys()
    bar = ProgressBar(total)
    pending: list[list[Any]] = [[] for _ in queues]
    sizes = [0] * len(queues)
    sent = 0
    nbytes = 0

    def flush(qi: int) -> None:
        nonlocal sent
        batch = pending[qi]
        client.send_batch(queues[qi], batch)
        sent += len(batch)
        pending[qi], sizes[qi] = [], 0
        bar.update(sent)

    t0 = time.monotonic()
    try:
        for i, msg in enumerate(messages):
            qi = i % len(queues)
            e = _entry(msg, uniq)
            esize = len(e.body) + len(e.properties) + 32
            if pending[qi] and (len(pending[qi]) >= batch_size or sizes[qi] + esize > _MAX_BATCH_BYTES):
                flush(qi)
            pending[qi].append(e)
            sizes[qi] += esize
            nbytes += len(e.body)
        for qi in range(len(queues)):
            if pending[qi]:
                flush(qi)
    finally:
        bar.close(sent)
    return sent, nbytes, len(queues), time.monotonic() - t0


def _generated(count: int, size: int, tags: Sequence[str], key_prefix: str) -> Iterator[Message]:
    filler = (b"abcdefghijklmnopqrstuvwxyz0123456789" * (size // 36 + 2))
    for i in range(count):
        head = b"msg-%08d " % i
        body = (head + filler)[:size]
        yield Message(body, tags[i % len(tags)] if tags else None, [f"{key_prefix}{i}"] if key_prefix else [])


_JSON_FIELDS = ("body", "tag", "keys", "properties")


def _read_jsonl(path: str) -> list[Message]:
    """Every line of ``path`` (``-`` = stdin) as a message; checked before anything is sent."""
    name = "stdin" if path == "-" else path
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    out: list[Message] = []
    try:
        for lineno, line in enumerate(stream, 1):
            if not line.strip():
                continue
            where = f"line {lineno} of {name}"
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise CliError(f"{where} is not JSON ({exc.args[0]}): each line must be an object like "
                               '{"body": "...", "tag": "TagA", "keys": ["k1"], "properties": {"p": "v"}}') from None
            if not isinstance(obj, dict):
                raise CliError(f"{where} is a JSON {type(obj).__name__}, not an object with a body field")
            unknown = sorted(set(obj) - set(_JSON_FIELDS))
            if unknown:
                raise CliError(f"{where}: unknown field(s) {', '.join(unknown)}; the fields are "
                               + ", ".join(_JSON_FIELDS))
            if "body" not in obj or obj["body"] is None:
                raise CliError(f"{where} has no body field: every message needs one")
            body = obj["body"]
            data = body.encode() if isinstance(body, str) else json.dumps(body, separators=(",", ":")).encode()
            tag = obj.get("tag")
            if tag is not None and not isinstance(tag, str):
                raise CliError(f"{where}: tag must be a string")
            keys = obj.get("keys") or []
            if isinstance(keys, str):
                keys = keys.split()
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise CliError(f"{where}: keys must be a string or a list of strings")
            props = obj.get("properties") or {}
            if not isinstance(props, dict):
                raise CliError(f"{where}: properties must be an object of string values")
            out.append(Message(data, tag or None, keys, {str(k): str(v) for k, v in props.items()}))
    finally:
        if stream is not sys.stdin:
            stream.close()
    return out


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError("unreachable")


def _cmd_produce(args: argparse.Namespace) -> int:
    if args.file is not None and (args.count is not None or args.size is not None):
        raise CliError("--count/--size generate messages and --file reads them: pass one or the other")
    messages: Iterable[Message]
    if args.file is not None:
        items = _read_jsonl(args.file)
        messages, total, what = items, len(items), f"from {'stdin' if args.file == '-' else args.file}"
    else:
        count = args.count or 1000
        size = args.size or 256
        if size > 4 * 1024 * 1024:
            raise CliError(f"--size {size} is over the 4 MiB a broker accepts per message: pass a smaller size")
        tags = [t for t in args.tags.split(",") if t.strip()] if args.tags else []
        messages, total, what = _generated(count, size, tags, args.key_prefix), count, "generated"
    ns = namesrv_of(args)
    client = make_client(ns, args)
    try:
        try:
            sent, nbytes, nq, secs = send_messages(client, args.topic, messages, total, batch_size=args.batch)
        except TopicNotFoundError:
            raise CliError(f"topic {args.topic!r} does not exist on {ns} (and the broker does not auto-create "
                           f"topics): create it with `{PROG} topic create {args.topic}`") from None
    finally:
        client.close()
    rate = sent / max(secs, 1e-6)
    print(f"produced {sent:,} messages ({what}, {fmt_bytes(nbytes)}) to {args.topic} over {nq} queues "
          f"in {secs:.2f}s, {rate:,.0f} msg/s")
    return 0
