"""Login limits over real sockets: no stranger, from any address, spends them for another.

The server runs in this process (its own event loop in a thread) so that a test can
choose limits no command-line option sets. Every client is on loopback; Linux routes
all of 127/8 there, so a client socket bound to 127.0.0.2 is another address.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dpsql.server.server import Server, ServerConfig

from . import rawclient as raw
from .conftest import PASSWORDS, make_store, serve_args, start_server


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("limits") / "adult.duckdb")


@contextlib.contextmanager
def serving(db: Path, **options: Any) -> Iterator[Server]:
    """A server on a free port of 127.0.0.1 with ``options`` as its ServerConfig."""
    config = ServerConfig(db=db, port=0, failed_login_delay=0.01, **options)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            server = Server(config)
            loop.run_until_complete(server.start())
        except BaseException as err:  # shown by the test, not lost in the thread
            box["error"] = err
            started.set()
            return
        box["server"] = server
        started.set()
        loop.run_forever()
        loop.run_until_complete(server.stop(grace=5))
        loop.close()

    thread = threading.Thread(target=main, name="test-server", daemon=True)
    thread.start()
    assert started.wait(120), "the server did not start"
    if "error" in box:
        raise box["error"]
    try:
        yield box["server"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)


def login_from(server: Server, source: str, user: str, password: str) -> raw.Message:
    """The last message of a login from ``source``: ReadyForQuery, or the ErrorResponse."""
    with raw.RawClient(server.port, timeout=60, source=source) as client:
        return client.login(user, password)[-1]


def stalled(server: Server, source: str) -> raw.RawClient:
    """A connection from ``source`` that starts logging in and then says nothing."""
    client = raw.RawClient(server.port, timeout=60, source=source)
    client.send(raw.startup_packet("alice"))
    assert client.read().kind == b"R"  # the server has counted it and waits for SCRAM
    return client


_CLIENT_FIRST = b"n,,n=,r=" + base64.b64encode(b"nonce-of-the-client")
SASL_FIRST = raw.frame(b"p", raw.cstr("SCRAM-SHA-256") + struct.pack("!i", len(_CLIENT_FIRST))
                       + _CLIENT_FIRST)  # SASLInitialResponse: client-first-message


def silent(server: Server, source: str) -> raw.RawClient:
    """A connection from ``source`` that says nothing at all."""
    return raw.RawClient(server.port, timeout=60, source=source)


@contextlib.contextmanager
def idle_sockets(port: int, sources: list[str], each: int) -> Iterator[list[int]]:
    """``each`` silent sockets from every source, each re-opened as soon as the server closes it
    (as the red team's slots.py); yields a list whose length counts the re-openings."""
    selector = selectors.DefaultSelector()
    stop, reopened = threading.Event(), []

    def open_one(source: str) -> None:
        sock = socket.socket()
        sock.bind((source, 0))
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, source)

    def hold() -> None:
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    sock.close()
                    reopened.append(1)
                    open_one(key.data)

    for source in sources:
        for _ in range(each):
            open_one(source)
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    try:
        yield reopened
    finally:
        stop.set()
        holder.join(60)
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        selector.close()


def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_idle_sockets_from_any_addresses_never_keep_a_login_out(store: Path) -> None:
    # Red team F4: 8 idle sockets at 127.0.0.1, re-opened at each close, kept every login
    # out; idle sockets from 127.0.0.2-9 took all the global slots.
    sources = ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]
    with serving(store, max_pending_logins=8) as server, idle_sockets(server.port, sources, 4):
        until(lambda: server.logins.held() == 8, "the idle sockets did not take every slot")
        for user in ("alice", "carol", "frank", "alice", "carol"):
            assert login_from(server, "127.0.0.1", user, PASSWORDS[user]).kind == b"Z"
        assert login_from(server, "127.0.0.9", "dave", PASSWORDS["dave"]).kind == b"Z"


