"""Draft a policy from the data: column types, bounds, category lists and hidden guesses.

Onboarding a data set means declaring every column's domain (hundreds of codes
for some ACS columns). ``dpsql policy draft`` reads a CSV/Parquet file (with a
private in-memory DuckDB, like an import) or a table of a store, and writes a
complete policy whose every derived line carries a ``# from the data: ...``
comment.

Not DP, and the draft says so: bounds, category lists and counts are read from
the private rows. Whatever the administrator keeps becomes a public fact (it is
the domain analysts see), so the draft is a starting point for a decision, not
a release. Reading a store's table is admin-only and audited.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI reads MAX_CATEGORIES at startup: DuckDB loads when used
    import duckdb


#: A text or integer column with at most this many distinct values is categorical.
MAX_CATEGORIES = 300
#: An integer column with at most this many distinct values is read as codes (categorical)
#: even where the codes are dense (0, 1, 2, ...); above it, only sparse codes are.
SMALL_CODES = 50
#: A text or integer column whose non-NULL values are this distinct looks like an identifier.
IDENTIFIER_SHARE = 0.95
MIN_IDENTIFIER_ROWS = 20
#: About how many steps of a "nice" number the bounds are rounded to, and how many bins.
BOUND_STEPS, BINS = 20, 10

_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
             "UINTEGER", "UBIGINT")
_FLOATS = ("FLOAT", "DOUBLE", "REAL", "DECIMAL")

HEADER = """\
# Draft dpsql policy for {source}, written by `dpsql policy draft`.
#
# PRIVATE: every bound, category list and count below was read from the private rows.
# None of it is differentially private. Whatever this file keeps becomes a public fact:
# analysts see the domains, and DP protects only what is not already public. Decide
# column by column: keep what you would publish anyway (codes from a data dictionary,
# bounds everybody knows), widen or replace the rest, and delete the "from the data"
# comments before the file leaves your hands. Check the hidden guesses (identifiers,
# free text), the privacy unit, and the placeholders: budgets and users.
version: 1
name: {dataset} (drafted from the data)
accounting: zcdp          # rho adds up; epsilon requests are converted at the delta below
delta: 1.0e-6
"""

DATASET = """
datasets:
  {dataset}:
    table: {table}
    privacy_unit: null              # each row is one person; if a person may have several
                                    # rows, name the column identifying them and set max_rows
    budget: {{epsilon: 1}}            # placeholder: the total for all users together
    query_cap: {{epsilon: 0.5}}       # placeholder: the most one query may cost
    default_query: {{epsilon: 0.1}}   # placeholder: a query that names no cost
    # synthesizers: [independent, joint, range, sds, napsu_mq]   # which releases are allowed
    columns:
"""

USERS = """\
users:
  admin:                            # placeholder: your administrators and analysts
    role: admin
    budgets:
      {dataset}: {{epsilon: 1}}
"""


@dataclass(frozen=True)
class Profile:
    """What the draft reads of one column (private: for the administrator only)."""

    name: str
    sql_type: str
    rows: int
    present: int  # non-NULL (and, for floats, finite) values
    distinct: int
    low: Any = None
    high: Any = None
    values: tuple[Any, ...] | None = None  # every distinct value, when few enough

    @property
    def kind(self) -> str:
        """integer, float, boolean, text or other, from the SQL type."""
        upper = self.sql_type.upper()
        if upper in _INTEGERS:
            return "integer"
        if upper.startswith(_FLOATS):
            return "float"
        if upper == "BOOLEAN":
            return "boolean"
        return "text" if upper == "VARCHAR" else "other"


def profile(con: duckdb.DuckDBPyConnection, relation: str, name: str, sql_type: str,
            max_categories: int) -> Profile:
    """Counts, range and (up to ``max_categories``) the distinct values of one column."""
    from dpsql.domain import quote

    col = quote(name)
    base = Profile(name, sql_type, 0, 0, 0)
    finite = f" FILTER (WHERE isfinite({col}::DOUBLE))" if base.kind == "float" else ""
    range_sql = f"min({col}){finite}, max({col}){finite}" \
        if base.kind in ("integer", "float") else "NULL, NULL"
    count = f"count({col}){finite}"
    row = con.execute(f"SELECT count(*), {count}, count(DISTINCT {col}), {range_sql} "
                      f"FROM {relation}").fetchone()
    assert row is not None
    rows, present, distinct, low, high = row
    values = None
    if distinct <= max_categories and base.kind in ("integer", "text", "boolean"):
        values = tuple(r[0] for r in con.execute(
            f"SELECT DISTINCT {col} FROM {relation} WHERE {col} IS NOT NULL ORDER BY 1"
        ).fetchall())
    return Profile(name, sql_type, rows, present, distinct, low, high, values)


def column_spec(p: Profile, max_categories: int) -> tuple[dict[str, Any], str]:
    """The policy entry guessed for a column, and the comment saying what it came from."""
    nulls = p.rows - p.present
    null_note = f"; NULL in {nulls} rows" if nulls else ""
    seen = f"{p.distinct} distinct values"
    if p.kind == "other":
        return {"type": "hidden"}, f"type {p.sql_type} is not a policy type"
    if p.present == 0:
        return {"type": "hidden"}, "no values"
    if p.kind in ("integer", "text") and p.present >= MIN_IDENTIFIER_ROWS \
            and p.distinct >= IDENTIFIER_SHARE * p.present:
        return {"type": "hidden"}, f"{seen} in {p.present} rows: an identifier?"
    if p.values is not None and (p.kind != "integer" or _codes(p)):
        values = ([None] if nulls else []) + list(p.values)
        return {"type": "categorical", "values": values}, seen + null_note
    if p.kind == "text" or p.kind == "boolean":
        return {"type": "hidden"}, (f"free text? {seen}, more than --max-categories "
                                    f"{max_categories}")
    lo, hi = nice_bounds(p.low, p.high, integer=p.kind == "integer")
    spec = {"type": p.kind, "bounds": [lo, hi], "bins": nice_step(hi - lo, BINS,
                                                                  integer=p.kind == "integer")}
    if nulls:
        spec["nullable"] = True
    return spec, f"min {_plain(p.low)}, max {_plain(p.high)}, {seen}{null_note}"


def _codes(p: Profile) -> bool:
    """Whether an integer column's few values look like codes rather than quantities."""
    return p.distinct <= SMALL_CODES or (p.high - p.low + 1) > 2 * p.distinct


