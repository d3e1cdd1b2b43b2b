"""The router in-process, with a fake statement handler standing in for session.sql."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from dpsql.errors import BudgetExceeded, QueryRejected
from dpsql.server.catalog import CatalogSource, ConnectionCatalog
from dpsql.server.pgcatalog import Client
from dpsql.server.router import Router, StatementError
from dpsql.services import open_store
from dpsql.store import Store


@dataclass
class Reply:
    table: pa.Table
    status: str
    notice: str | None = None
    warning: str | None = None


class FakeHandler:
    """Records what reaches the session and answers a fixed table."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.error: Exception | None = None
        self.table = pa.table({"n": [1]})

    def __call__(self, text: str) -> Reply:
        self.seen.append(text)
        if self.error is not None:
            raise self.error
        return Reply(self.table, f"SELECT {self.table.num_rows}", "cost epsilon=0.1")


@pytest.fixture(scope="module")
def store(server_store: Path) -> Iterator[Store]:
    with open_store(server_store) as opened:
        yield opened


@pytest.fixture(scope="module")
def source(store: Store) -> Iterator[CatalogSource]:
    built = CatalogSource(store)
    yield built
    built.close()


@pytest.fixture
def handler() -> FakeHandler:
    return FakeHandler()


@pytest.fixture
def router(source: CatalogSource, handler: FakeHandler) -> Iterator[Router]:
    catalog = ConnectionCatalog(source, Client("alice", "adult", 4, {}))
    resets: list[int] = []
    made = Router(user="alice", database="adult", handler=handler, catalog=catalog,
                  reset_options=lambda: resets.append(1), pid=7, started="2024-01-01",
                  startup={"application_name": "tests", "client_encoding": "UTF8"})
    made.resets = resets  # type: ignore[attr-defined]
    yield made
    catalog.close()


@pytest.mark.parametrize("text", [
    pytest.param("SELECT count(*) FROM adult", id="dp_query"),
    pytest.param("SELECT * FROM released.adult_syn", id="released"),
    pytest.param("SET dpsql.epsilon = 0.5", id="set_dpsql"),
    pytest.param("RESET dpsql.epsilon", id="reset_dpsql"),
    pytest.param("SHOW dpsql.budget", id="show_budget"),
    pytest.param("SELECT * FROM dpsql_budget()", id="budget_function"),
    pytest.param("EXPLAIN PRIVACY SELECT count(*) FROM adult", id="explain_privacy"),
    pytest.param("SELECT * FROM pg_catalog.pg_class c JOIN adult a ON true", id="mixed"),
    pytest.param("WITH pg_class AS (SELECT * FROM adult) SELECT * FROM pg_class", id="cte"),
    pytest.param("SELECT * FROM read_csv('/etc/passwd')", id="file_function"),
    pytest.param("DROP TABLE adult", id="ddl"),
    pytest.param("SELECT * FROM main.adult", id="raw_table"),
])
def test_analyst_statements_go_to_the_session(router, handler, text):
    outcome = router.run(text)
    assert handler.seen == [text]
    assert outcome.tag == "SELECT 1"
    assert outcome.notices == [("NOTICE", "00000",
                                                               "cost epsilon=0.1")]


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT version()", "PostgreSQL 15.0"),
    ("select current_schema()", "public"),
    ("SELECT current_user", "alice"),
    ("SELECT 1", 1),
    ("SELECT current_setting('application_name')", "tests"),
])
def test_client_queries_are_answered_from_the_catalog(router, handler, text, expected):
    table = router.run(text).table
    value = table.column(0)[0].as_py()
    assert (value.startswith(expected) if isinstance(expected, str) else value == expected)
    assert handler.seen == []


def test_client_parameters(router):
    assert router.run("SHOW application_name").table.to_pylist() == [
        {"application_name": "tests"}]
    outcome = router.run("SET application_name TO 'psql'")
    assert outcome.tag == "SET"
    assert outcome.parameter_status == {"application_name": "psql"}
    router.run("SET search_path = public, released")
    assert router.settings["search_path"] == "public, released"
    router.run("SET extra_float_digits = 3")
    router.run("SET TIME ZONE 'Europe/Paris'")
    assert router.settings["TimeZone"] == "Europe/Paris"
    router.run("SET statement_timeout = '2s'")
    assert router.statement_timeout_ms == 2000
    assert router.run("RESET application_name").parameter_status == {"application_name": "tests"}
    router.run("RESET ALL")
    assert router.settings["TimeZone"] == "UTC"
    assert router.resets == [1]


@pytest.mark.parametrize(("text", "code"), [
    ("SET no_such_parameter = 1", "42704"), ("SHOW no_such_parameter", "42704"),
    ("SET DateStyle = 'German'", "22023"), ("SET client_encoding = 'LATIN1'", "22023"),
    ("SET TimeZone = 'Mars/Base'", "22023"), ("SET server_version = '9'", "55P02"),
    ("SET default_transaction_read_only = off", "25006"),
    ("COPY adult TO '/tmp/leak.csv'", "0A000"), ("COPY adult FROM STDIN", "0A000"),
    ("COPY (SELECT 1) TO '/tmp/leak.csv'", "0A000"), ("COPY (SELECT 1) TO PROGRAM 'ls'", "0A000"),
    ("COPY (SELECT 1) TO STDOUT (FORMAT binary)", "0A000"),
    ("COPY (SELECT 1) TO STDOUT (FORCE_QUOTE *)", "0A000"),
    ("COPY (SET dpsql.epsilon = 9) TO STDOUT", "42601"),
    ("DECLARE c CURSOR FOR SELECT 1", "25P01"), ("DECLARE c BINARY CURSOR WITH HOLD FOR SELECT 1",
                                                 "0A000"),
    ("DECLARE c CURSOR WITH HOLD FOR SHOW dpsql.budget", "42601"),
    ("FETCH 1 FROM c", "34000"), ("CLOSE c", "34000"), ("SET ROLE admin", "0A000"),
    ("SELECT * FROM pg_catalog.pg_stat_user_tables", "42P01"),
    ("SELECT pg_read_file('/etc/passwd')", "42883"),
])
def test_refusals(router, handler, text, code):
    with pytest.raises(StatementError) as caught:
        router.run(text)
    assert caught.value.sqlstate == code
    assert handler.seen == []


