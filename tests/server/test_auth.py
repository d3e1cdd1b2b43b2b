from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest

from dpsql.errors import ConfigurationError
from dpsql.server import auth
from dpsql.store import Store

from .conftest import make_store


def test_rfc7677_example_exchange():
    # RFC 7677 section 3: user "user", password "pencil".
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    exchange = auth.ScramExchange(auth.Verifier.make("pencil", salt=salt), genuine=True)
    exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    # Replay the RFC's server nonce to reproduce its proof and signature.
    exchange._nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    exchange._server_first = f"r={exchange._nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = exchange.final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_wrong_proof_and_mock_verifiers_fail():
    exchange = auth.ScramExchange(auth.Verifier.make("pencil"), genuine=True)
    first = exchange.first(b"n,,n=,r=abc").decode()
    nonce = dict(p.split("=", 1) for p in first.split(","))["r"]
    with pytest.raises(auth.AuthFailed):
        exchange.final(f"c=biws,r={nonce},p={base64.b64encode(b'x' * 32).decode()}".encode())
    # A correct proof against a mock verifier (unknown user) still fails.
    mock = auth.ScramExchange(auth.mock_verifier("ghost", b"k" * 32), genuine=False)
    mock.first(b"n,,n=,r=abc")
    with pytest.raises(auth.AuthFailed):
        mock.final(b"c=biws,r=wrong,p=AAAA")


def test_mock_salt_is_stable_per_user_and_looks_real():
    a, b = auth.mock_verifier("ghost", b"s" * 32), auth.mock_verifier("ghost", b"s" * 32)
    c = auth.mock_verifier("other", b"s" * 32)
    assert a.salt == b.salt != c.salt
    assert len(a.salt) == auth.SALT_BYTES
    assert a.iterations == auth.DEFAULT_ITERATIONS


@pytest.mark.parametrize("header", [b"p=tls-server-end-point,,n=,r=x", b"x,,n=,r=x", b"n,,n="])
def test_unsupported_gs2_headers_fail(header):
    with pytest.raises(auth.AuthFailed):
        auth.ScramExchange(auth.Verifier.make("pw"), genuine=True).first(header)


def test_verifier_format_is_postgres_compatible():
    text = auth.Verifier.make("secret-pass", iterations=4096).encode()
    mechanism, params, keys = text.split("$")
    assert mechanism == "SCRAM-SHA-256"
    assert params.startswith("4096:")
    assert len(base64.b64decode(keys.split(":")[0])) == 32
    parsed = auth.Verifier.parse(text)
    assert parsed.check("secret-pass")
    assert not parsed.check("secret-pasS")


def test_saslprep_maps_spaces_and_keeps_invalid_text():
    assert auth.saslprep("I\u00adX") == "IX"  # soft hyphen is mapped to nothing
    assert auth.saslprep("a\u00a0b") == "a b"  # non-ASCII space becomes a space
    assert auth.saslprep("\u0007bell") == "\u0007bell"  # prohibited: the raw password is used


def test_login_backoff_grows_per_user_and_address():
    now = [0.0]
    backoff = auth.LoginBackoff(free=3, free_per_host=6, base=1, ceiling=8, hold_ceiling=4,
                                forget=100, clock=lambda: now[0])
    for _ in range(2):
        backoff.failed("eve", "10.0.0.1")
    assert backoff.wait("eve", "10.0.0.1") == 0  # fewer than `free` failures: no refusal
    waits, holds = [], []
    for _ in range(5):
        backoff.failed("eve", "10.0.0.1")
        waits.append(backoff.wait("eve", "10.0.0.1"))
        holds.append(backoff.hold("10.0.0.1"))
    assert holds == [0, 0, 0, 1, 2]  # 6 = free_per_host: the address's failures are held
    # doubling up to the ceiling, from the answer on (after the hold)
    assert waits == [1, 2, 4, 1 + 8, 2 + 8]
    assert backoff.wait("eve", "10.0.0.2") == 0  # the same name from another address
    assert backoff.wait("alice", "10.0.0.1") == 0  # another name at that address
    for _ in range(3):
        backoff.failed("mallory", "10.0.0.1")
    assert backoff.hold("10.0.0.1") == 4  # up to its own ceiling
    assert backoff.hold("10.0.0.2") == 0
    now[0] = 8.5
    assert backoff.hold("10.0.0.1") == 0
    backoff.succeeded("eve", "10.0.0.1")
    assert backoff.wait("eve", "10.0.0.1") == 0
    backoff.failed("bob", "10.0.0.3")
    now[0] = 200.0  # `forget` seconds without a failure clear a pair
    backoff.failed("bob", "10.0.0.3")
    backoff.failed("bob", "10.0.0.3")
    assert backoff.wait("bob", "10.0.0.3") == 0


