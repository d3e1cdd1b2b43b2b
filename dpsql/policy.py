"""Policies: YAML files validated into frozen objects, with a stable fingerprint.

A policy says which tables are sensitive, what each column's public domain is,
how much privacy budget each dataset and each user has, and which synthesizers
an administrator may release with. ``policies/schema.json`` is the contract;
this module adds the checks a schema cannot express (bounds in order, budgets
that fit inside each other, users that name real datasets).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

import yaml

from dpsql.engine_spec import EngineSpec, read_engine
from dpsql.errors import ConfigurationError, PolicyError
from dpsql.policy_legacy import old_public_counts
from dpsql.privacy import Kind, PrivacyCost, budget_cost

ColumnType = Literal["categorical", "integer", "float", "hidden"]
Role = Literal["admin", "analyst"]


@dataclass(frozen=True)
class Column:
    """One column's public description: its domain and how to bin it."""

    name: str
    type: ColumnType
    values: tuple[Any, ...] | None = None
    bounds: tuple[float, float] | None = None
    edges: tuple[float, ...] | None = None
    labels: tuple[str, ...] | None = None
    decode: str = "uniform"
    nullable: bool = False
    description: str | None = None  # for humans: shown by SQL clients (\d+, comments)

    @property
    def hidden(self) -> bool:
        """Never queryable."""
        return self.type == "hidden"

    @property
    def numeric(self) -> bool:
        """Integer or float (has bounds)."""
        return self.type in ("integer", "float")

    @property
    def bins_text(self) -> str:
        """The bins as people read them: ``9 bins of width 10`` (``bins: 10`` is a width)."""
        if self.edges is None:
            return ""
        count = len(self.edges) - 1
        inner = {b - a for a, b in zip(self.edges[:-2], self.edges[1:-1], strict=True)}
        width = f" of width {next(iter(inner)):g}" if len(inner) == 1 else ""
        last = self.edges[-1] - self.edges[-2]
        if width and last != next(iter(inner)):
            width += f" (the last {last:g})"
        return f"{count} bin{'s' if count != 1 else ''}{width}"

    @property
    def has_domain(self) -> bool:
        """Whether the column has a finite public domain (values, or bins)."""
        return (self.type == "categorical" and self.values is not None) or self.edges is not None

    @property
    def open_keys(self) -> bool:
        """A categorical column with no value list: GROUP BY selects its keys privately."""
        return self.type == "categorical" and self.values is None


@dataclass(frozen=True)
class Dataset:
    """A sensitive table and the rules for reaching it."""

    name: str
    table: str
    columns: Mapping[str, Column]
    budget: PrivacyCost
    query_cap: PrivacyCost | None
    default_query: PrivacyCost | None
    privacy_unit: str | None = None
    max_rows: int = 1
    public_row_count: int | None = None
    legacy_public_count: bool = False
    synthesizers: tuple[str, ...] = ()
    allow_non_dp: bool = False
    allow_options: tuple[str, ...] = ()
    description: str | None = None
    engine: EngineSpec | None = None  # None: the rows are in the store (DuckDB)

    def column(self, name: str) -> Column:
        """The named column; unknown names raise with a did-you-mean."""
        try:
            return self.columns[name]
        except KeyError:
            raise ConfigurationError(
                f"dataset {self.name!r} has no column {name!r}{did_you_mean(name, self.columns)}"
            ) from None

    @property
    def visible_columns(self) -> tuple[Column, ...]:
        """Columns that are not hidden."""
        return tuple(c for c in self.columns.values() if not c.hidden)


@dataclass(frozen=True)
class PublicTable:
    """A non-sensitive lookup table a DP query may join a dataset to on its unique ``key``.

    Its rows come from ``path`` (CSV or Parquet, relative to the policy file) or from
    store table ``table`` and are copied into the store's ``public_tables`` schema
    when the policy is applied (:meth:`dpsql.store.Store.apply_policy`).
    """

    name: str
    key: str
    path: str | None = None
    table: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class User:
    """A principal with a role and per-dataset budgets."""

    name: str
    role: Role
    budgets: Mapping[str, PrivacyCost] = field(default_factory=dict)
    max_connections: int = 4


