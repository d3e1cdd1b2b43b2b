"""The console in a real headless browser: log in, watch budgets move, act through forms."""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from PIL import Image

from dpsql.console.app import FAILED_LOGIN

from ..server.conftest import PASSWORDS, ServerProcess
from .conftest import console_url

PAGES = ("budgets", "audit", "releases", "releases/adult_syn", "policy", "jobs")


def log_in(driver: Any, url: str, user: str = "admin") -> None:
    """Fill and send the login form."""
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(url + "login")
    driver.find_element(By.NAME, "user").send_keys(user)
    driver.find_element(By.NAME, "password").send_keys(PASSWORDS[user])
    driver.find_element(By.TAG_NAME, "form").submit()
    shows(driver, "</h1>")


def shows(driver: Any, text: str, timeout: float = 20) -> None:
    """Wait until the page that a submit loads holds ``text``."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: text in d.page_source and
                                         d.execute_script("return document.readyState")
                                         == "complete")


def share(driver: Any, label: str) -> float:
    """The spent share a budget bar draws for ``label``."""
    from selenium.webdriver.common.by import By

    bar = driver.find_element(By.CSS_SELECTOR, f'svg[aria-label^="{label}:"]')
    return float(bar.get_attribute("data-share"))


def test_analyst_password_is_refused(browser: Any, console_server: ServerProcess) -> None:
    url = console_url(console_server)
    log_in(browser, url, "alice")
    shows(browser, "not an administrator")  # as a wrong password: it says nothing more
    assert FAILED_LOGIN in browser.page_source
    browser.get(url + "budgets")
    assert browser.current_url.endswith("/login")  # no session cookie was given


def test_budget_bar_moves_after_a_query(browser: Any, console_server: ServerProcess) -> None:
    url = console_url(console_server)
    log_in(browser, url)
    assert browser.current_url.endswith("/budgets")
    before = share(browser, "erin on adult")
    with psycopg.connect(console_server.dsn("erin"), autocommit=True) as conn:
        conn.execute("SET dpsql.epsilon = 0.5")
        conn.execute("SELECT COUNT(*) FROM adult").fetchone()
    browser.refresh()
    assert before == 0.0
    assert share(browser, "erin on adult") == pytest.approx(0.5)  # 0.5 of erin's epsilon 1


def test_grant_through_the_form_is_audited(browser: Any, console_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url = console_url(console_server)
    log_in(browser, url)
    form = browser.find_element(By.CSS_SELECTOR, 'form[action="grant"]')
    Select(form.find_element(By.NAME, "user")).select_by_value("frank")
    form.find_element(By.NAME, "epsilon").send_keys("0.25")
    form.submit()
    shows(browser, "granted epsilon")
    assert "granted epsilon=0.25 to frank on adult" in browser.page_source
    assert share(browser, "frank on adult") == 0.0  # granted 1.25, nothing spent
    browser.get(url + "audit?user=admin&kind=grant")
    rows = browser.find_elements(By.XPATH, "//tr[td[text()='grant']]")
    assert len(rows) == 1
    assert "grant frank adult epsilon=0.25" in rows[0].text
    browser.get(url + "audit?kind=admin_call")
    assert "console: dpsql budget grant --epsilon 0.25 -- frank adult" in browser.page_source


def test_a_release_opens_its_fidelity_report(browser: Any, console_server: ServerProcess) -> None:
    from selenium.webdriver.common.by import By

    url = console_url(console_server)
    log_in(browser, url)
    browser.get(url + "releases")
    browser.find_element(By.LINK_TEXT, "adult_syn").click()
    assert "independent" in browser.page_source
    assert "Fidelity report" in browser.page_source
    browser.find_element(By.LINK_TEXT, "Fidelity report").click()
    shows(browser, "Fidelity of released.adult_syn", timeout=60)
    assert browser.title == "dpsql fidelity report: adult_syn"
    assert browser.find_elements(By.CSS_SELECTOR, "img[src^='data:image/png']")


def test_a_post_without_the_csrf_token_is_refused(browser: Any,
                                                  console_server: ServerProcess) -> None:
    url = console_url(console_server)
    log_in(browser, url)
    cookie = "; ".join(f"{c['name']}={c['value']}" for c in browser.get_cookies())

    def post(body: bytes) -> int:
        request = urllib.request.Request(url + "grant", body, {"Cookie": cookie})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as err:
            return err.code

    assert post(b"user=dave&dataset=adult&epsilon=5") == 403
    assert post(b"user=dave&dataset=adult&epsilon=5&csrf=forged") == 403
    browser.get(url + "audit?kind=grant")
    assert "grant dave" not in browser.page_source


def test_a_page_on_another_port_cannot_use_the_login(browser: Any,
                                                     console_server: ServerProcess) -> None:
    # Browsers keep cookies per host, not per port: without the secret prefix as the
    # cookie's Path, a server on another port of 127.0.0.1 that the admin visits would be
    # sent the session cookie (SameSite=Strict too) and could replay it. It records what
    # it is sent. A page that knew the prefix would get the cookie sent with its <img>s
    # to the console: those must not run an evaluation (the Origin checks).
    url = console_url(console_server)
    log_in(browser, url)
    assert "dpsql_console" in {c["name"] for c in browser.get_cookies()}
    page = (f'<img src="{url}releases/adult_syn/report"><img src="{url}budgets">'
            '<img src="/pixel.png"><img src="/login">').encode()
    sent: list[tuple[str, str]] = []  # (path, Cookie header) of each request it was sent

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            sent.append((self.path, self.headers.get("Cookie", "")))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    before = evaluations(console_server)
    try:
        for path in ("/", "/budgets", "/login"):
            browser.get(f"http://127.0.0.1:{other.server_address[1]}{path}")  # waits for images
    finally:
        other.shutdown()
        other.server_close()
    assert evaluations(console_server) == before
    assert {path for path, _ in sent} >= {"/", "/budgets", "/login", "/pixel.png"}
    assert not [cookie for _, cookie in sent if "dpsql_console" in cookie], sent
    browser.get(url + "budgets")
    assert "<h1>Budgets</h1>" in browser.page_source  # the login was live all along


def evaluations(server: ServerProcess) -> int:
    """How many fidelity evaluations the served store's audit log holds."""
    with psycopg.connect(server.dsn("admin"), autocommit=True) as conn:
        rows = conn.execute("CALL dpsql('audit --json --last 1000')").fetchall()
    return sum('"evaluate"' in str(row) or "'evaluate'" in str(row) for row in rows)


