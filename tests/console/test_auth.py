"""Console logins, cookies, CSRF tokens and the command lines of its forms (no browser)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import dpsql
from dpsql.console.actions import action, perform
from dpsql.console.app import FAILED_LOGIN, Console
from dpsql.console.auth import Logins, cookie, password_ok, same_token, set_cookie
from dpsql.errors import AccessDenied, DPSQLError
from dpsql.server.logins import GuessGate, LoginBackoff
from dpsql.services import open_store

from ..server.conftest import PASSWORDS, make_store


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("console_auth") / "adult.duckdb")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_login_expires_when_idle_and_on_logout() -> None:
    clock = Clock()
    logins = Logins(idle=60, clock=clock)
    token, login = logins.open("admin")
    other, _ = logins.open("admin")
    assert token != other
    assert len(token) >= 40
    assert login.csrf not in (token, other)
    clock.now = 59
    assert logins.find(token) is login  # used: the idle timer restarts
    clock.now = 118
    assert logins.find(token) is login
    clock.now = 178.5
    assert logins.find(token) is None
    assert logins.find(other) is None
    token, _ = logins.open("admin")
    logins.close(token)
    assert logins.find(token) is None
    assert logins.find(None) is None


@pytest.mark.parametrize(("expected", "given", "ok"), [
    ("abc123", "abc123", True), ("abc123", "abc124", False), ("abc123", "", False),
    ("abc123", None, False), ("", "", False), (None, None, False)],
    ids=["same", "different", "empty", "missing", "both-empty", "both-missing"])
def test_csrf_tokens_must_match(expected: str | None, given: str | None, ok: bool) -> None:
    assert same_token(expected, given) is ok


def test_the_session_cookie_is_httponly_strict_and_below_the_prefix() -> None:
    header = set_cookie("dpsql_console", "tok", "/0123abcd/")
    assert header.split("; ")[0] == "dpsql_console=tok"
    assert {"HttpOnly", "SameSite=Strict", "Path=/0123abcd/"} <= set(header.split("; "))
    assert "Max-Age=0" in set_cookie("dpsql_console", "", "/0123abcd/", clear=True)
    assert cookie("a=1; dpsql_console=tok", "dpsql_console") == "tok"
    assert cookie("a=1", "dpsql_console") is None
    assert cookie(None, "dpsql_console") is None


def test_the_sql_password_is_checked(store_path: Path) -> None:
    with open_store(store_path) as store:
        assert password_ok(store, b"s" * 32, "admin", PASSWORDS["admin"])
        assert not password_ok(store, b"s" * 32, "admin", PASSWORDS["alice"])
        assert not password_ok(store, b"s" * 32, "nobody", PASSWORDS["admin"])


def test_form_values_stay_single_arguments(store_path: Path) -> None:
    chosen = action("/grant", {"user": "alice --as admin", "dataset": "adult; rm x",
                               "epsilon": "1"})
    assert chosen is not None
    assert chosen.back == "budgets"
    line = ["budget", "grant", "--epsilon", "1", "--", "alice --as admin", "adult; rm x"]
    assert list(chosen.line) == line  # the audit row's command line
    assert shlex.split(shlex.join(line)) == line
    with dpsql.connect(store_path, "admin") as session:
        with pytest.raises(DPSQLError):  # one user name, not a user and an option
            perform(session, chosen)
        assert "alice --as admin" not in str(session.budget())
    cancel = action("/jobs/7/cancel", {"confirm": "on"})
    assert cancel is not None
    assert (cancel.line, cancel.back) == (("jobs", "cancel", "7"), "jobs")
    # Cancelling forfeits a charge: unconfirmed (a hand-made post), nothing is cancelled.
    unconfirmed = action("/jobs/7/cancel", {})
    assert unconfirmed is not None
    with dpsql.connect(store_path, "admin") as session, \
            pytest.raises(DPSQLError, match="tick 'forfeit its charge'"):
        perform(session, unconfirmed)
    assert action("/nowhere", {}) is None


def test_an_analyst_cannot_run_a_command(store_path: Path) -> None:
    chosen = action("/grant", {"user": "alice", "dataset": "adult", "epsilon": "5"})
    assert chosen is not None
    with dpsql.connect(store_path, "alice") as session:
        with pytest.raises(AccessDenied, match="analyst"):
            perform(session, chosen)
        last = session.ledger.audit("alice", last=1)[0]
    assert (last["action"], last["outcome"]) == ("admin_call", "refused")
    assert last["statement"].startswith("console: dpsql budget grant")


def test_every_failed_console_login_says_the_same(store_path: Path) -> None:
    # Issue 40: an analyst's right password got its own answer, so the console told
    # anyone whether they had guessed it.
    with open_store(store_path) as store:
        console = Console(store, b"s" * 32, lambda user: dpsql.connect(store_path, user))
        console.failed_login_delay = 0.0
        clock = Clock()  # time stands still
        console.backoff = LoginBackoff(clock=clock, hold_ceiling=0.0)
        console.gate = GuessGate(clock=clock)
        console.login_wait = 0.0
        try:
            def refusal(user: str, password: str, host: str = "10.0.0.1") -> str:
                with pytest.raises(ValueError, match=r"\w") as caught:
                    console.log_in(user, password, host)
                return str(caught.value)

            attempts = [("alice", PASSWORDS["alice"]), ("alice", "not-alices-password"),
                        ("nobody", PASSWORDS["alice"]), ("admin", PASSWORDS["alice"])]
            assert {refusal(*attempt) for attempt in attempts} == {FAILED_LOGIN}
            # ... and counts the same: a right password of an analyst is a failure too.
            for _ in range(5):
                assert refusal("alice", PASSWORDS["alice"], "10.0.0.2") == FAILED_LOGIN
                assert refusal("nobody", "whatever-it-is", "10.0.0.2") == FAILED_LOGIN
            # Issue 40 (red team, F5): failures must never lock a right password out; on
            # the console everyone on the machine shares one address.
            for _ in range(20):
                assert refusal("admin", "a-strangers-guess", "10.0.0.2") == FAILED_LOGIN
            assert console.gate.turn("admin") > 0  # its guesses are paced now...
            assert console.backoff.delay("admin", "10.0.0.2") == 0.0  # (ceiling 0 here)
            assert console.log_in("admin", PASSWORDS["admin"], "10.0.0.2")  # ...not refused
        finally:
            console.httpd.server_close()
