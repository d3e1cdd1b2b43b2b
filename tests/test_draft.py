"""dpsql policy draft: a complete policy guessed from the data, every guess commented."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
import yaml

import dpsql
from dpsql.draft import nice_bounds, nice_step
from dpsql.errors import AccessDenied
from dpsql.policy import Policy

from .conftest import ADULT_POLICY, ADULT_SAMPLE
from .test_cli import run

ACS_SAMPLE = Path(__file__).parent / "data" / "acs_sample.csv"


def _draft(tmp_path: Path, data: Path, *extra: str) -> Path:
    out = tmp_path / f"{data.stem}.yaml"
    result = run("policy", "draft", str(data), "-o", str(out), *extra)
    assert result.returncode == 0, result.stderr
    assert "read from the private data" in result.stderr
    return out


def _columns(policy: Path) -> dict:
    raw = yaml.safe_load(policy.read_text())
    (dataset,) = raw["datasets"].values()
    return dataset["columns"]


def _file_range(data: Path, column: str, na: str | None = None) -> tuple:
    options = f", nullstr='{na}'" if na else ""
    return duckdb.sql(f"SELECT min({column}), max({column}) FROM read_csv('{data}'{options})"
                      ).fetchall()[0]


@pytest.mark.parametrize(("data", "na", "query"), [
    (ADULT_SAMPLE, None, "SELECT sex, COUNT(*) FROM adult_sample GROUP BY sex"),
    (ACS_SAMPLE, "N", "SELECT puma, COUNT(*) FROM acs_sample GROUP BY puma"),
], ids=["adult", "acs"])
def test_a_draft_loads_imports_without_refusal_and_answers(tmp_path: Path, data: Path,
                                                           na: str | None, query: str) -> None:
    policy = _draft(tmp_path, data, *(["--na", na] if na else []))
    text = policy.read_text()
    assert "PRIVATE: every bound, category list and count below was read from the private" \
        in text
    Policy.from_text(text)  # valid as drafted
    for line in text.splitlines():
        if line.startswith("      ") and "{type:" in line:
            assert "# from the data: " in line
    db = tmp_path / "s.duckdb"
    made = run("init", str(db), "--policy", str(policy), "--import", f"{data.stem}={data}",
               *(["--na", na] if na else []))  # refuses any value outside the drafted domains
    assert made.returncode == 0, made.stderr
    with dpsql.connect(db, "admin") as session:
        answer = session.sql(query)
    assert answer.table.num_rows == len(_columns(policy)[query.split()[1].rstrip(",")]["values"])


@pytest.mark.parametrize(("data", "na"), [(ADULT_SAMPLE, None), (ACS_SAMPLE, "N")],
                         ids=["adult", "acs"])
def test_drafted_bounds_contain_every_value(tmp_path: Path, data: Path, na: str | None) -> None:
    columns = _columns(_draft(tmp_path, data, *(["--na", na] if na else [])))
    numeric = {name: spec for name, spec in columns.items() if "bounds" in spec}
    assert numeric
    for name, spec in numeric.items():
        low, high = _file_range(data, name, na)
        assert spec["bounds"][0] <= low <= high <= spec["bounds"][1], name


def test_identifiers_and_free_text_are_guessed_hidden(tmp_path: Path) -> None:
    data = tmp_path / "people.csv"
    rows = [f"{i},P{i:05d},note number {i},word {i % 150},{'ab'[i % 2]},{i % 7},{i * 0.37 - 3:.2f}"
            for i in range(200)]
    data.write_text("id,Code,Comment,Tag,group,Level,score\n" + "\n".join(rows) + "\n")
    columns = _columns(_draft(tmp_path, data, "--max-categories", "100"))
    assert columns["id"] == {"type": "hidden"}
    assert columns["code"] == {"type": "hidden"}
    assert columns["comment"] == {"type": "hidden"}
    assert columns["tag"] == {"type": "hidden"}  # 150 distinct values, over --max-categories
    assert columns["group"] == {"type": "categorical", "values": ["a", "b"]}
    assert columns["level"] == {"type": "categorical", "values": [0, 1, 2, 3, 4, 5, 6]}
    assert columns["score"]["type"] == "float"
    assert columns["score"]["bounds"] == [-5, 75]  # -3 and 70.63, rounded outward by 5


def test_bounds_round_outward_to_nice_numbers() -> None:
    assert nice_bounds(17, 90, integer=True) == (15, 90)
    assert nice_bounds(-4600.0, 1341000.0, integer=False) == (-100000, 1400000)
    assert nice_bounds(0.013, 0.987, integer=False) == (Decimal("0"), Decimal("1"))
    assert nice_bounds(5, 5, integer=True) == (5, 6)  # a constant column still gets lo < hi
    assert nice_step(7, 10, integer=True) == 1
    assert nice_step(2226, 10) == 500


def test_a_draft_from_a_store_table_is_for_admins_and_audited(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store, _ = dpsql.init(db, ADULT_POLICY, {"adult": ADULT_SAMPLE})
    store.close()
    result = run("policy", "draft", "--db", str(db), "--table", "adult", "--dataset", "people")
    assert result.returncode == 0, result.stderr
    drafted = Policy.from_text(result.stdout)
    assert list(drafted.datasets) == ["people"]
    assert drafted.datasets["people"].table == "adult"
    with dpsql.connect(db, "admin") as session:
        assert [r["action"] for r in session.audit()].count("draft_policy") == 1
    refused = run("policy", "draft", "--db", str(db), "--table", "adult", "--as", "alice")
    assert refused.returncode == AccessDenied.exit_code
    assert refused.stdout == ""


def test_column_names_yaml_would_misread_are_quoted(tmp_path: Path) -> None:
    data = tmp_path / "flags.csv"
    data.write_text("on,null,yes,n\n" + "".join(f"{i % 2},{i % 3},{i % 4},{i}\n"
                                                  for i in range(30)))
    columns = _columns(_draft(tmp_path, data))
    assert list(columns) == ["on", "null", "yes", "n"]
    assert columns["on"] == {"type": "categorical", "values": [0, 1]}
