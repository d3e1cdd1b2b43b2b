"""PostgreSQL frontend/backend protocol v3: reading frames, decoding and encoding messages.

Only the subset dpsql serves: startup (with SSL/GSS negotiation and cancel
requests), SASL authentication, the simple and extended query protocols, and
Terminate. Every decoder checks lengths and raises :class:`ProtocolViolation`
on malformed input, which closes that connection and never the server.
Specification: PostgreSQL documentation, chapter "Frontend/Backend Protocol".
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PROTOCOL_3 = 196608  # major 3, minor 0
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
STARTUP_LIMIT = 10_000  # as PostgreSQL: a startup packet is small

_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_UINT32 = struct.Struct("!I")
_HEADER = struct.Struct("!ci")


class ProtocolViolation(Exception):
    """The client sent bytes that are not a valid message (SQLSTATE 08P01)."""

    sqlstate = "08P01"


class MessageTooLarge(ProtocolViolation):
    """A message is larger than the server's cap (SQLSTATE 54000)."""

    sqlstate = "54000"


# -- reading frames ----------------------------------------------------------------------


async def read_startup(reader: asyncio.StreamReader) -> bytes:
    """The payload of a startup-phase packet (length-prefixed, no type byte)."""
    head = await reader.readexactly(4)
    (length,) = _INT32.unpack(head)
    if length < 8 or length > STARTUP_LIMIT:
        raise ProtocolViolation(f"invalid startup packet length {length}")
    return await reader.readexactly(length - 4)


async def read_message(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, bytes]:
    """One typed message: (type byte, payload). Lengths over ``limit`` raise."""
    head = await reader.readexactly(5)
    kind, length = _HEADER.unpack(head)
    if length < 4:
        raise ProtocolViolation(f"invalid message length {length}")
    if length - 4 > limit:
        raise MessageTooLarge(f"message of {length} bytes exceeds the server's limit of "
                              f"{limit} bytes")
    payload = await reader.readexactly(length - 4) if length > 4 else b""
    return kind, payload


# -- decoding -------------------------------------------------------------------------------


