"""The CLI as a user runs it: a real process, exit codes per error class, --json."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

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
    from dpsql.cli import _load_commands, cli

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

    # Under zCDP a grant says why the granted epsilon grew by less than it typed (issue 45).
    said = run("budget", "grant", "bob", "adult", "--epsilon", "0.5", db=db)
    assert said.returncode == 0, said.stderr
    [note] = [line for line in said.stdout.splitlines() if line.startswith("note: the grant")]
    before, added = re.search(r"not ([\d.]+) \+ ([\d.]+)", note).groups()
    total = float(re.search(r"epsilon ([\d.]+) in all", note).group(1))
    assert float(added) == pytest.approx(0.5, rel=1e-3)
    assert float(before) < total < float(before) + float(added)  # concave: less than the sum

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


def test_query_epsilon_sets_the_cost_of_each_statement(tmp_path):
    """``dpsql query --epsilon`` (issue 45): checked as a number, never pasted into SQL."""
    db = adult_store(tmp_path)
    answered = run("query", "SELECT COUNT(*) FROM adult", "--user", "alice", "--epsilon",
                   "0.25", "--json", db=db)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["cost"]["epsilon"] == pytest.approx(0.25, rel=1e-3)
    script = tmp_path / "two.sql"
    script.write_text("SELECT COUNT(*) FROM adult;\nSELECT AVG(age) FROM adult;\n")
    both = run("query", "-f", str(script), "--user", "alice", "--epsilon", "0.125", "--json",
               db=db)
    assert both.returncode == 0, both.stderr
    assert [r["cost"]["epsilon"] for r in json.loads(both.stdout)] == \
        pytest.approx([0.125, 0.125], rel=1e-3)
    for bad in ("0.5; SET dpsql.epsilon = 5", "-1", "nan", "1e999"):
        refused = run("query", "SELECT COUNT(*) FROM adult", "--user", "alice", "--epsilon",
                      bad, db=db)
        assert refused.returncode != 0, bad
        assert "epsilon" in refused.stderr, refused.stderr
    spent = run("budget", "show", "--user", "alice", "--json", db=db)
    assert spent.returncode == 0, spent.stderr


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


# -- startup, the README's command table, --json everywhere ------------------------------

HEAVY_MODULES = ("pyarrow", "pandas", "duckdb", "numpy", "scipy", "sqlglot", "jax", "torch",
                 "dpsql.synth", "dpsql.session", "dpsql.store")


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_load_no_heavy_module(flag):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "dpsql", flag],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "dpsql.cli.query" in imported  # the listing is real: every command module loaded
    heavy = sorted(m for m in imported if m.split(".")[0] in HEAVY_MODULES
                   or any(m == h or m.startswith(h + ".") for h in HEAVY_MODULES))
    assert heavy == []


def _readme_rows():
    """(command spans, whole row) of the README's `| command | what it does |` table."""
    lines = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    start = lines.index("| command | what it does |") + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        first = re.split(r"(?<!\\)\|", line)[1]
        rows.append((re.findall(r"`([^`]+)`", first), line))
    return rows


def _command_path(words):
    """The click command that words name (dpsql releases show T -> releases show)."""
    from dpsql.cli import cli

    command, path = cli, []
    for word in words[1:]:
        if not isinstance(command, click.Group) or word not in command.commands:
            break
        command, path = command.commands[word], [*path, word]
    return command, path


def _flags(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-zA-Z])\b", text))


def test_readme_command_table_matches_the_cli():
    from dpsql.cli import _load_commands

    _load_commands()
    runner = CliRunner()
    documented = set()
    rows = _readme_rows()
    assert len(rows) >= 15
    for spans, line in rows:
        assert spans, line
        assert all(s.startswith("dpsql ") for s in spans), line
        helps = []
        for span in spans:
            command, path = _command_path(span.split())
            assert path, f"no command: {span}"
            assert not isinstance(command, click.Group) or command.invoke_without_command, (
                f"a group, not a command: {span}")
            documented.add(tuple(path))
            result = runner.invoke(command, ["--help"], prog_name=f"dpsql {' '.join(path)}")
            assert result.exit_code == 0, (span, result.output)
            missing = _flags(span) - _flags(result.output)
            assert not missing, f"dpsql {' '.join(path)} --help lacks {missing}"
            helps.append(result.output)
        for flag in _flags(line.split("|")[2]):  # flags the description names
            assert any(flag in h for h in helps), f"{flag} of row {line!r}"
    from dpsql.cli import cli

    commands = {path for path in _commands(cli)
                if not isinstance(_command_path(["dpsql", *path])[0], click.Group)}
    assert commands - documented == set(), "commands missing from the README's table"


# Store commands without --json, as the README says: interactive, long-running, YAML, a tour.
WITHOUT_JSON = {("shell",), ("serve",), ("policy", "draft"), ("demo",)}


def test_every_store_command_takes_json():
    from dpsql.cli import _load_commands, cli

    _load_commands()
    for path in _commands(cli):
        command = _command_path(["dpsql", *path])[0]
        if isinstance(command, click.Group):
            continue
        options = {o for p in command.params for o in p.opts}
        on_store = "--db" in options or path == ("init",)
        if on_store and path not in WITHOUT_JSON:
            assert "--json" in options, f"dpsql {' '.join(path)} has no --json"
        elif on_store:
            assert "--json" not in options, f"update WITHOUT_JSON and the README: {path}"


