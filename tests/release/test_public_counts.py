"""A public row count comes only from the policy: never counted from the rows."""

from __future__ import annotations

from pathlib import Path

import pytest

import dpsql
from dpsql.errors import ReleaseError
from dpsql.policy import Policy

from ..conftest import ADULT_SAMPLE
from .conftest import release_policy

DECLARED = 4321  # the sample has 5000 rows: a count from the rows would show


def _store(tmp_path: Path, name: str, policy: str, drop_last_row: bool = False) -> Path:
    """A store over the Adult sample, or the sample without its last row (a neighbour)."""
    data = ADULT_SAMPLE
    if drop_last_row:
        lines = ADULT_SAMPLE.read_text().splitlines(keepends=True)
        data = tmp_path / f"{name}.csv"
        data.write_text("".join(lines[:-1]))
    policy_file = tmp_path / f"{name}.yaml"
    policy_file.write_text(policy)
    store, _ = dpsql.init(tmp_path / f"{name}.duckdb", policy_file, {"adult": data})
    store.close()
    return tmp_path / f"{name}.duckdb"


def _joint(path: Path, **options):
    with dpsql.connect(path, "admin") as admin:
        return admin.release("adult", synthesizer="joint", epsilon=1, columns=["sex", "race"],
                             name="declared", seed=7, **options)


def test_a_declared_count_is_used_as_given_and_marked(make_store):
    result = _joint(make_store(release_policy(public_rows=DECLARED)))
    record = result.record
    assert record["rows"] == DECLARED
    assert record["domain"]["public_rows"] == DECLARED
    assert "declared in the policy" in record["domain"]["public_rows_source"]
    assert record["diagnostics"]["row_count"] == {"source": "declared", "rows": DECLARED}
    assert all(m["columns"] for m in record["measurements"])  # no count measured


def test_neighbouring_stores_give_the_same_record_under_a_declared_count(tmp_path):
    """Remove one row: table size, provenance and the joint check stay the same.

    The measurements' noisy values are not in the record, so apart from the
    release's identity and time the two records must be equal.
    """
    policy = release_policy(public_rows=DECLARED)
    records = [_joint(_store(tmp_path, name, policy, drop_last_row=drop)).record
               for name, drop in (("full", False), ("neighbour", True))]
    for record in records:
        for key in ("release_id", "released_at"):
            record.pop(key)
    assert records[0] == records[1]
    assert records[0]["rows"] == DECLARED


def test_the_joint_check_uses_the_declared_count(make_store):
    # 3 cells of noise sd ~1.6 add ~4 phantom rows: too many for 3 declared rows, not for 5000
    with pytest.raises(ReleaseError, match="phantom rows to 3 rows"):
        _joint(make_store(release_policy(public_rows=3)), max_noise_ratio=0.5)
    assert _joint(make_store(release_policy()), max_noise_ratio=0.5).record["rows"] > 3


def test_a_stored_policy_saying_true_estimates_the_count_and_warns(make_store):
    path = make_store(release_policy())
    with dpsql.connect(path, "admin") as admin:  # as a store from before the change holds it
        text = admin.policy.text.replace("    columns:", "    public_row_count: true\n"
                                         "    columns:")
        admin.store.cursor().execute("UPDATE dpsql.policies SET text = ?", [text])
    with dpsql.connect(path, "alice") as alice:  # the store still works for analysts
        alice.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.1) COUNT(*) FROM adult")
    with dpsql.connect(path, "admin") as admin:
        assert admin.policy.dataset("adult").legacy_public_count
        result = admin.release("adult", synthesizer="joint", epsilon=1, columns=["sex"],
                               name="legacy")
        assert result.record["diagnostics"]["row_count"]["source"] == "dp"
        assert result.record["domain"]["public_rows"] is None
        assert any("no longer honours" in w for w in result.warnings)
        admin.apply_policy(Policy.from_text(release_policy(public_rows=DECLARED)))  # the fix
        fixed = admin.release("adult", synthesizer="joint", epsilon=1, columns=["sex"],
                              name="fixed")
        assert fixed.record["rows"] == DECLARED
        assert not fixed.warnings
