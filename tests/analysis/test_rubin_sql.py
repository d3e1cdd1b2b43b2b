"""udfs.rubin, Rubin's rules in SQL, against dpsql.analysis.rubin and scipy's t quantile."""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator

import duckdb
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpsql.analysis import rubin
from dpsql.session import Session
from dpsql.store import install_udfs

#: Hill's (1970) t quantile against the exact one, from 2.5 degrees of freedom up.
HILL_TOLERANCE = 3e-5


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    connection = duckdb.connect()
    install_udfs(connection)
    yield connection
    connection.close()


def one(con: duckdb.DuckDBPyConnection, sql: str, parameters: list | None = None):
    """The single value of a one-row, one-column query."""
    return con.execute(sql, parameters).fetchall()[0][0]


def sql_rubin(con: duckdb.DuckDBPyConnection, q, u, arguments: str = "") -> dict:
    con.register("per_copy", pd.DataFrame({"q": np.asarray(q, float), "u": np.asarray(u, float)}))
    return one(con, f"SELECT udfs.rubin(q, u{arguments}) FROM per_copy")


def python_rubin(q, u, **options) -> rubin.Combined:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rubin.RubinWarning)
        return rubin.combine(q, u, **options)


CASES = {
    "hand_case_with_nu_com": (np.arange(10.0), [2.0] * 10, {"complete_dof": 20}),
    "few_dof": ([1.0, 2.0, 3.0, 4.0], [0.5] * 4, {}),
    "t_negative": ([1.0, 1.1], [1.0, 1.0], {"rows_ratio": 0.5, "complete_dof": 7}),
    "between_dominates": ([1.0, 2.0, 3.0, 4.0, 5.0], [0.01] * 5, {}),
    "between_20x_within": ([1.0, 2.0, 3.0, 4.0, 5.0], [0.15] * 5, {}),
    "between_9x_within": ([1.0, 2.0, 3.0, 4.0, 5.0], [1 / 3] * 5, {}),
    "healthy_99": (np.arange(20.0), np.full(20, 5.0), {"confidence": 0.99}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sql_matches_python(con: duckdb.DuckDBPyConnection, case: str) -> None:
    q, u, options = CASES[case]
    arguments = "".join(f", {k} := {v}" for k, v in options.items())
    got = sql_rubin(con, q, u, arguments)
    want = python_rubin(q, u, **options)
    for field in ("estimate", "std_error", "dof", "between", "within"):
        assert got[field] == pytest.approx(getattr(want, field), rel=1e-12), field
    assert got["adjusted"] == want.adjusted
    assert got["copies"] == want.copies
    assert got["unreliable"] == want.unreliable
    assert got["reason"].split(":")[0] in want.reason
    half = want.ci_high - want.estimate
    if want.dof >= 2.5:
        assert got["ci_high"] - got["estimate"] == pytest.approx(half, rel=HILL_TOLERANCE)
    else:  # rounded down to 2 or 1 degrees of freedom: wider, never narrower
        assert got["ci_high"] - got["estimate"] >= half
    assert got["estimate"] - got["ci_low"] == pytest.approx(got["ci_high"] - got["estimate"])


def test_t_quantile_is_hill_accurate(con: duckdb.DuckDBPyConnection) -> None:
    grid = [(p, df) for p in (0.75, 0.9, 0.95, 0.975, 0.995, 0.9995)
            for df in [*np.linspace(2.5, 10, 16), *np.geomspace(10, 1e9, 16)]]
    frame = pd.DataFrame(grid, columns=["p", "df"])
    got = np.array(con.execute("SELECT udfs.t_quantile(p, df) FROM frame").fetchall())[:, 0]
    exact = stats.t.ppf(frame["p"], frame["df"])
    assert np.max(np.abs(got / exact - 1)) < HILL_TOLERANCE
    assert one(con, "SELECT udfs.t_quantile(0.975, 'inf'::DOUBLE)") == (
        pytest.approx(stats.norm.ppf(0.975), rel=1e-15))
    assert one(con, "SELECT udfs.norm_quantile(1e-300)") == (
        pytest.approx(stats.norm.ppf(1e-300), rel=1e-14))


def test_t_quantile_below_2_5_dof_is_conservative_and_below_1_absent(
        con: duckdb.DuckDBPyConnection) -> None:
    for df, exact_at in ((2.4, 2), (2.0, 2), (1.5, 1), (1.0, 1)):
        got = one(con, "SELECT udfs.t_quantile(0.975, ?)", [df])
        # rel 1e-9: the floors (scipy 1.10, duckdb 1.5.1) differ from the newest at 4e-11
        assert got == pytest.approx(stats.t.ppf(0.975, exact_at), rel=1e-9)
        assert got >= stats.t.ppf(0.975, df) * (1 - 1e-9)
    assert one(con, "SELECT udfs.t_quantile(0.975, 0.5)") is None


@pytest.mark.parametrize(("q", "u", "message"), [
    pytest.param([1.0], [1.0], "at least 2 copies", id="one_copy"),
    pytest.param([1.0, 2.0], [-1.0, 1.0], "non-negative", id="negative_variance"),
])
def test_bad_input_is_refused(con: duckdb.DuckDBPyConnection, q, u, message: str) -> None:
    with pytest.raises(duckdb.InvalidInputException, match=message):
        sql_rubin(con, q, u)


def test_an_analyst_combines_released_copies_free(admin: Session, alice: Session) -> None:
    admin.release("adult", synthesizer="independent", epsilon=1, copies=5, name="adult_copies",
                  seed=3)
    answer = alice.sql("""
        WITH per_copy AS (
            SELECT _copy, avg(age) AS q, var_samp(age) / count(*) AS u
            FROM released.adult_copies GROUP BY _copy)
        SELECT unnest(udfs.rubin(q, u, complete_dof := 4999)) FROM per_copy""")
    assert answer.kind == "released"
    assert answer.cost.is_zero
    got = answer.table.to_pylist()[0]
    frame = admin.store.cursor().sql("SELECT _copy, age FROM released.adult_copies").df()
    per_copy = frame.groupby("_copy")["age"]
    want = python_rubin(per_copy.mean(), per_copy.var() / per_copy.size(), complete_dof=4999)
    assert got["estimate"] == pytest.approx(want.estimate, rel=1e-12)
    assert got["dof"] == pytest.approx(want.dof, rel=1e-9)
    assert got["unreliable"] == want.unreliable
    assert math.isfinite(got["std_error"])
