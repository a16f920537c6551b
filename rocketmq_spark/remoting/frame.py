"""Remoting frames: ``RemotingCommand`` and its two header encodings.

Wire layout (big-endian)::

    int32 total length           everything after this field
    int32 header word            high byte: serialize type (0 JSON, 1 ROCKETMQ binary),
                                 low 3 bytes: header length
    header bytes
    body bytes                   total - 4 - header length

Decoding accepts both header types. Responses are encoded in the serialize type
of the request they answer (``RemotingCommand.response_to`` copies it).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from orjson import loads as _orjson_loads

from ..errors import FrameTooLargeError, ProtocolError
from .codes import LanguageCode

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FLAG_ONEWAY",
    "FLAG_RESPONSE",
    "SERIALIZE_JSON",
    "SERIALIZE_ROCKETMQ",
    "RemotingCommand",
    "decode_frame",
    "plain_json",
    "read_frame_length",
    "send_success_frame",
    "success_frame",
]

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
#: Default cap on one frame's length prefix (bytes after the prefix).
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
#: Version we announce: the value of Java's V4_9_4 constant family; peers only log it.
PROTOCOL_VERSION = 435

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_LANG_BY_CODE = {m.value: m.name for m in LanguageCode}


def _plain(s: object) -> bool:
    """A str that JSON writes as is between quotes (printable ASCII, no quote or backslash)."""
    return type(s) is str and s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


#: languages peers announce (written as they are, without a check each time)
_PLAIN_LANGUAGES = frozenset({"JAVA", "PYTHON", "CPP", "GO", "OTHER"})


def _escape_separators(s: str) -> str:
    """The property separators (\\x01 between key and value, \\x02 after each pair) as JSON
    writes them."""
    return s if s.isprintable() else s.replace("\x01", "\\u0001").replace("\x02", "\\u0002")


def plain_json(s: str) -> str | None:
    """``s`` as a JSON string's content when only the property separators need escaping (as
    json.dumps escapes them), None otherwise."""
    if not s.isascii() or '"' in s or "\\" in s:
        return None
    if not s.isprintable():
        s = _escape_separators(s)
        if not s.isprintable():
            return None
    return s


def success_frame(opaque: int, ext_fields: dict[str, str] | None = None) -> bytes | None:
    """The encoded SUCCESS response (JSON header, language JAVA, no remark, no body) to the
    request ``opaque``, byte for byte what ``req.response_to(0, ext_fields).encode()`` gives a
    JSON request, without building the command (a broker answers thousands a second); None
    when a field needs escaping (build the command then)."""
    ext = ""
    if ext_fields:
        try:
            joined = "".join(ext_fields) + "".join(ext_fields.values())
        except TypeError:
            return None
        if not _plain(joined):
            return None
        ext = ',"extFields":{' + ",".join(f'"{k}":"{v}"' for k, v in ext_fields.items()) + "}"
    header = (f'{{"code":0,"language":"JAVA","version":{PROTOCOL_VERSION},"opaque":{opaque},"flag":{FLAG_RESPONSE}'
              f'{ext},"serializeTypeCurrentRPC":"JSON"}}').encode()
    return _U32.pack(4 + len(header)) + _U32.pack(len(header)) + header


#: what a send's SUCCESS answer header holds before and after its fields (see send_success_frame)
_SENT_HEAD = f'{{"code":0,"language":"JAVA","version":{PROTOCOL_VERSION},"opaque":'
_SENT_TAIL = '"},"serializeTypeCurrentRPC":"JSON"}'


def send_success_frame(opaque: int, msg_id: str, queue_id: int, queue_offset: int, region: str,
                       transaction_id: str) -> bytes | None:
    """:func:`success_frame` of a single send's answer fields (msgId, queueId, queueOffset,
    MSG_REGION, TRACE_ON true, transactionId, in that order), written from a template: a
    broker answers thousands of half messages a second. None when a field needs escaping."""
    if not (_plain(transaction_id) and _plain(msg_id) and _plain(region)):
        return None
    header = (f'{_SENT_HEAD}{opaque},"flag":{FLAG_RESPONSE},"extFields":{{"msgId":"{msg_id}","queueId":"{queue_id}",'
              f'"queueOffset":"{queue_offset}","MSG_REGION":"{region}","TRACE_ON":"true",'
              f'"transactionId":"{transaction_id}{_SENT_TAIL}').encode()
    n = len(header)
    return _U32.pack(4 + n) + _U32.pack(n) + header


_I31 = 1 << 31


def _json_header(header: bytes) -> Any:
    """``json.loads(header)``, its errors as ProtocolError: the exact reading behind
    :meth:`RemotingCommand._decode_json_fields`, which takes the headers the usual orjson read
    of :meth:`RemotingCommand._decode_json_header` does not (orjson makes a float of an integer
    past 64 bits, and refuses NaN or a lone surrogate, which json takes)."""
    try:
        return json.loads(header)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed JSON header: {exc}") from None


def _header_int(obj: dict[str, Any], key: str, default: int | None) -> int:
    """A header number as Java reads it into an int: integral and within 32 bits."""
    raw = obj.get(key)
    if type(raw) is int and -(1 << 31) <= raw < (1 << 31):  # the usual case, checked first
        return raw
    if raw is None and default is not None:
        raw = default
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ProtocolError(f"JSON header field {key}={raw!r} is not a number (a 32-bit integer is accepted)")
    try:
        value = int(raw)
    except (ValueError, OverflowError):
        raise ProtocolError(f"JSON header field {key}={raw!r} is not a 32-bit integer") from None
    if isinstance(raw, float) and value != raw or not -(1 << 31) <= value < (1 << 31):
        raise ProtocolError(f"JSON header field {key}={raw!r} is not a 32-bit integer")
    return value


def _ext_str(value: Any) -> str:
    """extFields values arrive as strings, numbers or booleans depending on the client."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


