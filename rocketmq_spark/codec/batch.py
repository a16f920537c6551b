"""Batch send bodies (SEND_BATCH_MESSAGE): per message ``int32 total | int32 magic |
int32 bodyCRC | int32 flag | int32 bodyLen | body | int16 propsLen | props``, laid end to end
(:data:`ENTRY_FIELDS` defines it for every walk of it). The broker's vectorised reading of
such bodies is :mod:`.batch_kernels`, the writer's vectorised encoding ``sink/encode.py``."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProtocolError
from .properties import decode_properties
from .record import MAX_PROPERTIES_BYTES, PROPERTIES_LENGTH_BYTES

__all__ = ["ENTRY_FIELDS", "ENTRY_HEAD", "ENTRY_OFFSETS", "BatchEntry", "EncodedBatch", "batch_entries",
           "decode_batch", "encode_batch"]

#: The head of a batch entry, field by field: (name, struct code). The body (bodyLength bytes),
#: the properties' length (an int16, as in a record: PROPERTIES_LENGTH_BYTES) and the properties
#: follow.
ENTRY_FIELDS: tuple[tuple[str, str], ...] = (
    ("totalSize", "i"), ("magic", "i"), ("bodyCRC", "i"), ("flag", "i"), ("bodyLength", "i"),
)
ENTRY_HEAD = struct.Struct(">" + "".join(code for _, code in ENTRY_FIELDS))
#: byte offsets of the head's fields in an entry
ENTRY_OFFSETS = {name: struct.calcsize(">" + "".join(c for _, c in ENTRY_FIELDS[:i]))
                 for i, (name, _) in enumerate(ENTRY_FIELDS)}
_I16 = struct.Struct(">h")


@dataclass(slots=True)
class BatchEntry:
    """One message of a batch send body (before the broker stores it): ``properties`` as
    ``key\\x01value\\x02`` text, ``flag`` the producer's message flag."""

    body: bytes
    properties: str = ""
    flag: int = 0

    def property_map(self) -> dict[str, str]:
        """The properties as a dict (:func:`~.properties.decode_properties`)."""
        return decode_properties(self.properties)


@dataclass(frozen=True, slots=True)
class EncodedBatch:
    """Plain messages already laid out as a batch body (see :func:`encode_batch`), ``count``
    of them; sent as one SEND_BATCH_MESSAGE like a list of :class:`BatchEntry`."""

    body: bytes
    count: int

    def __len__(self) -> int:
        return self.count

    def entries(self) -> list[BatchEntry]:
        """The messages one by one (for a transport that does not send batch bodies)."""
        return decode_batch(self.body)


def batch_entries(entries: list[BatchEntry] | EncodedBatch) -> list[BatchEntry]:
    """``entries`` as a list, an :class:`EncodedBatch` decoded."""
    return entries.entries() if isinstance(entries, EncodedBatch) else entries


def encode_batch(entries: list[BatchEntry]) -> bytes:
    """A batch body: per message int32 total, magic, bodyCRC, flag, bodyLen+body, int16 propLen+props.

    magic and bodyCRC are written as 0. A message's properties must fit 32767 bytes (UTF-8):
    longer ones raise :class:`ProtocolError` naming the message (a record stores their length
    as an int16, so brokers refuse them too)."""
    out = bytearray()
    for i, e in enumerate(entries):
        props = e.properties.encode()
        if len(props) > MAX_PROPERTIES_BYTES:
            raise ProtocolError(f"message {i} of the batch has {len(props)} bytes of properties; at most "
                                f"{MAX_PROPERTIES_BYTES} are accepted (a record stores their length as an int16)")
        total = ENTRY_HEAD.size + len(e.body) + PROPERTIES_LENGTH_BYTES + len(props)
        out += ENTRY_HEAD.pack(total, 0, 0, e.flag, len(e.body))
        out += e.body
        out += _I16.pack(len(props))
        out += props
    return bytes(out)


def decode_batch(body: bytes | memoryview) -> list[BatchEntry]:
    """Inverse of :func:`encode_batch`; rejects entries that overrun their total size."""
    out: list[BatchEntry] = []
    pos = 0
    n = len(body)
    try:
        while pos < n:
            total, _magic, _crc, flag, body_len = ENTRY_HEAD.unpack_from(body, pos)
            end = pos + total
            p = pos + ENTRY_HEAD.size
            if (total < ENTRY_HEAD.size + PROPERTIES_LENGTH_BYTES or end > n or body_len < 0
                    or p + body_len + PROPERTIES_LENGTH_BYTES > end):
                raise ProtocolError(f"batch entry at byte {pos} overruns the body ({total} bytes)")
            msg_body = bytes(body[p : p + body_len])
            p += body_len
            (props_len,) = _I16.unpack_from(body, p)
            p += PROPERTIES_LENGTH_BYTES
            if props_len < 0 or p + props_len > end:
                raise ProtocolError(f"batch entry properties at byte {pos} overrun the entry")
            props = bytes(body[p : p + props_len]).decode()
            out.append(BatchEntry(body=msg_body, properties=props, flag=flag))
            pos = end
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed batch body at byte {pos}: {exc}") from None
    return out
