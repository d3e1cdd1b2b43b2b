"""The wire shows zCDP budgets as the CLI and the shell do: rho, with epsilon beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import dpsql
from dpsql import passwords
from dpsql.privacy import WHY_RHO

from ..conftest import ADULT_POLICY, ADULT_SAMPLE
from .conftest import PASSWORDS, ServerProcess, serve_args, start_server


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server over the demo store (zCDP, delta 1e-6; alice holds epsilon 2)."""
    path = tmp_path_factory.mktemp("zcdp") / "adult.duckdb"
    store, _ = dpsql.init(path, ADULT_POLICY, {"adult": ADULT_SAMPLE})
    try:
        passwords.set_password(store, "alice", PASSWORDS["alice"])
    finally:
        store.close()
    with start_server(serve_args(Path(path))) as server:
        yield server


def test_dp_and_budget_notices_use_the_same_units_and_wording(served):
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SELECT COUNT(*) FROM adult")
        cur = conn.execute("SHOW dpsql.budget")
        row = dict(zip([c.name for c in cur.description or ()], cur.fetchone() or (),
                       strict=True))
        assert cur.fetchone() is None
    assert row["unit"] == "rho"
    assert (row["granted"], row["granted_epsilon"], row["delta"]) == (0.08815, 2, 1e-6)
    left = f"rho={row['remaining']:g} (epsilon={row['remaining_epsilon']:g} at delta=1e-06)"
    assert left == "rho=0.08783 (epsilon=1.996 at delta=1e-06)"
    assert notices == [
        f"dpsql: adult: charged rho=0.0003211 (epsilon=0.1 at delta=1e-06); remaining {left}",
        f"dpsql: {WHY_RHO}",
    ]


def test_an_answer_that_is_mostly_noise_gets_a_second_notice(served):
    """A true count of 0 lies inside its 1 - 1e-6 interval except with probability 1e-6."""
    with psycopg.connect(served.dsn("alice"), autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SET dpsql.ci = 0.999999")
        conn.execute("SELECT COUNT(*) AS n FROM adult WHERE age > 500").fetchall()
    assert len(notices) == 2
    assert notices[0].startswith("dpsql: adult: charged")
    assert notices[1].startswith("dpsql: mostly noise at 0.999999 confidence: n in 1 of 1 row(s)")