class Buffer:
    """A cursor over a payload with bounds-checked reads."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolViolation("message is shorter than its contents")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int16(self) -> int:
        """A signed 16-bit integer."""
        return int(_INT16.unpack(self._take(2))[0])

    def int32(self) -> int:
        """A signed 32-bit integer."""
        return int(_INT32.unpack(self._take(4))[0])

    def byte(self) -> bytes:
        """One byte."""
        return self._take(1)

    def cstring(self) -> str:
        """A NUL-terminated UTF-8 string."""
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise ProtocolViolation("unterminated string in message")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ProtocolViolation("invalid UTF-8 in message") from err

    def raw(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        return self._take(n)

    def rest(self) -> bytes:
        """Every byte left."""
        return self._take(len(self.data) - self.pos)

    def done(self) -> None:
        """Raise unless the whole payload was read."""
        if self.pos != len(self.data):
            raise ProtocolViolation("message has trailing bytes")


@dataclass(frozen=True)
class Startup:
    """A decoded startup-phase packet."""

    kind: str  # "startup", "ssl", "gss", "cancel"
    version: int = 0
    params: Mapping[str, str] = field(default_factory=dict)
    pid: int = 0
    key: int = 0


def decode_startup(payload: bytes) -> Startup:
    """Decode a StartupMessage, SSLRequest, GSSENCRequest or CancelRequest."""
    buf = Buffer(payload)
    code = buf.int32()
    if code == SSL_REQUEST:
        buf.done()
        return Startup("ssl")
    if code == GSSENC_REQUEST:
        buf.done()
        return Startup("gss")
    if code == CANCEL_REQUEST:
        pid, key = buf.int32(), buf.int32()
        buf.done()
        return Startup("cancel", pid=pid, key=key)
    if code >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: "
                                "dpsql speaks protocol 3")
    params: dict[str, str] = {}
    while True:
        name = buf.cstring()
        if not name:
            break
        params[name] = buf.cstring()
    buf.done()
    return Startup("startup", version=code, params=params)


def decode_query(payload: bytes) -> str:
    """Query ('Q'): the SQL text."""
    buf = Buffer(payload)
    text = buf.cstring()
    buf.done()
    return text


@dataclass(frozen=True)
class Parse:
    """A decoded Parse message."""
    name: str
    query: str
    param_types: tuple[int, ...]


def decode_parse(payload: bytes) -> Parse:
    """Parse ('P'): statement name, query text, declared parameter types."""
    buf = Buffer(payload)
    name, query = buf.cstring(), buf.cstring()
    count = buf.int16()
    if count < 0:
        raise ProtocolViolation("negative parameter count")
    types = tuple(buf.int32() & 0xFFFFFFFF for _ in range(count))
    buf.done()
    return Parse(name, query, types)


@dataclass(frozen=True)
class Bind:
    """A decoded Bind message."""
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]

    def param_format(self, index: int) -> int:
        """The format code of parameter ``index`` (one code applies to all)."""
        if not self.param_formats:
            return 0
        if len(self.param_formats) == 1:
            return self.param_formats[0]
        return self.param_formats[index]

    def result_format(self, index: int) -> int:
        """The format code of result column ``index`` (one code applies to all)."""
        if not self.result_formats:
            return 0
        if len(self.result_formats) == 1:
            return self.result_formats[0]
        return self.result_formats[index] if index < len(self.result_formats) else 0


def decode_bind(payload: bytes) -> Bind:
    """Bind ('B'): portal, statement, parameter values and formats."""
    buf = Buffer(payload)
    portal, statement = buf.cstring(), buf.cstring()
    formats = tuple(buf.int16() for _ in range(_count(buf)))
    values: list[bytes | None] = []
    for _ in range(_count(buf)):
        length = buf.int32()
        values.append(None if length == -1 else buf.raw(length))
    results = tuple(buf.int16() for _ in range(_count(buf)))
    buf.done()
    if any(f not in (0, 1) for f in formats + results):
        raise ProtocolViolation("format codes must be 0 (text) or 1 (binary)")
    if len(formats) not in (0, 1, len(values)):
        raise ProtocolViolation("parameter format count does not match the parameters")
    return Bind(portal, statement, formats, tuple(values), results)


def _count(buf: Buffer) -> int:
    count = buf.int16()
    if count < 0:
        raise ProtocolViolation("negative count in message")
    return count


def decode_target(payload: bytes) -> tuple[str, str]:
    """Describe ('D') and Close ('C'): ('S' statement | 'P' portal, name)."""
    buf = Buffer(payload)
    which = buf.byte().decode("latin-1")
    name = buf.cstring()
    buf.done()
    if which not in ("S", "P"):
        raise ProtocolViolation(f"invalid Describe/Close target {which!r}")
    return which, name


def decode_execute(payload: bytes) -> tuple[str, int]:
    """Execute ('E'): the portal and the row limit (0: all rows)."""
    buf = Buffer(payload)
    portal = buf.cstring()
    max_rows = buf.int32()
    buf.done()
    return portal, max(0, max_rows)


def decode_sasl_initial(payload: bytes) -> tuple[str, bytes]:
    """SASLInitialResponse: (mechanism, initial client data)."""
    buf = Buffer(payload)
    mechanism = buf.cstring()
    length = buf.int32()
    data = b"" if length == -1 else buf.raw(length)
    buf.done()
    return mechanism, data


# -- encoding -------------------------------------------------------------------------------


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + _INT32.pack(len(body) + 4) + body


def _cstr(text: str) -> bytes:
    return text.replace("\x00", "").encode("utf-8") + b"\x00"


def auth_ok() -> bytes:
    """AuthenticationOk."""
    return _message(b"R", _INT32.pack(0))


def auth_sasl(mechanisms: Sequence[str]) -> bytes:
    """AuthenticationSASL: the mechanisms offered."""
    return _message(b"R", _INT32.pack(10) + b"".join(_cstr(m) for m in mechanisms) + b"\x00")


def auth_sasl_continue(data: bytes) -> bytes:
    """AuthenticationSASLContinue: the server-first-message."""
    return _message(b"R", _INT32.pack(11) + data)


def auth_sasl_final(data: bytes) -> bytes:
    """AuthenticationSASLFinal: the server-final-message."""
    return _message(b"R", _INT32.pack(12) + data)


def parameter_status(name: str, value: str) -> bytes:
    """ParameterStatus: a reported run-time parameter and its value."""
    return _message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    """BackendKeyData: what a CancelRequest for this connection must carry."""
    return _message(b"K", _INT32.pack(pid) + _INT32.pack(key))


def negotiate_protocol_version(minor: int, unrecognized: Sequence[str]) -> bytes:
    """NegotiateProtocolVersion: the newest minor version served."""
    body = _INT32.pack(minor) + _INT32.pack(len(unrecognized))
    return _message(b"v", body + b"".join(_cstr(o) for o in unrecognized))


def ready_for_query(status: str) -> bytes:
    """ReadyForQuery with the transaction status (I, T or E)."""
    return _message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class FieldDescription:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int
    type_modifier: int = -1
    format: int = 0
    table_oid: int = 0
    column: int = 0


def row_description(fields: Sequence[FieldDescription]) -> bytes:
    """RowDescription: the columns of the rows that follow."""
    parts = [_INT16.pack(len(fields))]
    for f in fields:
        parts.append(_cstr(f.name) + struct.pack("!IhIhih", f.table_oid, f.column, f.type_oid,
                                                 f.type_size, f.type_modifier, f.format))
    return _message(b"T", b"".join(parts))


def data_row(values: Sequence[bytes | None]) -> bytes:
    """DataRow: one row's values (None is NULL)."""
    parts = [_INT16.pack(len(values))]
    for value in values:
        if value is None:
            parts.append(_INT32.pack(-1))
        else:
            parts.append(_INT32.pack(len(value)) + value)
    return _message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    """CommandComplete with its tag (``SELECT 3``, ``SET``)."""
    return _message(b"C", _cstr(tag))


