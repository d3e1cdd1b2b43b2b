"""Console logins: an administrator's SQL password, a session cookie and CSRF tokens.

A login is a random token in an HttpOnly, SameSite=Strict cookie whose Path is the
console's secret prefix; each login has
its own random CSRF token that every POST form carries back. Logins live in
memory only: restarting the server logs everyone out.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from dpsql import passwords
from dpsql.store import Store

COOKIE = "dpsql_console"
LOGIN_COOKIE = "dpsql_console_login"  # the login form's CSRF token (double submit)
IDLE_SECONDS = 30 * 60


@dataclass
class Login:
    """One logged-in administrator."""

    user: str
    csrf: str
    expires: float
    credential: passwords.Verifier | None = None  # the SQL password's verifier it logged in with
    flash: str | None = None  # what the last action said, shown once on the next page
    error: str | None = None


class Logins:
    """The open logins, by cookie token; one expires after ``idle`` seconds unused."""

    def __init__(self, idle: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle = idle
        self.clock = clock
        self._open: dict[str, Login] = {}

    def open(self, user: str, credential: passwords.Verifier | None = None) -> tuple[str, Login]:
        """A new login for ``user``: its cookie token and the login."""
        token = secrets.token_urlsafe(32)
        login = Login(user, secrets.token_urlsafe(32), self.clock() + self.idle, credential)
        self._open[token] = login
        return token, login

    def find(self, token: str | None) -> Login | None:
        """The live login of ``token`` (its idle timer restarts), else None."""
        login = self._open.get(token or "")
        if login is None or token is None:
            return None
        now = self.clock()
        if login.expires <= now:
            self._open.pop(token, None)
            return None
        login.expires = now + self.idle
        return login

    def close(self, token: str | None) -> None:
        """Log out (nothing when the token is unknown)."""
        if token:
            self._open.pop(token, None)


def set_cookie(name: str, value: str, path: str, *, clear: bool = False) -> str:
    """A Set-Cookie value no script may read, no other site may send, sent only below ``path``.

    ``path`` is the console's secret prefix: browsers send a host's cookies to its
    every port, but only to the paths they were set for.
    """
    age = "; Max-Age=0" if clear else ""
    return f"{name}={value}; Path={path}; HttpOnly; SameSite=Strict{age}"


def cookie(header: str | None, name: str) -> str | None:
    """The value of cookie ``name`` in a Cookie header, else None."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header or "")
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None else None


def same_token(expected: str | None, given: str | None) -> bool:
    """Whether a form's CSRF token is the expected one (constant time; both must exist)."""
    return bool(expected) and bool(given) and secrets.compare_digest(
        str(expected).encode(), str(given).encode())


def password_ok(store: Store, secret: bytes, user: str, password: str) -> bool:
    """Whether ``password`` is ``user``'s SQL password.

    An unknown user is checked against a mock verifier, so that both take the
    same time, as the wire server's SCRAM login does.
    """
    verifier = passwords.load_verifier(store, user)
    matches = (verifier or passwords.mock_verifier(user, secret)).check(password)
    return matches and verifier is not None
