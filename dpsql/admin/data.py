"""A released table with its provenance, and a release's fidelity (``dpsql export``, ``evaluate``).

Neither writes a file: :func:`export_release` returns the table and its record
(the caller writes the Parquet file, :meth:`Exported.parquet_table` carrying the
record in its metadata), and :func:`evaluate` returns the scores and, when asked,
the HTML report with its figures (the caller writes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dpsql.admin import operation
from dpsql.analysis.report import Report
from dpsql.session import Session


@dataclass(frozen=True)
class Exported:
    """Released table ``name`` (free to read) and its provenance record."""

    name: str
    release_id: str
    table: pa.Table
    record: dict[str, Any]

    def parquet_table(self) -> pa.Table:
        """The table with its record in the Parquet key-value metadata (``dpsql.provenance``)."""
        from dpsql.provenance import METADATA_KEY, to_json

        metadata = dict(self.table.schema.metadata or {})
        metadata[METADATA_KEY] = to_json(self.record).encode()
        return self.table.replace_schema_metadata(metadata)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: what was exported (not the rows)."""
        return {"name": self.name, "release_id": self.release_id, "rows": self.table.num_rows}


@operation("export")
def export_release(session: Session, *, name: str) -> Exported:
    """Released table ``name`` with its provenance.

    Any user may export a released table (they are free to read); a held one (its fit
    failed its diagnostics) only an administrator.
    """
    from dpsql.provenance import read_release

    entry, data = read_release(session.store, name, admin=session.is_admin)
    return Exported(name, entry["release_id"], data, entry["record"])


@dataclass(frozen=True)
class Evaluated:
    """A release scored against the real data, next to the bootstrap ideal (NOT DP)."""

    name: str
    copy: int | None
    rows_true: int
    rows_synthetic: int
    synthetic: dict[str, float]  # median, mean and r.m.s. of d, |z| and the figure of merit
    ideal: dict[str, float]
    report: Report | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able summary (what ``dpsql evaluate --json`` prints, besides the report's path)."""
        return {"name": self.name, "copy": self.copy, "dp": False,
                "note": "computed from the real data: not differentially private",
                "rows_true": self.rows_true, "rows_synthetic": self.rows_synthetic,
                "synthetic": self.synthetic, "ideal": self.ideal}


@operation("evaluate")
def evaluate(session: Session, *, name: str, copy: int | None = None, seed: int = 0,
             report: bool = True) -> Evaluated:
    """Score release ``name`` (one copy) against the real data (admins only; audited; NOT DP).

    ``seed`` seeds the bootstrap resample; ``report``: also render the HTML report.
    """
    from dpsql.analysis.fidelity import evaluate_release

    evaluation = evaluate_release(session.context(), name, copy=copy, seed=seed)
    rendered = None
    if report:
        from dpsql.analysis.report import render_report

        rendered = render_report(evaluation)
    return Evaluated(name, evaluation.copy, evaluation.synthetic.rows_true,
                     evaluation.synthetic.rows_synthetic, evaluation.synthetic.summary(),
                     evaluation.ideal.summary(), rendered)