def empty_query_response() -> bytes:
    """EmptyQueryResponse."""
    return _message(b"I")


def parse_complete() -> bytes:
    """ParseComplete."""
    return _message(b"1")


def bind_complete() -> bytes:
    """BindComplete."""
    return _message(b"2")


def close_complete() -> bytes:
    """CloseComplete."""
    return _message(b"3")


def no_data() -> bytes:
    """NoData."""
    return _message(b"n")


def portal_suspended() -> bytes:
    """PortalSuspended: Execute reached its row limit."""
    return _message(b"s")


def parameter_description(oids: Sequence[int]) -> bytes:
    """ParameterDescription: the type of each parameter."""
    return _message(b"t", _INT16.pack(len(oids)) + b"".join(_UINT32.pack(o) for o in oids))


def _fields(severity: str, code: str, message: str, detail: str | None, hint: str | None,
            position: int | None) -> bytes:
    parts = [b"S" + _cstr(severity), b"V" + _cstr(severity), b"C" + _cstr(code),
             b"M" + _cstr(message)]
    if detail:
        parts.append(b"D" + _cstr(detail))
    if hint:
        parts.append(b"H" + _cstr(hint))
    if position:
        parts.append(b"P" + _cstr(str(position)))
    return b"".join(parts) + b"\x00"


def error_response(code: str, message: str, *, severity: str = "ERROR",
                   detail: str | None = None, hint: str | None = None,
                   position: int | None = None) -> bytes:
    """ErrorResponse with a SQLSTATE and message (and hint, position)."""
    return _message(b"E", _fields(severity, code, message, detail, hint, position))


def notice_response(message: str, *, code: str = "00000", severity: str = "NOTICE") -> bytes:
    """NoticeResponse (NOTICE, WARNING) with a SQLSTATE and message."""
    return _message(b"N", _fields(severity, code, message, None, None, None))


def copy_out_response(columns: int) -> bytes:
    """CopyOutResponse: COPY data in text format follows, ``columns`` fields a row."""
    return _message(b"H", b"\x00" + _INT16.pack(columns) + _INT16.pack(0) * columns)


def copy_data(data: bytes) -> bytes:
    """CopyData: one line of COPY output."""
    return _message(b"d", data)


def copy_done() -> bytes:
    """CopyDone: the COPY output is complete."""
    return _message(b"c")
