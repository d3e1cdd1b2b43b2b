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


def test_shell_splits_statements_at_semicolons_outside_comments_and_strings(
        store_path: Path, tmp_path: Path) -> None:
    script = "\n".join([
        'SELECT COUNT(*) AS "n;" -- not the end;',
        "FROM adult;  SHOW dpsql.epsilon; /* ; */",
        "SHOW dpsql.ci",  # the last statement needs no ';'
    ]) + "\n"
    result = dpsql_cli("shell", "--db", str(store_path), "--user", "alice", stdin=script,
                       home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr
    assert result.stdout.count("n;\n") == 1
    assert "dpsql.epsilon" in result.stdout
    assert "dpsql.ci" in result.stdout
    with dpsql.connect(store_path, "alice") as alice:
        assert alice.audit()[-1]["statement"].startswith('SELECT COUNT(*) AS "n;"')


def test_bad_input_is_refused_and_the_shell_goes_on(store_path: Path, tmp_path: Path) -> None:
    deep = "SELECT COUNT(*) FROM adult WHERE " + "(" * 80 + "age > 30" + ")" * 80
    bad = "SELECT COUNT(*) FROM adult WHERE sex = \udcff"  # argv's escape for byte 0xFF
    for sql, message in ((deep, "nested too deeply"), (bad, "not valid UTF-8 (line 1, "
                                                            "column 40)")):
        result = dpsql_cli("query", sql, "--db", str(store_path), "--user", "alice")
        assert result.returncode == dpsql.QueryRejected.exit_code, result.stderr
        assert message in result.stderr
    script = (deep + ";\n").encode() + b"SELECT COUNT(*) FROM adult WHERE sex = \xff;\n" \
        + b"SHOW dpsql.epsilon;\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "DPSQL_HISTORY": str(tmp_path / "history")}
    shell = subprocess.run([sys.executable, "-m", "dpsql", "shell", "--db", str(store_path),
                            "--user", "alice"], input=script, capture_output=True, env=env,
                           timeout=120)
    err = shell.stderr.decode()
    assert shell.returncode == 0, err
    assert "nested too deeply" in err
    assert "not valid UTF-8" in err
    assert b"dpsql.epsilon" in shell.stdout  # the session survived both
    with dpsql.connect(store_path, "alice") as alice:
        rows = alice.audit()[-4:]
    assert [r["outcome"] for r in rows] == ["rejected"] * 4
    assert rows[-1]["statement"].endswith("sex = \\udcff;")  # kept, escaped


def test_a_set_in_one_query_command_says_it_does_not_last(store_path: Path) -> None:
    result = dpsql_cli("query", "SET dpsql.ci = 0.95", "--db", str(store_path),
                       "--user", "alice")
    assert result.returncode == 0, result.stderr
    assert "lasts for this one command" in result.stderr
