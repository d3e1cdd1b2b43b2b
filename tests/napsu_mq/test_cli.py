"""NAPSU-MQ end to end through the CLI: release with copies, release-more, Rubin's rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dpsql
from dpsql.analysis import rubin


def run(*args, db):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, timeout=1800)


def release(db, name: str, *options: str, copies: int = 10,
            columns: str = "age,sex,race,income_50k,hours_per_week") -> dict:
    args = ["release", "adult", "--synth", "napsu_mq", "--epsilon", "1", "--copies", str(copies),
            "--name", name, "--seed", "3", "--columns", columns,
            "--json"]
    for option in options:
        args += ["--option", option]
    made = run(*args, db=db)
    assert made.returncode == 0, made.stderr
    return json.loads(made.stdout)


def copies_of(db, name: str):
    with dpsql.connect(db, "alice") as session:
        return session.store.cursor().sql(f"SELECT * FROM released.{name}").df()


def check_release_and_more(db, name: str, out: dict) -> None:
    record = out["record"]
    assert record["copies"] == 10
    assert record["synthesizer"]["name"] == "napsu_mq"
    assert record["resumable"] is True
    shown = run("releases", "show", name, "--json", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "napsu_mq" in shown.stdout
    with dpsql.connect(db, "admin") as session:
        spent_before = [b for b in session.budget() if b.dataset == "adult"]
    more = run("release-more", name, "--copies", "3", "--json", db=db)
    assert more.returncode == 0, more.stderr
    with dpsql.connect(db, "admin") as session:
        spent_after = [b for b in session.budget() if b.dataset == "adult"]
    assert [b.spent for b in spent_after] == [b.spent for b in spent_before]
    frame = copies_of(db, name)
    assert sorted(frame["_copy"].unique()) == list(range(1, 14))
    sizes = frame.groupby("_copy").size()
    assert sizes.nunique() == 1
    assert sizes.iloc[0] == record["rows"]
    assert abs(record["rows"] - 5000) < 200  # the DP row estimate of the 5,000-row sample
    with warnings.catch_warnings(record=True) as raised:  # DP noise: df < 3 happens
        warnings.simplefilter("always", rubin.RubinWarning)
        table = rubin.fit_formula(frame, "income_50k ~ C(sex)", "logit")
    assert table.loc["C(sex)[T.1]", "copies"] == 13
    assert np.isfinite(table["std_error"]).all()
    flagged = {str(w.message).split(":")[0].removeprefix("coefficient ") for w in raised}
    assert flagged == set(table.index[table["unreliable"]])  # each warning is flagged too


def test_release_laplace_copies_and_release_more(store_path):
    name = "adult_napsu"
    # Healthy counts in every cell: where cells are near empty, Laplace is a poor fit
    # (the release then warns; see the NUTS test below).
    out = release(store_path, name, "inference=laplace", "cliques=sex+income_50k,race+sex",
                  "select=none", columns="sex,race,income_50k")
    assert out["warnings"] == []
    check_release_and_more(store_path, name, out)


@pytest.mark.slow
def test_release_nuts_copies_and_release_more(store_path):
    """The issue's command, with MST selection and NUTS (a shorter run than the paper's)."""
    name = "adult_napsu_nuts"
    out = release(store_path, name, "inference=nuts", "chains=2", "warmup=300", "samples=300",
                  "cliques=age+income_50k,sex+income_50k,race+sex")
    check_release_and_more(store_path, name, out)


def test_a_release_reports_its_warnings_once(store_path):
    # The fit's DiagnosticsWarning is the same text as the release's own warning: a release
    # returns (and the CLI prints) it, and does not also raise it as a Python warning.
    with warnings.catch_warnings(record=True) as raised, \
            dpsql.connect(store_path, "admin") as admin:
        warnings.simplefilter("always")
        result = admin.release("adult", synthesizer="napsu_mq", epsilon=1, name="rounded",
                               columns=["sex", "income_50k"], inference="laplace",
                               cliques="sex+income_50k", select="none", sampling="rounded")
    assert any("sampling=rounded" in w for w in result.warnings)
    assert not [w for w in raised if "sampling=rounded" in str(w.message)]
