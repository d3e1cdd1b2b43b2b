"""Provenance holds DP results and public facts only: every synthesizer's record is scanned.

Each registered synthesizer releases twice, with tiny settings, on the Adult
sample; the whole record is walked. No key may name a timing, a loss or a
uniqueness figure, and no number that both releases give at the same place may
equal an exact statistic of the source (its row count, or a 1-way or 2-way
count of the released columns). A DP estimate differs between the two releases
(its noise is fresh each time); it equals the exact value in both with
probability below 2e-5 per field at epsilon 0.1 (the sd of every row estimate
here is above 100, so a discrete Gaussian hits one value with probability
below 0.004 each time). A release labelled
``privacy: empirical`` may describe the real rows only in diagnostics labelled
``not_dp``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

import dpsql
from dpsql.synth import base

from ..conftest import ADULT_SAMPLE, policy_text

COLUMNS = ["age", "sex", "race", "income_50k"]
AGE_BIN = "floor(age / 10)"  # the policy's bins: width 10 from 0
FORBIDDEN_KEY = re.compile(r"time|second|duration|elapsed|loss|unique", re.IGNORECASE)
#: Smaller counts collide with public settings (columns, codes, chains), not with a leak.
SMALLEST_STATISTIC = 100

NAPSU_NUTS = {"cliques": "sex+income_50k", "select": "none", "inference": "nuts",
              "chains": "1", "warmup": "20", "samples": "20", "pilot_warmup": "0",
              "pilot_samples": "0", "jumps": "0", "moves": "1", "keep_draws": "20"}
CASES = [
    pytest.param("independent", {}, id="independent"),
    pytest.param("joint", {}, id="joint"),
    pytest.param("range", {"columns": ["age"]}, id="range"),
    pytest.param("sds", {}, id="sds"),
    pytest.param("napsu_mq", {"inference": "laplace", "select": "mst",
                              "laplace_iterations": "500"}, id="napsu_mq-laplace"),
    # 20 draws can leave a parameter constant: numpyro's ESS then divides by zero
    pytest.param("napsu_mq", NAPSU_NUTS, id="napsu_mq-nuts", marks=[
        pytest.mark.slow, pytest.mark.ci,
        pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")]),
    pytest.param("modp", {"mode": "dp", "blades": "1", "steps": "3"}, id="modp-dp"),
    pytest.param("mst", {"iters": "100"}, id="mst"),
    pytest.param("aim", {"rounds": "6", "iters": "100", "round_iters": "50"}, id="aim"),
    pytest.param("modp", {"mode": "empirical", "blades": "1", "epochs": "2",
                          "warmup_epochs": "1", "diagnostic_rows": "50"}, id="modp-empirical"),
]


def test_every_registered_synthesizer_is_scanned():
    assert set(base.available()) == {case.values[0] for case in CASES}


@pytest.fixture(scope="module")
def exact_statistics() -> set[int]:
    """The row count and every 1-way and 2-way count of the released columns."""
    con = duckdb.connect()
    con.execute(f"CREATE VIEW adult AS SELECT * FROM read_csv_auto('{ADULT_SAMPLE}')")
    keys = [AGE_BIN if c == "age" else c for c in COLUMNS]
    found = {con.execute("SELECT count(*) FROM adult").fetchone()[0]}
    for group in [*([k] for k in keys), *itertools.combinations(keys, 2)]:
        rows = con.execute(f"SELECT count(*) FROM adult GROUP BY {', '.join(group)}").fetchall()
        found |= {r[0] for r in rows}
    return {n for n in found if n >= SMALLEST_STATISTIC}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    names = ", ".join(sorted({case.values[0] for case in CASES}))
    extra = f"    synthesizers: [{names}]\n    allow_non_dp: true\n"
    policy = tmp_path_factory.mktemp("facts") / "policy.yaml"
    policy.write_text(policy_text("zcdp", budget="{epsilon: 100}", user_budget="{epsilon: 100}",
                                  extra_dataset=extra))
    path = policy.parent / "store.duckdb"
    dpsql.init(path, policy, {"adult": ADULT_SAMPLE})[0].close()
    return path


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a JSON-able record, keys included as leaves of their own."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}.{key}", key
            yield from leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def whole_number(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if float(value).is_integer() else None


def scanned(record: dict[str, Any]) -> dict[str, Any]:
    """The part of ``record`` that must hold DP or public facts only.

    An empirical release may describe the real rows in diagnostics labelled
    ``not_dp``; its size is the table's, which anyone can count.
    """
    if record["privacy"] != "empirical":
        return record
    assert "not differentially private" in record["diagnostics"]["not_dp"]
    return {k: v for k, v in record.items() if k not in ("diagnostics", "rows", "total_rows")}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("synthesizer", "options"), CASES)
def test_provenance_holds_no_timing_loss_or_exact_statistic(store, exact_statistics,
                                                            synthesizer, options):
    with dpsql.connect(store, "admin") as admin:
        name = re.sub(r"\W", "_", f"{synthesizer}_{options.get('mode', '')}_"
                                  f"{options.get('inference', '')}")
        options = {"columns": COLUMNS, **options}
        records = [admin.release("adult", synthesizer=synthesizer, epsilon=0.1,
                                 name=f"{name}_{run}", seed=run, **options).record
                   for run in (1, 2)]
    first, second = (dict(leaves(scanned(r))) for r in records)
    keys = [v for p, v in first.items() if p.endswith(f".{v}") and FORBIDDEN_KEY.search(v)]
    assert not keys, f"provenance keys naming a timing, loss or uniqueness: {keys}"
    exact = {path: value for path, value in first.items()
             if whole_number(value) in exact_statistics and second.get(path) == value}
    assert not exact, f"provenance fields equal to an exact statistic of the source: {exact}"
