"""A minimal PostgreSQL protocol client for tests that need frames no driver sends."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import secrets
import socket
import struct
from dataclasses import dataclass


def frame(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode() + b"\x00"


def startup_packet(user: str, database: str = "adult", **params: str) -> bytes:
    body = struct.pack("!i", 196608) + b"".join(
        cstr(k) + cstr(v) for k, v in {"user": user, "database": database, **params}.items())
    return struct.pack("!i", len(body) + 5) + body + b"\x00"


def parse(query: str, name: str = "", types: tuple[int, ...] = ()) -> bytes:
    return frame(b"P", cstr(name) + cstr(query) + struct.pack("!h", len(types))
                 + b"".join(struct.pack("!I", t) for t in types))


def bind(params: tuple[bytes | None, ...] = (), portal: str = "", statement: str = "",
         result_format: int = 0) -> bytes:
    body = cstr(portal) + cstr(statement) + struct.pack("!h", 0) + struct.pack("!h", len(params))
    for p in params:
        body += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    return frame(b"B", body + struct.pack("!hh", 1, result_format))


def describe(which: str, name: str = "") -> bytes:
    return frame(b"D", which.encode() + cstr(name))


def execute(portal: str = "", max_rows: int = 0) -> bytes:
    return frame(b"E", cstr(portal) + struct.pack("!i", max_rows))


def query(text: str) -> bytes:
    return frame(b"Q", cstr(text))


SYNC = frame(b"S")
TERMINATE = frame(b"X")


@dataclass
class Message:
    kind: bytes
    body: bytes

    def fields(self) -> dict[str, str]:
        """The fields of an ErrorResponse or NoticeResponse."""
        out = {}
        for part in self.body.split(b"\x00"):
            if part:
                out[part[:1].decode()] = part[1:].decode()
        return out


class RawClient:
    """One socket speaking the protocol by hand."""

    def __init__(self, port: int, timeout: float = 10, source: str | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def read(self) -> Message:
        kind = self._read(1)
        (length,) = struct.unpack("!i", self._read(4))
        return Message(kind, self._read(length - 4))

    def read_until(self, kind: bytes = b"Z") -> list[Message]:
        out = []
        while True:
            message = self.read()
            out.append(message)
            if message.kind == kind:
                return out

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def closed(self) -> bool:
        """Whether the server closes the socket (after reading what is left).

        False when nothing came for the socket's timeout: the server kept it open.
        """
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except ConnectionError:
            return True
        except TimeoutError:
            return False

    def login(self, user: str, password: str) -> list[Message]:
        """Startup and SCRAM-SHA-256; returns the messages up to the first ReadyForQuery
        (or up to the ErrorResponse)."""
        self.send(startup_packet(user))
        message = self.read()
        if message.kind == b"E":
            return [message]
        assert message.kind == b"R"
        assert struct.unpack("!i", message.body[:4])[0] == 10
        nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        first_bare = f"n=,r={nonce}"
        first = ("n,," + first_bare).encode()
        self.send(frame(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
        message = self.read()
        if message.kind == b"E":
            return [message]
        server_first = message.body[4:].decode()
        attrs = dict(part.split("=", 1) for part in server_first.split(","))
        salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]),
                                     int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        stored = hashlib.sha256(client_key).digest()
        without_proof = f"c=biws,r={attrs['r']}"
        auth_message = f"{first_bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored, auth_message, hashlib.sha256).digest()
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature,
                                                             strict=True))).decode()
        self.send(frame(b"p", f"{without_proof},p={proof}".encode()))
        messages = []
        while True:
            message = self.read()
            messages.append(message)
            if message.kind in (b"Z", b"E"):
                return messages

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
