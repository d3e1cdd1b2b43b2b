r"""``COPY (SELECT ...) TO STDOUT``: the statement's parts, and the answer as COPY lines.

psql's ``\copy (SELECT ...) TO 'file'`` and drivers' copy APIs send this
statement. dpsql answers its query exactly as if it had been sent alone (a DP
query is charged once, a released-table query runs on the isolated database),
then writes the answer in PostgreSQL's text or CSV COPY format. COPY from or
to server files is never accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dpsql.server.pgtypes import column_encoder

_NAME = r'(?:[A-Za-z_]\w*|"[^"]+")'
_COPY_QUERY = re.compile(r"^COPY\s*\((?P<query>.*)\)\s*TO\s+STDOUT\b(?P<options>.*)$",
                         re.I | re.S)
_COPY_TABLE = re.compile(
    rf"^COPY\s+(?P<table>{_NAME}(?:\s*\.\s*{_NAME})?)\s*"
    rf"(?:\((?P<columns>\s*{_NAME}\s*(?:,\s*{_NAME}\s*)*)\))?\s*TO\s+STDOUT\b(?P<options>.*)$",
    re.I | re.S)
_TOKEN = re.compile(r"'(?:[^']|'')*'|[^\s,()]+|[,()]")
_OLD_STYLE = {"csv": ("format", "csv"), "binary": ("format", "binary"),
              "header": ("header", "true")}


class CopyOptionError(ValueError):
    """A COPY statement dpsql does not accept (the message says what to write)."""


@dataclass(frozen=True)
class CopyFormat:
    """How rows are written: PostgreSQL's text format or CSV."""

    csv: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    quote: str = '"'


@dataclass(frozen=True)
class CopyStatement:
    """The query whose answer is copied out, and the format to write it in."""

    query: str
    format: CopyFormat


def parse(sql: str) -> CopyStatement | None:
    """The parts of ``COPY (query) TO STDOUT`` or ``COPY table TO STDOUT`` (else None)."""
    match = _COPY_QUERY.match(sql)
    if match:
        return CopyStatement(match.group("query").strip(), _format(match.group("options")))
    match = _COPY_TABLE.match(sql)
    if match:
        columns = match.group("columns") or "*"
        query = f"SELECT {columns.strip()} FROM {match.group('table')}"
        return CopyStatement(query, _format(match.group("options")))
    return None


def _unquote(token: str) -> str:
    return token[1:-1].replace("''", "'") if token.startswith("'") else token


def _options(text: str) -> list[tuple[str, str | None]]:
    """(name, value) pairs of both option syntaxes: ``(FORMAT csv, HEADER)`` and ``CSV HEADER``."""
    tokens = _TOKEN.findall(text)
    if tokens[:1] and tokens[0].lower() == "with":
        tokens = tokens[1:]
    if tokens[:1] == ["("] and tokens[-1:] == [")"]:
        items: list[list[str]] = [[]]
        for token in tokens[1:-1]:
            if token == ",":
                items.append([])
            else:
                items[-1].append(token)
        return [(item[0].lower(), _unquote(" ".join(item[1:])) if len(item) > 1 else None)
                for item in items if item]
    pairs: list[tuple[str, str | None]] = []
    words = iter(tokens)
    for word in words:
        name = word.lower()
        if name in _OLD_STYLE:
            pairs.append(_OLD_STYLE[name])
            continue
        value = next(words, None)
        if value is not None and value.lower() == "as":
            value = next(words, None)
        pairs.append((name, None if value is None else _unquote(value)))
    return pairs


def _single_character(name: str, value: str | None) -> str:
    if value is None or len(value) != 1:
        raise CopyOptionError(f"COPY {name} must be a single one-byte character")
    return value


def _format(text: str) -> CopyFormat:
    """The COPY options as a CopyFormat (refusing those dpsql does not write)."""
    found = dict(_options(text))
    unknown = sorted(set(found) - {"format", "header", "delimiter", "null", "quote"})
    if unknown:
        raise CopyOptionError(f"COPY option {unknown[0]} is not supported; dpsql writes "
                              "FORMAT text or csv with HEADER, DELIMITER, NULL and QUOTE")
    kind = (found.get("format") or "text").lower()
    if kind not in ("text", "csv"):
        raise CopyOptionError(f"COPY format {kind} is not supported; use FORMAT csv or text")
    csv = kind == "csv"
    header = "header" in found and (found["header"] or "true").lower() in ("true", "on", "1")
    if "quote" in found and not csv:
        raise CopyOptionError("COPY quote is available only in CSV mode")
    return CopyFormat(
        csv=csv, header=header,
        delimiter=_single_character("delimiter", found["delimiter"]) if "delimiter" in found
        else "," if csv else "\t",
        null=(found["null"] or "") if "null" in found else ("" if csv else "\\N"),
        quote=_single_character("quote", found["quote"]) if "quote" in found else '"')


def _text_field(value: str, fmt: CopyFormat) -> str:
    out = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    out = out.replace("\t", "\\t")
    return out.replace(fmt.delimiter, "\\" + fmt.delimiter) if fmt.delimiter != "\t" else out


def _csv_field(value: str, fmt: CopyFormat) -> str:
    special = (fmt.delimiter, fmt.quote, "\n", "\r")
    if value == fmt.null or any(ch in value for ch in special):
        return fmt.quote + value.replace(fmt.quote, fmt.quote * 2) + fmt.quote
    return value


def lines(table: pa.Table, fmt: CopyFormat, zone: Any) -> list[bytes]:
    """The rows of ``table`` (a header first if asked) as COPY lines, one per row."""
    field = _csv_field if fmt.csv else _text_field
    out = []
    if fmt.header:
        out.append(fmt.delimiter.join(field(name, fmt) for name in table.column_names))
    encoders = [column_encoder(table.schema.field(i).type, False, zone)
                for i in range(table.num_columns)]
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    for values in zip(*columns, strict=True):
        texts = [encode(value) for encode, value in zip(encoders, values, strict=True)]
        out.append(fmt.delimiter.join(fmt.null if text is None else field(text.decode(), fmt)
                                      for text in texts))
    return [(line + "\n").encode() for line in out]
