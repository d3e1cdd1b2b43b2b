"""Attacks on a running console over real HTTP: broken bodies, idle sockets, other origins."""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

import dpsql
from dpsql.console import admission, app
from dpsql.errors import ConfigurationError
from dpsql.services import open_store

from ..server.conftest import PASSWORDS, ServerProcess, make_store
from .conftest import console_url

GRANT = {"user": "frank", "dataset": "adult", "epsilon": "0.01"}


class Client:
    """Plain HTTP/1.0 requests to one console, with the Host header a browser would send."""

    def __init__(self, url: str) -> None:
        self.port = int(urlsplit(url).port or 0)
        self.host = f"127.0.0.1:{self.port}"
        self.root = urlsplit(url).path  # the secret prefix: "/<hex>/"

    def send(self, method: str, path: str, form: dict[str, str] | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
        """Ask for page ``path`` ("budgets", below the prefix) or for "/path" as it is."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        body = urlencode(form).encode() if form is not None else None
        target = path if path.startswith("/") else self.root + path
        conn.request(method, target, body, {"Host": self.host, **(headers or {})})
        response = conn.getresponse()
        headers = {}
        for key, value in response.getheaders():  # Set-Cookie may come more than once
            headers[key] = f"{headers[key]}\n{value}" if key in headers else value
        answer = response.status, headers, response.read().decode()
        conn.close()
        return answer

    def log_in(self, user: str = "admin") -> tuple[dict[str, str], str]:
        """A logged-in admin's Cookie header and CSRF token."""
        _, headers, _ = self.send("GET", "login")
        form_token = re.match(r"dpsql_console_login=([^;]+)", headers["Set-Cookie"])
        assert form_token is not None
        jar = {"Cookie": f"dpsql_console_login={form_token.group(1)}"}
        status, headers, _ = self.send("POST", "login", {
            "csrf": form_token.group(1), "user": user, "password": PASSWORDS[user]}, jar)
        assert status == 303
        session = re.search(r"^dpsql_console=([^;]+)", headers["Set-Cookie"], re.M)
        assert session is not None
        jar = {"Cookie": f"dpsql_console={session.group(1)}"}
        _, _, page = self.send("GET", "budgets", headers=jar)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        return jar, csrf.group(1)

    def raw(self, data: bytes, wait: float = 5) -> bytes:
        """Send ``data`` as is and keep the socket open; what the server answers."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=wait) as sock:
            sock.sendall(data)
            try:
                return sock.recv(200)
            except TimeoutError:
                return b"(no answer)"


@pytest.fixture(scope="module")
def client(console_server: ServerProcess) -> Client:
    return Client(console_url(console_server))


def audited(server: ServerProcess, action: str) -> int:
    """How many audit rows of ``action`` the served store holds (read over SQL)."""
    import psycopg

    with psycopg.connect(server.dsn("admin"), autocommit=True) as conn:
        rows = conn.execute("CALL dpsql('audit --json --last 1000')").fetchall()
    return sum(action in str(row) for row in rows)


def prefix_shown(client: Client, answer: tuple[int, dict[str, str], str]) -> bool:
    """Whether an answer names the console's prefix anywhere (status line aside)."""
    prefix = client.root.strip("/")
    return prefix in answer[2] or any(prefix in v for v in answer[1].values())


def near_misses(root: str) -> list[str]:
    """Paths outside the prefix: none, a wrong one, one a character off, a part of it."""
    prefix = root.strip("/")
    off = ("0" if prefix[-1] != "0" else "1")
    return ["/login", "/budgets", "/", "/releases/adult_syn/report", f"/{'a' * 32}/login",
            f"/{prefix[:-1]}{off}/budgets", f"/{prefix[:16]}/login", f"/x{prefix}/login",
            f"/login/{prefix}/"]


def test_requests_outside_the_prefix_get_a_bare_404(client: Client) -> None:
    # A server on another port must not learn the prefix: the cookie's Path is all
    # that keeps the browser from sending it there.
    jar, csrf = client.log_in()
    assert len(client.root.strip("/")) >= 32
    for path in near_misses(client.root):
        for answer in (client.send("GET", path, headers=jar),
                       client.send("POST", path, {**GRANT, "csrf": csrf}, jar)):
            assert answer[0] == 404, path
            assert answer[2] == "", path  # no page, no link
            assert "Location" not in answer[1]
            assert "Set-Cookie" not in answer[1]
            assert not prefix_shown(client, answer)
    status, headers, _ = client.send("GET", client.root.rstrip("/"), headers=jar)
    assert (status, headers["Location"]) == (303, client.root + "budgets")


def test_the_cookies_are_sent_only_below_the_prefix(client: Client) -> None:
    status, headers, _ = client.send("GET", "login")
    assert status == 200
    assert f"; Path={client.root};" in headers["Set-Cookie"]
    form_token = re.match(r"dpsql_console_login=([^;]+)", headers["Set-Cookie"])
    assert form_token is not None
    status, headers, _ = client.send("POST", "login", {
        "csrf": form_token.group(1), "user": "admin", "password": PASSWORDS["admin"]},
        {"Cookie": f"dpsql_console_login={form_token.group(1)}"})
    assert status == 303
    cookies = headers["Set-Cookie"].split("\n")
    assert {c.split("=")[0] for c in cookies} == {"dpsql_console", "dpsql_console_login"}
    assert all(f"; Path={client.root};" in c for c in cookies), cookies


@pytest.mark.parametrize("length", ["-1", "abc", "1e3"],
                         ids=["negative", "word", "float"])
def test_a_bad_content_length_is_refused_unread(client: Client, length: str) -> None:
    # "-1" once read the body to its end: a client could stream gigabytes into memory.
    answer = client.raw(f"POST {client.root}login HTTP/1.0\r\nHost: {client.host}\r\n"
                        f"Content-Length: {length}\r\n\r\n".encode() + b"a" * 100_000)
    assert answer.startswith(b"HTTP/1.0 400"), answer


def test_a_body_over_the_limit_is_refused(client: Client) -> None:
    answer = client.raw(f"POST {client.root}login HTTP/1.0\r\nHost: {client.host}\r\n"
                        f"Content-Length: {app.MAX_FORM + 1}\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.0 413"), answer


@pytest.mark.parametrize("headers", [
    {"Origin": "http://127.0.0.1:8888"}, {"Origin": "null"},
    {"Sec-Fetch-Site": "same-site"}, {"Sec-Fetch-Site": "cross-site"}],
    ids=["other-port", "opaque", "same-site", "cross-site"])
def test_a_post_from_another_origin_is_refused(client: Client, console_server: ServerProcess,
                                               headers: dict[str, str]) -> None:
    # Cookies are not kept per port: a page on another port of 127.0.0.1 is the same
    # site, so SameSite=Strict sends the console's cookie with its requests.
    jar, csrf = client.log_in()
    grants = audited(console_server, "console: dpsql budget grant")
    status, _, _ = client.send("POST", "grant", {**GRANT, "csrf": csrf}, {**jar, **headers})
    assert status == 403
    assert audited(console_server, "console: dpsql budget grant") == grants
    own = {"Origin": f"http://{client.host}", "Sec-Fetch-Site": "same-origin"}
    status, headers, _ = client.send("POST", "grant", {**GRANT, "csrf": csrf}, {**jar, **own})
    assert (status, headers["Location"]) == (303, client.root + "budgets")
    assert audited(console_server, "console: dpsql budget grant") == grants + 1


def test_another_origin_cannot_make_the_console_evaluate(client: Client,
                                                         console_server: ServerProcess) -> None:
    # The fidelity report runs (and audits) an evaluation: an <img> on another port must not.
    jar, _ = client.log_in()
    before = audited(console_server, "evaluate")
    status, _, _ = client.send("GET", "releases/adult_syn/report",
                               headers={**jar, "Sec-Fetch-Site": "same-site"})
    assert status == 403
    assert audited(console_server, "evaluate") == before
    status, _, page = client.send("GET", "budgets", headers={**jar, "Sec-Fetch-Site": "none"})
    assert status == 200  # typed in the address bar
    assert "<h1>Budgets</h1>" in page


def test_the_login_page_opens_from_anywhere(client: Client) -> None:
    status, _, page = client.send("GET", "login", headers={"Sec-Fetch-Site": "cross-site"})
    assert status == 200
    assert "Log in" in page


# -- idle and crowded connections (a console in this process, on a store of its own) ------------
@contextlib.contextmanager
def running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            line_timeout: float) -> Iterator[app.Console]:
    """A console with few slots, whose connections have ``line_timeout`` s for a request line."""
    monkeypatch.setattr(app, "LINE_TIMEOUT", line_timeout)
    monkeypatch.setattr(app, "READ_TIMEOUT", 1.0)
    monkeypatch.setattr(admission, "MAX_CONNECTIONS", 4)
    monkeypatch.setattr(admission, "MAX_WAITING", 8)
    monkeypatch.setattr(admission, "MAX_WAITING_PER_ADDRESS", 4)
    path = make_store(tmp_path / "adult.duckdb")
    with open_store(path) as store:
        console = app.Console(store, b"s" * 32, lambda user: dpsql.connect(path, user))
        console.start()
        try:
            yield console
        finally:
            console.stop()