@dataclass(frozen=True)
class Policy:
    """A validated policy. ``fingerprint`` hashes its canonical form."""

    accounting: Kind
    delta: float | None
    datasets: Mapping[str, Dataset]
    users: Mapping[str, User]
    canonical: str
    text: str
    name: str = ""
    source: str = "<policy>"
    answer_cache_mb: float = 256.0
    public_tables: Mapping[str, PublicTable] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        """A stable hash of the canonical form (16 hex digits)."""
        return hashlib.sha256(self.canonical.encode()).hexdigest()[:16]

    def dataset(self, name: str) -> Dataset:
        """The named dataset; unknown names raise with a did-you-mean."""
        try:
            return self.datasets[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown dataset {name!r}{did_you_mean(name, self.datasets)}"
            ) from None

    def user(self, name: str) -> User:
        """The named user; unknown names raise without revealing other users."""
        try:
            return self.users[name]
        except KeyError:
            raise ConfigurationError(
                f"unknown user {name!r}; users are declared in the policy's users: section"
            ) from None

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """Read and validate a policy file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise PolicyError(f"cannot read policy {path}: {err.strerror}") from err
        return cls.from_text(text, source=str(path))

    @classmethod
    def from_text(cls, text: str, source: str = "<policy>", *, stored: bool = False) -> Policy:
        """Validate policy YAML ``text``; ``source`` names it in error messages.

        ``stored``: the text comes from a store, where it was valid when applied
        (see :func:`dpsql.policy_legacy.old_public_counts`).
        """
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or "invalid YAML"
            raise PolicyError(f"{source}: not valid YAML{where}: {problem}") from err
        return _build(raw, text, source, stored)

    def diff(self, other: Policy) -> list[str]:
        """Human-readable changes from ``self`` to ``other``, one per line."""
        return _diff(json.loads(self.canonical), json.loads(other.canonical))


def did_you_mean(name: str, choices: Mapping[str, Any] | list[str] | tuple[str, ...]) -> str:
    """A ``; did you mean 'x'?`` suffix when a close public name exists."""
    import difflib

    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# -- validation -----------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    """The policy JSON Schema shipped with the package (also ``policies/schema.json``)."""
    text = resources.files("dpsql").joinpath("data/policy.schema.json").read_text("utf-8")
    return dict(json.loads(text))


def _path(parts: Any) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


def _schema_error(source: str, raw: Any) -> None:
    import jsonschema  # only when a policy is read: a worker or a lookup never validates one

    validator = jsonschema.Draft202012Validator(schema())
    error = jsonschema.exceptions.best_match(validator.iter_errors(raw))
    if error is None:
        return
    where = _path(error.absolute_path)
    hint = error.schema.get("description") if isinstance(error.schema, dict) else None
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        hint = f"allowed fields: {', '.join(allowed)}" if allowed else hint
    elif error.validator == "enum":
        hint = f"allowed: {', '.join(map(str, error.validator_value))}"
    elif error.validator == "oneOf" and where.endswith(("budget", "query_cap", "default_query")):
        hint = "write exactly one of epsilon (with optional delta) or rho"
    message = error.message if len(error.message) < 200 else error.message[:200] + "..."
    raise PolicyError(f"{source}: {where}: {message}" + (f" ({hint})" if hint else ""))


def _fail(source: str, where: str, message: str) -> PolicyError:
    return PolicyError(f"{source}: {where}: {message}")


def _budget(raw: dict[str, Any], kind: Kind, default_delta: float | None, source: str,
            where: str) -> PrivacyCost:
    try:
        delta = raw.get("delta", default_delta if "epsilon" in raw else None)
        if kind == "pure" and "delta" not in raw:
            delta = None
        return budget_cost(kind, epsilon=raw.get("epsilon"), delta=delta, rho=raw.get("rho"),
                           allow_infinite=True)
    except ConfigurationError as err:
        raise _fail(source, where, str(err)) from err


def _edges(raw: dict[str, Any], col_type: str, lo: float, hi: float, source: str,
           where: str) -> tuple[float, ...] | None:
    """Bin edges, each bin [e_i, e_i+1).

    The top edge is hi + 1 for integers (so the last bin holds hi) and hi itself,
    closed, for floats.
    """
    bins = raw.get("bins")
    if bins is None:
        return None
    integer = col_type == "integer"
    if isinstance(bins, list):
        edges = [float(e) for e in bins]
        if any(b <= a for a, b in itertools.pairwise(edges)):
            raise _fail(source, where + ".bins", "bin edges must increase strictly")
        if edges[0] != lo or edges[-1] != hi:
            raise _fail(source, where + ".bins",
                        f"bin edges must start at the lower bound {lo:g} and end at the upper "
                        f"bound {hi:g}")
        if integer:
            edges[-1] = hi + 1
    else:
        width = float(bins)
        if width > hi - lo:
            raise _fail(source, where + ".bins",
                        f"bin width {width:g} is wider than the bounds [{lo:g}, {hi:g}]")
        if integer and width != int(width):
            raise _fail(source, where + ".bins", "an integer column needs an integer bin width")
        count = math.floor((hi - lo) / width) + 1 if integer else math.ceil((hi - lo) / width)
        edges = [lo + k * width for k in range(count)] + [hi + 1 if integer else hi]
    if integer and any(e != int(e) for e in edges):
        raise _fail(source, where + ".bins", "an integer column needs integer bin edges")
    return tuple(edges)


def _column(name: str, raw: dict[str, Any], source: str, where: str) -> Column:
    col_type = raw["type"]
    extra = sorted(set(raw) - {"type", "description"})
    if col_type == "hidden":
        if extra:
            raise _fail(source, where, f"a hidden column takes no {', '.join(extra)}")
        return Column(name, "hidden")
    if col_type == "categorical":
        wrong = sorted(set(extra) - {"values", "labels", "decode"})
        if wrong:
            raise _fail(source, where, "a categorical column takes values: [...] (or none, for "
                        "keys chosen by DP partition selection), not bounds or bins")
        if "values" not in raw:
            if extra:
                raise _fail(source, where, "labels and decode need values: [...]")
            return Column(name, "categorical", description=raw.get("description"))
        values = tuple(raw["values"])
        labels = raw.get("labels")
        if labels is not None and len(labels) != len(values):
            raise _fail(source, where + ".labels", f"give one label per value ({len(values)})")
        if raw.get("decode") == "shape":
            raise _fail(source, where + ".decode", "decode: shape is for integer and float "
                        "columns with bins")
        return Column(name, "categorical", values=values, labels=tuple(labels) if labels else None,
                      decode=raw.get("decode", "label"), nullable=None in values,
                      description=raw.get("description"))
    if "values" in raw:
        raise _fail(source, where, f"a {col_type} column takes bounds, not values")
    if "bounds" not in raw:
        raise _fail(source, where, f"a {col_type} column needs bounds: [lower, upper]")
    lo, hi = (float(b) for b in raw["bounds"])
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise _fail(source, where + ".bounds", f"need finite bounds with lower < upper, got "
                    f"{raw['bounds']}")
    if col_type == "integer" and (lo != int(lo) or hi != int(hi)):
        raise _fail(source, where + ".bounds", "an integer column needs integer bounds")
    edges = _edges(raw, col_type, lo, hi, source, where)
    labels = raw.get("labels")
    if labels is not None and (edges is None or len(labels) != len(edges) - 1):
        raise _fail(source, where + ".labels", "give one label per bin (and declare bins)")
    decode = raw.get("decode", "uniform")
    if decode == "label" and labels is None:
        raise _fail(source, where + ".decode", "decode: label needs labels: [...]")
    if decode == "shape" and edges is None:
        raise _fail(source, where + ".decode", "decode: shape needs bins: WIDTH or [edges]")
    return Column(name, col_type, bounds=(lo, hi), edges=edges,
                  labels=tuple(labels) if labels else None, decode=decode,
                  nullable=raw.get("nullable", False), description=raw.get("description"))


def _dataset(name: str, raw: dict[str, Any], kind: Kind, delta: float | None,
             source: str, legacy: set[str]) -> Dataset:
    where = f"datasets.{name}"
    columns = {
        col: _column(col, spec, source, f"{where}.columns.{col}")
        for col, spec in raw["columns"].items()
    }
    unit = raw.get("privacy_unit")
    max_rows = raw.get("max_rows", 1)
    if unit is None and max_rows != 1:
        raise _fail(source, where + ".max_rows",
                    "without a privacy_unit each row is one unit, so max_rows must be 1")
    public_count = raw.get("public_row_count")
    if public_count is not None and unit is not None:
        raise _fail(source, where + ".public_row_count",
                    "a declared row count needs one row per person; with a privacy_unit the "
                    "number of units is what differential privacy protects, so it cannot be "
                    "public: remove public_row_count (releases then estimate the count with "
                    "noise)")
    if unit is not None and unit not in columns:
        raise _fail(source, where + ".privacy_unit",
                    f"column {unit!r} is not declared under columns (declare it, usually as "
                    "type: hidden)")
    budget = _budget(raw["budget"], kind, delta, source, where + ".budget")
    cap = _budget(raw["query_cap"], kind, delta, source, where + ".query_cap") \
        if "query_cap" in raw else None
    default = _budget(raw["default_query"], kind, delta, source, where + ".default_query") \
        if "default_query" in raw else cap
    if cap is not None and cap > budget:
        raise _fail(source, where + ".query_cap", "the per-query cap exceeds the dataset budget")
    if default is not None and cap is not None and default > cap:
        raise _fail(source, where + ".default_query", "the default query cost exceeds the cap")
    return Dataset(
        name=name, table=raw["table"], columns=MappingProxyType(columns), budget=budget,
        query_cap=cap, default_query=default, privacy_unit=unit, max_rows=max_rows,
        public_row_count=public_count, legacy_public_count=name in legacy,
        synthesizers=tuple(raw.get("synthesizers", ())),
        allow_non_dp=raw.get("allow_non_dp", False),
        allow_options=tuple(raw.get("allow_options", ())),
        description=raw.get("description"),
        engine=read_engine(raw["engine"], source, where + ".engine") if "engine" in raw else None,
    )


def _user(name: str, raw: dict[str, Any], datasets: Mapping[str, Dataset], kind: Kind,
          delta: float | None, source: str) -> User:
    budgets = {}
    for ds, spec in raw.get("budgets", {}).items():
        where = f"users.{name}.budgets.{ds}"
        if ds not in datasets:
            raise _fail(source, where, f"unknown dataset {ds!r}{did_you_mean(ds, datasets)}")
        budgets[ds] = _budget(spec, kind, delta, source, where)
        if budgets[ds] > datasets[ds].budget:
            raise _fail(source, where, f"the user's budget exceeds dataset {ds!r}'s total budget")
    return User(name, raw["role"], MappingProxyType(budgets), raw.get("max_connections", 4))


def _canonical(raw: dict[str, Any]) -> str:
    def clean(value: Any) -> Any:
        if isinstance(value, float) and math.isinf(value):
            return "inf"
        if isinstance(value, float) and value == int(value):
            return int(value)
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(raw), sort_keys=True, separators=(",", ":"))


def _build(raw: Any, text: str, source: str, stored: bool = False) -> Policy:
    if not isinstance(raw, dict):
        raise PolicyError(f"{source}: a policy is a YAML mapping with version, accounting, "
                          "datasets and users")
    canonical = _canonical(raw)
    raw, legacy = old_public_counts(raw, source, stored)
    _schema_error(source, raw)
    kind: Kind = raw["accounting"]
    delta = raw.get("delta")
    if kind == "zcdp" and delta is None:
        raise _fail(source, "delta", "accounting: zcdp needs a delta (e.g. 1.0e-6) to show "
                    "costs as (epsilon, delta)")
    if kind == "pure" and delta is not None:
        raise _fail(source, "delta", "accounting: pure has no delta; remove it or use zcdp")
    datasets = {
        name: _dataset(name, spec, kind, delta, source, legacy)
        for name, spec in raw["datasets"].items()
    }
    tables = [d.table for d in datasets.values()]
    if len(set(tables)) != len(tables):
        raise _fail(source, "datasets", "two datasets name the same table")
    users = {
        name: _user(name, spec, datasets, kind, delta, source)
        for name, spec in raw["users"].items()
    }
    if not any(u.role == "admin" for u in users.values()):
        raise _fail(source, "users", "declare at least one user with role: admin")
    public = {name: PublicTable(name, spec["key"], spec.get("path"), spec.get("table"),
                                spec.get("description"))
              for name, spec in raw.get("public_tables", {}).items()}
    clash = sorted({n.lower() for n in public} & {n.lower() for d in datasets.values()
                                                  for n in (d.name, d.table)})
    if clash:
        raise _fail(source, f"public_tables.{clash[0]}", "a public table cannot share its name "
                    "with a dataset or its table; rename it")
    private = {d.table.lower(): d.name for d in datasets.values()}
    for table in public.values():
        if table.table is not None and table.table.lower() in private:
            raise _fail(source, f"public_tables.{table.name}.table", f"table {table.table!r} "
                        f"holds dataset {private[table.table.lower()]!r}, which is sensitive; a "
                        "public table must hold public data only")
    return Policy(
        accounting=kind, delta=delta, datasets=MappingProxyType(datasets),
        users=MappingProxyType(users), canonical=canonical, text=text,
        name=str(raw.get("name", "")), source=source,
        answer_cache_mb=float(raw.get("answer_cache_mb", 256.0)),
        public_tables=MappingProxyType(public),
    )


def _diff(old: Any, new: Any, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        lines = []
        for key in sorted(set(old) | set(new)):
            sub = f"{where}.{key}" if where else key
            if key not in old:
                lines.append(f"+ {sub}: {json.dumps(new[key])}")
            elif key not in new:
                lines.append(f"- {sub}: {json.dumps(old[key])}")
            else:
                lines.extend(_diff(old[key], new[key], sub))
        return lines
    if old != new:
        return [f"~ {where}: {json.dumps(old)} -> {json.dumps(new)}"]
    return []
