"""``dpsql query`` and ``dpsql shell`` as a user runs them: real subprocesses on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dpsql


def dpsql_cli(*args: str, stdin: str | None = None,
              home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if home is not None:
        env["DPSQL_HISTORY"] = str(home / "history")
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, input=stdin, env=env, timeout=120)


def test_query_prints_the_table_and_the_cost(store_path: Path) -> None:
    result = dpsql_cli("query", "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex",
                       "--db", str(store_path), "--user", "alice")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["sex", "n"]
    assert len(lines) == 4
    assert "charged rho=" in result.stderr
    assert "remaining" in result.stderr


def test_query_json(store_path: Path) -> None:
    result = dpsql_cli("query", "SELECT AVG(age) FROM adult WHERE income_50k = 1",
                       "--db", str(store_path), "--user", "alice", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["kind"] == "dp"
    assert data["dataset"] == "adult"
    assert list(data["rows"][0]) == ["avg_age"]
    assert data["columns"]["avg_age"]["sum"]["mechanism"] == "discrete_gaussian"
    assert data["cost"]["rho"]
    assert data["remaining"]["epsilon"] < 2


def test_query_rejection_exit_code_and_json_error(store_path: Path) -> None:
    result = dpsql_cli("query", "SELECT * FROM adult", "--db", str(store_path),
                       "--user", "alice")
    assert result.returncode == dpsql.QueryRejected.exit_code
    assert "SELECT * would return raw rows" in result.stderr
    result = dpsql_cli("query", "SELECT MAX(age) FROM adult", "--db", str(store_path),
                       "--user", "alice", "--json")
    assert json.loads(result.stdout)["error"] == "query_rejected"


def test_shell_session(store_path: Path, tmp_path: Path) -> None:
    script = "\n".join([
        "SET dpsql.epsilon = 0.2;",
        "SELECT race,",
        "       COUNT(*) AS n",
        "FROM adult GROUP BY race;",
        "SELECT MIN(age) FROM adult;",
        "\\budget",
        "\\explain SELECT SUM(capital_gain) FROM adult",
        "\\help",
        "\\nonsense",
        "\\q",
    ]) + "\n"
    result = dpsql_cli("shell", "--db", str(store_path), "--user", "alice", stdin=script,
                       home=tmp_path)
    assert result.returncode == 0, result.stderr
    out, err = result.stdout, result.stderr
    assert "race" in out
    assert out.count("\n") > 10
    assert "epsilon=0.2 at delta" in err  # the session option was used
    assert "MIN has no differentially private mechanism" in err  # the shell kept going
    assert "remaining_epsilon" in out  # \budget
    assert "SUM(capital_gain)" in out
    assert "would cost" in err
    assert "\\explain QUERY" in out  # \help
    assert "unknown command \\nonsense" in err
    with dpsql.connect(store_path, "alice") as alice:
        assert alice.sql("SELECT race, COUNT(*) AS n FROM adult GROUP BY race").cached is False
        outcomes = [r["outcome"] for r in alice.audit()]
    assert outcomes.count("answered") == 2
    assert "rejected" in outcomes
