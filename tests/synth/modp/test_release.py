"""MODP through releases: the CLI as a user runs it, provenance, and the non-DP refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql.errors import ReleaseError
from dpsql.privacy import PrivacyCost

from ...conftest import policy_text

SMALL = ["--option", "blades=1", "--option", "steps=5", "--columns",
         "age,sex,race,income_50k"]


def run(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _policy(make_store, extra: str = "") -> Path:
    return make_store(policy_text("zcdp", budget="{epsilon: 10}", user_budget="{epsilon: 4}",
                                  extra_dataset="    synthesizers: [modp]\n" + extra))


def test_dp_release_from_the_command_line(store_path: Path) -> None:
    made = run("release", "adult", "--synth", "modp", "--option", "mode=dp", "--epsilon", "1",
               "--name", "adult_modp", "--seed", "3", "--json", *SMALL, db=store_path)
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)["record"]
    assert record["privacy"] == "dp"
    charged = PrivacyCost.zcdp(record["cost"]["charged"]["rho"])
    spent = PrivacyCost.zcdp(record["cost"]["spent"]["rho"])
    assert spent <= charged
    assert spent.value > charged.value * Fraction(999_999, 1_000_000)  # the budget is used
    assert record["parameters"]["dpsgd"]["steps"] == 5
    assert record["measurements"]  # the seed histogram's noisy marginals
    assert record["rows"] == record["parameters"]["rows"]  # the DP row count
    with dpsql.connect(store_path, "alice") as alice:
        count = alice.store.cursor().execute(
            "SELECT count(*), count(DISTINCT sex) FROM released.adult_modp").fetchone()
    assert count == (record["rows"], 2)


def test_empirical_release_is_refused_without_allow_non_dp(store_path: Path) -> None:
    refused = run("release", "adult", "--synth", "modp", "--name", "adult_modp", *SMALL,
                  db=store_path)
    assert refused.returncode == 7, refused.stderr
    assert "allow_non_dp: true" in refused.stderr
    with dpsql.connect(store_path, "admin") as admin:
        assert admin.budget()[0].spent.is_zero
        assert admin.audit(last=1)[0]["outcome"] == "refused"


def test_empirical_release_when_allowed_is_labelled(make_store) -> None:
    path = _policy(make_store, "    allow_non_dp: true\n")
    with dpsql.connect(path, "admin") as admin:
        done = admin.release("adult", synthesizer="modp", name="adult_modp",
                             columns=["age", "sex", "race", "income_50k"], epochs=3,
                             blades=2, seed=1)
        record = done.record
        assert record["privacy"] == "empirical"
        assert record["cost"]["spent"]["rho"] == "0"
        assert admin.budget()[0].spent.is_zero
        diagnostics = record["diagnostics"]
        assert {"entropy_bits", "multiplicity", "log10_effective_multiplicity",
                "hamming_rank"} <= set(diagnostics)
        rows = admin.store.cursor().execute(
            "SELECT count(*) FROM released.adult_modp").fetchone()
        assert rows == (5000,)


def test_passthrough_needs_the_policy_to_name_it(make_store) -> None:
    refused = _policy(make_store, "    allow_non_dp: true\n")
    with dpsql.connect(refused, "admin") as admin, \
            pytest.raises(ReleaseError, match="allow_options"):
        admin.release("adult", synthesizer="modp", name="x", passthrough="0.3", epochs=1)
    allowed = _policy(make_store, "    allow_non_dp: true\n    allow_options: [passthrough]\n")
    with dpsql.connect(allowed, "admin") as admin:
        done = admin.release("adult", synthesizer="modp", name="x", passthrough="0.3",
                             columns=["age", "sex"], epochs=1, blades=1)
        assert done.record["synthesizer"]["options"]["passthrough"] == "0.3"


def test_dp_mode_on_a_pure_policy_is_refused_before_any_charge(make_store) -> None:
    path = make_store(policy_text("pure", extra_dataset="    synthesizers: [modp]\n"))
    with dpsql.connect(path, "admin") as admin:
        with pytest.raises(dpsql.ConfigurationError, match="zcdp"):
            admin.release("adult", synthesizer="modp", name="x", epsilon=1, mode="dp")
        assert admin.budget()[0].spent.is_zero
