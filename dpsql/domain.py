"""Public column domains: encode policy columns to finite codes and decode them back.

A categorical column's codes index its public values; an integer or float
column's codes index its policy bins (values are clamped into the bounds
first, NaN and infinities included), and a nullable column gets one more code
for NULL. Encoding happens in SQL so counting stays in DuckDB; decoding is
post-processing on synthetic codes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsql.errors import ConfigurationError
from dpsql.policy import Column, Dataset, did_you_mean

#: Equal parts of a bin whose DP counts make a ``decode: shape`` column's shape.
SUB_BINS = 8

def sql_literal(value: Any) -> str:
    """A SQL literal for a public domain value (never for data)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise ConfigurationError(f"domain value {value} is not finite")
        return repr(float(value))
    text = str(value).replace("'", "''")
    return f"'{text}'"


def quote(name: str) -> str:
    """A double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Attribute:
    """One column of a domain: ``size`` codes, each with a label.

    ``shape``: for a ``decode: shape`` column, the measured DP probability of each
    sub-bin of each bin (:mod:`dpsql.synth.shape`); None until measured.
    """

    column: Column
    shape: tuple[tuple[float, ...], ...] | None = None

    @property
    def name(self) -> str:
        """The column name."""
        return self.column.name

    @property
    def bins(self) -> int:
        """Codes for values (categorical values or numeric bins), NULL excluded."""
        col = self.column
        if col.type == "categorical":
            return len([v for v in col.values or () if v is not None])
        assert col.edges is not None
        return len(col.edges) - 1

    @property
    def size(self) -> int:
        """Number of codes, NULL included."""
        return self.bins + (1 if self.column.nullable else 0)

    @property
    def null_code(self) -> int | None:
        """The code of NULL for a nullable column, else None."""
        return self.bins if self.column.nullable else None

    def _values(self) -> list[Any]:
        return [v for v in self.column.values or () if v is not None]

    def labels(self) -> list[str]:
        """A human label per code."""
        col = self.column
        if col.type == "categorical":
            out = [str(v) for v in self._values()]
            if col.labels:
                names = dict(zip(col.values or (), col.labels, strict=False))
                out = [names.get(v, str(v)) for v in self._values()]
        elif col.labels:
            out = list(col.labels)
        else:
            assert col.edges is not None
            top = "]" if col.type == "float" else ")"
            out = [f"[{a:g}, {b:g}{top if i == len(col.edges) - 2 else ')'}"
                   for i, (a, b) in enumerate(zip(col.edges, col.edges[1:], strict=False))]
        if col.nullable:
            out.append("NULL")
        return out

    def encode_sql(self, expr: str | None = None) -> str:
        """SQL giving this column's code (INTEGER) for ``expr``, NULL if outside the domain."""
        col = self.column
        expr = expr or quote(col.name)
        null_branch = f"WHEN {expr} IS NULL THEN {self.null_code} " if col.nullable else ""
        if col.type == "categorical":
            whens = " ".join(f"WHEN {expr} = {sql_literal(v)} THEN {i}"
                             for i, v in enumerate(self._values()))
            return f"(CASE {null_branch}{whens} ELSE NULL END)"
        assert col.edges is not None
        assert col.bounds is not None
        clamped = clamp_sql(expr, col.bounds)
        interior = col.edges[1:-1]
        if interior:
            code = " + ".join(f"CAST({clamped} >= {sql_literal(e)} AS INTEGER)" for e in interior)
        else:
            code = "0"
        return f"(CASE {null_branch}WHEN {expr} IS NOT NULL THEN {code} ELSE NULL END)"

    def encode_decoded_sql(self, expr: str | None = None) -> str:
        """Like :meth:`encode_sql`, for values this attribute decoded (bin labels included)."""
        col = self.column
        if col.type == "categorical" or col.decode != "label" or not col.labels:
            return self.encode_sql(expr)
        expr = expr or quote(col.name)
        null_branch = f"WHEN {expr} IS NULL THEN {self.null_code} " if col.nullable else ""
        whens = " ".join(f"WHEN {expr} = {sql_literal(label)} THEN {i}"
                         for i, label in enumerate(col.labels))
        return f"(CASE {null_branch}{whens} ELSE NULL END)"

    def decode(self, codes: np.ndarray, rng: np.random.Generator) -> pa.Array:
        """Values for ``codes``: the category, or a value from the bin (post-processing)."""
        codes = np.asarray(codes, dtype=np.int64)
        col = self.column
        nulls = codes == self.null_code if col.nullable else np.zeros(len(codes), dtype=bool)
        safe = np.where(nulls, 0, codes)
        if col.type == "categorical":
            return _take(self._values(), safe, nulls)
        assert col.edges is not None
        edges = np.asarray(col.edges, dtype=np.float64)
        lo, hi = edges[safe], edges[safe + 1]
        if col.decode == "label" and col.labels:
            return _take(list(col.labels), safe, nulls)
        if col.decode == "midpoint":
            values_f = (lo + hi) / 2
            if col.type == "integer":
                values_f = np.floor(values_f)
        elif col.decode == "shape" and self.shape is not None:
            values_f = _draw_in_shape(col, self.shape, safe, rng)
        elif col.type == "integer":
            values_f = rng.integers(lo.astype(np.int64), hi.astype(np.int64)).astype(np.float64)
        else:
            values_f = rng.uniform(lo, hi)
        if col.type == "integer":
            return pa.array(values_f.astype(np.int64), mask=nulls)
        return pa.array(values_f, mask=nulls)


