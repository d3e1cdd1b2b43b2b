"""Every mechanism implements the one protocol, and the package's imports go down only."""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from dpsql.errors import ConfigurationError
from dpsql.mechanisms.base import Mechanism
from dpsql.mechanisms.exponential import ExponentialMechanism
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.mechanisms.noisy_max import ReportNoisyMax
from dpsql.mechanisms.threshold import KeyThreshold
from dpsql.privacy import Kind, PrivacyCost
from tests.mechanisms.boundary import less

PACKAGE = Path(__file__).resolve().parents[2] / "dpsql" / "mechanisms"
#: What dpsql.mechanisms may import of dpsql (besides itself).
ALLOWED = {"dpsql.privacy", "dpsql.noise", "dpsql._exact", "dpsql.errors"}
THIRD_PARTY = {"numpy", "scipy"}


def _threshold(sensitivity: int, share: PrivacyCost) -> KeyThreshold:
    return KeyThreshold.calibrate(sensitivity, share, 1e-6)


#: name -> (calibrate(sensitivity, share), the accountings it can be charged in)
CASES: dict[str, tuple[Callable[[int, PrivacyCost], Any], tuple[Kind, ...]]] = {
    "laplace": (LaplaceMechanism.calibrate, ("pure", "zcdp")),
    "gaussian": (GaussianMechanism.calibrate, ("zcdp",)),
    "exponential": (ExponentialMechanism.calibrate, ("pure", "zcdp")),
    "noisy_max": (ReportNoisyMax.calibrate, ("pure", "zcdp")),
    "threshold": (_threshold, ("zcdp",)),
}
SHARE = {"pure": PrivacyCost.pure("0.7"), "zcdp": PrivacyCost.zcdp("0.07")}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kind", ["pure", "zcdp"])
def test_calibrate_cost_and_map_agree_at_the_boundary(name: str, kind: Kind) -> None:
    """check(sensitivity, cost(kind)) holds, one quantum less does not; cost fits the share."""
    calibrate, kinds = CASES[name]
    share = SHARE[kind]
    if kind not in kinds:
        with pytest.raises(ConfigurationError):
            calibrate(3, share)
        return
    mechanism = calibrate(3, share)
    assert isinstance(mechanism, Mechanism)
    assert mechanism.sensitivity == 3
    assert mechanism.check(3, share)
    for accounting in kinds:
        cost = mechanism.cost(accounting)
        assert mechanism.check(3, cost)
        assert not mechanism.check(3, less(cost))
    assert mechanism.cost(kind) <= share


def test_every_mechanism_module_is_in_the_cases() -> None:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__", "base", "additive"}
    assert modules == set(CASES)


def _dpsql_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == "dpsql":
                found |= {f"dpsql.{alias.name}" for alias in node.names}
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_imports_go_down_and_modules_stay_small(path: Path) -> None:
    names = _dpsql_imports(path)
    inside = {n for n in names if n.startswith("dpsql.") and not n.startswith("dpsql.mechanisms")}
    assert inside <= ALLOWED, f"{path.name} imports {sorted(inside - ALLOWED)}"
    outside = {n.split(".")[0] for n in names} - {"dpsql", "__future__"}
    assert outside <= THIRD_PARTY | set(sys.stdlib_module_names)
    assert len(path.read_text().splitlines()) < 500


@pytest.mark.parametrize("module", ["privacy.py", "noise.py", "_exact.py"])
def test_the_layers_below_never_import_mechanisms(module: str) -> None:
    names = _dpsql_imports(PACKAGE.parent / module)
    assert not {n for n in names if n.startswith("dpsql.mechanisms")}


def test_no_mechanism_is_left_above() -> None:
    """The mechanisms' classes live in dpsql.mechanisms only, not in query/, synth/ or privacy."""
    root = PACKAGE.parent
    for path in [root / "privacy.py", *root.glob("query/*.py"), *root.glob("synth/**/*.py")]:
        tree = ast.parse(path.read_text())
        classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        assert not classes & {"LaplaceMechanism", "GaussianMechanism", "ExponentialMechanism",
                              "ReportNoisyMax", "KeyThreshold"}, path


def test_a_gaussian_is_priced_exactly_at_a_fraction() -> None:
    mechanism = GaussianMechanism.calibrate(Fraction(1, 3), SHARE["zcdp"])
    assert mechanism.sensitivity == Fraction(1, 3)
    assert mechanism.cost() == SHARE["zcdp"]