def test_store_commands_print_valid_json(tmp_path):
    from dpsql.cli import _load_commands, cli

    _load_commands()
    db = tmp_path / "s.duckdb"
    calls = [
        ["init", str(db), "--policy", str(ADULT_POLICY), "--import", f"adult={ADULT_SAMPLE}"],
        ["policy", "check", str(ADULT_POLICY), "--db", str(db)],
        ["policy", "show", "--db", str(db)],
        ["policy", "apply", str(ADULT_POLICY), "--yes", "--db", str(db)],
        ["budget", "show", "--db", str(db)],
        ["budget", "grant", "bob", "adult", "--rho", "0.01", "--db", str(db)],
        ["query", "SELECT COUNT(*) FROM adult", "--user", "alice", "--db", str(db)],
        ["release", "adult", "--synth", "independent", "--epsilon", "0.5", "--columns",
         "age,sex", "--name", "syn", "--db", str(db)],
        ["release-more", "syn", "--copies", "1", "--db", str(db)],
        ["releases", "list", "--db", str(db)],
        ["releases", "show", "syn", "--db", str(db)],
        ["releases", "synthesizers"],
        ["export", "syn", str(tmp_path / "syn.parquet"), "--db", str(db)],
        ["evaluate", "syn", "--no-report", "--db", str(db)],
        ["user", "add", "alice", "--password-stdin", "--db", str(db)],
        ["user", "list", "--db", str(db)],
        ["user", "remove", "alice", "--db", str(db)],
        ["audit", "--last", "3", "--db", str(db)],
    ]
    runner = CliRunner()
    for args in calls:
        result = runner.invoke(cli, [*args, "--json"], input="a long password\n")
        assert result.exit_code == 0, (args, result.output, result.exception)
        json.loads(result.stdout)  # the whole of stdout is one JSON document


# -- operating-system failures and Ctrl-C ------------------------------------------------


def _cli_env(db):
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}


def test_a_full_disk_is_an_os_error_not_a_bug(tmp_path):
    db = adult_store(tmp_path)

    def small_files():  # a write past 4 KiB fails (EFBIG) as it would on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    grant = subprocess.run([sys.executable, "-m", "dpsql", "budget", "grant", "bob", "adult",
                            "--epsilon", "1"], capture_output=True, text=True, timeout=120,
                           env=_cli_env(db), preexec_fn=small_files)
    assert grant.returncode == 74, grant.stderr
    assert f'Could not write file "{db}.wal": File too large' in grant.stderr
    assert "internal error" not in grant.stderr
    with open("/dev/full", "w") as full:  # stdout on a device that is always full: ENOSPC
        shown = subprocess.run([sys.executable, "-m", "dpsql", "policy", "show", "--json"],
                               stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
                               env=_cli_env(db))
    assert shown.returncode == 74, shown.stderr
    assert "error: No space left on device; check the path" in shown.stderr


def test_permission_denied_on_the_store_is_an_os_error(tmp_path):
    db = adult_store(tmp_path)
    os.chmod(db, 0)
    command = [sys.executable, "-m", "dpsql", "audit", "--json"]
    if os.geteuid() == 0:  # root reads any file unless it gives up the capability to
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env=_cli_env(db))
    assert result.returncode == 74, result.stderr
    assert f"error: permission denied ({db})" in result.stderr
    assert json.loads(result.stdout)["error"] == "os_error"


def test_ctrl_c_during_a_release_exits_130_and_writes_nothing(tmp_path):
    db = adult_store(tmp_path)
    terminal, stderr = pty.openpty()  # a terminal, so that the progress bar shows
    fcntl.ioctl(stderr, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        with subprocess.Popen(
                [sys.executable, "-m", "dpsql", "release", "adult", "--synth", "napsu_mq",
                 "--epsilon", "0.5", "--columns", "age,sex,race,income_50k", "--name",
                 "stopped"], stdout=subprocess.DEVNULL, stderr=stderr,
                env=_cli_env(db)) as release:
            os.close(stderr)
            shown = _read_until(terminal, b"fit")  # charged, fitting: a long stage
            release.send_signal(signal.SIGINT)
            code = release.wait(timeout=120)
            shown += _read_until(terminal, b"\ninterrupted")
    finally:
        os.close(terminal)
    assert code == 130, shown.decode(errors="replace")[-2000:]
    assert b"interrupted: " in shown  # the charge stays, as the message says
    assert b"nothing was written" in shown
    assert b"the charge of rho=" in shown
    with dpsql.connect(db, "admin") as admin:
        assert "stopped" not in str(admin.sql("SHOW dpsql.released").table.to_pylist())
        last = admin.audit(last=1)[0]
    assert (last["action"], last["outcome"]) == ("release", "cancelled")


def _read_until(fd, marker, timeout=120):
    """What a terminal shows up to ``marker`` (or its end)."""
    seen, deadline = b"", time.monotonic() + timeout
    while marker not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            seen += chunk
    return seen
