"""A release's provenance records what it spent: every measurement, within-bin shapes included."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql import provenance
from dpsql.privacy import PrivacyCost

from ..conftest import policy_text

HOURS = "hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98], " \
        "decode: shape}"


def shaped_store(make_store, accounting: str) -> Path:
    """A store whose numeric column asks for a within-bin shape (``decode: shape``)."""
    columns = f"""
      sex: {{type: categorical, values: [0, 1]}}
      {HOURS}"""
    return make_store(policy_text(accounting=accounting, budget="{epsilon: 100}",
                                  columns=columns,
                                  extra_dataset="    synthesizers: [independent, range]\n"))


def _release(admin: dpsql.Session, synthesizer: str, **kwargs) -> tuple[PrivacyCost, dict]:
    """Release at epsilon 0.5; returns the ledger's charge and the provenance's ``cost``."""
    before = admin.ledger.budget("admin", "adult").spent
    admin.release("adult", synthesizer=synthesizer, name="syn", epsilon=0.5, seed=1, **kwargs)
    charge = admin.ledger.budget("admin", "adult").spent - before
    return charge, provenance.find(admin.store, "syn")["record"]


def test_provenance_spent_counts_the_within_bin_shapes(make_store) -> None:
    # Before issue 40 the shapes' tenth was charged but not recorded: 0.45 of 0.5.
    with dpsql.connect(shaped_store(make_store, "pure"), "admin") as admin:
        charge, record = _release(admin, "independent")
    assert "within_bin_shapes" in record
    assert record["cost"]["charged"] == charge.as_dict()
    assert record["cost"]["spent"] == charge.as_dict()  # exactly: 0.45 fit + 0.05 shape


def test_provenance_spent_under_zcdp_is_the_sum_of_the_measurements(make_store) -> None:
    # The discrete Gaussian sampler rounds sigma^2 up, so each measurement costs at
    # most its share: spent is the exact sum, a few parts in a billion below the charge.
    with dpsql.connect(shaped_store(make_store, "zcdp"), "admin") as admin:
        charge, record = _release(admin, "independent")
    measured = record["measurements"] + record["within_bin_shapes"]["measurements"]
    total = sum(Fraction(m["cost"]["rho"]) for m in measured)
    spent = Fraction(record["cost"]["spent"]["rho"])
    assert spent == total
    assert spent <= charge.value
    assert float(spent / charge.value) == pytest.approx(1.0, abs=1e-6)


def test_range_keeps_its_whole_budget_for_its_tree(make_store) -> None:
    # range releases leaf counts, not rows: it decodes nothing, so no shape is measured
    # and its tree gets the whole budget (before issue 40: 0.45 of 0.5).
    with dpsql.connect(shaped_store(make_store, "pure"), "admin") as admin:
        charge, record = _release(admin, "range", columns=["hours_per_week"])
    assert "within_bin_shapes" not in record
    assert record["cost"]["spent"] == charge.as_dict()
    levels = sum(Fraction(m["cost"]["epsilon"]) for m in record["measurements"])
    assert levels == charge.value
