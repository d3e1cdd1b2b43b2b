"""Property-based fuzzing: every generated statement is a DP answer or a QueryRejected.

Queries are drawn from a grammar that mixes accepted constructs (aggregates,
public keys, row predicates, HAVING/ORDER BY/LIMIT, GoogleSQL options) with
refused ones (raw columns, hidden columns, MIN, subqueries, joins, table
functions, type mismatches, non-deterministic calls, DDL, garbage text). No
other exception may escape, and an answer never holds a raw row: every column
is a public key, a noisy aggregate or arithmetic on them, and there are at most
as many rows as public groups (or keys present, for a key chosen by partition
selection). The default run draws 200 statements, and 100 under zcdp grouping by
a column with no value list; the slow run 1,500.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpsql
from dpsql.imports import table_columns
from dpsql.query.planner import plan_query
from dpsql.query.statement import QueryStatement, classify
from dpsql.session import Session
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE
from tests.query.conftest import with_budgets

NUMERIC = ["age", "capital_gain", "capital_loss", "hours_per_week", "education_num"]
CATEGORICAL = ["race", "sex", "income_50k", "workclass", "relationship", "native_country"]
#: The column the zcdp store lists no values for (keys by partition selection there).
OPEN = "native_country"
BAD_COLUMNS = ["fnlwgt", "agee", "adult.fnlwgt", "x.age"]

def rarely(good: st.SearchStrategy[str], bad: st.SearchStrategy[str],
           one_in: int = 10) -> st.SearchStrategy[str]:
    """``bad`` about once in ``one_in`` draws (keyed on a middle value: hypothesis favours the
    ends of integer ranges, which would make 'rare' branches common)."""
    return st.integers(0, one_in - 1).flatmap(lambda i: bad if i == one_in // 2 else good)


number = st.one_of(st.integers(-5, 120).map(str), st.sampled_from(["0.5", "1e3", "-3", "NULL"]))
literal = rarely(number, st.sampled_from(["'abc'", "TRUE", "1e999", "''"]), 8)
good_column = st.sampled_from(NUMERIC + CATEGORICAL)
column = rarely(good_column, st.sampled_from(BAD_COLUMNS), 30)


@st.composite
def predicate(draw: st.DrawFn, depth: int = 0) -> str:
    kind = draw(st.integers(0, 11 if depth < 2 else 6))
    if draw(st.integers(0, 29)) == 15:
        return draw(st.sampled_from(["age IN (SELECT age FROM adult)", "CAST(age AS INT) = 3",
                                     "EXISTS (SELECT 1)", "age % 2 = 0", "now() > 1"]))
    col = draw(column)
    value = draw(literal)
    if kind == 0:
        return f"{col} {draw(st.sampled_from(['=', '<>', '<', '<=', '>', '>=']))} {value}"
    if kind == 1:
        lo, hi = sorted(draw(st.lists(st.integers(-5, 120), min_size=2, max_size=2)))
        return f"{col} {draw(st.sampled_from(['', 'NOT ']))}BETWEEN {lo} AND {hi}"
    if kind == 2:
        items = draw(st.lists(literal, min_size=1, max_size=4))
        return f"{col} {draw(st.sampled_from(['', 'NOT ']))}IN ({', '.join(items)})"
    if kind == 3:
        return f"{col} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 4:
        return f"{col} {draw(st.sampled_from(['+', '-', '*', '/']))} {draw(literal)} > {value}"
    if kind == 5:
        fn = draw(rarely(st.sampled_from(["abs", "round"]), st.sampled_from(["random", "getenv"]),
                         6))
        return f"{fn}({col}) = {value}"
    if kind == 6:
        return f"{col} LIKE {draw(st.sampled_from(['1%', 'a_', '%']))!r}"
    left, right = draw(predicate(depth + 1)), draw(predicate(depth + 1))
    if kind == 8:
        return f"({left}) AND ({right})"
    if kind == 9:
        return f"({left}) OR ({right})"
    if kind == 10:
        return f"NOT ({left})"
    return f"({left}) AND {right}"


@st.composite
def aggregate(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 12))
    num = draw(st.sampled_from(NUMERIC))
    if kind <= 2 or kind > 9:
        text = draw(st.sampled_from(["COUNT(*)", f"COUNT({draw(column)})", f"SUM({num})",
                                     f"AVG({num})", "COUNT(1)", f"VAR_POP({num})",
                                     f"STDDEV_SAMP({num})", f"VARIANCE({draw(column)})"]))
    elif kind == 3:
        text = f"SUM({draw(column)})"
    elif kind == 4 and draw(st.integers(0, 3)) == 2:
        text = draw(st.sampled_from([f"MIN({num})", f"MAX({num})", f"COUNT(DISTINCT {num})",
                                     f"MEDIAN({num})", "COUNT(*) OVER ()", f"SUM({num} * 2)",
                                     f"STDDEV(DISTINCT {num})", f"VAR_SAMP({num} + 1)"]))
    elif kind == 5:
        text = f"COUNT(*) FILTER (WHERE {draw(predicate())})"
    elif kind == 6:
        text = f"SUM({num}) / COUNT(*)"
    elif kind == 7:
        text = f"COUNT(*) * {draw(literal)} + 1"
    else:
        text = f"AVG({num})"
    if draw(st.booleans()):
        text += f" AS {draw(st.sampled_from(['n', 'total', 'mean', 'x1']))}"
    return text


@st.composite
def key(draw: st.DrawFn) -> str:
    good = st.one_of(
        st.sampled_from([*CATEGORICAL, "education_num"]),
        st.builds(lambda c, w: f"dp_bin({c}, {w})", st.sampled_from(NUMERIC),
                  st.sampled_from(["5", "10", "25", "1000"])),
        st.sampled_from(["dp_bin(age)", "udfs.dp_bin(hours_per_week, 20)"]))
    bad = st.sampled_from(["age", "fnlwgt", "age + 1", "dp_bin(age, 0)", "dp_bin(age, 2.5)",
                           "dp_bin(capital_gain, -1)"])
    return draw(rarely(good, bad, 10))


@st.composite
def query(draw: st.DrawFn, keys_from: st.SearchStrategy[str] | None = None) -> str:
    keys = draw(st.lists(key() if keys_from is None else keys_from, max_size=2, unique=True))
    selected = draw(st.booleans())
    items = list(keys) if selected else []
    items += draw(st.lists(aggregate(), min_size=0 if keys else 1, max_size=3))
    if draw(st.integers(0, 29)) == 15:
        items.append(draw(st.sampled_from(["*", "age", "fnlwgt", "random()", "42"])))
    if not items:
        items = ["COUNT(*)"]
    source = "adult" if draw(st.integers(0, 29)) != 15 else draw(st.sampled_from(
        ["adults", "read_csv('/etc/passwd')", "(SELECT * FROM adult) s", "adult a JOIN adult b "
         "ON a.age = b.age", "dpsql.charges", "released.nothing"]))
    options = ""
    if draw(st.integers(0, 5)) == 0:
        eps = draw(st.sampled_from(["0.01", "0.3", "1", "1e-9"]))
        options = f"WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = {eps}) "
    sql = f"SELECT {options}{', '.join(items)} FROM {source}"
    if draw(st.booleans()):
        sql += f" WHERE {draw(predicate())}"
    if keys:
        ordinals = selected and draw(st.booleans())
        sql += " GROUP BY " + ", ".join([str(i + 1) for i in range(len(keys))] if ordinals
                                        else keys)
    if draw(st.integers(0, 3)) == 0:
        sql += f" HAVING COUNT(*) > {draw(st.integers(-10, 100))}"
    if draw(st.integers(0, 2)) == 0:
        sql += f" ORDER BY {draw(st.sampled_from(['1', 'COUNT(*)', 'race', 'n', '2']))}" \
               f"{draw(st.sampled_from(['', ' DESC', ' NULLS FIRST']))}"
    if draw(st.integers(0, 3)) == 0:
        sql += f" LIMIT {draw(st.integers(0, 20))}"
    return sql


other = st.one_of(
    st.builds(lambda q: f"EXPLAIN PRIVACY {q}", query()),
    st.sampled_from(["DROP TABLE adult", "COPY adult TO 'x.csv'", "ATTACH 'x'",
                     "SELECT COUNT(*) FROM adult; SELECT 1", "PRAGMA show_tables",
                     "SET threads = 1", "SHOW TABLES"]),
    st.text(max_size=60),
)
statement = rarely(query(), other, 8)


def _session(directory: Path, accounting: str) -> Iterator[Session]:
    text = with_budgets(ADULT_POLICY, accounting=accounting, budget={"epsilon": 1e9},
                        cap={"epsilon": 1}, default={"epsilon": 0.1})
    if accounting == "zcdp":
        raw = yaml.safe_load(text)
        del raw["datasets"]["adult"]["columns"][OPEN]["values"]
        text = yaml.safe_dump(raw)
    policy = directory / "policy.yaml"
    policy.write_text(text)
    store, _ = dpsql.init(directory / "fuzz.duckdb", policy, {"adult": ADULT_SAMPLE})
    store.close()
    with dpsql.connect(directory / "fuzz.duckdb", "alice") as alice:
        yield alice


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    yield from _session(tmp_path_factory.mktemp("fuzz"), "pure")


@pytest.fixture(scope="module")
def zcdp_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """zcdp, where GROUP BY native_country releases keys by partition selection."""
    yield from _session(tmp_path_factory.mktemp("fuzz_zcdp"), "zcdp")


def check(session: Session, sql: str) -> None:
    try:
        answer = session.sql(sql)
    except dpsql.QueryRejected as err:
        rejected = err
    else:
        rejected = None
    if rejected is not None:
        assert rejected.advice or rejected.construct, sql
        return
    assert answer.kind in ("dp", "explain"), (sql, answer.kind)
    if answer.kind == "explain":
        assert answer.cost.is_zero
        return
    for name, info in answer.columns.items():
        assert info["kind"] in ("key", "aggregate", "post-processing"), (sql, name)
    statement = classify(sql)
    assert isinstance(statement, QueryStatement)
    plan = plan_query(statement.ast, sql, session.policy,
                      lambda ds: table_columns(session.store, ds.table))
    if any(k.mode == "selected" for k in plan.keys):  # at most the keys present
        present = session.store.cursor().execute(
            f"SELECT count(DISTINCT {OPEN}) + 1 FROM main.adult").fetchone()
        assert present is not None
        assert answer.table.num_rows <= present[0], sql
    else:
        assert answer.table.num_rows <= plan.cells, sql
    assert (not answer.cost.infinite and answer.cost.units > 0) or answer.cached


def run(session: Session, examples: int,
        statements: st.SearchStrategy[str] = statement) -> Callable[[], None]:
    @settings(max_examples=examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(statements)
    def prop(sql: str) -> None:
        check(session, sql)

    return prop


def test_fuzz(session: Session) -> None:
    run(session, 200)()


def test_fuzz_partition_selection(zcdp_session: Session) -> None:
    """The grammar under zcdp, grouping by native_country (no value list) or by nothing."""
    open_key = rarely(st.just(OPEN), key(), 5)
    run(zcdp_session, 100, rarely(query(open_key), other, 8))()


@pytest.mark.slow
@pytest.mark.ci
def test_fuzz_many(session: Session) -> None:
    run(session, 1500)()
