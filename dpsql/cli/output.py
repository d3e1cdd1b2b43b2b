"""Terminal and JSON output for CLI commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any

import click


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, (Fraction, Decimal)):
        return float(value)
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def emit_json(data: Any) -> None:
    """Print ``data`` as indented JSON on stdout."""
    click.echo(json.dumps(_plain(data), indent=2, default=str))


def cell(value: Any) -> str:
    """One value as table text."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], *,
          right: Sequence[int] = ()) -> str:
    """A plain aligned text table (right-aligns the column indexes in ``right``)."""
    text = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text:
        widths = [max(w, len(v)) for w, v in zip(widths, row, strict=False)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if i in right else v.ljust(w)
                 for i, (v, w) in enumerate(zip(values, widths, strict=False))]
        return "  ".join(parts).rstrip()

    head = click.style(line(list(headers)), bold=True) if sys.stdout.isatty() else line(headers)
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([head, rule, *(line(r) for r in text)])


def arrow_table(data: Any) -> str:
    """A ``pyarrow.Table`` as an aligned text table (numbers right-aligned); "" if no columns."""
    import pyarrow as pa

    if data.num_columns == 0:
        return ""
    right = [i for i, f in enumerate(data.schema)
             if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    rows = [list(r.values()) for r in data.to_pylist()]
    return table(rows, data.column_names, right=right)


def heading(text: str) -> str:
    """A section title for terminal output."""
    return click.style(text, bold=True) if sys.stdout.isatty() else text
