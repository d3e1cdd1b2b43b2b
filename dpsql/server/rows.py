"""Answers as wire messages: RowDescription fields and DataRows from an Arrow table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from dpsql.server import messages as m
from dpsql.server.pgtypes import column_encoder, from_arrow

ENCODE_SLICE = 4096  # answer rows encoded between two looks at a statement timeout or cancel


def text_formats(_: int) -> int:
    """Every column in text format (the simple query protocol's)."""
    return 0


def row_fields(schema: pa.Schema, formats: Callable[[int], int]) -> list[m.FieldDescription]:
    """RowDescription fields for an Arrow schema."""
    out = []
    for index, arrow_field in enumerate(schema):
        pg, typmod = from_arrow(arrow_field.type)
        out.append(m.FieldDescription(arrow_field.name, pg.oid, pg.size, typmod,
                                      formats(index)))
    return out


def encode_rows(table: pa.Table, formats: Callable[[int], int], zone: Any,
                check: Callable[[], None] | None = None) -> list[bytes]:
    """Every row of ``table`` as a DataRow message.

    ``check`` runs before each slice of rows and raises to stop: a statement
    timeout or cancel then ends the encoding of a large answer, not only its query.
    """
    encoders = [column_encoder(table.schema.field(i).type, formats(i) == 1, zone)
                for i in range(table.num_columns)]
    out: list[bytes] = []
    for start in range(0, table.num_rows, ENCODE_SLICE):
        if check is not None:
            check()
        part = table.slice(start, ENCODE_SLICE)
        columns = [part.column(i).to_pylist() for i in range(part.num_columns)]
        out.extend(m.data_row([enc(v) for enc, v in zip(encoders, values, strict=True)])
                   for values in zip(*columns, strict=True))
    return out
