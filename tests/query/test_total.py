"""No generated SQL may raise on particular data: extreme values of every numeric type.

An error that appears only when some row holds a large value would tell the
analyst about that row (and after the charge). Each query here must answer on
a table holding each type's extreme value exactly as on the same table without
it; the answers are exact (unbounded budget), so only the extreme row differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dpsql
import dpsql.policies
from dpsql.services import open_store

from .conftest import table_policy

TYPES = {
    "b": ("BIGINT", "9223372036854775807"),
    "u": ("UBIGINT", "18446744073709551615"),
    "h": ("HUGEINT", "170141183460469231731687303715884105727"),
    "d": ("DECIMAL(38,2)", "999999999999999999999999999999999999.99"),
    "i": ("INTEGER", "2147483647"),
    "f": ("DOUBLE", "'inf'"),
}

POLICY = table_policy(
    "      name: {type: categorical, values: [a, b, rich]}\n"
    + "\n".join(f"      {c}: {{type: float, bounds: [0, 1000000], bins: [0, 10, 1000000]}}"
                for c in TYPES))

QUERIES = [
    "SELECT COUNT(*) FROM t WHERE {c} > 0.0000000000000000000001",
    "SELECT COUNT(*) FROM t WHERE {c} BETWEEN 0.5 AND 1e30",
    "SELECT COUNT(*) FROM t WHERE {c} IN (1, 2.5, -3)",
    "SELECT COUNT(*) FROM t WHERE {c} + 0.5 > 1 OR -{c} < 0.25",
    "SELECT COUNT(*) FROM t WHERE {c} >= 99999999999999999999999.0",
    "SELECT SUM({c}), AVG({c}), COUNT({c}) FROM t",
    "SELECT VAR_POP({c}), STDDEV_SAMP({c}) FILTER (WHERE {c} > 0.5) FROM t",
    "SELECT dp_bin({c}), COUNT(*) FROM t GROUP BY dp_bin({c})",
    "SELECT dp_bin({c}, 100), SUM({c}) FROM t GROUP BY 1",
    "SELECT name, SUM({c}) FROM t WHERE name = 'rich' AND {c} < 5.5 GROUP BY name",
    "SELECT name, MEDIAN({c}), MIN({c}), MAX({c}), QUANTILE_CONT({c}, 0.9) FROM t GROUP BY name",
    "SELECT name, COUNT(DISTINCT {c}), COUNT(DISTINCT {c}) FILTER (WHERE {c} > 0.5) FROM t "
    "GROUP BY name",
]


def _store(tmp_path: Path, extreme: bool) -> Path:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY)
    csv = tmp_path / "seed.csv"
    csv.write_text("name\na\n")
    path = tmp_path / ("extreme.duckdb" if extreme else "plain.duckdb")
    with open_store(path, create=True) as store, store.transaction() as cur:
        columns = ", ".join(f"{c} {t}" for c, (t, _) in TYPES.items())
        cur.execute(f"CREATE TABLE main.t (name VARCHAR, {columns})")
        ones = ", ".join(f"CAST(1 AS {t})" for t, _ in TYPES.values())
        cur.execute(f"INSERT INTO main.t VALUES ('a', {ones}), ('b', {ones})")
        if extreme:
            values = ", ".join(f"CAST({v} AS {t})" for t, v in TYPES.values())
            cur.execute(f"INSERT INTO main.t VALUES ('rich', {values})")
    with open_store(path) as store:
        dpsql.policies.apply_policy(store, dpsql.policy.Policy.load(policy), "admin")
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return (_store(tmp_path_factory.mktemp("plain"), False),
            _store(tmp_path_factory.mktemp("extreme"), True))


@pytest.mark.parametrize("column", list(TYPES))
@pytest.mark.parametrize("template", QUERIES)
def test_extreme_values_never_raise(stores, column, template):
    query = template.format(c=column)
    for path in stores:
        with dpsql.connect(path, "admin") as session:
            answer = session.sql(query)
            assert answer.kind == "dp"


def test_enum_keys_group_like_text(tmp_path):
    """An ENUM column arrives dictionary-encoded; grouping by it must answer, not fail."""
    policy = tmp_path / "p.yaml"
    policy.write_text(table_policy("      mood: {type: categorical, values: [sad, ok, happy]}"))
    path = tmp_path / "enum.duckdb"
    with open_store(path, create=True) as store, store.transaction() as cur:
        cur.execute("CREATE TYPE mood_t AS ENUM ('sad', 'ok', 'happy')")
        cur.execute("CREATE TABLE main.t (mood mood_t)")
        cur.execute("INSERT INTO main.t VALUES ('ok'), ('ok'), ('happy')")
    with open_store(path) as store:
        dpsql.policies.apply_policy(store, dpsql.policy.Policy.load(policy), "admin")
    with dpsql.connect(path, "admin") as session:
        rows = session.sql("SELECT mood, COUNT(*) FROM t GROUP BY mood ORDER BY mood").table
    assert dict(zip(rows.column("mood").to_pylist(), rows.column(1).to_pylist(),
                    strict=True)) == {"sad": 0, "ok": 2, "happy": 1}
