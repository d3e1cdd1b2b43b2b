"""Fixtures for the wire server: a store with SQL users, and servers in subprocesses."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

import dpsql
from dpsql.outside import Handling
from dpsql.passwords import set_password

from ..conftest import ADULT_SAMPLE

HERE = Path(__file__).resolve().parent
PASSWORDS = {"admin": "admin-secret-1", "alice": "alice-secret-1", "carol": "carol-secret-1",
             "dave": "dave-secret-1", "erin": "erin-secret-1", "frank": "frank-secret-1"}

SERVER_POLICY = """version: 1
accounting: pure
datasets:
  adult:
    table: adult
    description: Adult census sample
    budget: {epsilon: 100}
    query_cap: {epsilon: 1}
    default_query: {epsilon: 0.1}
    synthesizers: [independent]
    columns:
      age: {type: integer, bounds: [0, 84], bins: 10, description: age in whole years}
      sex: {type: categorical, values: [0, 1], description: "1: male, 0: female"}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden, description: census sampling weight}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 10}}}
  alice: {role: analyst, budgets: {adult: {epsilon: 5}}}
  carol: {role: analyst, budgets: {adult: {epsilon: 1}}, max_connections: 60}
  dave: {role: analyst, budgets: {adult: {epsilon: 1}}, max_connections: 2}
  erin: {role: analyst, budgets: {adult: {epsilon: 1}}}
  frank: {role: analyst, budgets: {adult: {epsilon: 1}}}
"""


def make_store(path: Path, policy_text: str = SERVER_POLICY, data: Path = ADULT_SAMPLE,
               passwords: dict[str, str] = PASSWORDS,
               released: tuple[str, ...] = ("age", "sex", "race"),
               outside: Handling = "refuse") -> Path:
    """A store over ``data`` (the Adult sample), a policy, passwords, and one release of
    the ``released`` columns (``released.adult_syn``); ``outside`` as for :func:`dpsql.init`."""
    policy = path.parent / "server_policy.yaml"
    policy.write_text(policy_text)
    store, _ = dpsql.init(path, policy, {"adult": data}, outside=outside)
    try:
        for user, password in passwords.items():
            set_password(store, user, password)
    finally:
        store.close()
    with dpsql.connect(path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="adult_syn", epsilon=1,
                      rows=200, columns=list(released), seed=7)
    return path


@pytest.fixture(scope="module")
def server_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store per test module (tests that spend budget use their own users)."""
    return make_store(tmp_path_factory.mktemp("wire") / "adult.duckdb")


@dataclass
class ServerProcess:
    """A server running in a subprocess, and the lines it logged."""

    process: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    def dsn(self, user: str = "alice", password: str | None = None, **extra: str) -> str:
        parts = {"host": "127.0.0.1", "port": str(self.port), "user": user,
                 "password": PASSWORDS.get(user, "") if password is None else password,
                 "dbname": "adult", "sslmode": "disable", "connect_timeout": "10", **extra}
        return " ".join(f"{k}='{v}'" for k, v in parts.items())

    def alive(self) -> bool:
        return self.process.poll() is None


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONUNBUFFERED": "1"}


@contextlib.contextmanager
def cancelling(conn: psycopg.Connection, ready: Callable[[], bool] = lambda: True
               ) -> Iterator[None]:
    """Cancel ``conn``'s statement once ``ready()``, and again every 0.1 s until the block ends.

    A cancel that arrives before the statement starts is dropped when it starts (as in
    PostgreSQL), hence the repeats; the thread is joined before the block ends, so no
    cancel reaches a later statement.
    """
    done = threading.Event()

    def cancel() -> None:
        while not done.is_set() and not ready():
            done.wait(0.05)
        while not done.is_set():
            conn.cancel()
            done.wait(0.1)

    canceller = threading.Thread(target=cancel, daemon=True)
    canceller.start()
    try:
        yield
    finally:
        done.set()
        canceller.join()


@contextlib.contextmanager
def start_server(args: list[str], timeout: float = 60) -> Iterator[ServerProcess]:
    """Start a server process, wait until it listens, and always stop it afterwards."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=_env())
    lines: queue.Queue[str] = queue.Queue()
    logged: list[str] = []

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
            logged.append(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    port = None
    deadline = time.monotonic() + timeout
    try:
        while port is None:
            if process.poll() is not None:
                time.sleep(0.2)
                raise RuntimeError("server exited before listening:\n" + "".join(logged))
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("server did not start in time:\n" + "".join(logged)) from None
            match = re.search(r"listening on [\d.]+:(\d+)", line)
            if match:
                port = int(match.group(1))
        yield ServerProcess(process, port, logged)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def serve_args(db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dpsql", "serve", "--db", str(db), "--port", "0", *extra]


def fake_args(db: Path, **options: object) -> list[str]:
    return [sys.executable, str(HERE / "fake_server.py"), str(db),
            *(f"{k}={v}" for k, v in options.items())]


@pytest.fixture(scope="module")
def fake_server(server_store: Path) -> Iterator[ServerProcess]:
    """The real protocol, router and catalog, with a fake statement handler."""
    with start_server(fake_args(server_store)) as server:
        yield server
