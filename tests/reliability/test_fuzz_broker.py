"""Bad input against the embedded broker over real sockets: 10,000 malformed frames (100,000
with ``--soak``) from a seeded generator (``tests/fuzz_frames.py``) at the broker and its name server.

While they arrive the broker must keep serving a well-behaved client, answer every well-framed
request on the connection it came on (an error code is fine, silence or a dropped connection
is not), close only the connection of a frame it cannot parse, never crash a handler with an
unexpected exception, and leave the store as it was: the reference topic's messages and the
group's offsets are checked byte for byte at the end.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from fuzz_frames import OPAQUE_LIMIT, FuzzFrame, frames
from rocketmq_spark import EmbeddedBroker
from rocketmq_spark.client import RemotingClient
from rocketmq_spark.codec import BatchEntry, decode_records
from rocketmq_spark.remoting.codes import RequestCode
from rocketmq_spark.remoting.frame import DEFAULT_MAX_FRAME, RemotingCommand, decode_frame

pytestmark = [pytest.mark.integration, pytest.mark.reliability]

SEED = 20261123
REF_TOPIC = "FuzzReference"
REF_GROUP = "FuzzReferenceGroup"
PER_QUEUE = 50
CHUNK = 64  # well-framed frames written back to back on one connection before a probe


class RawPeer:
    """A bare socket: writes any bytes, reads frames back."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def frames_until(self, opaque: int | None, timeout_s: float) -> tuple[list[RemotingCommand], bool]:
        """Frames read until one answers ``opaque`` (or, for None, until the peer closes);
        the bool says whether the peer closed the connection."""
        got: list[RemotingCommand] = []
        deadline = time.monotonic() + timeout_s
        while True:
            while len(self.buf) >= 4:
                (n,) = struct.unpack_from(">I", self.buf)
                if len(self.buf) < 4 + n:
                    break
                cmd = decode_frame(bytes(self.buf[: 4 + n]))
                del self.buf[: 4 + n]
                got.append(cmd)
                if opaque is not None and cmd.is_response and cmd.opaque == opaque:
                    return got, False
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no answer to opaque {opaque} within {timeout_s}s ({len(got)} frames read)")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return got, True
            self.buf += data


