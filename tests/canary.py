"""The canary store, the leak oracle and the attack generator shared by the canary fuzzes.

The sensitive table ``adult`` holds canary values no reply may ever show: one
tag in every string an analyst must not see (a categorical value outside the
policy's domain, a hidden column, a column the policy does not list, a categorical
column with no value list (each value held by one unit), another
user's audit row), unusual numbers in numeric columns, and exact statistics
chosen so that they are unlikely to turn up by chance (1013 rows, 719 distinct
notes, a min and max with many digits). The oracle also knows the store secret
and every SCRAM verifier. Queries are generated from ``duckdb_functions()`` of a
plain in-memory DuckDB, so a function added by a future DuckDB is attacked too.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import decimal
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

import dpsql
from tests.server.conftest import make_store

TAG = "CANARY_7f3a91c4e2"
ROWS = 1013
DISTINCT_NOTES = 719
INCOME_MIN, INCOME_CANARY = 1234.5678, 7777777.123  # the canary is the column's max
FNLWGT_CANARY, CODE_CANARY = 8888888.25, 31415926535
PASSWORDS = {"admin": "admin-canary-pw-1", "alice": "alice-canary-pw-1"}
STORE_NAME = "canary"  # the DuckDB catalog of the store is its file stem
RELEASED_COLUMNS = ("age", "sex", "label", "income")

POLICY = """version: 1
accounting: pure
datasets:
  adult:
    table: adult
    budget: {epsilon: 1000000}
    query_cap: {epsilon: 1}
    default_query: {epsilon: 0.1}
    synthesizers: [independent]
    columns:
      age: {type: integer, bounds: [0, 100], bins: 10}
      sex: {type: categorical, values: [0, 1]}
      label: {type: categorical, values: [a, b, c]}
      income: {type: float, bounds: [0, 1000000], bins: 100000}
      note: {type: hidden}
      fnlwgt: {type: hidden}
      zip: {type: categorical}
public_tables:
  sexes: {path: sexes.csv, key: sex}
  labels: {path: labels.csv, key: label}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 1000000}}}
  alice: {role: analyst, budgets: {adult: {epsilon: 1000000}}}
  bob: {role: analyst, budgets: {adult: {epsilon: 1}}}
"""


def _rows() -> Iterator[list[Any]]:
    """The sensitive rows: ordinary values with canaries planted at fixed places."""
    rng = np.random.default_rng(20261125)
    for i in range(ROWS):
        income = round(float(rng.uniform(5000, 90000)), 4)
        fnlwgt = int(rng.integers(20000, 400000))
        label = str(rng.choice(["a", "b", "c"]))
        if i == 17:
            income, label = INCOME_CANARY, f"{TAG}_LABEL"  # outside bounds and domain
        if i == 401:
            income, fnlwgt = INCOME_MIN, FNLWGT_CANARY
        code = CODE_CANARY if i == 555 else i * 7
        yield [int(rng.integers(17, 91)), int(rng.integers(0, 2)), label, income,
               f"{TAG}_NOTE_{i % DISTINCT_NOTES}", fnlwgt, f"{TAG}_SSN_{i}", code,
               f"{TAG}_ZIP_{i}"]


def build_store(directory: Path) -> Path:
    """The canary store: data, policy, a released table, passwords and bob's audit rows."""
    data = directory / "adult.csv"
    with data.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["age", "sex", "label", "income", "note", "fnlwgt", "ssn", "code",
                         "zip"])
        writer.writerows(_rows())
    (directory / "sexes.csv").write_text("sex,name\n0,female\n1,male\n2,other\n")
    (directory / "labels.csv").write_text("label,grp\na,x\nb,y\nc,x\n")
    # The canaries outside the declared domain stay in the table as they are.
    path = make_store(directory / f"{STORE_NAME}.duckdb", POLICY, data, PASSWORDS,
                      released=RELEASED_COLUMNS, outside="keep")
    with dpsql.connect(path, "bob") as bob:  # another user's audit rows hold a canary
        for text in (f"SELECT count(*) FROM adult WHERE label = '{TAG}_AUDIT'",
                     f"SELECT '{TAG}_AUDIT' FROM nowhere"):
            with contextlib.suppress(dpsql.DPSQLError):
                bob.sql(text)
    return path