@pytest.fixture
def console(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[app.Console]:
    """A console that drops a connection silent for a second."""
    with running(tmp_path, monkeypatch, 1.0) as console:
        yield console


@pytest.fixture
def patient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[app.Console]:
    """A console whose idle connections stay (a minute for their request line)."""
    with running(tmp_path, monkeypatch, 60.0) as console:
        yield console


def idle(port: int, source: str, data: bytes = b"") -> socket.socket:
    """A connection from ``source`` that sends ``data`` (no whole request line) and waits."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    if data:
        sock.sendall(data)
    return sock


def eventually(check: Callable[[], bool], timeout: float = 30) -> None:
    """Wait until ``check()`` holds (the server's threads work on their own time)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_a_silent_connection_is_closed_unanswered(console: app.Console) -> None:
    with socket.create_connection(("127.0.0.1", console.port), timeout=30) as sock:
        assert sock.recv(100) == b""  # no request line within LINE_TIMEOUT
    with socket.create_connection(("127.0.0.1", console.port), timeout=30) as sock:
        sock.sendall(f"GET {urlsplit(console.url).path}login HTTP/1.0\r\n".encode())
        assert sock.recv(100) == b""  # below the prefix, but no headers within READ_TIMEOUT


def test_the_prefix_is_checked_at_the_request_line(console: app.Console) -> None:
    # Issue 40: the prefix was checked only after the whole request was read, so a
    # stranger's half-sent request held a connection as long as one of the admin's.
    for line in (b"GET / HTTP/1.1\r\n", b"POST /login HTTP/1.0\r\n", b"GET /x y z w\r\n"):
        with socket.create_connection(("127.0.0.1", console.port), timeout=30) as sock:
            sock.sendall(line)  # and no headers
            answer = b""
            while chunk := sock.recv(1000):
                answer += chunk
            assert answer == b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n", line


def test_idle_sockets_cannot_starve_the_admin(patient: app.Console) -> None:
    # Issue 40: MAX_CONNECTIONS idle sockets sending "GET /" made the console answer 503.
    client = Client(patient.url)
    sockets = [idle(patient.port, source, b"GET /") for source in ("127.0.0.2", "127.0.0.1")
               for _ in range(3 * admission.MAX_CONNECTIONS)]
    try:
        eventually(lambda: patient.httpd.waiting.count() == admission.MAX_WAITING)
        assert patient.httpd.waiting.count("127.0.0.2") <= admission.MAX_WAITING_PER_ADDRESS
        assert client.send("GET", "login")[0] == 200  # from 127.0.0.1, as the newest
        jar, _ = client.log_in()
        assert client.send("GET", "budgets", headers=jar)[0] == 200
    finally:
        for sock in sockets:
            sock.close()


def test_idle_connections_cannot_take_every_thread(patient: app.Console) -> None:
    before = threading.active_count()
    sockets = [idle(patient.port, f"127.0.0.{2 + i % 5}") for i in range(40)]
    try:
        eventually(lambda: patient.httpd.waiting.count() == admission.MAX_WAITING)
        eventually(lambda: threading.active_count() - before <= admission.MAX_WAITING)  # not 40
        # The oldest waiting connections were closed to make room for newer ones.
        assert sum(sock.recv(100) == b"" for sock in sockets[:20]) == 20
    finally:
        for sock in sockets:
            sock.close()
    eventually(lambda: patient.httpd.waiting.count() == 0)
    assert Client(patient.url).send("GET", "login")[0] == 200


def test_waiting_connections_are_capped_per_address() -> None:
    waiting = admission.Waiting(total=5, per_address=2)
    assert waiting.add("a1", "10.0.0.1") == []
    assert waiting.add("a2", "10.0.0.1") == []
    assert waiting.add("b1", "10.0.0.2") == []
    assert waiting.add("a3", "10.0.0.1") == ["a1"]  # its address's oldest makes room
    assert waiting.add("c1", "10.0.0.3") == []
    assert waiting.add("d1", "10.0.0.4") == []
    assert (waiting.count(), waiting.count("10.0.0.1")) == (5, 2)
    assert waiting.add("e1", "10.0.0.5") == ["a2"]  # all taken: the oldest of all
    assert not waiting.remove("a1")  # dropped: its request goes unanswered
    assert waiting.remove("b1")
    assert not waiting.remove("b1")
    assert (waiting.count(), waiting.count("10.0.0.1"), waiting.count("10.0.0.2")) == (4, 1, 0)


def test_each_console_has_its_own_random_prefix(console: app.Console) -> None:
    def another(prefix: str | None = None) -> app.Console:
        return app.Console(console.store, b"s" * 32, console.open_session, prefix=prefix)

    other, fixed = another(), another("scripted-" + "x" * 23)
    for refused in ("x" * 31, "x" * 32 + ";", "x" * 32 + "\n"):  # short; would end the Path
        with pytest.raises(ConfigurationError, match="32 or more"):
            another(refused)
    other.httpd.server_close()
    fixed.httpd.server_close()
    assert re.fullmatch(r"[0-9a-f]{32}", console.prefix)
    assert other.prefix != console.prefix
    assert console.url == f"http://127.0.0.1:{console.port}/{console.prefix}/"
    assert fixed.url.endswith(":" + str(fixed.port) + "/scripted-" + "x" * 23 + "/")


def test_a_new_password_ends_the_logins_made_with_the_old(client: Client,
                                                         console_server: ServerProcess) -> None:
    # Resetting a leaked password must lock out whoever logged in with it.
    jar, _ = client.log_in()
    db = console_server.process.args[console_server.process.args.index("--db") + 1]
    subprocess.run([sys.executable, "-m", "dpsql", "user", "add", "admin", "--password-stdin",
                    "--db", db], input=PASSWORDS["admin"], text=True, check=True,
                   capture_output=True)
    status, _, page = client.send("GET", "budgets", headers=jar)
    assert status == 403
    assert "password changed" in page
    assert client.send("GET", "budgets", headers=jar)[0] == 303  # logged out: to login
    fresh, _ = client.log_in()
    assert client.send("GET", "budgets", headers=fresh)[0] == 200
