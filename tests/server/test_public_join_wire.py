"""Over the wire: a DP query joined to a public table, and the public table read for free."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import yaml

from ..query.conftest import EDUCATION_TABLE
from .conftest import SERVER_POLICY, ServerProcess, make_store, serve_args, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    raw = yaml.safe_load(SERVER_POLICY)
    raw["public_tables"] = EDUCATION_TABLE
    path = make_store(tmp_path_factory.mktemp("join") / "adult.duckdb", yaml.safe_dump(raw))
    with start_server(serve_args(path)) as server:
        yield server


def test_join_and_free_public_table_through_psycopg(served: ServerProcess) -> None:
    with psycopg.connect(served.dsn("alice"), autocommit=True) as con:
        rows = con.execute("SELECT e.level, COUNT(*) AS n FROM adult a JOIN edu e "
                           "ON a.education_num = e.education_num GROUP BY e.level "
                           "ORDER BY 1").fetchall()
        assert [r[0] for r in rows] == ["high", "low", "mid"]
        assert all(isinstance(r[1], int) for r in rows)
        free = con.execute("SELECT count(*) FROM public_tables.edu").fetchone()
        assert free == (15,)
        with pytest.raises(psycopg.errors.SyntaxErrorOrAccessRuleViolation,
                           match=r"aggregating public column edu\.years"):
            con.execute("SELECT SUM(e.years) FROM adult a JOIN edu e "
                        "ON a.education_num = e.education_num")
