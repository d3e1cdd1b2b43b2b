"""Fixtures for the console: a served store with the console on, and a headless Chromium."""

from __future__ import annotations

import re
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..server.conftest import ServerProcess, make_store, serve_args, start_server

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1200,900")


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``dpsql serve --console`` on a fresh store (one per test module)."""
    db = make_store(tmp_path_factory.mktemp("console") / "adult.duckdb")
    with start_server(serve_args(db, "--console", "--console-port", "0")) as server:
        yield server


def console_url(server: ServerProcess, timeout: float = 30) -> str:
    """The console's address, from the private file whose path ``dpsql serve`` printed.

    The address holds the secret prefix: the server never prints it, and writes it
    to a file only its owner may read.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(server.lines):
            match = re.search(r"console \(administrators\): its address is in (\S+\.url) ", line)
            if match:
                path = Path(match.group(1))
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
                return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError("dpsql serve printed no console address file:\n"
                         + "".join(server.lines))


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One headless Chromium (Debian's, with its chromedriver) for a test module."""
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium')}")
    driver = webdriver.Chrome(options=options,
                              service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the browser tests write their screenshots."""
    return tmp_path_factory.mktemp("screenshots")
