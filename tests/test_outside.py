"""Domain checks: init, policy check --db and policy apply report values outside the
declared domains and refuse unless --outside says to drop, clamp or keep them."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

import dpsql
from dpsql.errors import AccessDenied
from dpsql.outside import DomainError
from dpsql.policies import policy_history

from .conftest import ADULT_POLICY, ADULT_SAMPLE
from .test_cli import run

AGE = ("      age:            {type: integer, bounds: [0, 84], bins: 10, "
       "description: age code (0-84)}")
RACE = "      race:           {type: categorical, values: [0, 1, 2, 3, 4]}"


def _policy(directory: Path, age: bool = True, race: bool = True) -> Path:
    """The Adult policy with age narrowed to [0, 60] and/or race to codes 0-2."""
    text = ADULT_POLICY.read_text()
    assert AGE in text
    assert RACE in text
    if age:
        text = text.replace(AGE, "      age: {type: integer, bounds: [0, 60], bins: 10}")
    if race:
        text = text.replace(RACE, "      race: {type: categorical, values: [0, 1, 2]}")
    path = directory / f"narrow_{age}_{race}.yaml"
    path.write_text(text)
    return path


def _truth(where: str = "TRUE") -> int:
    """Rows of the Adult sample matching ``where``, counted straight from the file."""
    rows = duckdb.sql(f"SELECT count(*) FROM read_csv('{ADULT_SAMPLE}') WHERE {where}").fetchall()
    return int(rows[0][0])


OLD, OTHER_RACE = "age > 60", "race NOT IN (0, 1, 2)"


def _cli(*args: str) -> Result:
    from dpsql.cli import _load_commands, cli

    _load_commands()
    return CliRunner().invoke(cli, list(args))


def _rows(db: Path, sql: str) -> list[tuple]:
    with dpsql.connect(db, "admin") as session:
        return session.store.cursor().execute(sql).fetchall()


def _init(tmp_path: Path, policy: Path, *extra: str) -> Result:
    return _cli("init", str(tmp_path / "s.duckdb"), "--policy", str(policy), "--import",
                f"adult={ADULT_SAMPLE}", *extra)


def test_init_reports_and_refuses_values_outside_creating_nothing(tmp_path: Path) -> None:
    assert _truth(OLD) > 0
    assert _truth(OTHER_RACE) > 0
    result = run("init", str(tmp_path / "s.duckdb"), "--policy", str(_policy(tmp_path)),
                 "--import", f"adult={ADULT_SAMPLE}")
    assert result.returncode == DomainError.exit_code, result.stderr
    assert f"adult.age: {_truth(OLD)} row(s) outside the domain (e.g. " in result.stderr
    assert f"adult.race: {_truth(OTHER_RACE)} row(s) outside the domain (e.g. " in result.stderr
    assert "--outside drop, clamp or keep" in result.stderr
    assert not (tmp_path / "s.duckdb").exists()


def test_a_policy_that_covers_the_data_imports_without_a_word(tmp_path: Path) -> None:
    result = _init(tmp_path, ADULT_POLICY)
    assert result.exit_code == 0, result.output
    assert "outside" not in result.output


def test_drop_removes_exactly_the_rows_outside(tmp_path: Path) -> None:
    result = _init(tmp_path, _policy(tmp_path), "--outside", "drop")
    assert result.exit_code == 0, result.output
    assert "rows dropped" in result.output
    db = tmp_path / "s.duckdb"
    assert _rows(db, "SELECT count(*) FROM adult") == [(_truth(f"NOT ({OLD} OR {OTHER_RACE})"),)]
    assert _rows(db, f"SELECT count(*) FROM adult WHERE {OLD} OR {OTHER_RACE}") == [(0,)]


def test_clamp_sets_numbers_to_the_bounds_and_keeps_every_row(tmp_path: Path) -> None:
    result = _init(tmp_path, _policy(tmp_path, race=False), "--outside", "clamp",
                   "--enforce-bounds")
    assert result.exit_code == 0, result.output
    db = tmp_path / "s.duckdb"
    assert _rows(db, "SELECT count(*), max(age), count(*) FILTER (WHERE age = 60) FROM adult") \
        == [(_truth(), 60, _truth("age >= 60"))]


def test_clamp_refuses_categories_it_cannot_clamp(tmp_path: Path) -> None:
    result = _init(tmp_path, _policy(tmp_path), "--outside", "clamp")
    assert isinstance(result.exception, DomainError)
    assert "adult.race hold categories" in str(result.exception)
    assert not (tmp_path / "s.duckdb").exists()


def test_keep_stores_the_rows_as_they_are(tmp_path: Path) -> None:
    result = _init(tmp_path, _policy(tmp_path), "--outside", "keep")
    assert result.exit_code == 0, result.output
    assert "kept as they are" in result.output
    assert _rows(tmp_path / "s.duckdb", "SELECT count(*), max(age) FROM adult") == \
        _rows_of_file("SELECT count(*), max(age)")


def _rows_of_file(select: str) -> list[tuple]:
    return duckdb.sql(f"{select} FROM read_csv('{ADULT_SAMPLE}')").fetchall()


def _audited(db: Path) -> list[str]:
    with dpsql.connect(db, "admin") as session:
        return [r["action"] for r in session.audit()]


def test_policy_check_reports_refuses_and_is_audited(tmp_path: Path) -> None:
    assert _init(tmp_path, ADULT_POLICY).exit_code == 0
    db, narrow = tmp_path / "s.duckdb", _policy(tmp_path)
    before = _audited(db).count("domain_check")
    refused = _cli("policy", "check", str(narrow), "--db", str(db))
    assert isinstance(refused.exception, DomainError)
    assert f"adult.age: {_truth(OLD)} row(s)" in refused.output
    passed = _cli("policy", "check", str(narrow), "--db", str(db), "--outside", "drop")
    assert passed.exit_code == 0, passed.output
    assert "with --outside drop" in passed.output
    assert _rows(db, "SELECT count(*) FROM adult") == [(_truth(),)]  # a check changes nothing
    assert _audited(db).count("domain_check") == before + 2
    analyst = _cli("policy", "check", str(narrow), "--db", str(db), "--as", "alice")
    assert isinstance(analyst.exception, AccessDenied)


def test_policy_apply_refuses_then_drops_when_told(tmp_path: Path) -> None:
    assert _init(tmp_path, ADULT_POLICY).exit_code == 0
    db, narrow = tmp_path / "s.duckdb", _policy(tmp_path)
    with dpsql.connect(db, "admin") as session:
        first = session.policy.fingerprint
    refused = _cli("policy", "apply", str(narrow), "--db", str(db), "-y")
    assert isinstance(refused.exception, DomainError)
    with dpsql.connect(db, "admin") as session:
        assert session.policy.fingerprint == first
    assert _rows(db, "SELECT count(*) FROM adult") == [(_truth(),)]
    applied = _cli("policy", "apply", str(narrow), "--db", str(db), "-y", "--outside", "drop")
    assert applied.exit_code == 0, applied.output
    with dpsql.connect(db, "admin") as session:
        assert session.policy.fingerprint != first
        history = policy_history(session.store)
    assert f"adult.age: {_truth(OLD)} row(s) outside the domain: --outside drop" \
        in (history[-1].changes or "")
    assert _rows(db, "SELECT count(*) FROM adult") == [(_truth(f"NOT ({OLD} OR {OTHER_RACE})"),)]


def test_the_python_api_applies_with_the_same_choices(tmp_path: Path) -> None:
    store, _ = dpsql.init(tmp_path / "s.duckdb", ADULT_POLICY, {"adult": ADULT_SAMPLE})
    store.close()
    with dpsql.connect(tmp_path / "s.duckdb", "admin") as admin:
        found = admin.check_domain(dpsql.policy.Policy.load(_policy(tmp_path, race=False)))
        assert [(o.column, o.rows, o.clampable) for o in found] == [("age", _truth(OLD), True)]
        assert all(e > 60 for e in found[0].examples)
        admin.apply_policy(_policy(tmp_path, race=False), outside="clamp")
        assert admin.store.cursor().execute("SELECT max(age) FROM adult").fetchall() == [(60,)]
    with dpsql.connect(tmp_path / "s.duckdb", "alice") as alice, pytest.raises(AccessDenied):
        alice.check_domain()


def test_a_clamp_that_would_break_an_enforced_check_refuses_and_changes_nothing(
        tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    store, _ = dpsql.init(db, ADULT_POLICY, {"adult": ADULT_SAMPLE}, enforce_bounds=True)
    store.close()
    far = tmp_path / "far.yaml"
    far.write_text(ADULT_POLICY.read_text().replace(
        AGE, "      age: {type: integer, bounds: [90, 100], bins: 1}"))
    with dpsql.connect(db, "admin") as admin:
        first = admin.policy.fingerprint
        with pytest.raises(DomainError, match="CHECK constraint"):
            admin.apply_policy(far, outside="clamp")
        assert admin.policy.fingerprint == first
    assert _rows(db, "SELECT max(age) FROM adult") == _rows_of_file("SELECT max(age)")


@pytest.mark.parametrize("fresh", [False, True], ids=["delete", "copy_kept_rows"])
def test_drop_keeps_rows_whose_value_is_null_or_inside(fresh: bool) -> None:
    """An import drops by copying the rows kept (``fresh``), a policy apply by DELETE: both
    keep exactly the rows no predicate holds for (a NULL number is not outside)."""
    from dpsql.outside import settle
    from dpsql.policy import Policy

    policy = Policy.from_text(ADULT_POLICY.read_text().replace(AGE, "      age: {type: integer, "
                                                               "bounds: [0, 60], bins: 10}"))
    dataset = next(ds for ds in policy.datasets.values() if ds.table == "adult")
    con = duckdb.connect()
    con.execute("CREATE TABLE adult AS SELECT * FROM (VALUES (30, 0), (NULL, 1), (70, 2), "
                "(60, 3)) v(age, race)")
    found = settle(con, "adult", dataset, {"age": "INTEGER", "race": "INTEGER"}, "drop",
                   fresh=fresh)
    assert [(o.column, o.rows) for o in found] == [("age", 1)]
    assert con.execute("SELECT age, race FROM adult ORDER BY race").fetchall() == [
        (30, 0), (None, 1), (60, 3)]
