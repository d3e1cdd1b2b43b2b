"""Login limits over real sockets: no stranger, from any address, spends them for another.

The server runs in this process (its own event loop in a thread) so that a test can
choose limits no command-line option sets. Every client is on loopback; Linux routes
all of 127/8 there, so a client socket bound to 127.0.0.2 is another address.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Iterator
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


def test_made_up_names_do_not_lock_users_out_of_their_address(store: Path) -> None:
    # Issue 40: failed logins under made-up names from an address refused every user
    # there, right password or not, for up to 5 minutes.
    with serving(store, login_failures_free=3, login_failures_free_per_host=5) as server:
        for i in range(5):
            failure = login_from(server, "127.0.0.3", f"made-up-{i}", "guess-guess")
            assert failure.fields()["M"] == ("password authentication failed for user "
                                             f'"made-up-{i}"')
        assert login_from(server, "127.0.0.3", "alice", PASSWORDS["alice"]).kind == b"Z"
        # A known name's own failures still refuse it at an address, and it alone: fail
        # (waiting out each refusal) until a refusal lasts long enough to test it.
        for _ in range(30):
            text = login_from(server, "127.0.0.7", "erin", "guess-guess").fields()["M"]
            refusal = re.fullmatch(r'too many failed logins for user "erin" from this '
                                   r"address; try again in (\d+) s", text)
            if refusal is not None and int(refusal.group(1)) >= 3:
                break
            if refusal is not None:
                time.sleep(int(refusal.group(1)))
        refused = login_from(server, "127.0.0.7", "erin", PASSWORDS["erin"])
        assert refused.fields()["M"].startswith('too many failed logins for user "erin"')
        assert login_from(server, "127.0.0.1", "erin", PASSWORDS["erin"]).kind == b"Z"
        assert login_from(server, "127.0.0.7", "frank", PASSWORDS["frank"]).kind == b"Z"


def test_idle_sockets_of_one_address_leave_the_login_slots_of_others(store: Path) -> None:
    # Issue 40: idle sockets re-opened at every login timeout held all the login slots.
    with serving(store, max_pending_logins=64, max_pending_logins_per_address=3) as server:
        idle = [stalled(server, "127.0.0.2") for _ in range(3)]
        try:
            with raw.RawClient(server.port, timeout=60, source="127.0.0.2") as refused:
                message = refused.read()
                assert (message.kind, message.fields()["C"]) == (b"E", "53300")
                assert message.fields()["M"] == ("sorry, too many connections are logging in "
                                                 "from your address at once; try again in a "
                                                 "few seconds")
                assert refused.closed()
            assert server.logins.held("127.0.0.2") == 3  # the refused one took no slot
            assert login_from(server, "127.0.0.1", "alice", PASSWORDS["alice"]).kind == b"Z"
        finally:
            for client in idle:
                client.close()


def test_a_login_gives_its_slot_back(store: Path) -> None:
    with serving(store, max_pending_logins=2, max_pending_logins_per_address=1) as server:
        with raw.RawClient(server.port, timeout=60) as client:
            assert client.login("alice", PASSWORDS["alice"])[-1].kind == b"Z"
            assert server.logins.held() == 0  # logged in: a client slot, not a login slot
            # so the same address logs in again while the first connection stays
            assert login_from(server, "127.0.0.1", "alice", PASSWORDS["alice"]).kind == b"Z"
        # The global cap stays: a third address is refused while two are logging in.
        with stalled(server, "127.0.0.4"), stalled(server, "127.0.0.5"), \
                raw.RawClient(server.port, timeout=60, source="127.0.0.6") as refused:
            message = refused.read()
            assert message.fields()["M"].startswith("sorry, too many connections are "
                                                    "logging in at once")


def test_dpsql_serve_sets_the_share_of_an_address(store: Path) -> None:
    with start_server(serve_args(store, "--max-pending-logins-per-address", "1")) as server:
        first = raw.RawClient(server.port, timeout=60)
        first.send(raw.startup_packet("alice"))
        assert first.read().kind == b"R"
        with first, raw.RawClient(server.port, timeout=60) as refused:
            assert refused.read().fields()["M"].startswith("sorry, too many connections are "
                                                           "logging in from your address")
            with raw.RawClient(server.port, timeout=60, source="127.0.0.2") as other:
                assert other.login("alice", PASSWORDS["alice"])[-1].kind == b"Z"