def test_a_burst_from_one_address_all_logs_in(store: Path) -> None:
    # Red team F4: 20 analysts connecting at once from 127.0.0.1 were refused past the
    # address's share (8) of the login slots.
    users = ["carol"] * 24  # the policy lets carol hold 60 connections
    ready = threading.Barrier(len(users))
    results: list[bytes] = []

    def analyst(client: raw.RawClient, user: str) -> None:
        ready.wait(60)
        last = client.login(user, PASSWORDS[user])[-1]
        results.append(last.kind if last.kind == b"Z" else last.fields()["M"].encode())

    with serving(store) as server:
        clients = [raw.RawClient(server.port, timeout=60) for _ in users]
        try:
            threads = [threading.Thread(target=analyst, args=pair)
                       for pair in zip(clients, users, strict=True)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert results == [b"Z"] * len(users)  # all logged in at once
        finally:
            for client in clients:
                client.close()


def test_a_newcomer_takes_the_slot_of_a_connection_that_waits(store: Path) -> None:
    with serving(store, max_pending_logins=2, login_step_timeout=60, login_timeout=8) as server:
        with raw.RawClient(server.port, timeout=60) as client:
            assert client.login("alice", PASSWORDS["alice"])[-1].kind == b"Z"
            assert server.logins.held() == 0  # logged in: a client slot, not a login slot
        first, second = stalled(server, "127.0.0.4"), stalled(server, "127.0.0.5")
        with first, second:
            assert login_from(server, "127.0.0.6", "carol", PASSWORDS["carol"]).kind == b"Z"
            # The one that had waited longest made room, the other keeps its slot.
            assert (server.logins.held(), server.lingering) == (1, 1)
            # It learns so when its login would have timed out, whatever it sends: a
            # client re-opening every socket the server closes cannot set off a chain
            # of drops.
            first.send(SASL_FIRST)
            dropped = first.read()
            assert (dropped.kind, dropped.fields()["C"]) == (b"E", "53300")
            assert dropped.fields()["M"] == ("sorry, too many connections are logging in at "
                                             "once; try again in a few seconds")
            assert first.closed()
            assert server.lingering == 0


def test_a_login_step_times_out_long_before_the_login(store: Path) -> None:
    # Red team F4: a socket had the whole login timeout (10 s) to send its first byte.
    with serving(store, login_timeout=240) as server:
        quiet = silent(server, "127.0.0.2")
        halfway = stalled(server, "127.0.0.3")  # sent its startup packet, then nothing
        with quiet, halfway:  # closed() waits 60 s: only a step's timer (1 s) ends them
            assert quiet.closed()
            assert halfway.closed()
        until(lambda: server.logins.held() == 0, "the slots were not freed")


def test_others_failures_never_refuse_a_right_password(store: Path) -> None:
    # Red team F5: five bad passwords for frank from 127.0.0.1 refused frank's right one
    # there, and one more per refusal window kept it so.
    with serving(store) as server:
        for _ in range(6):
            failure = login_from(server, "127.0.0.1", "frank", "not-franks-password")
            assert failure.fields()["M"] == 'password authentication failed for user "frank"'
        assert login_from(server, "127.0.0.1", "frank", PASSWORDS["frank"]).kind == b"Z"
        for _ in range(3):
            assert login_from(server, "127.0.0.1", "frank", "not-franks-password").kind == b"E"
            assert login_from(server, "127.0.0.1", "frank", PASSWORDS["frank"]).kind == b"Z"


def test_a_proof_waits_its_turn_a_bounded_time(store: Path) -> None:
    # With a name's turns all but stopped, its right password still gets in: checked once it
    # has waited half the login timeout.
    with serving(store, login_guesses_per_second=0.0001, login_timeout=6) as server:
        for _ in range(5):
            assert login_from(server, "127.0.0.2", "frank", "not-franks-password").kind == b"E"
        assert server.gate.turn("frank") > 1000
        assert login_from(server, "127.0.0.1", "frank", PASSWORDS["frank"]).kind == b"Z"
        assert login_from(server, "127.0.0.1", "frank", "not-franks-password").kind == b"E"


def wrong_proof_waiting(server: Server, source: str, user: str) -> raw.RawClient:
    """A connection from ``source`` whose wrong proof of ``user`` waits for its turn."""
    before = server.waiting_turn
    client, _ = server_first(server, source, user)
    client.send(raw.frame(b"p", b"c=biws,r=x,p=" + base64.b64encode(b"x" * 32)))
    until(lambda: server.waiting_turn == before + 1, "the proof did not wait for its turn")
    return client


def test_proofs_wait_their_turn_out_of_the_login_slots(store: Path) -> None:
    # A guesser's proofs waiting for their turn never crowd out other logins. Past as many
    # as there are login slots, the address with the most waiting gives one up.
    turned_away = ("sorry, too many connections are logging in at once; try again in a few "
                   "seconds")
    with serving(store, max_pending_logins=1, login_guesses_per_second=0.0001,
                 login_failures_free=1, login_timeout=60) as server:
        assert login_from(server, "127.0.0.2", "frank", "not-franks-password").kind == b"E"
        with wrong_proof_waiting(server, "127.0.0.2", "frank") as waiting:
            assert login_from(server, "127.0.0.3", "alice", PASSWORDS["alice"]).kind == b"Z"
            # Another from the same address is turned away, unchecked...
            again = login_from(server, "127.0.0.2", "frank", PASSWORDS["frank"])
            assert again.fields()["M"] == turned_away
            # ... one from another address takes the place of the one waiting there.
            assert login_from(server, "127.0.0.4", "frank", PASSWORDS["frank"]).kind == b"Z"
            assert waiting.read().fields()["M"] == turned_away
        assert server.waiting_turn == 0


def test_made_up_names_do_not_lock_users_out_of_their_address(store: Path) -> None:
    # Issue 40: failed logins under made-up names from an address refused every user
    # there, right password or not, for up to 5 minutes.
    with serving(store, login_failures_free=3, login_failures_free_per_host=5) as server:
        for i in range(8):
            failure = login_from(server, "127.0.0.3", f"made-up-{i}", "guess-guess")
            assert failure.fields()["M"] == ("password authentication failed for user "
                                             f'"made-up-{i}"')
        assert login_from(server, "127.0.0.3", "alice", PASSWORDS["alice"]).kind == b"Z"
        assert server.backoff.failures(None, "127.0.0.3") == 8


def server_first(server: Server, source: str, user: str) -> tuple[raw.RawClient, dict[str, str]]:
    """A SCRAM exchange of ``user`` from ``source`` up to server-first-message (salt and count)."""
    client = raw.RawClient(server.port, timeout=60, source=source)
    with contextlib.ExitStack() as on_failure:
        on_failure.callback(client.close)
        client.send(raw.startup_packet(user))
        assert client.read().kind == b"R"
        client.send(SASL_FIRST)
        message = client.read()
        assert message.kind == b"R"
        on_failure.pop_all()
    return client, dict(part.split("=", 1) for part in message.body[4:].decode().split(","))


def test_a_made_up_name_keeps_its_salt_across_restarts(store: Path) -> None:
    # Red team F6: a made-up name's salt changed at each start, a real user's did not.
    offered = []
    for _ in range(2):
        with serving(store) as server:
            answers = {}
            for user in ("frank", "made-up-name"):
                client, attrs = server_first(server, "127.0.0.8", user)
                client.close()
                answers[user] = (attrs["s"], attrs["i"])
            offered.append(answers)
    assert offered[0] == offered[1]
    assert offered[0]["made-up-name"][1] == offered[0]["frank"][1] == "4096"


def counted(server: Server, user: str, host: str, failures: int) -> Callable[[], bool]:
    return lambda: server.backoff.failures(user, host) == failures


def test_an_exchange_abandoned_after_the_salt_counts_as_a_failure(
        store: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Red team F6: an exchange abandoned after server-first was neither counted nor logged.
    caplog.set_level(logging.WARNING, logger="dpsql.server")
    with serving(store) as server:
        for user in ("frank", "made-up-name"):
            client, _ = server_first(server, "127.0.0.9", user)
            client.close()
            until(counted(server, user, "127.0.0.9", 1), "the abandoned exchange was not counted")
            assert f"abandoned login for user '{user}' from 127.0.0.9" in caplog.text
        quiet, _ = server_first(server, "127.0.0.9", "frank")
        with quiet:  # one that stalls after the salt counts too, at its step's timeout
            until(counted(server, "frank", "127.0.0.9", 2), "the stalled exchange was not counted")
        client = raw.RawClient(server.port, timeout=60, source="127.0.0.9")
        client.send(raw.startup_packet("frank"))
        assert client.read().kind == b"R"
        client.close()  # before the salt (psql asking for a password): not a failure
        with raw.RawClient(server.port, timeout=60, source="127.0.0.9") as after:
            assert after.login("frank", PASSWORDS["frank"])[-1].kind == b"Z"
        assert server.backoff.failures("frank", "127.0.0.9") == 0  # a success clears it
        assert server.backoff.failures(None, "127.0.0.9") == 3


def test_dpsql_serve_sets_the_login_slots_and_step_timeout(store: Path) -> None:
    with start_server(serve_args(store, "--max-pending-logins", "1",
                                 "--login-step-timeout", "60")) as server:
        first = raw.RawClient(server.port, timeout=60)
        first.send(raw.startup_packet("alice"))
        assert first.read().kind == b"R"
        with first, raw.RawClient(server.port, timeout=60, source="127.0.0.2") as other:
            assert other.login("alice", PASSWORDS["alice"])[-1].kind == b"Z"
            first.send(SASL_FIRST)
            assert first.read().fields()["C"] == "53300"  # it made room
