"""DP within-bin shapes (``decode: shape``): a bin's values spread as the data's do.

In the Adult sample the rows with 40-59 hours a week bunch at a few values
(49, 44, 59, 54): over the bin's eight sub-bins their distribution is 0.44 in
total variation from a uniform draw inside the bin. A synthetic table decoded
with the measured shape lands within sampling noise of it (about 1,300 rows in
the bin: a total variation near 0.03, standard deviation about 0.01; the
shape's Laplace noise at epsilon 1 has scale 1 against counts of 20-450). The
thresholds, 0.12 and 0.3, are over 9 standard deviations from both: a
false-positive rate below 1e-12.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import dpsql
from dpsql import provenance
from dpsql.domain import SUB_BINS, Domain, integer_starts
from dpsql.errors import PolicyError
from dpsql.policy import Policy
from dpsql.synth import shape

from ..conftest import policy_text

HOURS = "hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]"


def shaped_policy(decode: str) -> str:
    return policy_text(budget="{epsilon: 100}", columns=columns(decode),
                       extra_dataset="    synthesizers: [independent]\n")


def columns(decode: str) -> str:
    return f"""
      sex: {{type: categorical, values: [0, 1]}}
      {HOURS}, decode: {decode}}}"""


def sub_bins(session: dpsql.Session, table: str) -> np.ndarray:
    """The distribution of ``table``'s rows with 40-59 hours over that bin's 8 sub-bins."""
    rows = session.store.cursor().execute(
        f"SELECT floor((hours_per_week - 40) * 8 / 20) AS s, count(*) FROM {table} "
        "WHERE hours_per_week BETWEEN 40 AND 59 GROUP BY s ORDER BY s").fetchall()
    counts = np.zeros(SUB_BINS)
    for sub, count in rows:
        counts[int(sub)] = count
    return counts / counts.sum()


def within_bin_distance(session: dpsql.Session, table: str) -> float:
    """Total variation between the real and the released spread inside the 40-59 bin."""
    real, released = sub_bins(session, "main.adult"), sub_bins(session, f"released.{table}")
    return float(np.abs(real - released).sum() / 2)


@pytest.mark.parametrize(("decode", "low", "high"), [("shape", 0.0, 0.12), ("uniform", 0.3, 1.0)])
def test_a_shaped_bin_keeps_the_peak_a_uniform_draw_flattens(make_store, decode: str, low: float,
                                                             high: float) -> None:
    path = make_store(shaped_policy(decode))
    with dpsql.connect(path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="syn", epsilon=10, seed=1)
        assert low <= within_bin_distance(admin, "syn") <= high
        record = provenance.find(admin.store, "syn")["record"]
    if decode == "uniform":
        assert "within_bin_shapes" not in record
        return
    shapes = record["within_bin_shapes"]
    assert len(shapes["probabilities"]["hours_per_week"]) == 5  # one row per bin
    (measured,) = shapes["measurements"]
    assert measured["cells"] == 5 * SUB_BINS
    # A tenth of the release's epsilon 10 (discrete Laplace, sensitivity max_rows = 1).
    assert float(measured["cost"]["epsilon"]) == pytest.approx(1.0)
    spent, charged = record["cost"]["spent"], record["cost"]["charged"]
    assert float(spent["epsilon"]) <= float(charged["epsilon"])


def test_more_copies_decode_with_the_stored_shape(make_store) -> None:
    path = make_store(shaped_policy("shape"))
    with dpsql.connect(path, "admin") as admin:
        admin.release("adult", synthesizer="independent", name="syn", epsilon=10, seed=1)
        spent = admin.ledger.budget("admin", "adult").spent
        admin.release_more("syn", copies=2, seed=2)
        assert admin.ledger.budget("admin", "adult").spent == spent  # no new measurement
        assert within_bin_distance(admin, "syn") <= 0.12


def test_integer_sub_bins_cover_each_integer_once() -> None:
    edges = np.array([0.0, 3.0, 40.0, 60.0])
    starts = integer_starts(edges)
    for b in range(3):  # consecutive, from the bin's start to its end: a partition
        assert starts[b, 0] == edges[b]
        assert starts[b, -1] == edges[b + 1]
        assert (np.diff(starts[b]) >= 0).all()
    # A bin of 3 integers has 3 sub-bins holding one each, the others empty.
    assert int((np.diff(starts[0]) > 0).sum()) == 3


def test_a_noisy_shape_becomes_probabilities() -> None:
    holds = np.array([[True, True, False, True]])
    kept = np.asarray(shape._normalized(np.array([[3, -2, 9, 1]]), holds))
    assert kept.tolist() == [[0.75, 0.0, 0.0, 0.25]]  # negatives and empty sub-bins: zero
    nothing = np.asarray(shape._normalized(np.array([[-1, -5, 4, 0]]), holds))
    assert nothing.tolist() == [[1 / 3, 1 / 3, 0.0, 1 / 3]]  # uniform where values exist


def test_the_shape_share_is_taken_from_the_release_budget() -> None:
    assert Fraction(0) < shape.SHARE < Fraction(1)


@pytest.mark.parametrize(("column", "message"), [
    ("sex: {type: categorical, values: [0, 1], decode: shape}", "integer and float columns"),
    ("hours_per_week: {type: integer, bounds: [0, 98], decode: shape}", "needs bins"),
])
def test_a_shape_needs_a_binned_numeric_column(tmp_path, column: str, message: str) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(policy_text(columns=f"\n      {column}"))
    with pytest.raises(PolicyError, match=message):
        Policy.load(policy)


def test_the_domain_carries_shapes_only_for_the_columns_measured(make_store) -> None:
    path = make_store(shaped_policy("shape"))
    with dpsql.connect(path, "admin") as admin:
        domain = Domain.from_dataset(admin.policy.dataset("adult"))
    shaped = domain.with_shapes({"hours_per_week": [[1.0] + [0.0] * (SUB_BINS - 1)] * 5})
    assert shaped["sex"].shape is None
    values = shaped["hours_per_week"].decode(np.array([2, 2, 2]), np.random.default_rng(0))
    assert all(40 <= v < 43 for v in values.to_pylist())  # only the first sub-bin
