from __future__ import annotations

import asyncio
import struct

import pytest

from dpsql.server import messages as m

from .rawclient import bind, frame, parse, startup_packet


def test_startup_packet_decodes_parameters():
    packet = m.decode_startup(startup_packet("alice", "adult", application_name="x")[4:])
    assert packet.kind == "startup"
    assert packet.version == m.PROTOCOL_3
    assert dict(packet.params) == {"user": "alice", "database": "adult", "application_name": "x"}


@pytest.mark.parametrize(("code", "kind"), [(m.SSL_REQUEST, "ssl"), (m.GSSENC_REQUEST, "gss")])
def test_negotiation_requests(code, kind):
    assert m.decode_startup(struct.pack("!i", code)).kind == kind


def test_cancel_request_carries_pid_and_key():
    packet = m.decode_startup(struct.pack("!iii", m.CANCEL_REQUEST, 1234, 99))
    assert (packet.kind, packet.pid, packet.key) == ("cancel", 1234, 99)


@pytest.mark.parametrize("payload", [
    pytest.param(struct.pack("!i", 2 << 16), id="protocol_2"),
    pytest.param(struct.pack("!i", m.PROTOCOL_3) + b"user\x00alice", id="unterminated"),
    pytest.param(struct.pack("!i", m.SSL_REQUEST) + b"x", id="trailing_bytes"),
    pytest.param(b"\x00\x03", id="short"),
    pytest.param(struct.pack("!i", m.PROTOCOL_3) + b"user\x00\xff\xfe\x00\x00", id="bad_utf8"),
])
def test_malformed_startup_is_a_protocol_violation(payload):
    with pytest.raises(m.ProtocolViolation):
        m.decode_startup(payload)


def test_parse_and_bind_round_trip():
    p = m.decode_parse(parse("SELECT $1", "s1", (23,))[5:])
    assert (p.name, p.query, p.param_types) == ("s1", "SELECT $1", (23,))
    b = m.decode_bind(bind((b"5", None), portal="p", statement="s1", result_format=1)[5:])
    assert (b.portal, b.statement, b.params) == ("p", "s1", (b"5", None))
    assert b.param_format(1) == 0
    assert b.result_format(3) == 1


@pytest.mark.parametrize("payload", [
    pytest.param(b"\x00\x00\x00\x01\x00\x01", id="bind_count_without_values"),
    pytest.param(b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09ab", id="value_longer_than_message"),
    pytest.param(b"\x00\x00\x00\x01\x00\x07", id="format_code_7"),
])
def test_malformed_bind(payload):
    with pytest.raises(m.ProtocolViolation):
        m.decode_bind(payload)


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def test_read_message_enforces_the_size_cap():
    async def read(data: bytes, limit: int) -> tuple[bytes, bytes]:
        return await m.read_message(_reader(data), limit)

    assert asyncio.run(read(frame(b"Q", b"x\x00"), 10)) == (b"Q", b"x\x00")
    with pytest.raises(m.MessageTooLarge):
        asyncio.run(read(frame(b"Q", b"x" * 11), 10))
    with pytest.raises(m.ProtocolViolation):
        asyncio.run(read(b"Q" + struct.pack("!i", 2), 10))
    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(read(b"Q" + struct.pack("!i", 9) + b"ab", 10))


def test_error_response_fields():
    data = m.error_response("53400", "no budget", hint="ask", position=7)
    fields = dict((part[:1], part[1:]) for part in data[5:].split(b"\x00") if part)
    assert fields[b"C"] == b"53400"
    assert fields[b"M"] == b"no budget"
    assert fields[b"H"] == b"ask"
    assert fields[b"P"] == b"7"
    assert fields[b"S"] == b"ERROR"
