"""``dpsql query`` and ``dpsql shell`` as a user runs them: real subprocesses on a real store."""

from __future__ import annotations

import csv
import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

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
    result = dpsql_cli("query", "SELECT MODE(age) FROM adult", "--db", str(store_path),
                       "--user", "alice", "--json")
    assert json.loads(result.stdout)["error"] == "query_rejected"


def test_shell_session(store_path: Path, tmp_path: Path) -> None:
    script = "\n".join([
        "SET dpsql.epsilon = 0.2;",
        "SELECT race,",
        "       COUNT(*) AS n",
        "FROM adult GROUP BY race;",
        "SELECT MODE(age) FROM adult;",
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
    assert "MODE has no differentially private mechanism" in err  # the shell kept going
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


def test_query_file_answers_each_statement_and_exits_with_the_first_failure(
        store_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "report.sql"
    script.write_text("\n".join([
        "SET dpsql.epsilon = 0.25;",
        "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex;",
        "",
        "SELECT MODE(age) FROM adult;",  # statement 3, line 4: rejected (exit 4)
        "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 50)",
        "  COUNT(*) FROM adult;",  # statement 4, line 5: over budget (exit 5)
        "SELECT COUNT(*) AS people FROM adult",  # the last needs no ';'
    ]) + "\n")
    result = dpsql_cli("query", "-f", str(script), "--db", str(store_path), "--user", "alice")
    assert result.returncode == dpsql.QueryRejected.exit_code  # the first failure's, not the last
    assert f"error: statement 3 (line 4 of {script}): MODE has no" in result.stderr
    assert f"error: statement 4 (line 5 of {script}): " in result.stderr
    assert result.stderr.count("error:") == 2
    assert "epsilon=0.25 at delta" in result.stderr  # the SET held for the later statements
    blocks = result.stdout.split("\n\n")
    assert [b.split()[0] for b in blocks] == ["sex", "people"]  # both answered, in order
    with dpsql.connect(store_path, "alice") as alice:
        outcomes = [r["outcome"] for r in alice.audit()]
    assert outcomes.count("answered") == 2


def test_query_csv_is_plain_csv_of_the_rows(store_path: Path) -> None:
    result = dpsql_cli("query", "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1) sex, "
                       "COUNT(*) AS n, AVG(age) AS \"mean, age\" FROM adult GROUP BY sex "
                       "ORDER BY sex", "--format", "csv", "--db", str(store_path),
                       "--user", "alice")
    assert result.returncode == 0, result.stderr
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert rows[0] == ["sex", "n", "mean, age"]
    assert [r[0] for r in rows[1:]] == ["0", "1"]
    assert all(float(r[2]) > 0 and int(r[1]) > 0 for r in rows[1:])
    assert "charged" in result.stderr  # notices stay off stdout
    assert "charged" not in result.stdout


def test_query_file_from_stdin_as_json(store_path: Path) -> None:
    result = dpsql_cli("query", "-f", "-", "--format", "json", "--db", str(store_path),
                       "--user", "alice", stdin="SHOW dpsql.ci;\nSELECT * FROM adult;\n")
    assert result.returncode == dpsql.QueryRejected.exit_code
    first, second = json.loads(result.stdout)
    assert (first["statement"], first["line"], first["kind"]) == (1, 1, "show")
    assert (second["statement"], second["line"], second["error"]) == (2, 2, "query_rejected")
    both = dpsql_cli("query", "SHOW dpsql.ci", "--json", "--format", "csv", "--db",
                     str(store_path), "--user", "alice")
    assert both.returncode == 2
    assert "--json means --format json" in both.stderr


# Started with Ctrl-C ignored and blocked, as a careless parent may leave it: the shell
# still takes it (psql does too).
_HOSTILE = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
            "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


@pytest.mark.parametrize("parent", ["plain", "ignoring Ctrl-C"])
def test_shell_ctrl_c_clears_the_line_and_ctrl_d_exits_0(store_path: Path, tmp_path: Path,
                                                         parent: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "DPSQL_HISTORY": str(tmp_path / "history")}
    start = [sys.executable] + (["-c", _HOSTILE] if parent != "plain" else [])
    with subprocess.Popen([*start, "-m", "dpsql", "shell", "--db", str(store_path),
                           "--user", "alice"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env) as shell:
        assert shell.stdin is not None
        assert shell.stdout is not None
        shell.stdin.write(b"SELECT COUNT(*) FROM no_such_table\n")  # unfinished: no ';'
        shell.stdin.flush()
        assert _read_until(shell.stdout, b"  ...> ", seconds=120)  # waits for the rest
        for _ in range(10):  # a signal landing just before the read blocks waits: send again
            shell.send_signal(signal.SIGINT)
            if _read_until(shell.stdout, b"\ndpsql> ", seconds=3):  # a fresh prompt
                break
        else:
            status = Path(f"/proc/{shell.pid}/status").read_text()
            shell.kill()
            pytest.fail("Ctrl-C gave no fresh prompt; the shell's signals: "
                        + " ".join(line for line in status.splitlines() if line.startswith("Sig"))
                        + f"; its stderr: {shell.communicate()[1][-2000:]!r}")
        out, err = shell.communicate(b"SHOW dpsql.ci;\n", timeout=120)  # then Ctrl-D
    assert shell.returncode == 0, err
    assert b"dpsql.ci" in out
    assert b"error" not in err  # the cleared line never reached the parser
    with dpsql.connect(store_path, "alice") as alice:
        assert "no_such_table" not in str([r["statement"] for r in alice.audit()])


def _read_until(stream: Any, marker: bytes, seconds: float) -> bool:
    """Read ``stream`` until it shows ``marker`` (True) or ``seconds`` pass (False)."""
    seen, deadline = b"", time.monotonic() + seconds
    while marker not in seen and time.monotonic() < deadline:
        if select.select([stream], [], [], 0.2)[0]:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"the shell ended: {seen!r}"
            seen += chunk
    return marker in seen


def test_completer_offers_public_names(store_path: Path) -> None:
    from dpsql.cli.complete import Completer
    from dpsql.cli.query import BACKSLASH_COMMANDS

    with dpsql.connect(store_path, "admin") as admin:
        admin.release("adult", synthesizer="independent", epsilon=1, columns=["age", "sex"],
                      name="adult_ind", seed=1)
    with dpsql.connect(store_path, "alice") as alice:
        complete = Completer(alice, BACKSLASH_COMMANDS).candidates
        assert complete("\\b", "") == ["\\budget"]
        assert complete("\\", "") == sorted(BACKSLASH_COMMANDS)
        assert complete("sel", "") == ["select"]
        assert complete("GRO", "SELECT sex FROM adult ") == ["GROUP BY"]
        assert complete("adu", "SELECT COUNT(*) FROM ") == ["adult"]
        assert complete("capital", "SELECT ") == ["capital_gain", "capital_loss"]
        assert complete("fnl", "SELECT ") == []  # hidden in the policy: never offered
        assert complete("rele", "FROM ") == ["released."]
        assert complete("released.", "SELECT * FROM ") == ["released.adult_ind"]
        assert complete("dpsql.e", "SET ") == ["dpsql.epsilon"]
        assert "dpsql.budget" in complete("dpsql.", "SHOW ")
        assert "dpsql.budget" not in complete("dpsql.", "SET ")
        assert complete("\\explain", "x ") == []  # a backslash command only opens a line
