"""Policies: the shipped examples validate, bad ones fail naming file, field and what to do."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from dpsql.errors import PolicyError
from dpsql.policy import Policy
from dpsql.privacy import PrivacyCost

from .conftest import policy_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["adult.yaml", "acs.yaml"])
def test_shipped_policies_validate(name):
    policy = Policy.load(ROOT / "policies" / name)
    assert policy.accounting == "zcdp"
    assert len(policy.fingerprint) == 16
    schema = json.loads((ROOT / "policies" / "schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(yaml.safe_load(policy.text))


def test_a_categorical_column_without_values_has_open_keys():
    text = policy_text(columns="\n      zip: {type: categorical, description: code}")
    col = Policy.from_text(text).datasets["adult"].columns["zip"]
    assert col.open_keys
    assert not col.has_domain  # nothing to synthesize over
    assert col.values is None


def test_policy_objects_are_frozen():
    policy = Policy.from_text(policy_text())
    with pytest.raises(AttributeError):
        policy.accounting = "zcdp"  # type: ignore[misc]
    with pytest.raises(TypeError):
        policy.datasets["x"] = None  # type: ignore[index]


def test_fingerprint_is_stable_and_canonical():
    a = Policy.from_text(policy_text())
    reformatted = yaml.safe_dump(yaml.safe_load(policy_text()), default_flow_style=False)
    b = Policy.from_text(reformatted)
    assert a.fingerprint == b.fingerprint
    c = Policy.from_text(policy_text(budget="{epsilon: 2}"))
    assert c.fingerprint != a.fingerprint


def test_budgets_parse_in_the_policy_accounting():
    pure = Policy.from_text(policy_text())
    assert pure.dataset("adult").budget == PrivacyCost.pure(1)
    zcdp = Policy.from_text(policy_text("zcdp", budget="{rho: 0.5}", user_budget="{rho: 0.1}"))
    assert zcdp.dataset("adult").budget == PrivacyCost.zcdp("0.5")


def test_bins_become_edges():
    policy = Policy.from_text(policy_text())
    age = policy.dataset("adult").column("age")
    assert age.edges == (0, 10, 20, 30, 40, 50, 60, 70, 80, 85)
    assert age.has_domain


BAD = {
    "not_yaml": ("version: 1\n  accounting: [", "not valid YAML"),
    "unknown_field": (policy_text().replace("accounting: pure", "accounting: pure\ncolor: red"),
                      "allowed fields"),
    "bad_accounting": (policy_text().replace("accounting: pure", "accounting: fuzzy"),
                       "allowed: pure, zcdp"),
    "zcdp_without_delta": (policy_text("zcdp").replace("delta: 1.0e-6\n", ""), "needs a delta"),
    "pure_with_delta": (policy_text().replace("accounting: pure", "accounting: pure\ndelta: 0.1"),
                        "no delta"),
    "negative_budget": (policy_text(budget="{epsilon: -1}"), "datasets.adult.budget"),
    "bounds_reversed": (policy_text(columns="\n      age: {type: integer, bounds: [90, 17]}"),
                        "lower < upper"),
    "missing_bounds": (policy_text(columns="\n      age: {type: integer}"), "needs bounds"),
    "categorical_labels_without_values": (
        policy_text(columns="\n      sex: {type: categorical, labels: [a]}"),
        "labels and decode need values"),
    "categorical_with_bounds": (
        policy_text(columns="\n      sex: {type: categorical, bounds: [0, 1]}"),
        "not bounds or bins"),
    "hidden_with_bounds": (policy_text(columns="\n      f: {type: hidden, bounds: [0, 1]}"),
                           "hidden column takes no bounds"),
    "user_over_dataset": (policy_text(user_budget="{epsilon: 2}"), "exceeds dataset"),
    "unknown_dataset_for_user": (policy_text().replace("budgets: {adult: {epsilon: 1}}}\n",
                                 "budgets: {adlt: {epsilon: 1}}}\n"), "did you mean 'adult'"),
    "no_admin": (policy_text().replace("role: admin", "role: analyst"), "role: admin"),
    "bad_role": (policy_text().replace("role: admin", "role: root"), "allowed: admin, analyst"),
    "cap_over_budget": (policy_text(extra_dataset="    query_cap: {epsilon: 5}\n"),
                        "exceeds the dataset budget"),
    "unit_not_declared": (policy_text(extra_dataset="    privacy_unit: person\n"
                                      "    max_rows: 3\n"), "not declared under columns"),
    "max_rows_without_unit": (policy_text(extra_dataset="    max_rows: 3\n"), "max_rows must be 1"),
    "bin_edges_outside": (policy_text(columns="\n      age: {type: integer, bounds: [0, 84], "
                                      "bins: [5, 84]}"), "start at the lower bound"),
    "float_width_for_integer": (policy_text(columns="\n      age: {type: integer, bounds: [0, 84],"
                                            " bins: 2.5}"), "integer bin width"),
    "labels_count": (policy_text(columns="\n      sex: {type: categorical, values: [0, 1], "
                                 "labels: [a]}"), "one label per value"),
    "rho_in_pure": (policy_text(budget="{rho: 1}"), "rho needs accounting: zcdp"),
    "public_row_count_true": (policy_text(extra_dataset="    public_row_count: true\n"),
                              "datasets.adult.public_row_count: public_row_count: true (or "
                              "false) is no longer accepted, because dpsql never takes a count "
                              "of the rows as public: write the number of rows"),
    "public_row_count_zero": (policy_text(extra_dataset="    public_row_count: 0\n"),
                              "datasets.adult.public_row_count"),
    "public_row_count_with_unit": (policy_text(
        extra_dataset="    privacy_unit: fnlwgt\n    public_row_count: 5000\n"),
        "with a privacy_unit the number of units is what differential privacy protects"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_invalid_policies_name_file_field_and_fix(case, tmp_path):
    text, expected = BAD[case]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as info:
        Policy.load(path)
    message = str(info.value)
    assert str(path) in message
    assert expected in message


def test_missing_file():
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.load("/nonexistent/policy.yaml")


def test_diff_lists_changes():
    a = Policy.from_text(policy_text())
    b = Policy.from_text(policy_text(budget="{epsilon: 2}"))
    changes = a.diff(b)
    assert "~ datasets.adult.budget.epsilon: 1 -> 2" in changes
    assert a.diff(a) == []


def test_a_declared_row_count_is_kept_as_given():
    policy = Policy.from_text(policy_text(extra_dataset="    public_row_count: 32561\n"))
    assert policy.dataset("adult").public_row_count == 32561
    assert Policy.from_text(policy_text()).dataset("adult").public_row_count is None


def test_a_stored_policy_saying_true_reads_as_no_public_count():
    text = policy_text(extra_dataset="    public_row_count: true\n")
    stored = Policy.from_text(text, stored=True)
    adult = stored.dataset("adult")
    assert adult.public_row_count is None
    assert adult.legacy_public_count
    # its fingerprint is the one recorded when it was applied: the text's own
    assert stored.fingerprint != Policy.from_text(policy_text()).fingerprint
    assert not Policy.from_text(policy_text(extra_dataset="    public_row_count: false\n"),
                                stored=True).dataset("adult").legacy_public_count


def test_bins_read_as_a_count_and_a_width():
    """`bins: 10` is a width: over [0, 84] it makes 9 bins, and the text says both."""
    from dpsql.policy import Column

    by_width = Column("age", "integer", bounds=(0, 84),
                      edges=(*(float(e) for e in range(0, 81, 10)), 85.0))
    assert by_width.bins_text == "9 bins of width 10 (the last 5)"
    assert Column("x", "float", bounds=(0, 1), edges=(0.0, 0.5, 1.0)).bins_text == \
        "2 bins of width 0.5"
    assert Column("x", "float", bounds=(0, 1), edges=(0.0, 1.0)).bins_text == "1 bin"
    assert Column("x", "integer", bounds=(0, 9), edges=(0.0, 2.0, 5.0, 10.0)).bins_text == \
        "3 bins"  # widths 2, 3 and 5
    assert Column("x", "integer", bounds=(0, 9)).bins_text == ""
