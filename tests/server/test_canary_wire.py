"""Canary fuzz over the wire: what psycopg shows an analyst never holds private data.

A sample of the in-process canary fuzz (tests/query/test_canary.py: every
hand-written shape, a slice of the generated function calls) plus catalog
queries only the server answers (pg_class, pg_stats, pg_authid, settings,
COPY ... TO STDOUT, cursors) go
through ``dpsql serve`` on one psycopg connection with a password. Rows,
column names, status, notices, SQLSTATE, message, detail and hint are all
checked; the budget (``dpsql_budget()``) must only move for a DP answer.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import canary
from tests.canary import Reply, Secrets

from .conftest import ServerProcess, serve_args, start_server

STRIDE = 25  # one generated function call in STRIDE goes over the wire, and every call of
FAMILIES = re.compile(r"histogram|serializ|query|summar")  # the families found leaking before
DP_NOTICE = re.compile(r"charged|repeated query answered from the cache")
WIRE_ONLY = (
    "SELECT relname, reltuples, relpages FROM pg_catalog.pg_class",
    "SELECT * FROM pg_catalog.pg_stats", "SELECT * FROM pg_catalog.pg_statistic",
    "SELECT * FROM pg_catalog.pg_stat_user_tables", "SELECT * FROM pg_catalog.pg_authid",
    "SELECT rolname, rolpassword FROM pg_catalog.pg_authid", "SELECT * FROM pg_shadow",
    "SELECT * FROM pg_catalog.pg_user", "SELECT * FROM pg_catalog.pg_settings", "SHOW ALL",
    "SELECT a.attname, a.atttypid FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c "
    "ON a.attrelid = c.oid WHERE c.relname = 'adult'",
    "SELECT * FROM information_schema.columns WHERE table_name = 'adult'",
    "SELECT version()", "SHOW data_directory", "SELECT current_setting('data_directory')",
    "SELECT pg_read_file('canary.duckdb')", "SELECT pg_catalog.pg_table_size('adult')",
    "SELECT pg_catalog.pg_relation_size('adult')", "SELECT count(*) FROM pg_catalog.pg_class",
    "SELECT obj_description('adult'::regclass)", "SELECT * FROM adult LIMIT 1",
    "COPY (SELECT * FROM adult) TO STDOUT", "COPY adult TO STDOUT",
    "COPY (SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram(adult, note)) TO STDOUT",
    "COPY (SELECT json_serialize_plan('SELECT max(income) FROM adult', optimize := true)) "
    "TO STDOUT",
    "DECLARE c1 CURSOR FOR SELECT * FROM adult", "FETCH ALL FROM c1",
    "DECLARE c2 CURSOR FOR SELECT * FROM released.adult_syn CROSS JOIN LATERAL "
    "histogram(adult, note)", "FETCH ALL FROM c2",
    "DECLARE c3 CURSOR FOR SELECT * FROM released.adult_syn", "FETCH 5 FROM c3", "CLOSE c3",
)


@pytest.fixture(scope="module")
def canary_served(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[tuple[ServerProcess, Path, Secrets]]:
    path = canary.build_store(tmp_path_factory.mktemp("canary_wire"))
    secrets = Secrets.read(path)  # before the server takes the store
    with start_server(serve_args(path)) as server:
        yield server, path, secrets


def wire_sample(path: Path) -> list[str]:
    """Every hand-written shape, a slice of the generated calls, and catalog queries."""
    shapes = list(canary.shape_attacks(path))
    generated = [q for q in canary.attacks(path) if q not in set(shapes)]
    chosen = {q: None for i, q in enumerate(generated) if i % STRIDE == 0 or FAMILIES.search(q)}
    return [*shapes, *chosen, *WIRE_ONLY]


class WireAnalyst:
    """Alice on one psycopg connection (a new one if the server drops it)."""

    def __init__(self, server: ServerProcess) -> None:
        self.dsn = server.dsn("alice", password=canary.PASSWORDS["alice"])
        self.notices: list[tuple[object, ...]] = []
        self.conn = self._connect()

    def _connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn, autocommit=True)
        conn.add_notice_handler(lambda d: self.notices.append(
            (d.severity, d.sqlstate, d.message_primary, d.message_detail, d.message_hint)))
        return conn

    def budget(self) -> list[tuple[object, ...]]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT * FROM dpsql_budget()")
            return cur.fetchall()

    def ask(self, query: str) -> Reply:
        if self.conn.closed:
            self.conn = self._connect()
        before = self.budget()
        self.notices.clear()  # from here on, only this query's notices
        values: tuple[object, ...]
        try:
            with self.conn.cursor() as cur:
                if query.startswith("COPY"):
                    with cur.copy(query) as copy:
                        values, kind = (b"".join(bytes(b) for b in copy),), "free"
                else:
                    cur.execute(query)
                    names = [d.name for d in cur.description or []]
                    rows = cur.fetchmany(1000) if cur.description else []
                    values, kind = (names, rows, cur.statusmessage), "free"
        except psycopg.Error as err:
            diag = err.diag
            values = (str(err), diag.sqlstate, diag.message_primary, diag.message_detail,
                      diag.message_hint, diag.context)
            kind = "refused"
        notices = tuple(self.notices)
        if self.conn.closed:
            return Reply((*values, *notices, "connection lost"), kind, False)
        if kind == "free" and any(DP_NOTICE.search(str(n[2])) for n in notices):
            kind = "dp"  # a DP answer's notice states its charge, or that it repeats a charged one
        return Reply((*values, *notices), kind, self.budget() != before)


def test_no_reply_leaks_over_the_wire(canary_served) -> None:
    server, path, secrets = canary_served
    analyst = WireAnalyst(server)
    kinds: Counter[str] = Counter()

    def ask(query: str) -> Reply:
        reply = analyst.ask(query)
        kinds[reply.kind] += 1
        return reply

    sample = wire_sample(path)
    assert 300 <= len(sample) <= 800
    try:
        failures = canary.fuzz(secrets, ask, sample)
    finally:
        analyst.conn.close()
    assert not failures, canary.report(failures)
    assert min(kinds["free"], kinds["refused"]) > 50, kinds
    assert kinds["dp"] >= 1, kinds