def nice_step(span: Decimal | float, parts: int, *, integer: bool = False) -> Decimal:
    """The smallest 1, 2 or 5 times a power of ten that cuts ``span`` in at most ``parts``."""
    raw = Decimal(str(span)) / parts if span > 0 else Decimal(1)
    exponent = raw.adjusted()
    step = next(s for m in (1, 2, 5, 10) if (s := Decimal(m).scaleb(exponent)) >= raw)
    return max(step, Decimal(1)) if integer else step


def nice_bounds(low: Any, high: Any, *, integer: bool) -> tuple[Decimal, Decimal]:
    """``[low, high]`` rounded outward to multiples of a nice step (never narrower)."""
    lo, hi = Decimal(str(low)), Decimal(str(high))
    step = nice_step(hi - lo, BOUND_STEPS, integer=integer)
    lo_nice = (lo / step).to_integral_value(ROUND_FLOOR) * step
    hi_nice = (hi / step).to_integral_value(ROUND_CEILING) * step
    return lo_nice, hi_nice if hi_nice > lo_nice else lo_nice + step


def _plain(value: Any) -> str:
    """A number as written in YAML: no exponent, no trailing zeros."""
    if isinstance(value, Decimal):
        text = format(value, "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    if isinstance(value, float):
        return _plain(Decimal(repr(value)))
    return json.dumps(value, ensure_ascii=False)


def _key(name: str) -> str:
    """A column name as a YAML key, quoted where YAML would read another type (on, null, 1)."""
    import yaml

    plain = yaml.safe_load(f"{name}: 0")
    return name if isinstance(plain, dict) and list(plain) == [name] else json.dumps(name)


def _flow(value: Any) -> str:
    """A YAML flow value: mappings and lists inline, numbers plain, text quoted."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v if k == 'type' else _flow(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    return _plain(value)


def draft(con: duckdb.DuckDBPyConnection, relation: str, *, dataset: str, table: str,
          source: str, max_categories: int = MAX_CATEGORIES) -> str:
    """A complete policy (YAML text) for ``relation``, every derived line commented."""
    from dpsql.store import check_identifier

    check_identifier(dataset, "dataset name")
    check_identifier(table, "table name")
    rel = con.sql(f"SELECT * FROM {relation}")
    profiles = [profile(con, relation, name, str(sql_type), max_categories)
                for name, sql_type in zip(rel.columns, rel.types, strict=True)]
    width = max((len(p.name) for p in profiles), default=0) + 1
    lines = [HEADER.format(source=source, dataset=dataset), DATASET.format(
        dataset=dataset, table=table)]
    for p in profiles:
        spec, note = column_spec(p, max_categories)
        key = (_key(p.name) + ":").ljust(width)
        lines.append(f"      {key} {_flow(spec)}  # from the data: {note}\n")
    lines.append("\n" + USERS.format(dataset=dataset))
    return "".join(lines)


def draft_file(path: str | Path, *, na: str | None = None, normalize: bool = True,
               dataset: str | None = None, max_categories: int = MAX_CATEGORIES) -> str:
    """Draft a policy for a CSV/Parquet file, named as ``dpsql init --import`` would name it."""
    import duckdb

    from dpsql.imports import normalize_name, read_file

    data = read_file(path, na=na)
    if normalize:
        data = data.rename_columns([normalize_name(c) for c in data.column_names])
    name = dataset or normalize_name(Path(path).name.split(".")[0])
    con = duckdb.connect(":memory:")
    try:
        con.register("rows", data)
        return draft(con, "rows", dataset=name, table=name, source=Path(path).name,
                     max_categories=max_categories)
    finally:
        con.close()
