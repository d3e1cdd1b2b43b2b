"""SQL cursors: ``DECLARE c CURSOR FOR query``, ``FETCH``/``MOVE``, ``CLOSE``.

psycopg's named cursors and SQLAlchemy's ``stream_results`` read big results
in pieces through them. dpsql computes the whole answer once, when the cursor
is declared (a DP query is charged then, and only then), and keeps it in
memory; ``FETCH`` and ``MOVE`` only move a position over it, in either
direction, following PostgreSQL's rules for where a cursor stands.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

_NAME = r'(?P<name>[A-Za-z_]\w*|"[^"]+")'
_DECLARE = re.compile(
    rf"^DECLARE\s+{_NAME}\s+(?P<options>(?:(?:BINARY|ASENSITIVE|INSENSITIVE|NO\s+SCROLL|SCROLL)"
    r"\s+)*)CURSOR\s+(?:(?P<hold>WITH|WITHOUT)\s+HOLD\s+)?FOR\s+(?P<query>.+)$", re.I | re.S)
_DIRECTION = (r"NEXT|PRIOR|FIRST|LAST|(?:ABSOLUTE|RELATIVE)\s+[+-]?\d+|[+-]?\d+|ALL|"
              r"(?:FORWARD|BACKWARD)(?:\s+(?:[+-]?\d+|ALL))?")
_FETCH = re.compile(rf"^(?P<verb>FETCH|MOVE)\s+(?:(?P<direction>{_DIRECTION})\s+)?"
                    rf"(?:(?:FROM|IN)\s+)?{_NAME}$", re.I | re.S)
_CLOSE = re.compile(rf"^CLOSE\s+{_NAME}$", re.I | re.S)


def cursor_name(raw: str) -> str:
    """A cursor name as PostgreSQL keeps it: quoted names as written, others lower-cased."""
    return raw[1:-1] if raw.startswith('"') else raw.lower()


@dataclass(frozen=True)
class Declare:
    """A DECLARE statement: the cursor's name, its query, whether it outlives the transaction."""

    name: str
    query: str
    hold: bool
    binary: bool


@dataclass(frozen=True)
class Fetch:
    """A FETCH or MOVE statement."""

    name: str
    direction: str
    move: bool


def parse_declare(sql: str) -> Declare | None:
    """The parts of a DECLARE statement (None for any other statement)."""
    match = _DECLARE.match(sql)
    if match is None:
        return None
    return Declare(cursor_name(match.group("name")), match.group("query").strip(),
                   (match.group("hold") or "").upper() == "WITH",
                   "BINARY" in match.group("options").upper())


def parse_fetch(sql: str) -> Fetch | None:
    """The parts of a FETCH or MOVE statement (None for any other statement)."""
    match = _FETCH.match(sql)
    if match is None:
        return None
    direction = " ".join((match.group("direction") or "NEXT").upper().split())
    return Fetch(cursor_name(match.group("name")), direction,
                 match.group("verb").upper() == "MOVE")


def parse_close(sql: str) -> str | None:
    """The cursor a ``CLOSE name`` statement closes (None for any other statement)."""
    match = _CLOSE.match(sql)
    return None if match is None or match.group("name").upper() == "ALL" else \
        cursor_name(match.group("name"))


@dataclass
class Cursor:
    """A computed answer and a position over it: 0 before the first row, rows 1..n, n+1 after."""

    table: pa.Table
    hold: bool
    position: int = 0

    def step(self, direction: str) -> list[int]:
        """Move as ``direction`` says; the (0-based) rows a FETCH returns, in order."""
        total = self.table.num_rows
        word, _, number = direction.partition(" ")
        if word in ("ABSOLUTE", "RELATIVE", "FIRST", "LAST"):
            target = {"FIRST": 1, "LAST": -1}.get(word) or int(number)
            return self._absolute(self.position + target if word == "RELATIVE" else target)
        if word in ("FORWARD", "BACKWARD"):
            word = number or "1"
        count = {"NEXT": 1, "PRIOR": -1, "ALL": total + 1}.get(word) or int(word)
        if direction.startswith("BACKWARD"):
            count = -count
        if count == 0:
            return self._absolute(self.position)
        if count > 0:
            rows = list(range(self.position, min(self.position + count, total)))
            self.position = min(self.position + count, total + 1)
        else:
            rows = list(range(self.position - 2, max(self.position + count, 1) - 2, -1))
            self.position = max(self.position + count, 0)
        return rows

    def _absolute(self, target: int) -> list[int]:
        total = self.table.num_rows
        if target < 0:
            target = total + 1 + target
        self.position = min(max(target, 0), total + 1)
        return [self.position - 1] if 1 <= self.position <= total else []
