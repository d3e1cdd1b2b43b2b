"""Budgets that add up: zCDP budgets in rho with epsilon beside them, the same everywhere."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import yaml

import dpsql
from dpsql.privacy import WHY_RHO, epsilon_from_rho, rho_from_epsilon_delta

from .conftest import ADULT_POLICY
from .test_cli import adult_store, run
from .test_privacy import _dp_accounting_epsilon

NOTE = f"dpsql: {WHY_RHO}"
FIGURE = r"[0-9.]+"


def _store(tmp_path: Path, bob: float = 1.5) -> Path:
    """The demo store (zCDP, delta 1e-6) with bob granted epsilon ``bob`` by the policy."""
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["users"]["bob"]["budgets"]["adult"] = {"epsilon": bob}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(raw))
    return adult_store(tmp_path, policy)


def _both(rho: str, epsilon: str) -> str:
    return f"rho={rho} (epsilon={epsilon} at delta=1e-06)"


def _rows(text: str) -> dict[str, dict[str, str]]:
    """A printed budget table as {first cell: {column: cell}} (the strings as shown)."""
    lines = text.splitlines()
    headers = lines[0].split()
    return {cells[0]: dict(zip(headers, cells, strict=True))
            for cells in (line.split() for line in lines[2:]) if len(cells) == len(headers)}


def test_grant_of_epsilon_under_zcdp_states_both_units_and_the_epsilon_total(tmp_path):
    db = _store(tmp_path)
    granted = run("budget", "grant", "bob", "adult", "--epsilon", "0.5", db=db)
    assert granted.returncode == 0, granted.stderr
    first, standing, note, arithmetic = granted.stdout.splitlines()
    assert first == f"granted {_both('0.006642', '0.5')} to bob on adult"
    assert re.fullmatch(r"note: the grant added rho 0\.006642 to rho [\d.]+; at delta 1e-06 "
                        r"that is epsilon 1\.601 in all, not 1\.5 \+ 0\.5 \(epsilons under "
                        r"zCDP do not add\)", arithmetic), arithmetic
    # 1.5 and 0.5 make 1.601, not 2: the rhos add, and epsilon is concave in rho
    total = rho_from_epsilon_delta(1.5, 1e-6).value + rho_from_epsilon_delta(0.5, 1e-6).value
    assert round(_dp_accounting_epsilon(float(total), 1e-6), 3) == 1.601
    nothing = re.escape(_both("0", "0"))
    match = re.fullmatch(rf"bob on adult: granted rho=({FIGURE}) \(epsilon=1\.601 at "
                         rf"delta=1e-06\), spent {nothing}, remaining rho=({FIGURE}) "
                         r"\(epsilon=1\.6 at delta=1e-06\)", standing)
    assert match, standing
    assert Fraction(match[2]) <= total <= Fraction(match[1]) * Fraction(10001, 10000)
    assert note == NOTE

    shown = _rows(run("budget", "show", "--user", "bob", db=db).stdout)["bob"]
    assert (shown["granted"], shown["granted_epsilon"]) == (match[1], "1.601")
    assert (shown["spent"], shown["remaining"]) == ("0", match[2])


def test_grant_in_rho_and_json_carry_both_units(tmp_path):
    db = _store(tmp_path, bob=1)
    granted = run("budget", "grant", "bob", "adult", "--rho", "0.01", db=db)
    assert round(_dp_accounting_epsilon(0.01, 1e-6), 4) == 0.6217
    assert granted.stdout.startswith(f"granted {_both('0.01', '0.6217')} to bob on adult\n")
    as_json = json.loads(run("budget", "grant", "bob", "adult", "--rho", "0.01", "--json",
                             db=db).stdout)
    assert as_json["added"]["rho"] == "0.01"
    assert as_json["added"]["epsilon"] == epsilon_from_rho(Fraction(1, 100), 1e-6)
    total = rho_from_epsilon_delta(1, 1e-6).value + Fraction(2, 100)
    assert Fraction(as_json["granted"]["rho"]) == total
    assert as_json["granted"]["epsilon"] == epsilon_from_rho(total, 1e-6)
    assert as_json["granted"]["delta"] == 1e-6
    shown = json.loads(run("budget", "show", "--user", "bob", "--json", db=db).stdout)
    assert shown[0]["remaining"] == as_json["remaining"]


def test_budget_show_adds_up_in_rho(tmp_path):
    db = _store(tmp_path)
    for epsilon in ("0.3", "0.2"):
        asked = run("query", f"SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {epsilon}) "
                    "COUNT(*) FROM adult", "--user", "bob", db=db)
        assert asked.returncode == 0, asked.stderr
    shown = run("budget", "show", db=db)
    assert shown.stdout.splitlines()[-1] == NOTE
    bob = _rows(shown.stdout)["bob"]
    granted, spent, left = (Fraction(bob[k]) for k in ("granted", "spent", "remaining"))
    # four figures each: granted to the nearest, spent up, remaining down
    assert abs(granted - spent - left) <= granted / 1000
    assert bob["granted_epsilon"] == "1.5"
    assert Fraction(bob["spent_epsilon"]) < Fraction("0.5")  # 0.3 and 0.2 compose to less
    assert Fraction(bob["remaining_epsilon"]) > 1  # and leave more than 1.5 - 0.5
    with dpsql.connect(db, "bob") as session:
        standing = session.budget()[0]
    assert standing.spent.value <= spent
    assert standing.remaining.value >= left
    assert repr(standing) == f"<Budget {standing}>"
    assert str(standing) == (f"bob on adult: granted {_both(bob['granted'], '1.5')}, "
                             f"spent {_both(bob['spent'], bob['spent_epsilon'])}, "
                             f"remaining {_both(bob['remaining'], bob['remaining_epsilon'])}")


def test_shell_budget_and_budget_show_print_the_same_strings(tmp_path):
    db = _store(tmp_path)
    shell = run("shell", "--user", "alice", db=db,
                input_text="SELECT COUNT(*) FROM adult;\n\\budget\n\\q\n")
    assert shell.returncode == 0, shell.stderr
    table = shell.stdout[shell.stdout.index("dataset"):]
    from_shell = _rows(table)["adult"]
    shown = run("budget", "show", "--user", "alice", db=db)
    from_show = _rows(shown.stdout)["alice"]
    assert from_show.pop("user") == "alice"
    assert from_shell == from_show
    assert from_shell["unit"] == "rho"
    assert from_shell["granted_epsilon"] == "2"
    assert NOTE in shell.stderr.splitlines()
    assert shown.stdout.splitlines()[-1] == NOTE
    charged = next(line for line in shell.stderr.splitlines() if "charged" in line)
    left = _both(from_show["remaining"], from_show["remaining_epsilon"])
    assert charged.endswith(f"remaining {left}")


def test_pure_accounting_keeps_epsilon(tmp_path):
    raw = yaml.safe_load(ADULT_POLICY.read_text())
    raw["accounting"] = "pure"
    raw.pop("delta")
    policy = tmp_path / "pure.yaml"
    policy.write_text(yaml.safe_dump(raw))
    db = adult_store(tmp_path, policy)
    granted = run("budget", "grant", "bob", "adult", "--epsilon", "0.5", db=db)
    assert granted.stdout.splitlines() == [
        "granted epsilon=0.5 to bob on adult",
        "bob on adult: granted epsilon=1.5, spent epsilon=0, remaining epsilon=1.5"]
    shown = run("budget", "show", db=db)
    assert "rho" not in shown.stdout
    assert _rows(shown.stdout)["bob"]["granted"] == "1.5"
    assert shown.stdout.splitlines()[-1] == "dpsql: epsilon adds up (granted = spent + remaining)"
