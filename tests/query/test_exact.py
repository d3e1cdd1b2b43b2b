"""Exactness: with an unbounded budget (no noise) DP answers equal plain DuckDB SQL.

The policy grants ``epsilon: .inf``, so every mechanism is calibrated to zero
noise and the only differences left are the ones dpsql makes on purpose: every
public group gets a row (empty groups: COUNT and SUM 0, AVG NULL), values are
clamped into the declared bounds (the data lies inside them here), and
real-valued sums are added on a fixed-point grid (rounding below 1e-6 relative).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import dpsql
from dpsql.session import Session
from tests.query.conftest import plain

# (name, DP query, reference query, number of leading key columns)
ADULT_CASES = [
    ("count", "SELECT COUNT(*) FROM adult", "SELECT COUNT(*) FROM adult", 0),
    ("count_col", "SELECT COUNT(age) FROM adult", "SELECT COUNT(age) FROM adult", 0),
    ("sum", "SELECT SUM(capital_gain) FROM adult", "SELECT SUM(capital_gain) FROM adult", 0),
    ("avg", "SELECT AVG(hours_per_week) FROM adult", "SELECT AVG(hours_per_week) FROM adult", 0),
    ("sum_categorical", "SELECT SUM(income_50k) FROM adult",
     "SELECT SUM(income_50k) FROM adult", 0),
    ("between", "SELECT COUNT(*), SUM(age) FROM adult WHERE age BETWEEN 20 AND 40",
     "SELECT COUNT(*), SUM(age) FROM adult WHERE age BETWEEN 20 AND 40", 0),
    ("in_and_or", "SELECT COUNT(*) FROM adult WHERE race IN (1, 2) OR (sex = 0 AND "
     "NOT income_50k = 1)", "SELECT COUNT(*) FROM adult WHERE race IN (1, 2) OR (sex = 0 AND "
     "NOT income_50k = 1)", 0),
    ("not_in_is_not_null", "SELECT COUNT(*) FROM adult WHERE workclass NOT IN (0, 4) AND age "
     "IS NOT NULL", "SELECT COUNT(*) FROM adult WHERE workclass NOT IN (0, 4) AND age IS NOT "
     "NULL", 0),
    ("arithmetic", "SELECT COUNT(*) FROM adult WHERE capital_gain - capital_loss > 0 OR "
     "age * 2 < 30 OR hours_per_week / 2 >= 40",
     "SELECT COUNT(*) FROM adult WHERE capital_gain - capital_loss > 0 OR age * 2 < 30 OR "
     "hours_per_week / 2 >= 40", 0),
    ("functions", "SELECT COUNT(*) FROM adult WHERE abs(age - 40) < 5 AND round(hours_per_week"
     " / 3) = 13", "SELECT COUNT(*) FROM adult WHERE abs(age - 40) < 5 AND "
     "round(hours_per_week / 3) = 13", 0),
    ("filter", "SELECT COUNT(*) FILTER (WHERE sex = 1), SUM(age) FILTER (WHERE race = 0) "
     "FROM adult", "SELECT COUNT(*) FILTER (WHERE sex = 1), SUM(age) FILTER (WHERE race = 0) "
     "FROM adult", 0),
    ("spread", "SELECT VAR_POP(age), VAR_SAMP(age), STDDEV_POP(age), STDDEV_SAMP(age) "
     "FROM adult", "SELECT VAR_POP(age), VAR_SAMP(age), STDDEV_POP(age), STDDEV_SAMP(age) "
     "FROM adult", 0),
    ("spread_aliases_odd_midpoint", "SELECT VARIANCE(capital_gain), STDDEV(capital_gain), "
     "AVG(capital_gain) FROM adult", "SELECT VARIANCE(capital_gain), STDDEV(capital_gain), "
     "AVG(capital_gain) FROM adult", 0),
    ("spread_grouped_filter", "SELECT education_num, VAR_SAMP(hours_per_week) FILTER (WHERE "
     "sex = 1), STDDEV_POP(age) FROM adult GROUP BY 1", "SELECT education_num, "
     "VAR_SAMP(hours_per_week) FILTER (WHERE sex = 1), STDDEV_POP(age) FROM adult GROUP BY 1",
     1),
    ("group_categorical", "SELECT race, COUNT(*), SUM(capital_loss), AVG(age) FROM adult "
     "GROUP BY race", "SELECT race, COUNT(*), SUM(capital_loss), AVG(age) FROM adult "
     "GROUP BY race", 1),
    ("group_two", "SELECT sex, income_50k, COUNT(*) FROM adult GROUP BY sex, income_50k",
     "SELECT sex, income_50k, COUNT(*) FROM adult GROUP BY sex, income_50k", 2),
    ("group_width1_bins", "SELECT education_num, COUNT(*) FROM adult GROUP BY education_num",
     "SELECT education_num, COUNT(*) FROM adult GROUP BY education_num", 1),
    ("group_dp_bin", "SELECT dp_bin(age, 10) AS decade, COUNT(*) FROM adult GROUP BY decade",
     "SELECT dp_bin(age, 10) AS decade, COUNT(*) FROM adult GROUP BY decade", 1),
    ("group_udfs_dp_bin", "SELECT udfs.dp_bin(hours_per_week, 25), AVG(age) FROM adult "
     "GROUP BY 1", "SELECT dp_bin(hours_per_week, 25), AVG(age) FROM adult GROUP BY 1", 1),
    ("group_by_ordinal_where", "SELECT native_country, COUNT(*) FROM adult WHERE age > 50 "
     "GROUP BY 1", "SELECT native_country, COUNT(*) FROM adult WHERE age > 50 GROUP BY 1", 1),
    ("group_all", "SELECT marital_status, relationship, COUNT(*) FROM adult GROUP BY ALL",
     "SELECT marital_status, relationship, COUNT(*) FROM adult GROUP BY ALL", 2),
    ("empty_where", "SELECT sex, COUNT(*), SUM(age), AVG(age) FROM adult WHERE age > 1000 "
     "GROUP BY sex", "SELECT sex, COUNT(*), SUM(age), AVG(age) FROM adult WHERE age > 1000 "
     "GROUP BY sex", 1),
]

# Post-processing cases compare row by row, in order (both sides list the same groups).
ORDERED_CASES = [
    ("having_order_limit", "SELECT race, COUNT(*) AS n FROM adult GROUP BY race HAVING n > 40 "
     "ORDER BY n DESC LIMIT 3", "SELECT race, COUNT(*) AS n FROM adult GROUP BY race HAVING "
     "COUNT(*) > 40 ORDER BY n DESC LIMIT 3"),
    ("expressions", "SELECT sex, SUM(age) / COUNT(*) AS mean, COUNT(*) * 2 + 1 AS twice FROM "
     "adult GROUP BY sex ORDER BY sex", "SELECT sex, SUM(age) / COUNT(*) AS mean, COUNT(*) * 2 "
     "+ 1 AS twice FROM adult GROUP BY sex ORDER BY sex"),
    ("order_by_aggregate_offset", "SELECT occupation, COUNT(*) FROM adult GROUP BY occupation "
     "ORDER BY AVG(age), occupation LIMIT 4 OFFSET 2", "SELECT occupation, COUNT(*) FROM adult "
     "GROUP BY occupation ORDER BY AVG(age), occupation LIMIT 4 OFFSET 2"),
    ("having_key", "SELECT workclass, COUNT(*) FROM adult GROUP BY workclass HAVING workclass "
     "IN (1, 2, 3) AND COUNT(*) >= 0 ORDER BY 1", "SELECT workclass, COUNT(*) FROM adult "
     "GROUP BY workclass HAVING workclass IN (1, 2, 3) ORDER BY 1"),
]

# Post-processing of constants and NULLs follows SQL (one row, compared with DuckDB).
CONSTANT_CASES = [
    "SELECT COUNT(*) + NULL, COUNT(*) = NULL, NULL = NULL, NULL AND TRUE, NOT NULL FROM adult",
    "SELECT coalesce(NULL, COUNT(*)), abs(NULL), round(NULL), -NULL FROM adult",
    "SELECT NULL LIKE 'a', lower(NULL), length(NULL), NULL IN (1, 2), NULL IS NULL, COUNT(*) "
    "FROM adult",
    "SELECT NULL IS DISTINCT FROM NULL, COUNT(*) IS NOT DISTINCT FROM NULL, NULL BETWEEN 1 "
    "AND 2 FROM adult",
    "SELECT TRUE, 'x', 1.5, lower('AbC'), length('abc') + COUNT(*), 'ab' LIKE 'a%' FROM adult",
    "SELECT SUM(age) / COUNT(*), abs(-SUM(age)), round(AVG(age), 2) FROM adult",
    "SELECT COUNT(*) FROM adult HAVING NULL",
    "SELECT COUNT(*) FROM adult HAVING NOT (COUNT(*) > 5 OR NULL)",
    "SELECT COUNT(*) FROM adult HAVING TRUE ORDER BY 1",
]

ACS_CASES = [
    ("string_keys_like", "SELECT puma, COUNT(*) FROM acs WHERE puma LIKE '%-0%' GROUP BY "
     "puma", "SELECT puma, COUNT(*) FROM acs WHERE puma LIKE '%-0%' GROUP BY puma", 1),
    ("nullable_key", "SELECT msp, COUNT(*), AVG(agep) FROM acs GROUP BY msp",
     "SELECT msp, COUNT(*), AVG(agep) FROM acs GROUP BY msp", 1),
    ("nullable_integer_bins", "SELECT noc, COUNT(*) FROM acs GROUP BY noc",
     "SELECT noc, COUNT(*) FROM acs GROUP BY noc", 1),
    ("float_sum_avg", "SELECT sex, SUM(pincp), AVG(pincp), COUNT(pincp) FROM acs GROUP BY sex",
     "SELECT sex, SUM(pincp), AVG(pincp), COUNT(pincp) FROM acs GROUP BY sex", 1),
    ("is_null_ilike", "SELECT COUNT(*) FROM acs WHERE indp IS NULL AND puma ILIKE '%01%'",
     "SELECT COUNT(*) FROM acs WHERE indp IS NULL AND puma ILIKE '%01%'", 0),
    ("float_spread", "SELECT sex, VAR_POP(pincp), STDDEV_SAMP(density), VAR_SAMP(povpip) "
     "FROM acs GROUP BY sex", "SELECT sex, VAR_POP(pincp), STDDEV_SAMP(density), "
     "VAR_SAMP(povpip) FROM acs GROUP BY sex", 1),
    ("float_bins", "SELECT dp_bin(density, 5000), AVG(density) FROM acs GROUP BY 1",
     "SELECT dp_bin(density, 5000), AVG(density) FROM acs GROUP BY 1", 1),
    ("string_functions", "SELECT COUNT(*) FROM acs WHERE lower(puma) = '01-01301' OR "
     "length(puma) <> 8", "SELECT COUNT(*) FROM acs WHERE lower(puma) = '01-01301' OR "
     "length(puma) <> 8", 0),
]


def close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)
    return bool(a == b)


def empty_value(label: str) -> Any:
    """What a public group with no rows answers: 0 for COUNT and SUM, NULL for the others."""
    return 0 if label.startswith(("count", "sum")) else None


def check_grouped(session: Session, dp_sql: str, ref_sql: str, keys: int) -> None:
    answer = session.sql(dp_sql)
    assert answer.kind == "dp"
    assert answer.cost.infinite
    reference = {row[:keys]: row[keys:] for row in plain(session, ref_sql)}
    got = [tuple(r.values()) for r in answer.table.to_pylist()]
    names = answer.table.column_names[keys:]
    assert len({row[:keys] for row in got}) == len(got), "each public group once"
    for row in got:
        expected = reference.pop(row[:keys], None)
        if expected is None:
            expected = tuple(empty_value(n) for n in names)
        # SQL's SUM over no non-NULL values is NULL; dpsql answers 0 (it cannot tell).
        expected = tuple(0 if e is None and n.startswith("sum") else e
                         for e, n in zip(expected, names, strict=True))
        assert all(close(a, b) for a, b in zip(row[keys:], expected, strict=True)), \
            (row, expected)
    assert not reference, f"groups missing from the DP answer: {list(reference)[:5]}"


@pytest.mark.parametrize(("dp_sql", "ref_sql", "keys"), [c[1:] for c in ADULT_CASES],
                         ids=[c[0] for c in ADULT_CASES])
def test_adult_matches_plain_duckdb(exact_adult: Session, dp_sql: str, ref_sql: str,
                                    keys: int) -> None:
    check_grouped(exact_adult, dp_sql, ref_sql, keys)


@pytest.mark.parametrize(("dp_sql", "ref_sql"), [c[1:] for c in ORDERED_CASES],
                         ids=[c[0] for c in ORDERED_CASES])
def test_post_processing_matches_plain_duckdb(exact_adult: Session, dp_sql: str,
                                              ref_sql: str) -> None:
    answer = exact_adult.sql(dp_sql)
    got = [tuple(r.values()) for r in answer.table.to_pylist()]
    expected = plain(exact_adult, ref_sql)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert all(close(x, y) for x, y in zip(a, b, strict=True)), (a, b)


@pytest.mark.parametrize("sql", CONSTANT_CASES)
def test_constants_and_nulls_in_post_processing(exact_adult: Session, sql: str) -> None:
    got = [tuple(r.values()) for r in exact_adult.sql(sql).table.to_pylist()]
    expected = plain(exact_adult, sql)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert all(close(x, y) for x, y in zip(a, b, strict=True)), (a, b)


def test_division_by_zero_is_null_not_an_error(exact_adult: Session) -> None:
    """DuckDB raises on x / 0; post-processing is total (NULL), like SQL's NULLIF idiom."""
    row = exact_adult.sql("SELECT COUNT(*) / 0 AS a, COUNT(*) / (COUNT(*) - COUNT(*)) AS b "
                          "FROM adult").table.to_pylist()[0]
    assert row == {"a": None, "b": None}


@pytest.mark.parametrize(("dp_sql", "ref_sql", "keys"), [c[1:] for c in ACS_CASES],
                         ids=[c[0] for c in ACS_CASES])
def test_acs_matches_plain_duckdb(acs_path: Any, dp_sql: str, ref_sql: str, keys: int) -> None:
    with dpsql.connect(acs_path, "alice") as session:
        check_grouped(session, dp_sql, ref_sql, keys)


def test_public_key_set_is_complete(exact_adult: Session) -> None:
    """Every public key appears, in code order, even where the data has no row."""
    answer = exact_adult.sql("SELECT native_country, dp_bin(age, 20), COUNT(*) FROM adult "
                             "GROUP BY 1, 2")
    countries = exact_adult.policy.dataset("adult").column("native_country").values
    assert answer.table.num_rows == len(countries or ()) * 5
    assert answer.table.column(0).to_pylist()[:5] == [0] * 5
    assert answer.table.column(1).to_pylist()[:5] == [0, 20, 40, 60, 80]
    assert 0 in answer.table.column(2).to_pylist()  # some public groups are empty
