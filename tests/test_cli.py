"""The CLI as a user runs it: a real process, exit codes per error class, --json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import click
import pytest
import yaml
from click.testing import CliRunner

import dpsql

from .conftest import ADULT_POLICY, ADULT_SAMPLE


def run(*args: str, db=None, input_text=None, env_extra=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if db:
        env["DPSQL_DB"] = str(db)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, input=input_text, timeout=300)


def adult_store(directory, policy=ADULT_POLICY):
    """A store made with ``dpsql init`` from the Adult sample under ``policy``."""
    db = directory / "s.duckdb"
    made = run("init", str(db), "--policy", str(policy), "--import", f"adult={ADULT_SAMPLE}")
    assert made.returncode == 0, made.stderr
    return db


def test_help_explains_commands():
    result = run("--help")
    assert result.returncode == 0
    for command in ("init", "policy", "budget", "audit", "demo"):
        assert command in result.stdout


def _commands(group, path=()):
    for name, command in group.commands.items():
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_help_page_keeps_its_examples_on_their_own_lines():
    from dpsql.cli import _load_commands
    from dpsql.cli.common import cli

    _load_commands()
    runner = CliRunner()
    commands = list(_commands(cli))
    assert len(commands) > 15
    for path in commands:
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert not re.search(r"\\b(\s|$)", result.output), \
            f"dpsql {' '.join(path)} --help shows click's \\b marker"
        if "Examples:" in result.output:
            after = result.output.split("Examples:")[1]
            assert after.startswith("\n"), f"dpsql {' '.join(path)} --help: {after[:80]!r}"


def test_init_budget_grant_audit_round_trip(tmp_path):
    db = tmp_path / "s.duckdb"
    result = run("init", str(db), "--policy", str(ADULT_POLICY), "--import",
                 f"adult={ADULT_SAMPLE}", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tables"] == ["adult"]

    shown = json.loads(run("budget", "show", "--json", db=db).stdout)
    assert {row["user"] for row in shown} == {"admin", "alice", "bob"}

    granted = run("budget", "grant", "bob", "adult", "--epsilon", "1", "--json", db=db)
    assert granted.returncode == 0, granted.stderr
    assert json.loads(granted.stdout)["user"] == "bob"

    audit = json.loads(run("audit", "--last", "1", "--json", db=db).stdout)
    assert audit[0]["action"] == "grant"

    table = run("budget", "show", "--user", "bob", db=db)
    assert "bob" in table.stdout
    assert "remaining" in table.stdout


def test_init_enforce_bounds(tmp_path):
    db = tmp_path / "e.duckdb"
    result = run("init", str(db), "--policy", str(ADULT_POLICY), "--import",
                 f"adult={ADULT_SAMPLE}", "--enforce-bounds")
    assert result.returncode == 0, result.stderr
    with dpsql.connect(db, "admin") as admin:
        checks = admin.store.cursor().execute(
            "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'adult' "
            "AND constraint_type = 'CHECK'").fetchone()
    assert checks == (5,)  # age, education_num, capital_gain, capital_loss, hours_per_week
    outlier = tmp_path / "outlier.csv"
    lines = ADULT_SAMPLE.read_text().splitlines()
    outlier.write_text("\n".join([lines[0], "200" + lines[1][lines[1].index(","):]]) + "\n")
    refused = run("init", str(tmp_path / "o.duckdb"), "--policy", str(ADULT_POLICY),
                  "--import", f"adult={outlier}", "--enforce-bounds")
    assert refused.returncode == 8
    assert "age hold values outside" in refused.stderr
    assert not (tmp_path / "o.duckdb").exists()


def test_exit_codes_per_error_class(tmp_path, store_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\naccounting: sometimes\n")
    assert run("policy", "check", str(bad)).returncode == 3
    denied = run("budget", "grant", "alice", "adult", "--epsilon", "1", db=store_path,
                 env_extra={"DPSQL_USER": "alice"})
    assert denied.returncode == 6
    assert "analyst" in denied.stderr
    assert run("budget", "grant", "bob", "adult", "--epsilon", "-1", db=store_path).returncode == 8
    assert run("budget", "show", db=tmp_path / "missing.duckdb").returncode == 9
    as_json = run("budget", "grant", "bob", "adult", "--epsilon", "nan", "--json", db=store_path)
    assert json.loads(as_json.stdout)["error"] == "configuration_error"


def test_policy_apply_shows_and_records_changes(store_path, tmp_path):
    newer = tmp_path / "p.yaml"
    newer.write_text(ADULT_POLICY.read_text().replace("adult: {epsilon: 1}", "adult: {epsilon: 2}"))
    result = run("policy", "apply", str(newer), "--yes", db=store_path)
    assert result.returncode == 0, result.stderr
    assert "users.bob.budgets.adult.epsilon: 1 -> 2" in result.stdout
    again = run("policy", "apply", str(newer), "--yes", db=store_path)
    assert "no changes" in again.stdout
    history = json.loads(run("policy", "show", "--json", db=store_path).stdout)["history"]
    assert len(history) == 2


def test_policy_check_against_store(store_path):
    result = run("policy", "check", str(ADULT_POLICY), "--db", str(store_path))
    assert result.returncode == 0
    assert "valid" in result.stdout


@pytest.mark.parametrize("args", [["demo"]])
def test_demo_runs(args):
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert "Create a governed store" in result.stdout
    assert "refused" in result.stdout


def test_audit_shows_a_refused_cost_as_asked_not_charged(tmp_path):
    db = adult_store(tmp_path)
    refused = run("query", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50) COUNT(*) "
                  "FROM adult", "--user", "alice", db=db)
    assert refused.returncode == dpsql.BudgetExceeded.exit_code, refused.stderr
    answered = run("query", "SELECT COUNT(*) FROM adult", "--user", "alice", db=db)
    assert answered.returncode == 0, answered.stderr
    lines = run("audit", "--last", "2", db=db).stdout.splitlines()
    assert "refused" in lines[-2]
    assert "asked rho=" in lines[-2]
    assert "answered" in lines[-1]
    assert "asked" not in lines[-1]
    assert "rho=" in lines[-1]


def test_policy_check_and_grant_warn_about_budgets_that_cannot_hold(tmp_path):
    db = adult_store(tmp_path)
    spend = run("query", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.9) COUNT(*) "
                "FROM adult", "--user", "bob", db=db)
    assert spend.returncode == 0, spend.stderr
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["users"]["bob"]["budgets"]["adult"] = {"epsilon": 0.5}
    lowered = tmp_path / "lowered.yaml"
    lowered.write_text(yaml.safe_dump(raw))
    checked = run("policy", "check", str(lowered), db=db)
    assert checked.returncode == 0, checked.stderr
    assert "note: bob on adult: the budget" in checked.stdout
    assert "is below what is spent" in checked.stdout
    raw["datasets"]["adult"]["synthesizers"] = ["indepndent", "joint"]
    typo = tmp_path / "typo.yaml"
    typo.write_text(yaml.safe_dump(raw))
    refused = run("policy", "check", str(typo), db=db)
    assert refused.returncode == dpsql.PolicyError.exit_code
    assert "unknown synthesizer 'indepndent'" in refused.stderr
    assert "did you mean 'independent'" in refused.stderr
    granted = run("budget", "grant", "alice", "adult", "--epsilon", "100", db=db)
    assert granted.returncode == 0, granted.stderr
    assert "exceeds the dataset's total" in granted.stdout


def test_policy_apply_refuses_before_showing_changes(tmp_path):
    db = adult_store(tmp_path)
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["datasets"]["adult"]["columns"]["shoe_size"] = {"type": "integer", "bounds": [30, 50]}
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(raw))
    applied = run("policy", "apply", str(broken), "--yes", db=db)
    assert applied.returncode == dpsql.PolicyError.exit_code
    assert "has no such column" in applied.stderr
    assert "changes from" not in applied.stdout


def test_budget_show_under_pure_accounting_has_no_rho_column(tmp_path):
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["accounting"] = "pure"
    raw.pop("delta", None)
    policy = tmp_path / "pure.yaml"
    policy.write_text(yaml.safe_dump(raw))
    db = adult_store(tmp_path, policy)
    shown = run("budget", "show", db=db)
    assert shown.returncode == 0, shown.stderr
    assert "rho" not in shown.stdout
    assert "remaining" in shown.stdout.splitlines()[0]
