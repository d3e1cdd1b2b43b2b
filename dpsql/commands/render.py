"""Text for results: aligned tables, headings and JSON, the same on a terminal and over CALL.

Pure functions of their arguments. Headings and table headers are styled (bold);
a terminal door prints the style only to a terminal (``click.echo``), CALL's
door strips it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click

from dpsql.admin.wire import plain


def json_text(data: Any) -> str:
    """``data`` as the indented JSON a command prints with --json."""
    return json.dumps(plain(data), indent=2, default=str)


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

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([click.style(line(list(headers)), bold=True), rule,
                      *(line(r) for r in text)])


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
    """A section title."""
    return click.style(text, bold=True)


def warning(text: str) -> str:
    """A warning line (for standard error)."""
    return click.style("warning: ", fg="yellow", bold=True) + text


def error(text: str) -> str:
    """An error line (for standard error)."""
    return click.style("error: ", fg="red", bold=True) + text


def short(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
