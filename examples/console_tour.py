"""The administrators' web console, driven from a script with urllib.

    python examples/console_tour.py

Builds a store from the bundled Adult sample, gives the admin a SQL password,
starts `dpsql serve --console` on free ports, lets the analyst alice spend some
budget over the wire, then logs in to the console as a browser would (at the
address the server wrote to a file only its owner may read, below its secret
random path prefix; the login form's CSRF token, the session cookie, sent only
below that prefix), reads the budget page, grants alice more budget through the
grant form, finds the grant in the audit page and shows that the bare port
answers 404. The server is stopped at the end. Open the printed URL in a browser
to look around while it runs (set CONSOLE_TOUR_WAIT=60 to keep it up for a minute).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.cookiejar import CookieJar
from importlib import resources
from pathlib import Path

import psycopg

import dpsql
from dpsql import passwords

DATA = Path(str(resources.files("dpsql").joinpath("data")))
PASSWORDS = {"admin": "admin-console-1", "alice": "alice-console-1"}


def start(db: Path) -> tuple[subprocess.Popen[str], int, str]:
    """`dpsql serve --console` in a subprocess: it, the SQL port and the console URL."""
    server = subprocess.Popen([sys.executable, "-m", "dpsql", "serve", "--db", str(db),
                               "--port", "0", "--console", "--console-port", "0"],
                              stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    port = None
    for line in server.stderr:
        print("  server:", line.rstrip())
        port = port or _number(re.search(r"listening on [\d.]+:(\d+)", line))
        # The address holds the console's secret prefix: the server writes it to a file
        # only its owner may read, and prints that file's path.
        url = re.search(r"console \(administrators\): its address is in (\S+\.url) ", line)
        if port and url:
            threading.Thread(target=server.stderr.read, daemon=True).start()  # drain the log
            return server, port, Path(url.group(1)).read_text().strip()
    raise RuntimeError("the server did not start")


def _number(match: re.Match[str] | None) -> int | None:
    return int(match.group(1)) if match else None


class Browser:
    """Just enough of a browser: cookies, forms with their CSRF token, redirects."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))

    def get(self, path: str) -> str:
        """Page ``path`` ("audit?kind=grant"), below the console's prefix."""
        with self.opener.open(self.url + path, timeout=60) as response:
            return str(response.read().decode())

    def post(self, path: str, page: str, **fields: str) -> str:
        """Send a form of ``page`` (its CSRF token included) to ``path``."""
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token is not None, "the page has no form"
        body = urllib.parse.urlencode({"csrf": token.group(1), **fields}).encode()
        with self.opener.open(self.url + path, body, timeout=60) as response:
            return str(response.read().decode())


def bare_status(url: str, path: str) -> int:
    """The status of ``path`` asked for at the console's port without its prefix."""
    bare = urllib.parse.urlsplit(url)._replace(path="/" + path).geturl()
    try:
        with urllib.request.urlopen(bare, timeout=60) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def title(page: str) -> str:
    match = re.search(r"<title>(.*?)</title>", page)
    return match.group(1) if match else "(no title)"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "adult.duckdb"
        store, _ = dpsql.init(db, DATA / "adult.yaml", {"adult": DATA / "adult_sample.csv"})
        for user, password in PASSWORDS.items():  # what `dpsql user add USER` does
            passwords.set_password(store, user, password)
        store.close()

        server, port, url = start(db)
        try:
            dsn = (f"host=127.0.0.1 port={port} dbname=adult user=alice "
                   f"password={PASSWORDS['alice']}")
            with psycopg.connect(dsn, autocommit=True) as conn:
                for epsilon in ("0.1", "0.3", "0.2"):
                    conn.execute(f"SET dpsql.epsilon = {epsilon}")
                    conn.execute("SELECT COUNT(*) FROM adult").fetchone()
            print(f"\n1. alice asked three DP counts; the console is at {url}")

            browser = Browser(url)
            page = browser.post("login", browser.get("login"), user="admin",
                                password=PASSWORDS["admin"])
            print(f"2. logged in as admin: {title(page)}")
            for label in re.findall(r'aria-label="([^"]+ spent)"', page):
                print("   bar:", label)

            page = browser.post("grant", page, user="alice", dataset="adult", epsilon="0.5")
            print("3. granted through the form:",
                  re.search(r'class="flash">([^<]*)', page).group(1))  # type: ignore[union-attr]
            audit = browser.get("audit?kind=grant")
            print("4. the audit page shows it:",
                  re.search(r"grant alice adult [^<]*", audit).group(0))  # type: ignore[union-attr]
            print("5. without the secret prefix, /login answers:", bare_status(url, "login"))
            time.sleep(float(os.environ.get("CONSOLE_TOUR_WAIT", "0")))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
            print("server stopped with exit code", server.returncode)


if __name__ == "__main__":
    main()