def test_transactions_are_tracked_like_postgres(router, handler):
    assert router.run("BEGIN").tag == "BEGIN"
    assert router.txn == "T"
    assert router.run("BEGIN").notices[0][1] == "25001"
    handler.error = BudgetExceeded("no budget left")
    with pytest.raises(StatementError) as caught:
        router.run("SELECT count(*) FROM adult")
    assert caught.value.sqlstate == "53400"
    assert router.txn == "E"
    with pytest.raises(StatementError) as aborted:
        router.run("SELECT 1")
    assert aborted.value.sqlstate == "25P02"
    assert router.run("COMMIT").tag == "ROLLBACK"
    assert router.txn == "I"
    assert router.run("COMMIT").notices[0][1] == "25P01"
    router.run("START TRANSACTION READ ONLY")
    router.run("SAVEPOINT a")
    router.run("ROLLBACK TO SAVEPOINT a")
    assert router.run("END").tag == "COMMIT"
    assert router.txn == "I"


def test_discard_all_resets_the_session(router):
    router.run("SET application_name = 'x'")
    outcome = router.run("DISCARD ALL")
    assert outcome.discard
    assert outcome.deallocate == "ALL"
    assert router.settings["application_name"] == "tests"
    assert router.resets == [1]
    router.run("BEGIN")
    with pytest.raises(StatementError):
        router.run("DISCARD ALL")


def test_errors_carry_sqlstate_and_position(router, handler):
    handler.error = QueryRejected("window functions are not allowed", construct="OVER",
                                  line=2, column=5, advice="remove OVER")
    with pytest.raises(StatementError) as caught:
        router.run("SELECT\n    rank() OVER () FROM adult")
    assert caught.value.sqlstate == "42000"
    assert caught.value.position == 12


def test_internal_errors_never_show_their_message(router, handler):
    handler.error = RuntimeError("the private value is 4242")
    with pytest.raises(StatementError) as caught:
        router.run("SELECT count(*) FROM adult")
    assert caught.value.sqlstate == "XX000"
    assert "4242" not in caught.value.message
    assert "reference" in caught.value.message


def test_a_cursor_answers_its_query_once_and_hands_it_out_in_pieces(router, handler):
    handler.table = pa.table({"n": list(range(10))})
    router.run("BEGIN")
    declared = router.run("DECLARE c CURSOR FOR SELECT n FROM adult_syn")
    assert (declared.tag, declared.table) == ("DECLARE CURSOR", None)
    assert declared.notices == [("NOTICE", "00000", "cost epsilon=0.1")]
    fetched = [router.run(f"FETCH {d} FROM c") for d in ("2", "FORWARD 3", "NEXT")]
    assert [f.table.column("n").to_pylist() for f in fetched] == [[0, 1], [2, 3, 4], [5]]
    assert [f.tag for f in fetched] == ["FETCH 2", "FETCH 3", "FETCH 1"]
    assert router.run("MOVE ABSOLUTE 8 IN c").tag == "MOVE 1"
    assert router.run("FETCH ALL c").table.column("n").to_pylist() == [8, 9]
    assert router.run("FETCH c").tag == "FETCH 0"
    assert handler.seen == ["SELECT n FROM adult_syn"]  # charged once, whatever was fetched
    assert router.run("CLOSE c").tag == "CLOSE CURSOR"
    with pytest.raises(StatementError) as closed:
        router.run("FETCH c")
    assert closed.value.sqlstate == "34000"


def test_cursors_end_with_their_transaction_unless_held(router, handler):
    router.run("BEGIN")
    router.run("DECLARE passing CURSOR FOR SELECT n FROM adult_syn")
    router.run('DECLARE "Held" CURSOR WITH HOLD FOR SELECT n FROM adult_syn')
    router.run("COMMIT")
    assert router.run('FETCH 1 FROM "Held"').tag == "FETCH 1"
    with pytest.raises(StatementError):
        router.run("FETCH passing")
    router.run("RESET ALL")  # resets parameters, keeps cursors (as PostgreSQL does)
    assert router.run('FETCH 1 FROM "Held"').tag == "FETCH 0"
    router.run("DISCARD ALL")
    with pytest.raises(StatementError):
        router.run('FETCH 1 FROM "Held"')
    assert len(handler.seen) == 2


def test_copy_answers_the_inner_query_once_in_the_format_asked(router, handler):
    outcome = router.run("COPY (SELECT n FROM adult_syn) TO STDOUT WITH (FORMAT csv, HEADER)")
    assert handler.seen == ["SELECT n FROM adult_syn"]
    assert outcome.tag == "COPY 1"
    assert outcome.table is not None
    assert outcome.table.column_names == ["n"]
    assert outcome.copy is not None
    assert outcome.copy.csv
    assert outcome.copy.header
    assert outcome.notices == [("NOTICE", "00000", "cost epsilon=0.1")]
    router.run("COPY released.adult_syn (age, sex) TO STDOUT")
    assert handler.seen[-1] == "SELECT age, sex FROM released.adult_syn"