def test_screenshots_of_every_page_are_not_blank(browser: Any, console_server: ServerProcess,
                                                 shots: Path) -> None:
    url = console_url(console_server)
    browser.delete_all_cookies()
    browser.get(url + "login")
    taken = [_shot(browser, shots / "login.png")]
    log_in(browser, url)
    for page in PAGES:
        browser.get(url + page)
        assert "<h1>" in browser.page_source
        assert "Not found" not in browser.title
        taken.append(_shot(browser, shots / f"{page.replace('/', '_')}.png"))
    for path in taken:
        assert_not_blank(path)


def assert_not_blank(path: Path) -> None:
    """A page was drawn: contrast and many grey levels (a blank or flat page has neither)."""
    pixels = np.asarray(Image.open(path).convert("L"), dtype=float)
    assert pixels.std() > 10, f"{path} looks blank"
    assert len(np.unique(pixels)) > 20, f"{path} has too few shades"


@pytest.mark.parametrize("colour", [255, 0], ids=["white", "black"])
def test_a_blank_screenshot_is_caught(tmp_path: Path, colour: int) -> None:
    blank = tmp_path / "blank.png"
    Image.new("RGB", (1200, 900), (colour,) * 3).save(blank)
    with pytest.raises(AssertionError, match="looks blank"):
        assert_not_blank(blank)


def _shot(driver: Any, path: Path) -> Path:
    drawn(driver)
    assert driver.save_screenshot(str(path))
    return path


def drawn(driver: Any, timeout: float = 60) -> None:
    """Wait until the page has loaded, shows its heading, and a frame of it was painted.

    ``get`` returns at the load event, which on a busy machine can come before the
    first paint: once the heading is visible, two animation frames later one with it
    has been drawn.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout)
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")
    wait.until(expected_conditions.visibility_of_element_located((By.TAG_NAME, "h1")))
    driver.set_script_timeout(timeout)
    driver.execute_async_script("const done = arguments[arguments.length - 1];"
                                "requestAnimationFrame(() => requestAnimationFrame(() => done()));")