def integer_starts(edges: np.ndarray) -> np.ndarray:
    """Per bin, the first integer of each :data:`SUB_BINS` sub-bin, then the bin's end.

    That is ``lo + ceil(j * (hi - lo) / SUB_BINS)`` for j = 0..SUB_BINS.
    """
    lo, width = edges[:-1, None], (edges[1:] - edges[:-1])[:, None]
    j = np.arange(SUB_BINS + 1)[None, :]
    return (lo + np.ceil(j * width / SUB_BINS)).astype(np.int64)


def _draw_in_shape(col: Column, shape: tuple[tuple[float, ...], ...], bins: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """A value per bin code: a sub-bin drawn from the bin's shape, then uniform inside it."""
    cumulative = np.cumsum(np.asarray(shape, dtype=np.float64), axis=1)[bins]
    sub = np.minimum((rng.random(len(bins))[:, None] > cumulative).sum(axis=1), SUB_BINS - 1)
    edges = np.asarray(col.edges, dtype=np.float64)
    if col.type == "integer":
        starts = integer_starts(edges)
        lo, hi = starts[bins, sub], starts[bins, sub + 1]
        return rng.integers(lo, np.maximum(hi, lo + 1)).astype(np.float64)
    width = (edges[bins + 1] - edges[bins]) / SUB_BINS
    return edges[bins] + (sub + rng.random(len(bins))) * width


def _take(values: list[Any], codes: np.ndarray, nulls: np.ndarray) -> pa.Array:
    """``values[codes]`` as an Arrow array, NULL where ``nulls``."""
    taken = pa.array(values).take(pa.array(codes))
    if not nulls.any():
        return taken
    return pc.if_else(pa.array(nulls), pa.nulls(len(codes), taken.type), taken)


def clamp_sql(expr: str, bounds: tuple[float, float]) -> str:
    """SQL clamping ``expr`` into ``bounds`` as DOUBLE.

    +-inf land on the bounds, NaN on the lower bound, NULL stays NULL.

    TRY_CAST keeps it total: a value that cannot be read as a number is NULL.
    """
    lo, hi = (sql_literal(float(b)) for b in bounds)
    value = f"TRY_CAST({expr} AS DOUBLE)"
    return (f"(CASE WHEN {value} IS NULL THEN NULL WHEN isnan({value}) THEN {lo} "
            f"ELSE least(greatest({value}, {lo}), {hi}) END)")


@dataclass(frozen=True)
class Domain:
    """The finite public domain of some columns of a dataset.

    ``max_rows`` is how many rows one privacy unit may contribute to the bounded
    source (the sensitivity of a count); ``public_rows`` is the row count the
    policy declares public (``public_row_count: N``), else None: never a count
    of the rows.
    """

    attributes: tuple[Attribute, ...]
    max_rows: int = 1
    public_rows: int | None = None

    @classmethod
    def from_dataset(cls, dataset: Dataset, columns: Sequence[str] | None = None) -> Domain:
        """The domain of ``columns`` (default: every visible column with a finite domain)."""
        if columns is None:
            chosen = [c for c in dataset.visible_columns if c.has_domain]
        else:
            repeated = sorted({c for c in columns if list(columns).count(c) > 1})
            if repeated:
                raise ConfigurationError(f"column(s) {', '.join(repeated)} listed more than once")
            chosen = []
            for name in columns:
                if name not in dataset.columns:
                    raise ConfigurationError(f"dataset {dataset.name!r} has no column {name!r}"
                                             f"{did_you_mean(name, dataset.columns)}")
                col = dataset.columns[name]
                if col.hidden:
                    raise ConfigurationError(f"column {name!r} is hidden by the policy")
                if not col.has_domain:
                    raise ConfigurationError(
                        f"column {name!r} has no bins in the policy; add bins: WIDTH (or a list "
                        "of edges) to use it in a synthesizer")
                chosen.append(col)
        if not chosen:
            raise ConfigurationError(f"dataset {dataset.name!r} has no column with a finite "
                                     "public domain; declare values or bins in the policy")
        return cls(tuple(Attribute(c) for c in chosen), max_rows=dataset.max_rows,
                   public_rows=dataset.public_row_count)

    @property
    def names(self) -> tuple[str, ...]:
        """Column names, in order."""
        return tuple(a.name for a in self.attributes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Number of codes per column."""
        return tuple(a.size for a in self.attributes)

    def __getitem__(self, name: str) -> Attribute:
        for attribute in self.attributes:
            if attribute.name == name:
                return attribute
        hint = did_you_mean(name, self.names)
        raise ConfigurationError(f"no column {name!r} in this domain{hint}")

    def __len__(self) -> int:
        return len(self.attributes)

    def size(self, names: Iterable[str] | None = None) -> int:
        """Number of cells of the marginal over ``names`` (default: all columns)."""
        chosen = self.names if names is None else tuple(names)
        return math.prod(self[n].size for n in chosen)

    def with_shapes(self, shapes: Mapping[str, Sequence[Sequence[float]]]) -> Domain:
        """This domain with the measured within-bin ``shapes`` of some columns."""
        return replace(self, attributes=tuple(
            replace(a, shape=tuple(tuple(float(p) for p in b) for b in shapes[a.name]))
            if a.name in shapes else a for a in self.attributes))

    def project(self, names: Sequence[str]) -> Domain:
        """The sub-domain of ``names``, in that order."""
        return replace(self, attributes=tuple(self[n] for n in names))

    def encode_sql(self, source: str) -> str:
        """A SELECT over ``source`` (a table or subquery) giving each column's code."""
        items = ", ".join(f"{a.encode_sql()} AS {quote(a.name)}" for a in self.attributes)
        return f"SELECT {items} FROM {source}"

    def encode_decoded_sql(self, source: str) -> str:
        """A SELECT over ``source`` giving each column's code from decoded (released) values."""
        items = ", ".join(f"{a.encode_decoded_sql()} AS {quote(a.name)}" for a in self.attributes)
        return f"SELECT {items} FROM {source}"

    def decode(self, codes: pa.Table, rng: np.random.Generator) -> pa.Table:
        """Turn a table of codes (one column per attribute, extra columns kept) into values."""
        out = {}
        for name in codes.column_names:
            column = codes.column(name).to_numpy()
            out[name] = self[name].decode(column, rng) if name in self.names else codes.column(name)
        return pa.table(out)

    def describe(self) -> dict[str, Any]:
        """JSON-able summary (public information only)."""
        out = {"columns": {a.name: {"type": a.column.type, "codes": a.size}
                           for a in self.attributes},
               "max_rows": self.max_rows, "public_rows": self.public_rows}
        if self.public_rows is not None:
            out["public_rows_source"] = "declared in the policy (public_row_count)"
        return out