def test_made_up_names_never_refuse_a_known_user_at_their_address():
    # Issue 40: 56 failures under made-up names refused every user at the address, for
    # up to 5 minutes, with the right password. Now they only hold failures.
    now = [0.0]
    backoff = auth.LoginBackoff(clock=lambda: now[0])
    for i in range(56):
        backoff.failed(f"made-up-{i}", "10.0.0.9")
    assert backoff.wait("alice", "10.0.0.9") == 0
    assert backoff.hold("10.0.0.9") > 0  # further failures from there are slower
    for _ in range(5):  # a known name's own failures still refuse it there
        backoff.failed("alice", "10.0.0.9")
    assert backoff.wait("alice", "10.0.0.9") > 0
    assert backoff.wait("alice", "10.0.0.8") == 0


def test_login_backoff_keeps_bounded_memory():
    backoff = auth.LoginBackoff(capacity=100)
    for i in range(5000):
        backoff.failed(f"user{i}", f"10.0.{i % 7}.{i % 251}")
    assert len(backoff._failures) == 100


def test_login_slots_are_shared_out_by_address():
    slots = auth.LoginSlots(total=5, per_address=2)
    assert [slots.take(pid, "10.0.0.1") for pid in (1, 2, 3)] == [None, None, "address"]
    assert slots.take(4, "10.0.0.2") is None  # another address still gets one
    assert slots.take(5, "10.0.0.3") is None
    assert slots.take(6, "10.0.0.3") is None
    assert slots.take(7, "10.0.0.4") == "total"  # the global cap stays
    slots.release(1)
    slots.release(1)  # twice (logged in, then closed): freed once
    assert (slots.held(), slots.held("10.0.0.1")) == (4, 1)
    assert slots.take(8, "10.0.0.1") is None
    for pid in (2, 4, 5, 6, 8):
        slots.release(pid)
    assert slots.held() == 0
    assert slots._per_host == {}  # no address is kept once it holds nothing


def test_credentials_in_the_store(tmp_path):
    db = make_store(tmp_path / "s.duckdb")
    with Store.open(db) as store:
        assert auth.load_verifier(store, "alice").check("alice-secret-1")
        assert auth.load_verifier(store, "nobody") is None
        with pytest.raises(ConfigurationError, match="no user 'nobody'"):
            auth.set_password(store, "nobody", "long enough")
        with pytest.raises(ConfigurationError, match="at least"):
            auth.set_password(store, "alice", "short")
        assert auth.remove_user(store, "alice")
        assert not auth.remove_user(store, "alice")
        assert auth.load_verifier(store, "alice") is None
        users = {row["user"]: row["role"] for row in auth.list_users(store)}
        assert users["admin"] == "admin"
        assert "alice" not in users
        stored = store.cursor().execute("SELECT verifier FROM dpsql.credentials").fetchall()
        assert all("secret" not in row[0] for row in stored)


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True, text=True,
                          input=stdin, env=env, timeout=120)


def test_user_commands(tmp_path):
    db = str(make_store(tmp_path / "s.duckdb"))
    added = _cli("user", "add", "erin", "--password-stdin", "--db", db, stdin="erin-pass-123\n")
    assert added.returncode == 0, added.stderr
    listed = _cli("user", "list", "--db", db, "--json")
    assert "erin" in listed.stdout
    assert "secret" not in listed.stdout
    with Store.open(db) as store:
        assert auth.load_verifier(store, "erin").check("erin-pass-123")
    unknown = _cli("user", "add", "mallory", "--password-stdin", "--db", db, stdin="whatever123\n")
    assert unknown.returncode == 8
    assert "no user 'mallory'" in unknown.stderr
    prompted = _cli("user", "add", "erin", "--db", db, stdin="first-pass1\nother-pass1\n"
                    "second-pass\nsecond-pass\n")
    assert prompted.returncode == 0, prompted.stderr
    assert "do not match" in prompted.stderr + prompted.stdout
    with Store.open(db) as store:
        assert auth.load_verifier(store, "erin").check("second-pass")
    removed = _cli("user", "remove", "erin", "--db", db)
    assert removed.returncode == 0
    assert "removed" in removed.stdout
    again = _cli("user", "remove", "erin", "--db", db)
    assert again.returncode == 8