# -- the oracle ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Secrets:
    """What no reply may contain: canary strings, canary numbers, exact statistics, secrets."""

    strings: tuple[str, ...]
    numbers: tuple[float, ...]
    statistics: tuple[float, ...]

    @classmethod
    def read(cls, path: Path) -> Secrets:
        """Read the store's secret, verifiers and the exact statistics of ``adult`` (admin)."""
        con = duckdb.connect(str(path), read_only=True)
        try:
            secret = con.execute("SELECT value FROM dpsql.meta WHERE key = 'secret'").fetchone()
            verifiers = [v for (v,) in con.execute("SELECT verifier FROM dpsql.credentials")
                         .fetchall()]
            stats = con.execute("SELECT count(*), count(DISTINCT note), min(income), max(income), "
                            "sum(income), avg(income), sum(age), avg(age), sum(fnlwgt), "
                            "count(DISTINCT fnlwgt), count(DISTINCT income), var_pop(income), "
                            "var_samp(income), stddev_pop(income), stddev_samp(income), "
                            "var_pop(least(income, 1000000)) FROM main.adult"
                            ).fetchone()
        finally:
            con.close()
        assert secret is not None
        assert stats is not None
        assert stats[:4] == (ROWS, DISTINCT_NOTES, INCOME_MIN, INCOME_CANARY)
        pieces = [p for v in verifiers for p in re.split(r"[$:]", v) if len(p) >= 16]
        return cls(strings=(TAG, secret[0], *verifiers, *pieces),
                   numbers=(INCOME_CANARY, FNLWGT_CANARY, float(CODE_CANARY)),
                   statistics=tuple(float(s) for s in stats))


# A number standing alone in text (not a piece of a UUID, hash or date).
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?![\w-])")


