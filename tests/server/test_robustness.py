"""Malformed input never stops the server; TLS when configured."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import struct
import subprocess

import psycopg
import pytest

from dpsql.errors import AddressInUse
from dpsql.imports import tables
from dpsql.services import open_store

from . import rawclient as raw
from .conftest import PASSWORDS, _env, fake_args, make_store, serve_args, start_server

FUZZ_CASES = 200
_TYPES = b"QPBDECSHXpdcfF" + bytes(range(65, 91))


def _garbage(rng: random.Random, n: int) -> bytes:
    return bytes(rng.getrandbits(8) for _ in range(n))


def _fuzz_case(rng: random.Random, index: int, port: int) -> None:
    kind = index % 7
    with raw.RawClient(port, timeout=5) as client:
        if kind == 0:  # random bytes instead of a startup packet
            client.send(_garbage(rng, rng.randint(1, 64)))
        elif kind == 1:  # a startup length that lies (too small, too large, or random)
            length = rng.choice([0, 3, 7, 10_001, 2**31 - 1, rng.randint(8, 200)])
            client.send(struct.pack("!i", length) + _garbage(rng, rng.randint(0, 40)))
        elif kind == 2:  # a truncated startup packet, then the client goes away
            packet = raw.startup_packet("alice")
            client.send(packet[:rng.randint(1, len(packet) - 1)])
        elif kind == 3:  # garbage where the SASL exchange should be (an unknown user name)
            client.send(raw.startup_packet(f"fuzz{index}"))
            client.read()
            client.send(raw.frame(b"p", _garbage(rng, rng.randint(0, 80))))
        else:  # after a good login: random types, garbage bodies, lying lengths
            assert client.login("alice", PASSWORDS["alice"])[-1].kind == b"Z"
            body = _garbage(rng, rng.randint(0, 100))
            if kind == 4:
                client.send(bytes([rng.choice(_TYPES)]) + struct.pack("!i", len(body) + 4) + body)
            elif kind == 5:
                length = rng.choice([-5, 0, 3, 2**31 - 1, len(body) + 50])
                client.send(bytes([rng.choice(b"QPBDE")]) + struct.pack("!i", length) + body)
            else:
                mutable = bytearray(rng.choice([
                    raw.parse("SELECT $1"), raw.bind((b"1",)), raw.describe("S"),
                    raw.execute(), raw.query("SELECT 1")]))
                for _ in range(rng.randint(1, 4)):
                    mutable[rng.randrange(1, len(mutable))] = rng.getrandbits(8)
                client.send(bytes(mutable) + raw.SYNC)
        client.sock.shutdown(socket.SHUT_WR)  # the client is done: incomplete frames end here
        client.closed()


def test_fuzzed_messages_never_stop_the_server(server_store):
    """The real server (router, sessions, ledger) survives garbage and serves a DP query after."""
    rng = random.Random(20240229)
    with start_server(serve_args(server_store)) as server:
        for index in range(FUZZ_CASES):
            _fuzz_case(rng, index, server.port)
            assert server.alive(), f"server died on fuzz case {index}"
        with psycopg.connect(server.dsn("alice"), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            total = conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0]
            assert isinstance(total, int)
        crashes = [line for line in server.lines if "connection handler failed" in line]
        assert not crashes, "".join(server.lines[-40:])


def _openssl_cert(tmp_path):
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None,
                    reason="openssl is not installed, so no test certificate can be made")
def test_tls(tmp_path):
    cert, key = _openssl_cert(tmp_path)
    store = make_store(tmp_path / "tls.duckdb")
    with start_server(fake_args(store, cert=cert, key=key)) as server:
        with psycopg.connect(server.dsn("alice", sslmode="require"), autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT current_user").fetchone() == ("alice",)
        with psycopg.connect(server.dsn("alice", sslmode="verify-ca", sslrootcert=str(cert)),
                             autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use  # and the certificate verified against its CA
        with pytest.raises(psycopg.OperationalError, match="TLS connections only"):
            psycopg.connect(server.dsn("alice", sslmode="disable"))
        done = subprocess.run(["psql", server.dsn("alice", sslmode="require"), "-X", "-tAc",
                               "SELECT current_user"], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin"})
        assert done.stdout.strip() == "alice", done.stderr


def test_without_tls_ssl_requests_are_declined(fake_server):
    with socket.create_connection(("127.0.0.1", fake_server.port), timeout=5) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"N"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(fake_server.dsn("alice", sslmode="require"))


def test_sigterm_shuts_down_cleanly(tmp_path):
    store = make_store(tmp_path / "stop.duckdb")
    with start_server(fake_args(store)) as server:
        conn = psycopg.connect(server.dsn("alice"), autocommit=True)
        conn.execute("SELECT 1")
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=20) == 0
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
    # The store is released: it opens for writing again.
    with open_store(store) as reopened:
        assert tables(reopened) == ["adult"]


def test_a_busy_port_is_a_clear_error(store_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        args = serve_args(store_path)
        args[args.index("--port") + 1] = str(port)
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=_env())
    assert done.returncode == AddressInUse.exit_code
    assert f"port {port} on 127.0.0.1 is in use" in done.stderr
    assert "--port" in done.stderr
    assert "internal error" not in done.stderr


def _stalled(port: int) -> raw.RawClient:
    """A connection that sends its startup packet and then says nothing."""
    client = raw.RawClient(port, timeout=60)  # closed() waits this long for the login timer
    client.send(raw.startup_packet("alice"))
    assert client.read().kind == b"R"  # the server waits for the SASL response
    return client


def test_connections_logging_in_have_their_own_slots_and_timer(tmp_path):
    store = make_store(tmp_path / "slots.duckdb")
    options = {"max_clients": 2, "max_pending_logins": 3, "login_timeout": 1}
    with start_server(fake_args(store, **options)) as server:
        first = psycopg.connect(server.dsn("alice"), autocommit=True)
        stalled = [_stalled(server.port), _stalled(server.port)]
        # Idle sockets do not take the slots of logged-in clients...
        second = psycopg.connect(server.dsn("erin"), autocommit=True)
        stalled.append(_stalled(server.port))
        assert first.execute("SELECT 1").fetchone() == (1,)
        # ... and with every login slot held by them, a newcomer is not refused: it takes
        # the slot of the one that waited longest (red team F4: idle sockets re-opened at
        # each close kept every login out).
        second.close()
        third = psycopg.connect(server.dsn("erin"), autocommit=True)
        assert third.execute("SELECT 1").fetchone() == (1,)
        # Nothing but the login timers (1 s) close the stalled; closed() waits up to 60 s.
        assert all(client.closed() for client in stalled)
        for client in stalled:
            client.close()
        third.close()
        psycopg.connect(server.dsn("erin")).close()  # their slots are free again
        first.close()
