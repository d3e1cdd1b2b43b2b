"""The console's secret prefix stays off terminals, logs and command lines (issue 40)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dpsql.cli.serve import PREFIX_VARIABLE, console_prefix
from dpsql.errors import ConfigurationError

from ..server.conftest import ServerProcess, _env, make_store, serve_args, start_server
from .conftest import console_url
from .test_attacks import Client

SECRET = "scripted-prefix-" + "q" * 20


def test_the_prefix_is_never_printed(console_server: ServerProcess) -> None:
    url = console_url(console_server)  # read from a file of mode 0600 that serve printed
    prefix = urlsplit(url).path.strip("/")
    assert len(prefix) >= 32
    assert Client(url).send("GET", "login")[0] == 200
    assert prefix not in "".join(console_server.lines)


def test_the_prefix_is_refused_on_the_command_line(tmp_path: Path) -> None:
    # Every user of the machine reads a command line in ps.
    done = subprocess.run([*serve_args(tmp_path / "none.duckdb"), "--console",
                           "--console-prefix", SECRET], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert done.returncode == 2, done.stderr
    assert "(ps)" in done.stderr
    assert "DPSQL_CONSOLE_PREFIX" in done.stderr
    assert "--console-prefix-file" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def test_a_prefix_file_must_be_private(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFIX_VARIABLE, raising=False)
    path = tmp_path / "prefix"
    path.write_text(SECRET + "\n")
    path.chmod(0o640)
    with pytest.raises(ConfigurationError, match=r"not a private file of yours .* chmod 600"):
        console_prefix(path)
    path.chmod(0o600)
    assert console_prefix(path) == SECRET
    link = tmp_path / "link"
    link.symlink_to(path)
    with pytest.raises(ConfigurationError, match="cannot read the console prefix file"):
        console_prefix(link)  # a link could point anywhere: refused
    assert console_prefix(None) is None  # a random one
    monkeypatch.setenv(PREFIX_VARIABLE, "x" * 32)
    assert console_prefix(None) == "x" * 32
    with pytest.raises(ConfigurationError, match="once"):
        console_prefix(path)


def test_a_prefix_file_sets_the_address_and_the_address_file_goes(tmp_path: Path) -> None:
    db = make_store(tmp_path / "adult.duckdb")
    prefix = tmp_path / "prefix"
    prefix.write_text(SECRET + "\n")
    prefix.chmod(0o600)
    args = serve_args(db, "--console", "--console-port", "0", "--console-prefix-file",
                      str(prefix))
    with start_server(args) as server:
        url = console_url(server)
        assert urlsplit(url).path == f"/{SECRET}/"
        assert Client(url).send("GET", "login")[0] == 200
        assert SECRET not in "".join(server.lines)
        printed = next(line for line in server.lines if ".url " in line)
        written = Path(printed.split(" is in ")[1].split()[0])
    assert not written.exists()  # removed when the server stopped