@dataclass(slots=True)
class RemotingCommand:
    """One request or response. ``ext_fields`` values are always strings."""

    code: int
    opaque: int = 0
    flag: int = 0
    ext_fields: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    remark: str | None = None
    language: str = "PYTHON"
    version: int = PROTOCOL_VERSION
    serialize_type: int = SERIALIZE_JSON
    #: (``ext_fields``, those fields as the JSON header writes them between its braces), set by
    #: a builder that writes them faster than the encoder (a send per message); used while
    #: ``ext_fields`` is that very dict, so fields are changed by giving a new dict, never in place
    ext_json: tuple[dict[str, str], str] | None = field(default=None, repr=False, compare=False)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    def response_to(
        self,
        code: int = 0,
        ext_fields: dict[str, str] | None = None,
        body: bytes = b"",
        remark: str | None = None,
    ) -> RemotingCommand:
        """Build the response to this request: same opaque and serialize type."""
        return RemotingCommand(
            code=code,
            opaque=self.opaque,
            flag=FLAG_RESPONSE,
            ext_fields=ext_fields or {},
            body=body,
            remark=remark,
            language="JAVA",
            serialize_type=self.serialize_type,
        )

    # -- encoding -----------------------------------------------------------------

    def encode_header(self) -> bytes:
        if self.serialize_type == SERIALIZE_ROCKETMQ:
            return self._encode_binary_header()
        fast = self._encode_plain_json_header()
        return fast if fast is not None else self._dump_json_header()

    def _dump_json_header(self) -> bytes:
        header: dict[str, Any] = {
            "code": self.code,
            "language": self.language,
            "version": self.version,
            "opaque": self.opaque,
            "flag": self.flag,
        }
        if self.remark is not None:
            header["remark"] = self.remark
        if self.ext_fields:
            header["extFields"] = self.ext_fields
        header["serializeTypeCurrentRPC"] = "JSON"
        return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()

    def _encode_plain_json_header(self) -> bytes | None:
        """The JSON header written directly when no string in it needs escaping but for the
        property separators (a batch response's msgId list runs to ~17 KB, which json.dumps
        would scan char by char; a send's properties come once per message); byte for byte
        what :meth:`_dump_json_header` writes. None: take that path."""
        for n in (self.code, self.version, self.opaque, self.flag):
            if not isinstance(n, int) or type(n) is bool:
                return None
        language, remark = self.language, self.remark
        if (language not in _PLAIN_LANGUAGES and not _plain(language)) or (remark is not None and not _plain(remark)):
            return None
        fields = self.ext_fields
        ext = ""
        cached = self.ext_json
        if cached is not None and cached[0] is fields:
            ext = f',"extFields":{{{cached[1]}}}'
        elif fields:
            try:  # keys and values must be strings (json.dumps writes anything else)
                "".join(fields)
                "".join(fields.values())
            except TypeError:
                return None
            body = ",".join([f'"{k}":"{v}"' for k, v in fields.items()])
            # one check of every key and value at once: ASCII, no backslash, no quote but ours
            if not body.isascii() or "\\" in body or body.count('"') != 4 * len(fields):
                return None
            if not body.isprintable():
                # the property separators, escaped as json.dumps escapes them (in a key too)
                body = _escape_separators(body)
                if not body.isprintable():
                    return None
            ext = f',"extFields":{{{body}}}'
        rem = "" if remark is None else f',"remark":"{remark}"'
        # request codes are IntEnums: int() writes their number
        return (f'{{"code":{int(self.code)},"language":"{language}","version":{int(self.version)},'
                f'"opaque":{int(self.opaque)},"flag":{int(self.flag)}{rem}{ext},"serializeTypeCurrentRPC":"JSON"}}'
                ).encode()

    def _encode_binary_header(self) -> bytes:
        lang = LanguageCode.__members__.get(self.language, LanguageCode.OTHER).value
        parts = [_BIN_FIXED.pack(self.code, lang, self.version, self.opaque, self.flag)]
        remark = (self.remark or "").encode()
        parts.append(_I32.pack(len(remark)))
        parts.append(remark)
        ext = bytearray()
        for key, value in self.ext_fields.items():
            k = key.encode()
            v = _ext_str(value).encode()
            ext += struct.pack(">h", len(k)) + k + _I32.pack(len(v)) + v
        parts.append(_I32.pack(len(ext)))
        parts.append(bytes(ext))
        return b"".join(parts)

    def encode(self) -> bytes:
        """The whole frame, length prefix included."""
        header = self.encode_header()
        total = 4 + len(header) + len(self.body)
        word = (self.serialize_type << 24) | (len(header) & 0xFFFFFF)
        return b"".join((_U32.pack(total), _U32.pack(word), header, self.body))

    # -- decoding -----------------------------------------------------------------

    @classmethod
    def decode(cls, data: bytes | memoryview) -> RemotingCommand:
        """Decode a frame without its 4-byte length prefix."""
        if len(data) < 4:
            raise ProtocolError(f"frame of {len(data)} bytes is shorter than its header word")
        (word,) = _U32.unpack_from(data, 0)
        ser = word >> 24
        header_len = word & 0xFFFFFF
        if header_len > len(data) - 4:
            raise ProtocolError(
                f"header length {header_len} exceeds the frame's {len(data) - 4} bytes"
            )
        if ser == SERIALIZE_JSON:
            cmd = cls._decode_json_header(data[4 : 4 + header_len])
        elif ser == SERIALIZE_ROCKETMQ:
            cmd = cls._decode_binary_header(bytes(data[4 : 4 + header_len]))
            cmd.serialize_type = ser
        else:
            raise ProtocolError(f"unknown serialize type {ser} (accepted: 0 JSON, 1 ROCKETMQ)")
        if len(data) > 4 + header_len:
            cmd.body = bytes(data[4 + header_len :])
        return cmd

    @classmethod
    def _decode_json_header(cls, header: bytes | memoryview) -> RemotingCommand:
        """The command of a JSON header. The usual header (four 32-bit ints, string extFields,
        remark and language) is read from orjson's parse (the broker and the client decode a
        header per message: 1.2 against 2.5 µs with json for a half message's). orjson makes a
        float of an integer past 64 bits: in a field read here that sends the header the general
        way (:meth:`_decode_json_fields`, json's exact reading), in one not read it changes
        nothing."""
        try:
            obj = _orjson_loads(header)
        except ValueError:
            obj = None
        if type(obj) is dict:
            get = obj.get
            code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
            ext, remark, language = get("extFields"), get("remark"), get("language", "JAVA")
            if (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
                    and -_I31 <= code < _I31 and -_I31 <= opaque < _I31 and -_I31 <= flag < _I31
                    and -_I31 <= version < _I31 and type(language) is str and (remark is None or type(remark) is str)):
                if ext is None:
                    return cls(code, opaque, flag, {}, b"", remark, language, version)
                if type(ext) is dict:
                    try:  # JSON keys are always strings; values usually are: one C pass tells
                        "".join(ext.values())
                    except TypeError:
                        pass
                    else:
                        return cls(code, opaque, flag, ext, b"", remark, language, version)
        header = bytes(header)  # a refusal's traceback must not hold a view of the connection's buffer
        return cls._decode_json_fields(header)

    @classmethod
    def _decode_json_fields(cls, header: bytes) -> RemotingCommand:
        """:meth:`_decode_json_header` of any header: each field checked, the errors worded."""
        obj = _json_header(header)
        if not isinstance(obj, dict):
            raise ProtocolError("JSON header is not an object")
        if "code" not in obj:
            raise ProtocolError("JSON header has no code")
        code, opaque, flag, version = obj["code"], obj.get("opaque", 0), obj.get("flag", 0), obj.get("version", 0)
        # the usual header: four ints in range (checked at once; anything else goes field by field)
        if not (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
                and -_I31 <= code < _I31 and -_I31 <= opaque < _I31 and -_I31 <= flag < _I31
                and -_I31 <= version < _I31):
            code = _header_int(obj, "code", None)
            opaque = _header_int(obj, "opaque", 0)
            flag = _header_int(obj, "flag", 0)
            version = _header_int(obj, "version", 0)
        ext = obj.get("extFields") or {}
        if type(ext) is not dict:
            raise ProtocolError("extFields is not an object")
        if ext:
            try:  # JSON keys are always strings; values usually are: one C pass tells
                "".join(ext.values())
            except TypeError:
                ext = {k: _ext_str(v) for k, v in ext.items()}
        remark = obj.get("remark")
        language = obj.get("language", "JAVA")
        return cls(code, opaque, flag, ext, b"", None if remark is None else str(remark),
                   language if type(language) is str else str(language), version)

    @classmethod
    def _decode_binary_header(cls, header: bytes) -> RemotingCommand:
        try:
            code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
            pos = _BIN_FIXED.size
            (remark_len,) = _I32.unpack_from(header, pos)
            pos += 4
            if remark_len < 0 or pos + remark_len > len(header):
                raise ProtocolError(f"remark length {remark_len} out of bounds")
            remark = header[pos : pos + remark_len].decode() if remark_len else None
            pos += remark_len
            (ext_len,) = _I32.unpack_from(header, pos)
            pos += 4
            end = pos + ext_len
            if ext_len < 0 or end > len(header):
                raise ProtocolError(f"extFields length {ext_len} out of bounds")
            ext: dict[str, str] = {}
            while pos < end:
                (klen,) = struct.unpack_from(">h", header, pos)
                pos += 2
                key = header[pos : pos + klen].decode()
                pos += klen
                (vlen,) = _I32.unpack_from(header, pos)
                pos += 4
                if klen < 0 or vlen < 0 or pos + vlen > end:
                    raise ProtocolError("extFields entry out of bounds")
                ext[key] = header[pos : pos + vlen].decode()
                pos += vlen
        except (struct.error, UnicodeDecodeError) as exc:
            raise ProtocolError(f"malformed ROCKETMQ header: {exc}") from None
        return cls(
            code=code,
            opaque=opaque,
            flag=flag,
            ext_fields=ext,
            remark=remark,
            language=_LANG_BY_CODE.get(lang, "OTHER"),
            version=version,
        )


def read_frame_length(prefix: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> int:
    """Validate a 4-byte length prefix before anything is allocated for the frame."""
    (length,) = _U32.unpack(prefix)
    if length > max_frame:
        raise FrameTooLargeError(f"frame of {length} bytes exceeds the cap of {max_frame} bytes")
    if length < 4:
        raise ProtocolError(f"frame length {length} is shorter than the header word")
    return length


def decode_frame(frame: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> RemotingCommand:
    """Decode one whole frame, length prefix included (tests and tools)."""
    if len(frame) < 4:
        raise ProtocolError("frame shorter than its length prefix")
    length = read_frame_length(frame[:4], max_frame)
    if len(frame) - 4 != length:
        raise ProtocolError(f"frame announces {length} bytes but carries {len(frame) - 4}")
    return RemotingCommand.decode(memoryview(frame)[4:])