def flatten(value: Any) -> Iterator[Any]:
    """Every scalar inside ``value`` (lists, maps, structs, Arrow-style key/value pairs)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(key)
            yield from flatten(item)
    elif isinstance(value, (list, tuple, set)):
        for item in value:
            yield from flatten(item)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        yield bytes(value).decode("latin-1")
    else:
        yield value


def numbers_in(values: Iterable[Any]) -> Iterator[float]:
    """The numbers in ``values``: numeric cells, and every number written inside text."""
    for value in values:
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float, decimal.Decimal, np.number)):
            yield float(value)
        elif not isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):
            for match in _NUMBER.finditer(str(value)):
                yield float(match.group())


def _near(x: float, targets: Iterable[float]) -> float | None:
    for target in targets:
        if math.isfinite(x) and abs(x - target) <= 1e-12 * max(1.0, abs(target)):
            return target
    return None


def leaks(secrets: Secrets, values: Iterable[Any], *, exact: bool) -> list[str]:
    """What in a reply's ``values`` betrays the sensitive table or a secret.

    With ``exact`` (free or refused replies) exact statistics count too; a charged
    DP answer is noisy by design and may come near one, so it is spared that check.
    """
    scalars = [v for value in values for v in flatten(value)]
    text = "\n".join(str(v) for v in scalars).lower()
    found = [f"string {s[:24]}..." for s in secrets.strings if s.lower() in text]
    targets = secrets.numbers + (secrets.statistics if exact else ())
    for x in numbers_in(scalars):
        hit = _near(x, targets)
        if hit is not None:
            found.append(f"number {hit!r}")
    return sorted(set(found))


@dataclass(frozen=True)
class Reply:
    """What the analyst saw of one statement: every value of the answer or of the error.

    ``kind``: ``dp`` (a charged, noisy answer), ``free`` or ``refused``.
    ``charged``: whether the ledger gained a charge while it ran.
    """

    values: tuple[Any, ...]
    kind: str
    charged: bool


def violations(secrets: Secrets, reply: Reply) -> list[str]:
    """Why ``reply`` breaks the guarantee (empty when it does not)."""
    found = leaks(secrets, reply.values, exact=reply.kind != "dp")
    if reply.charged and reply.kind != "dp":
        found.append(f"charged, then {reply.kind}")
    return found


def fuzz(secrets: Secrets, ask: Callable[[str], Reply], queries: Iterable[str]
         ) -> dict[str, tuple[list[str], Reply]]:
    """Ask every query; returns the ones that leak, with why and the reply."""
    failures = {}
    for query in queries:
        reply = ask(query)
        found = violations(secrets, reply)
        if found:
            failures[query] = (found, reply)
    return failures


def report(failures: dict[str, tuple[list[str], Reply]], limit: int = 25) -> str:
    """A readable list of leaking queries and what their replies showed."""
    lines = [f"{len(failures)} queries leak:"]
    for query, (found, reply) in list(failures.items())[:limit]:
        lines.append(f"  {query}\n    {found} {reply.kind}: {str(reply.values)[:300]}")
    return "\n".join(lines)


# -- the attacks --------------------------------------------------------------------------

RELEASED = "released.adult_syn"
TABLE_NAMES = ("adult", "main.adult", f"{STORE_NAME}.main.adult", f"{STORE_NAME}.adult",
               '"adult"', "dpsql.meta", "dpsql.credentials", "dpsql.audit", "dpsql.charges")
SQL_TEXTS = ("SELECT * FROM adult", "FROM dpsql.meta", "SELECT * FROM dpsql.credentials",
             "SELECT count(*), max(income), min(income) FROM main.adult",
             "FROM dpsql.audit")
# Hand-written shapes: every way of naming the sensitive table or the store's internals.
SHAPES = (
    "SELECT * FROM {t}", "FROM {t}", "SELECT count(*) FROM {t}", "SUMMARIZE {t}",
    "DESCRIBE {t}", "SHOW {t}", "PRAGMA table_info('{t}')", "EXPLAIN SELECT * FROM {t}",
    "EXPLAIN ANALYZE SELECT * FROM {t}",
    "SELECT * FROM released.adult_syn r JOIN {t} a ON r.age = a.age",
    "SELECT * FROM released.adult_syn UNION ALL SELECT age, sex, label, income FROM {t}",
    "SELECT * FROM released.adult_syn CROSS JOIN LATERAL (SELECT * FROM {t}) x",
    "SELECT (SELECT max(income) FROM {t}) FROM released.adult_syn",
    "SELECT (SELECT count(*) FROM {t})",
    "WITH x AS (SELECT * FROM {t}) SELECT * FROM released.adult_syn, x",
    "WITH x AS (SELECT * FROM {t}) SELECT * FROM x",
    "SELECT * FROM released.adult_syn WHERE age IN (SELECT age FROM {t})",
    "SELECT * FROM released.adult_syn WHERE EXISTS (SELECT 1 FROM {t} WHERE income > 7e6)",
    "SELECT histogram(x) FROM {t} x", "SELECT list(x) FROM {t} x",
    "SELECT * FROM released.adult_syn CROSS JOIN LATERAL (SELECT histogram(x) FROM {t} x) h",
    "SELECT * FROM released.adult_syn CROSS JOIN LATERAL (SELECT list(x) FROM {t} x) h",
    "SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram({t}, note) LIMIT 50",
    "SELECT * FROM released.adult_syn CROSS JOIN LATERAL histogram_values({t}, income) h",
    "SELECT * FROM query_table('{t}')", "SELECT * FROM query('FROM {t}')",
    "SELECT * FROM released.adult_syn, query_table('{t}')",
    "SELECT * FROM released.adult_syn r CROSS JOIN LATERAL query('FROM {t}')",
    "SELECT max(income) FROM {t}", "SELECT * FROM {t} LIMIT 5",
    "SELECT var_pop(income), stddev_samp(age) FROM {t}",
    "SELECT label, variance(income), stddev(income) FILTER (WHERE income > 7e6) FROM {t} "
    "GROUP BY label", "SELECT var_samp(fnlwgt) FROM {t}",
    "SELECT {t}.* FROM released.adult_syn, {t}",
)
VIEWS = ("information_schema.tables", "information_schema.columns",
         "information_schema.schemata", "duckdb_tables()", "duckdb_columns()",
         "duckdb_databases()", "duckdb_settings()", "duckdb_views()", "duckdb_functions()",
         "duckdb_constraints()", "duckdb_indexes()", "duckdb_sequences()",
         "duckdb_temporary_files()", "duckdb_memory()", "pragma_database_size()",
         "pragma_storage_info('adult')", "pragma_table_info('adult')",
         "pg_catalog.pg_class", "pg_catalog.pg_stats", "pg_catalog.pg_attribute",
         "duckdb_table_sample('adult')")
SETTINGS_AND_MORE = (
    "SELECT current_setting('temp_directory')", "SELECT current_setting('threads')",
    "SELECT getvariable('x')", "SELECT current_database()", "SELECT current_schemas(true)",
    "SET VARIABLE x = (SELECT max(income) FROM adult)", "SELECT getvariable('x')",
    "PRAGMA database_list", "PRAGMA show_tables", "PRAGMA storage_info('adult')",
    "SELECT * FROM released.adult_syn, (SELECT current_setting('temp_directory'))",
    "ATTACH 'canary.duckdb' AS c2", "DETACH canary",
    "COPY adult TO '/tmp/canary_copy.csv'", "COPY (SELECT * FROM adult) TO 'x.csv'",
    "EXPORT DATABASE '/tmp/canary_export'", "USE canary.main",
    "CREATE MACRO udfs.peek() AS TABLE SELECT * FROM main.adult",
    "CREATE TEMP TABLE x AS SELECT * FROM adult", "CALL pragma_table_info('adult')",
    "SELECT * FROM udfs.dp_bin(1, 2)", "SELECT udfs.dp_bin(income, 1) FROM adult",
    "SELECT * FROM released.adult_syn WHERE income = 7777777.123",
    "SELECT json_serialize_plan('SELECT max(income) FROM adult')",
    "SELECT json_serialize_sql('SELECT * FROM adult')",
    "SELECT * FROM released.adult_syn, LATERAL (SELECT * FROM adult a "
    "WHERE a.age = adult_syn.age) x",
)
# DP quantiles (charged, noisy) and their misuses (refused before any charge): the income
# canary is the column's maximum, outside its bounds, and the one row of its label.
DP_SHAPES = (
    "SELECT MAX(income), MIN(income), MEDIAN(age) FROM adult",
    "SELECT label, MAX(income) FROM adult GROUP BY label",
    "SELECT MAX(income) FROM adult WHERE income > 7000000",
    "SELECT QUANTILE_CONT(income, 1) FROM adult",
    "SELECT PERCENTILE_CONT(0.99) WITHIN GROUP (ORDER BY income) FILTER (WHERE sex = 1) "
    "FROM adult",
    "SELECT MEDIAN(fnlwgt) FROM adult", "SELECT MAX(note) FROM adult",
    "SELECT MIN(label) FROM adult", "SELECT MAX(income * 10) FROM adult",
    "SELECT MEDIAN(DISTINCT income) FROM adult", "SELECT QUANTILE_CONT(income, 1.5) FROM adult",
    "SELECT QUANTILE_CONT(income, age) FROM adult",
    "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY fnlwgt) FROM adult",
    "SELECT PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY income) FROM adult",
    # GROUP BY a column with no value list (every value a canary held by one unit): under
    # this pure policy partition selection has no delta and is refused, misuses too.
    "SELECT zip, COUNT(*) FROM adult GROUP BY zip", "SELECT COUNT(*) FROM adult GROUP BY zip",
    "EXPLAIN PRIVACY SELECT zip, SUM(income) FROM adult GROUP BY zip",
    "SELECT zip, label, COUNT(*) FROM adult GROUP BY zip, label",
    "SELECT zip, MEDIAN(income) FROM adult GROUP BY zip", "SELECT zip, COUNT(*) FROM adult",
    "SELECT COUNT(*) FROM adult WHERE zip LIKE '%ZIP_1%'",
)
# COUNT(DISTINCT) (charged, noisy) and its misuses (refused before any charge): note and
# fnlwgt are hidden, ssn is not in the policy, and 719 distinct notes is an exact statistic.
DISTINCT_SHAPES = (
    "SELECT COUNT(DISTINCT income), COUNT(DISTINCT label) FROM adult",
    "SELECT label, COUNT(DISTINCT age) FILTER (WHERE income > 7000000) FROM adult "
    "GROUP BY label",
    "SELECT COUNT(DISTINCT note) FROM adult", "SELECT COUNT(DISTINCT fnlwgt) FROM adult",
    "SELECT COUNT(DISTINCT ssn) FROM adult", "SELECT COUNT(DISTINCT income * 10) FROM adult",
    "SELECT COUNT(DISTINCT label, note) FROM adult", "SELECT SUM(DISTINCT income) FROM adult",
    "SELECT COUNT(*) FROM adult WHERE COUNT(DISTINCT note) > 1",
    "SELECT COUNT(DISTINCT *) FROM adult", "SELECT COUNT(DISTINCT (label, note)) FROM adult",
)
# Joins with the policy's public tables (sexes on sex, labels on label): DP answers, and
# the misuses that would reach a hidden column, a canary or the rows themselves (refused).
JOIN_SHAPES = (
    "SELECT s.name, COUNT(*) FROM adult a JOIN sexes s ON a.sex = s.sex GROUP BY s.name",
    "SELECT l.grp, SUM(a.income), AVG(a.age) FROM adult a LEFT JOIN labels l "
    "ON a.label = l.label GROUP BY l.grp",
    "SELECT l.grp, COUNT(DISTINCT a.income) FROM adult a JOIN labels l ON a.label = l.label "
    "GROUP BY l.grp",
    "SELECT COUNT(*) FROM adult a JOIN labels l ON a.label = l.label WHERE l.grp = 'x' "
    "AND a.income > 7000000",
    "SELECT l.grp, MEDIAN(a.income) FROM adult a JOIN labels l ON a.label = l.label "
    "GROUP BY l.grp",
    "SELECT COUNT(*) FROM adult a JOIN labels l ON a.note = l.label",
    "SELECT COUNT(*) FROM adult a JOIN labels l ON a.zip = l.label",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON a.income = s.sex",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON a.fnlwgt = s.sex",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON a.sex = s.sex AND a.income > 7000000",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON a.sex = s.sex OR a.note = s.name",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON TRUE",
    "SELECT COUNT(*) FROM adult a JOIN sexes s ON a.sex + 0 = s.sex",
    "SELECT COUNT(*) FROM adult a JOIN adult b ON a.sex = b.sex",
    "SELECT COUNT(*) FROM adult a JOIN released.adult_syn r ON a.sex = r.sex",
    "SELECT COUNT(*) FROM adult a JOIN (SELECT * FROM adult) s ON a.sex = s.sex",
    "SELECT COUNT(*) FROM adult a JOIN public_tables.sexes s ON a.sex = s.sex",
    "SELECT COUNT(*) FROM adult a RIGHT JOIN sexes s ON a.sex = s.sex",
    "SELECT s.name, MAX(a.income) FROM adult a JOIN sexes s ON a.sex = s.sex GROUP BY s.name",
    "SELECT SUM(s.sex) FROM adult a JOIN sexes s ON a.sex = s.sex",
    "SELECT s.name, COUNT(*) FROM adult a JOIN sexes s ON a.sex = s.sex "
    "WHERE s.name = a.label GROUP BY s.name",
    "SELECT a.note, COUNT(*) FROM adult a JOIN sexes s ON a.sex = s.sex GROUP BY a.note",
    "SELECT * FROM public_tables.sexes s JOIN adult a ON a.sex = s.sex",
    "SELECT * FROM public_tables.labels l, main.adult a WHERE a.label = l.label",
    "SELECT * FROM public_tables.sexes CROSS JOIN released.adult_syn LIMIT 5",
)
# The store's own file, read by path: the free path must not be able to open it.
PATH_SHAPES = (
    "ATTACH '{path}' AS c2 (READ_ONLY)", "SELECT * FROM read_duckdb('{path}')",
    "SELECT * FROM read_duckdb('{path}', table_name := 'adult')",
    "SELECT * FROM released.adult_syn, read_duckdb('{path}', table_name := 'credentials', "
    "schema_name := 'dpsql')",
    "SELECT * FROM read_blob('{path}')", "SELECT * FROM read_text('{path}.wal')",
    "SELECT * FROM read_csv('{path}')", "SELECT * FROM glob('{path}*')",
    "SELECT * FROM '{path}'", "FROM '{path}'",
    "SELECT * FROM released.adult_syn, '{path}' x",
)


def _functions() -> list[tuple[str, str, list[str], list[str]]]:
    """(name, type, parameter names, parameter types) of every overload DuckDB lists."""
    con = duckdb.connect(":memory:")
    try:
        rows = con.execute("SELECT DISTINCT function_name, function_type, parameters, "
                           "parameter_types FROM duckdb_functions() ORDER BY ALL").fetchall()
    finally:
        con.close()
    return [(name, kind, list(params), [t or "ANY" for t in types])
            for name, kind, params, types in rows if re.fullmatch(r"\w+", name)]


def _literal(sql_type: str) -> str:
    """A harmless literal of ``sql_type``, for arguments that are not under attack."""
    upper = sql_type.upper()
    if upper.endswith("[]"):
        return "[]"
    if any(t in upper for t in ("INT", "DOUBLE", "FLOAT", "DECIMAL", "NUMERIC")):
        return "1"
    if "BOOL" in upper:
        return "true"
    if "DATE" in upper or "TIME" in upper:
        return "TIMESTAMP '2020-01-01'"
    if "INTERVAL" in upper:
        return "INTERVAL 1 DAY"
    return "'adult'"


def _string_slots(types: list[str]) -> list[int]:
    return [i for i, t in enumerate(types) if t.upper() in ("VARCHAR", "ANY", "JSON")]


def _calls(params: list[str], types: list[str], attack: str) -> list[tuple[int, str]]:
    """(rank, arguments) with ``attack`` in every text/any slot and harmless literals
    elsewhere: all arguments (rank 0: positional, named after the first, or the attack then
    a hidden column), then one to three (rank 1 to 3; trailing parameters may have defaults)."""
    slots = _string_slots(types)
    args = [attack if i in slots else _literal(t) for i, t in enumerate(types)]
    named = [*args[:1], *(f"{p} := {a}" for p, a in zip(params[1:], args[1:], strict=True))]
    calls = [(0, ", ".join(args)), (0, ", ".join(named))]
    if 1 in slots:  # a table name, then a hidden column: histogram(source, col_name)
        calls.append((0, f"{args[0]}, 'note'"))
    calls += [(n, ", ".join(args[:n])) for n in range(min(1, len(args)), min(3, len(args)) + 1)]
    return calls


def _shapes(kind: str, call: str) -> tuple[str, ...]:
    if kind in ("table", "table_macro"):
        return (f"SELECT * FROM {call}",
                f"SELECT * FROM {RELEASED} r CROSS JOIN LATERAL {call} LIMIT 50")
    return f"SELECT {call}", f"SELECT {call} FROM {RELEASED} LIMIT 50"


def function_attacks(strings: tuple[str, ...], per_name: int | None = None) -> Iterator[str]:
    """Every DuckDB function called with table names, SQL text and paths as arguments.

    With ``per_name``, at most that many queries per function (four times as many
    for table functions), the most dangerous first: all arguments given, each
    attack string in its order once, alternating FROM-less and over a released table.
    """
    quoted = [f"'{s}'" for s in strings]
    ranked: dict[tuple[str, str], list[tuple[tuple[int, ...], str]]] = {}
    for name, kind, params, types in _functions():
        if kind == "pragma":
            continue  # PRAGMA statements are among the hand-written shapes
        for s, attack in enumerate(quoted if _string_slots(types) else [""]):
            for variant, (rank, args) in enumerate(_calls(params, types, attack)):
                for shape, query in enumerate(_shapes(kind, f"{name}({args})")):
                    key = (rank, shape != (s + variant) % 2, s, variant, shape)
                    ranked.setdefault((name, kind), []).append((key, query))
    for (_, kind), queries in ranked.items():
        ordered = list(dict.fromkeys(q for _, q in sorted(queries)))
        cap = None if per_name is None or kind == "table_macro" else \
            per_name * (4 if kind == "table" else 1)
        yield from ordered[:cap]


def column_attacks(kinds: tuple[str, ...], released: bool = True) -> Iterator[str]:
    """One-argument functions of ``kinds`` over sensitive columns (and released ones)."""
    for name, kind, _, types in _functions():
        if kind not in kinds or len(types) != 1:
            continue
        if released:
            yield f"SELECT {name}(r.income) FROM {RELEASED} r"
            yield f"SELECT {name}(r.label) FROM {RELEASED} r"
        yield (f"SELECT * FROM {RELEASED} r CROSS JOIN LATERAL "
               f"(SELECT {name}(a.income) FROM adult a) x LIMIT 5")
        yield f"SELECT {name}(a) FROM {RELEASED} r, adult a"


def shape_attacks(store: Path) -> Iterator[str]:
    """Hand-written shapes over every spelling of the sensitive and internal tables."""
    for shape in SHAPES:
        for table in TABLE_NAMES:
            yield shape.format(t=table.strip('"') if "'" in shape else table)
    for view in VIEWS:
        yield f"SELECT * FROM {view}"
        yield f"SELECT * FROM {RELEASED} r CROSS JOIN LATERAL (SELECT * FROM {view}) v LIMIT 50"
    yield from SETTINGS_AND_MORE
    yield from DP_SHAPES
    yield from DISTINCT_SHAPES
    yield from JOIN_SHAPES
    for shape in PATH_SHAPES:
        yield shape.format(path=store)


def sampled(queries: list[str], share: float, seeds: Iterable[str]) -> list[str]:
    """The queries a keyed hash places below ``share`` for any of ``seeds``, in order.

    For a time-boxed run: a fixed seed asks the same queries every time, a seed
    that changes (CI passes the commit) asks others each time, so that over
    many runs every query is asked.
    """
    if share >= 1:
        return queries
    keys = [seed.encode() for seed in seeds]
    return [q for q in queries if any(
        int.from_bytes(hashlib.blake2b(q.encode(), key=key[:64], digest_size=8).digest(), "big")
        < share * 2**64 for key in keys)]


def attacks(store: Path, *, thorough: bool = False) -> list[str]:
    """The attack queries against the store at ``store``, deduplicated, in a stable order.

    The default set calls every function DuckDB lists at least once with a table
    name, an SQL text and the store's path; ``thorough`` tries every overload,
    every attack string and every one-argument function over columns.
    """
    if thorough:
        strings = (*TABLE_NAMES, *SQL_TEXTS, str(store), store.name)
        functions = function_attacks(strings)
        columns = column_attacks(("scalar", "aggregate", "macro", "window"))
    else:
        functions = function_attacks((SQL_TEXTS[3], "adult", str(store)), per_name=2)
        columns = column_attacks(("aggregate", "macro"), released=False)
    seen: dict[str, None] = {}
    for query in (*shape_attacks(store), *functions, *columns):
        assert TAG not in query  # a canary in a reply must have come from the store
        seen.setdefault(query, None)
    return list(seen)
