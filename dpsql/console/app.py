"""The console's HTTP server: a thread of ``dpsql serve`` on localhost, one page per request.

Reads go through the same functions as ``budget show``, ``audit``, ``releases`` and
``jobs``; actions (grant, release, cancel a job) are typed operations of
:mod:`dpsql.admin` (:mod:`dpsql.console.actions`): a form's values are their
arguments, never a command line. They run as the logged-in administrator,
audited (action ``admin_call``) besides what the operation itself records.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from dpsql.console import actions, pages, views
from dpsql.console.admission import Server
from dpsql.console.auth import (
    COOKIE,
    LOGIN_COOKIE,
    Login,
    Logins,
    cookie,
    password_ok,
    same_token,
    set_cookie,
)
from dpsql.errors import ConfigurationError, DPSQLError
from dpsql.passwords import load_verifier
from dpsql.policies import active_policy
from dpsql.server.logins import GuessGate, LoginBackoff
from dpsql.session import Session
from dpsql.store import Store

log = logging.getLogger("dpsql.console")
MAX_FORM = 64 * 1024
MAX_LINE = 8192  # bytes of a request line
LINE_TIMEOUT = 5.0  # seconds a new connection has to send its request line
READ_TIMEOUT = 10.0  # seconds a request below the prefix may stay silent (headers, body)
FAILED_LOGIN = "wrong user name or password, or not an administrator of this store"
HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # (no-referrer would make our own forms' Origin null)
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "img-src data:; form-action 'self'; frame-ancestors 'none'",
}
ELSEWHERE = pages.layout("Refused", "", error="a page of another site or port asked for this; "
                         "open the console from its own address")
PREFIX = re.compile(r"[A-Za-z0-9_-]{32,}")  # as secrets.token_hex(16) and longer
_RELEASE = re.compile(r"^/releases/([^/]+)(/report)?$")


class Console:
    """The console of one served store, listening on 127.0.0.1 only, under a secret path.

    Browsers send a host's cookies to all its ports: a web server on another port
    of this machine that the admin's browser visits would be sent the session
    cookie. The cookie's Path is the console's random ``prefix`` (as Jupyter's
    token), so the browser sends it to no other path, which such a server cannot
    know; every request outside the prefix is a bare 404.
    """

    def __init__(self, store: Store, secret: bytes, open_session: Callable[[str], Session],
                 port: int = 0, prefix: str | None = None) -> None:
        prefix = secrets.token_hex(16) if prefix is None else prefix
        if not PREFIX.fullmatch(prefix):
            raise ConfigurationError("the console's path prefix must be 32 or more letters, "
                                     "digits, '-' or '_' (a secret, as a password)")
        self.prefix = prefix
        self.root = f"/{prefix}/"  # every page is below it; cookies are sent only there
        self.store = store
        self.secret = secret
        self.open_session = open_session
        self.logins = Logins()
        self.backoff = LoginBackoff()
        self.gate = GuessGate()  # the pace of guesses of one name, over all addresses
        self.login_lock = threading.Lock()  # neither is thread-safe; requests are
        self.failed_login_delay = 0.5  # seconds, at least, before a failed login is answered
        self.login_wait = 10.0  # seconds a login waits at most for its name's turn
        self.httpd = Server(("127.0.0.1", port), _handler(self))
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}{self.root}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        threading.Thread(target=self.httpd.serve_forever, name="dpsql-console",
                         daemon=True).start()

    def stop(self) -> None:
        """Stop serving and close the socket (connections yet to ask for a page at once)."""
        self.httpd.shutdown()
        self.httpd.waiting.drop_all()
        self.httpd.server_close()

    def log_in(self, user: str, password: str, host: str) -> str:
        """Check an administrator's SQL password; the new login's token (ValueError: why not).

        Every failure says the same (:data:`FAILED_LOGIN`) and counts the same: an
        analyst's right password is refused exactly as a wrong one, so the console
        tells nobody whether a password is right. Failures never refuse a right
        password, so nobody can lock an administrator out (everyone on the machine
        shares 127.0.0.1): a guess waits for its name's turn (:class:`GuessGate`,
        ``login_wait`` seconds at most, then it is checked anyway), and a failure is
        answered after a delay, longer when the name or the address fails often
        (:meth:`LoginBackoff.delay`).
        """
        deadline = time.monotonic() + self.login_wait
        while True:
            with self.login_lock:
                turn = self.gate.turn(user)
            if turn <= 0 or time.monotonic() >= deadline:
                break
            time.sleep(min(turn, max(0.0, deadline - time.monotonic())))
        hold = 0.0
        with self.login_lock:
            principal = active_policy(self.store).users.get(user)
            admin = password_ok(self.store, self.secret, user, password) and \
                principal is not None and principal.role == "admin"
            if admin:
                self.backoff.succeeded(user, host)
            else:
                self.backoff.failed(user, host)
                self.gate.spend(user)
                hold = max(self.failed_login_delay, self.backoff.delay(user, host))
        if not admin:
            log.warning("console: failed login for %r from %s", user, host)
            time.sleep(hold)
            raise ValueError(FAILED_LOGIN)
        log.info("console: %s logged in from %s", user, host)
        return self.logins.open(user, load_verifier(self.store, user))[0]


def _prefixed(target: str, prefix: str) -> str | None:
    """The path of request target ``target`` below ``prefix`` ("/budgets"), else None.

    The prefix is compared in constant time: it is what keeps the cookie from
    the servers on the other ports.
    """
    head, _, rest = urlsplit(target).path[1:].partition("/")
    return "/" + rest if secrets.compare_digest(head.encode(), prefix.encode()) else None


def _handler(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.console = console
    Handler.timeout = LINE_TIMEOUT  # per read: a silent client is dropped, not waited for
    return Handler


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "dpsql-console"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to the server log at debug level, the secret prefix masked."""
        text = format % args
        log.debug("console: %s", text.replace(self.console.prefix, "<prefix>"))

    def handle_one_request(self) -> None:
        """Serve one request (HTTP/1.0), if its request line names a page below the prefix.

        The prefix is checked as soon as the request line is in, before any header
        is read: a request elsewhere gets a bare 404 and is closed at once, and only
        a request below the prefix takes one of the serving slots.
        """
        self.close_connection = True
        server = self.server
        assert isinstance(server, Server)
        try:
            line = self.rfile.readline(MAX_LINE + 1)
        except OSError:  # silent too long, reset, or dropped for a newer connection
            line = b""
        if not server.waiting.remove(self.request) or not line or len(line) > MAX_LINE:
            return
        if not self._below_prefix(line):
            return self._bare(HTTPStatus.NOT_FOUND)
        if not server.slots.acquire(blocking=False):
            return self._bare(HTTPStatus.SERVICE_UNAVAILABLE)
        try:
            self.request.settimeout(READ_TIMEOUT)
            self.raw_requestline = line
            if not self.parse_request():
                return
            method = getattr(self, "do_" + self.command, None)
            if method is None:
                return self.send_error(HTTPStatus.NOT_IMPLEMENTED)
            method()
            self.wfile.flush()
        except OSError:  # the client went silent or away
            pass
        finally:
            server.slots.release()

    def _below_prefix(self, line: bytes) -> bool:
        """Whether request line ``line`` asks for a page below the prefix."""
        words = line.decode("iso-8859-1").split()
        if len(words) not in (2, 3):
            return False
        return _prefixed(words[1], self.console.prefix) is not None

    def _bare(self, status: HTTPStatus) -> None:
        """Answer ``status`` with nothing else (no page, nothing naming the prefix)."""
        with contextlib.suppress(OSError):
            self.wfile.write(f"HTTP/1.0 {status.value} {status.phrase}\r\n"
                             "Content-Length: 0\r\n\r\n".encode("ascii"))

    # -- plumbing ---------------------------------------------------------------------------
    def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for key, value in {**HEADERS, **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _redirect(self, to: str, cookies: Sequence[str] = ()) -> None:
        """To page ``to`` of the console (a name below its prefix), setting ``cookies``."""
        self.send_response(303)
        self.send_header("Location", self.console.root + to)
        for value in cookies:
            self.send_header("Set-Cookie", value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _local(self) -> bool:
        """Whether the Host header names this console (no DNS rebinding from a web page)."""
        port = self.console.port
        return self.headers.get("Host", "") in (f"127.0.0.1:{port}", f"localhost:{port}")

    def _from_elsewhere(self) -> bool:
        """Whether a browser sent this for a page of another origin.

        Cookies are not kept per port: SameSite=Strict would send ours with the requests
        of a page on another port of 127.0.0.1 (the same site) that knew the prefix.
        """
        origin = self.headers.get("Origin")
        return (self.headers.get("Sec-Fetch-Site") in ("same-site", "cross-site")
                or (origin is not None and origin != f"http://{self.headers['Host']}"))

    def _inside(self) -> str | None:
        """The path of this request below the console's prefix ("/budgets"), else None."""
        return _prefixed(self.path, self.console.prefix)

    def _cookie(self, name: str, value: str, clear: bool = False) -> str:
        return set_cookie(name, value, self.console.root, clear=clear)

    def _layout(self, title: str, body: str, login: Login, **notes: str | None) -> str:
        """A page with the navigation of a logged-in admin."""
        return pages.layout(title, body, user=login.user, csrf=login.csrf,
                            root=self.console.root, **notes)

    def _token(self) -> str | None:
        return cookie(self.headers.get("Cookie"), COOKIE)

    def _form(self) -> dict[str, str] | int:
        """The posted form, or the status refusing it (400: bad length, 413: too long)."""
        length = self.headers.get("Content-Length") or "0"
        if not (length.isascii() and length.isdigit()):  # "-1" would read to the end
            return 400
        if int(length) > MAX_FORM:
            return 413
        return dict(parse_qsl(self.rfile.read(int(length)).decode("utf-8", "replace")))

    # -- requests -----------------------------------------------------------------------------
    def do_GET(self) -> None:
        """Pages: the login form, or a page of a logged-in administrator."""
        if not self._local():
            return self._send(421, "wrong Host header")
        path = self._inside()
        if path is None:
            return self._send(404)  # bare: nothing here names the prefix
        if path != "/login" and self._from_elsewhere():
            return self._send(403, ELSEWHERE)
        if path == "/":
            return self._redirect("budgets")
        if path == "/login":
            token = secrets.token_urlsafe(32)
            return self._send(200, pages.login_page(token),
                              {"Set-Cookie": self._cookie(LOGIN_COOKIE, token)})
        login = self.console.logins.find(self._token())
        if login is None:
            return self._redirect("login")
        query = dict(parse_qsl(urlsplit(self.path).query))
        flash, error = login.flash, login.error
        login.flash = login.error = None
        self._page(login, path, query, flash, error)

    def _page(self, login: Login, path: str, query: dict[str, str], flash: str | None,
              error: str | None) -> None:
        match = _RELEASE.match(path)
        with self._session(login) as session:
            if session is None:
                return
            try:
                if match and match.group(2):
                    return self._send(200, views.report(session, unquote(match.group(1))))
                title, body = _view(session, path, query, login.csrf, match)
            except DPSQLError as err:
                title, body, error = "Error", "", str(err)
            if title is None:
                return self._send(404, self._layout("Not found", "", login))
            self._send(200, self._layout(title, body, login, flash=flash, error=error))

    def do_POST(self) -> None:
        """Log in, log out and the actions; each form must carry its CSRF token."""
        if not self._local():
            return self._send(421, "wrong Host header")
        path = self._inside()
        if path is None:
            return self._send(404)  # bare, and the body is left unread
        if self._from_elsewhere():
            return self._send(403, ELSEWHERE)
        form = self._form()
        if isinstance(form, int):
            return self._send(form, "bad Content-Length" if form == 400 else "form too large")
        if path == "/login":
            return self._log_in(form)
        token = self._token()
        login = self.console.logins.find(token)
        if login is None:
            return self._redirect("login")
        if not same_token(login.csrf, form.get("csrf")):
            return self._send(403, pages.layout("Refused", "", error="missing or wrong CSRF "
                                                "token; reload the page and try again"))
        if path == "/logout":
            self.console.logins.close(token)
            return self._redirect("login", [self._cookie(COOKIE, "", clear=True)])
        chosen = actions.action(path, form)
        if chosen is None:
            return self._send(404, pages.layout("Not found", ""))
        with self._session(login) as session:
            if session is None:
                return
            try:
                login.flash = actions.perform(session, chosen) or "done"
            except DPSQLError as err:
                login.error = str(err)
        self._redirect(chosen.back)

    def _log_in(self, form: dict[str, str]) -> None:
        expected = cookie(self.headers.get("Cookie"), LOGIN_COOKIE)
        if not same_token(expected, form.get("csrf")):
            return self._send(403, pages.layout("Refused", "", error="missing or wrong CSRF "
                                                "token; reload the login page"))
        try:
            token = self.console.log_in(form.get("user", ""), form.get("password", ""),
                                        self.client_address[0])
        except ValueError as err:
            fresh = secrets.token_urlsafe(32)
            return self._send(403, pages.login_page(fresh, str(err)),
                              {"Set-Cookie": self._cookie(LOGIN_COOKIE, fresh)})
        self._redirect("budgets", [self._cookie(COOKIE, token),
                                   self._cookie(LOGIN_COOKIE, "", clear=True)])

    def _session(self, login: Login) -> _AdminSession:
        return _AdminSession(self, login)


class _AdminSession:
    """A Session of the logged-in user while they are an admin with the same SQL password.

    Else the login ends: resetting a leaked password locks its holder out.
    """

    def __init__(self, handler: _Handler, login: Login) -> None:
        self.handler, self.login = handler, login
        self.session: Session | None = None

    def __enter__(self) -> Session | None:
        console, user = self.handler.console, self.login.user
        try:
            self.session = console.open_session(user)
            if self.session.is_admin and \
                    load_verifier(console.store, user) == self.login.credential:
                return self.session
        except DPSQLError:
            pass
        console.logins.close(self.handler._token())
        self.handler._send(403, pages.layout("Refused", "", error=f"{user} is no longer an "
                                             "administrator of this store, or their SQL "
                                             "password changed; log in again"))
        return None

    def __exit__(self, *exc: object) -> None:
        if self.session is not None:
            self.session.close()


def _view(session: Session, path: str, query: dict[str, str], csrf: str,
          release: re.Match[str] | None) -> tuple[str | None, str]:
    """The title and body of page ``path`` (None: no such page)."""
    if path == "/budgets":
        return "Budgets", views.budgets(session, csrf)
    if path == "/audit":
        return "Audit log", views.audit(session, query)
    if path == "/releases":
        return "Releases", views.releases(session, csrf)
    if release is not None:
        name = unquote(release.group(1))
        return f"Release {name}", views.release(session, name)
    if path == "/policy":
        return "Policy", views.policy(session)
    if path == "/jobs":
        return "Jobs", views.jobs(session, csrf)
    return None, ""
