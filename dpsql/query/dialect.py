"""The SQL dialect analysts write: DuckDB's, plus GoogleSQL's differential privacy clause.

``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5, delta = 1e-7) ...``
parses into a :class:`DPOptions` node on the SELECT (sqlglot has no such
syntax, so the DuckDB parser is extended at the one place it reads what
follows ``SELECT``). This module also turns positions in the text into line
and column numbers and builds :class:`QueryRejected` errors that carry them.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.errors import ParseError, TokenError
from sqlglot.parsers.duckdb import DuckDBParser
from sqlglot.tokens import Token

from dpsql.errors import QueryRejected


class DPOptions(exp.Expression):
    """``WITH DIFFERENTIAL_PRIVACY OPTIONS (name = value, ...)`` on a SELECT."""

    arg_types: ClassVar[dict[str, bool]] = {"expressions": True}


class _Parser(DuckDBParser):
    def _parse_hint(self) -> Any:
        if self._match_text_seq("WITH", "DIFFERENTIAL_PRIVACY"):
            if not self._match_text_seq("OPTIONS"):
                self.raise_error("expected OPTIONS (name = value, ...) after "
                                 "WITH DIFFERENTIAL_PRIVACY")
            options = self._parse_wrapped_csv(self._parse_assignment)
            return self.expression(DPOptions(expressions=options))
        return super()._parse_hint()


class DPDuckDB(DuckDB):
    """DuckDB's dialect with GoogleSQL's ``SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (...)``."""

    Parser = _Parser


DIALECT = DPDuckDB()


def line_col(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of character ``offset`` in ``text``."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def node_start(node: exp.Expr) -> int | None:
    """The smallest source offset recorded on ``node`` or any node below it."""
    best: int | None = None
    for sub in node.walk():
        meta = sub._meta if isinstance(sub, exp.Expression) else None
        if meta and "start" in meta and (best is None or meta["start"] < best):
            best = meta["start"]
    return best


def reject(text: str, message: str, node: exp.Expr | int | None = None, *,
           construct: str | None = None, advice: str | None = None) -> QueryRejected:
    """A QueryRejected naming ``construct`` at ``node`` (an AST node or a text offset)."""
    offset = node if isinstance(node, int) else node_start(node) if node is not None else None
    if isinstance(node, exp.Func) and offset is not None and not node.meta_get("start"):
        offset = _function_start(text, node, offset)
    line, column = line_col(text, offset) if offset is not None else (None, None)
    return QueryRejected(message, construct=construct, line=line, column=column, advice=advice)


def _function_start(text: str, node: exp.Func, inner: int) -> int:
    """Where a function's name starts when sqlglot only recorded its arguments' positions."""
    if isinstance(node, exp.Case):  # CASE [x] WHEN ...: the last CASE before the first part
        found = [m.start() for m in re.finditer(r"\bCASE\b", text[:inner], re.IGNORECASE)]
        return found[-1] if found else inner
    name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
    before = text[:inner].rstrip(" \t\n(")
    if before.upper().endswith(name.upper()):
        return len(before) - len(name)
    return inner


def tokenize(text: str) -> list[Token]:
    """Tokens of ``text`` (comments dropped), or QueryRejected for unreadable input."""
    _refuse_nul(text)
    try:
        return list(DIALECT.tokenize(text))
    except TokenError as err:
        raise _unreadable(text) from err


def _refuse_nul(text: str) -> None:
    """Refuse the NUL character, as PostgreSQL does: DuckDB cannot parse it in a literal."""
    at = text.find("\x00")
    if at >= 0:
        raise reject(text, "the NUL character (U+0000) is not accepted in SQL text", at,
                     construct="syntax", advice="remove it from the statement")


def _unreadable(text: str) -> QueryRejected:
    """The refusal of text the tokenizer cannot read, at the string or comment left open."""
    start = unterminated_at(text)
    what = "an unterminated string, quote or comment?" if start is None else \
        f"{_OPENERS.get(text[start:start + 2], _OPENERS.get(text[start], 'text'))} never closed"
    return reject(text, f"cannot read this SQL ({what})", start, construct="syntax",
                  advice="check the quotes and comments")


_OPENERS = {"'": "a string", '"': "a quoted name", "/*": "a comment", "$": "a $$ string"}
_CLOSERS = {"'": "'", '"': '"', "/*": "*/"}


def unterminated_at(text: str) -> int | None:
    """Where a string, quoted name, dollar-quoted string or block comment opens and never closes."""
    i = 0
    while i < len(text):
        two, one = text[i:i + 2], text[i]
        if two == "--":
            end = text.find("\n", i)
            i = len(text) if end < 0 else end + 1
            continue
        dollar = re.match(r"\$(\w*)\$", text[i:]) if one == "$" else None
        opener = two if two == "/*" else one if one in ("'", '"') else None
        if dollar is not None:
            end = text.find(dollar.group(0), i + len(dollar.group(0)))
            if end < 0:
                return i
            i = end + len(dollar.group(0))
        elif opener is not None:
            closer, j = _CLOSERS[opener], i + len(opener)
            while True:
                end = text.find(closer, j)
                if end < 0:
                    return i
                if closer != "*/" and text[end + 1:end + 2] == closer:  # '' or "" escapes
                    j = end + 2
                    continue
                break
            i = end + len(closer)
        else:
            i += 1
    return None


def parse_statements(text: str) -> list[exp.Expr]:
    """Parse ``text`` into statements with the analyst dialect; syntax errors are rejections."""
    _refuse_nul(text)
    try:
        statements = DIALECT.parse(text)
    except RecursionError:
        raise nested_too_deeply() from None
    except TokenError as err:
        raise _unreadable(text) from err
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        description = str(first.get("description") or "invalid SQL").split(". Line")[0]
        line, column = first.get("line"), first.get("col")
        raise QueryRejected(f"syntax error: {description}", construct="syntax", line=line,
                            column=column, advice="see docs/sql.md for the accepted SQL") from err
    return [s for s in statements if s is not None]


def nested_too_deeply() -> QueryRejected:
    """The refusal of a statement too deeply nested to read (Python's recursion limit)."""
    return QueryRejected("this query is nested too deeply", construct="expression",
                         advice="simplify the expression (fewer nested parentheses)")


def describe(node: exp.Expr) -> str:
    """A short human name for a construct, e.g. ``function read_csv`` or ``JOIN``."""
    names = {
        exp.Join: "JOIN", exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT",
        exp.Window: "window function (OVER)", exp.Subquery: "subquery", exp.Star: "*",
        exp.With: "WITH (common table expression)", exp.Distinct: "DISTINCT",
        exp.Cast: "CAST", exp.Case: "CASE", exp.Lateral: "LATERAL",
    }
    for kind, name in names.items():
        if isinstance(node, kind):
            return name
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}"
    if isinstance(node, exp.Func):  # DuckDB's name for it (RANDOM, not sqlglot's RAND)
        match = re.match(r"([A-Za-z_]\w*)\s*\(", node.sql(dialect="duckdb"))
        return f"function {(match.group(1) if match else node.sql_name()).lower()}"
    return node.key.upper()


def keyword_start(text: str, *keywords: str) -> int | None:
    """Where the first of ``keywords`` (e.g. UNION) appears as a token of ``text``."""
    try:
        tokens = tokenize(text)
    except QueryRejected:
        return None
    wanted = {k.upper() for k in keywords}
    return next((t.start for t in tokens if t.text.upper() in wanted), None)


def unparen(node: exp.Expr) -> exp.Expr:
    """``node`` without the parentheses around it."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node
