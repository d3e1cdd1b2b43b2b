"""The console's HTTP server: a thread of ``dpsql serve`` on localhost, one page per request.

Reads go through the same functions as ``budget show``, ``audit``, ``releases`` and
``jobs``; actions (grant, release, cancel a job) run the ``dpsql`` command line
through :func:`dpsql.server.procedure.call`, as ``CALL dpsql(...)`` does: as the
logged-in administrator, audited (action ``admin_call``) besides what the command
itself records.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import shlex
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from dpsql.console import pages, views
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
from dpsql.server import procedure
from dpsql.server.auth import LoginBackoff, load_verifier
from dpsql.session import Session
from dpsql.store import Store

log = logging.getLogger("dpsql.console")
MAX_FORM = 64 * 1024
READ_TIMEOUT = 10.0  # seconds a connection may stay silent before it is closed
MAX_CONNECTIONS = 32  # connections served at once (a thread each); more are turned away
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
_CANCEL = re.compile(r"^/jobs/(\d+)/cancel$")


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
        self.login_lock = threading.Lock()  # LoginBackoff is not thread-safe; requests are
        self.httpd = _Server(("127.0.0.1", port), _handler(self))
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}{self.root}"

    def start(self) -> None:
        """Serve in a daemon thread."""
        threading.Thread(target=self.httpd.serve_forever, name="dpsql-console",
                         daemon=True).start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def log_in(self, user: str, password: str, host: str) -> str:
        """Check an administrator's SQL password; the new login's token (ValueError: why not)."""
        with self.login_lock:
            wait = self.backoff.wait(user, host)
            if wait > 0:
                raise ValueError(f"too many failed logins for {user!r} from this address; "
                                 f"try again in {int(wait) + 1} s")
            if not password_ok(self.store, self.secret, user, password):
                self.backoff.failed(user, host)
                log.warning("console: failed login for %r from %s", user, host)
                raise ValueError("wrong user name or password")
            self.backoff.succeeded(user, host)
        if self.store.active_policy().users[user].role != "admin":
            raise ValueError(f"{user} is an analyst; the console is for administrators "
                             "(analysts connect with psql, psycopg or the Python API)")
        log.info("console: %s logged in from %s", user, host)
        return self.logins.open(user, load_verifier(self.store, user))[0]


def run_command(session: Session, args: list[str]) -> str:
    """Run ``dpsql ARGS`` as the session's admin through CALL dpsql's code path; its output."""
    command = shlex.join(args)
    answer = procedure.call(session, command, statement=f"console: dpsql {command}")
    lines = answer.table.column(0).to_pylist() if answer.table is not None else []
    return "\n".join([*(str(x) for x in lines), answer.notice or ""]).strip()


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` of them.

    Idle or slow sockets would otherwise hold a thread each without end, until the
    process (the SQL server's too) could start no more; those beyond the limit are
    answered 503 and closed.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def _handler(console: Console) -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        pass

    Handler.console = console
    Handler.timeout = READ_TIMEOUT  # per read: a silent client is dropped, not waited for
    return Handler


class _Handler(BaseHTTPRequestHandler):
    console: Console
    server_version = "dpsql-console"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to the server log at debug level."""
        log.debug("console: " + format, *args)

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
        """The path of this request below the console's prefix ("/budgets"), else None.

        The prefix is compared in constant time: it is what keeps the cookie from
        the servers on the other ports.
        """
        head, _, rest = urlsplit(self.path).path[1:].partition("/")
        return "/" + rest if secrets.compare_digest(head.encode(), self.console.prefix.encode()) \
            else None

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
        args, back = _action(path, form)
        if args is None:
            return self._send(404, pages.layout("Not found", ""))
        with self._session(login) as session:
            if session is None:
                return
            try:
                login.flash = run_command(session, args) or "done"
            except DPSQLError as err:
                login.error = str(err)
        self._redirect(back)

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


def _action(path: str, form: dict[str, str]) -> tuple[list[str] | None, str]:
    """The dpsql command line of a form, and the page to go back to."""
    if path == "/grant":
        return ["budget", "grant", "--epsilon", form.get("epsilon", ""), "--",
                form.get("user", ""), form.get("dataset", "")], "budgets"
    if path == "/release":
        return ["release", "--synth", form.get("synthesizer", ""), "--epsilon",
                form.get("epsilon", ""), "--name", form.get("name", ""), "--detach", "--",
                form.get("dataset", "")], "jobs"
    match = _CANCEL.match(path)
    if match:
        return ["jobs", "cancel", match.group(1)], "jobs"
    return None, "budgets"