class HandlerCrashes(logging.Handler):
    """Records tracebacks: the broker's "request code N failed" (a handler raised something
    other than the ValueError it answers bad fields with) and asyncio's "Fatal error:
    protocol.data_received() call failed" (the frame decoder raised something other than
    ProtocolError)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


@pytest.fixture()
def fuzz_broker(tmp_path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(str(tmp_path / "store"), grpc_port=None) as mq:
        yield mq


def _is_int(raw: str | None, value: int) -> bool:
    try:
        return raw is not None and int(raw) == value
    except ValueError:
        return False


def _probe(opaque: int) -> bytes:
    return RemotingCommand(RequestCode.GET_MAX_OFFSET, opaque=opaque,
                           ext_fields={"topic": REF_TOPIC, "queueId": "0"}).encode()


def _fuzz(addr: str, batch: list[FuzzFrame], stats: Counter[str], probe_opaque: int,
          unanswered: list[FuzzFrame]) -> None:
    """Well-framed frames go back to back on one connection followed by a probe, which must be
    answered on that same connection; each broken frame gets a connection of its own, which the
    broker may answer and must close (after our half-close at the latest)."""
    framed = [f for f in batch if f.framed]
    if framed:
        peer = RawPeer(addr)
        try:
            peer.sock.sendall(b"".join(f.data for f in framed) + _probe(probe_opaque))
            got, closed = peer.frames_until(probe_opaque, 30)
        finally:
            peer.close()
        assert not closed, f"the broker closed a connection over well-framed requests {[f.index for f in framed]}"
        answered = {c.opaque for c in got if c.is_response}
        for f in framed:
            stats["framed"] += 1
            cmd = decode_frame(f.data)
            if cmd.opaque in answered:
                stats["framed answered"] += 1
            elif (f.oneway or cmd.code == RequestCode.PULL_MESSAGE
                  or cmd.code == RequestCode.END_TRANSACTION and _is_int(cmd.ext_fields.get("commitOrRollback"), 0)):
                # no answer due (yet): oneway, a pull held for long polling, or an END_TRANSACTION
                # saying "unknown yet" (Java's broker answers none either; its check-back asks again)
                stats["framed oneway, held or not answered by design"] += 1
            else:
                unanswered.append(f)
    for f in batch:
        if f.framed:
            continue
        peer = RawPeer(addr)
        try:
            try:
                peer.sock.sendall(f.data)
                peer.sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the broker already refused the prefix and closed
            got, closed = peer.frames_until(None, 10)
        finally:
            peer.close()
        stats["broken"] += 1
        assert closed
        stats["broken answered" if got else "broken closed silently"] += 1


def test_malformed_frames_do_not_hurt_the_broker(fuzz_broker: EmbeddedBroker, soak: bool,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    total = 100_000 if soak else 10_000
    # tens of thousands of expected warnings; crashes are caught below
    caplog.set_level(logging.CRITICAL, logger="rocketmq_spark")
    caplog.set_level(logging.CRITICAL, logger="asyncio")
    crashes = HandlerCrashes()
    for name in ("rocketmq_spark.broker", "asyncio"):
        logging.getLogger(name).addHandler(crashes)
    client = RemotingClient(fuzz_broker.namesrv_addr)
    try:
        client.create_topic(REF_TOPIC, 4)
        qs = client.message_queues(REF_TOPIC, refresh=True)
        for q in qs:
            client.send_batch(q, [BatchEntry(f"ref-{q.queue_id}-{i}".encode()) for i in range(PER_QUEUE)])
        client.create_group(REF_GROUP)
        assert client.update_consumer_offsets(REF_GROUP, {q: 10 + q.queue_id for q in qs}) == {}
        stats: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        live_sends = 0
        batch: list[FuzzFrame] = []
        unanswered: list[FuzzFrame] = []
        started = time.monotonic()
        for f in frames(SEED, total, DEFAULT_MAX_FRAME):
            kinds[f.kind.split(" code ")[0]] += 1
            batch.append(f)
            if len(batch) < CHUNK:
                continue
            # four chunks in five at the broker, one at the name server
            addr = fuzz_broker.namesrv_addr if (f.index // CHUNK) % 5 == 4 else fuzz_broker.broker_addr
            _fuzz(addr, batch, stats, OPAQUE_LIMIT + f.index, unanswered)
            batch = []
            if (f.index // CHUNK) % 8 == 0:
                # a well-behaved client is served meanwhile, on its long-lived connection
                client.send(qs[1], b"live-%d" % live_sends)
                live_sends += 1
        if batch:
            _fuzz(fuzz_broker.broker_addr, batch, stats, OPAQUE_LIMIT + total, unanswered)
        elapsed = time.monotonic() - started

        assert stats["framed"] + stats["broken"] == total
        # every well-framed request got an answer, except oneway ones and pulls held for long polling
        assert not unanswered, "well-framed requests left unanswered: " + "; ".join(
            f"#{f.index} {decode_frame(f.data)!r}"[:300] for f in unanswered[:5])
        assert stats["framed answered"] > 0.9 * stats["framed"], stats
        assert not crashes.records, "handler crashes: " + "; ".join(
            f"{r.getMessage()}: {r.exc_info[1]!r}" for r in crashes.records[:10])  # type: ignore[index]
        # the store is as it was: every reference message, byte for byte, and the group's offsets
        for q in qs:
            extra = live_sends if q.queue_id == 1 else 0
            assert client.max_offset(q) == PER_QUEUE + extra
            body = client.pull(q, 0, 1024).body
            got = [m.payload() for m in decode_records(body)]
            want = [f"ref-{q.queue_id}-{i}".encode() for i in range(PER_QUEUE)]
            want += [b"live-%d" % i for i in range(extra)]
            assert got == want
        assert client.query_consumer_offsets(REF_GROUP, qs) == {q: 10 + q.queue_id for q in qs}
        logging.getLogger(__name__).info("fuzzed %d frames in %.1fs: %s; kinds %s", total, elapsed, dict(stats),
                                         dict(kinds))
    finally:
        for name in ("rocketmq_spark.broker", "asyncio"):
            logging.getLogger(name).removeHandler(crashes)
        client.close()
