"""Classify one analyst statement before anything else looks at it.

Every statement an analyst sends (CLI, Python, wire server) is exactly one of:
``SET``/``RESET``/``SHOW`` of a ``dpsql.*`` option, ``EXPLAIN PRIVACY <query>``,
or a query (SELECT). Anything else, and any text holding several statements,
is rejected here, before a parser or a database sees more of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.tokens import Token, TokenType

from dpsql.query.dialect import parse_statements, reject, tokenize


@dataclass(frozen=True)
class SetStatement:
    """``SET dpsql.<name> = value``."""

    name: str
    value: str


@dataclass(frozen=True)
class ResetStatement:
    """``RESET dpsql.<name>`` or ``RESET ALL``."""

    name: str


@dataclass(frozen=True)
class ShowStatement:
    """``SHOW dpsql.<name>``, ``SHOW dpsql.budget`` or ``SHOW ALL``."""

    name: str


@dataclass(frozen=True)
class ExplainStatement:
    """``EXPLAIN PRIVACY <query>``: the query's text and where it starts."""

    text: str
    offset: int


@dataclass(frozen=True)
class QueryStatement:
    """A SELECT (or set operation) parsed with the analyst dialect."""

    ast: exp.Expr


Statement = SetStatement | ResetStatement | ShowStatement | ExplainStatement | QueryStatement

_PRIVACY = re.compile(r"\s*PRIVACY\b", re.IGNORECASE)
_QUERY_STARTS = {TokenType.SELECT, TokenType.WITH, TokenType.FROM, TokenType.L_PAREN}
_ALLOWED = ("SELECT queries, EXPLAIN PRIVACY <query>, SET/RESET/SHOW dpsql.<option> and "
            "SHOW dpsql.budget")


def classify(text: str) -> Statement:
    """The one statement in ``text``, or QueryRejected saying why it is not accepted."""
    tokens = tokenize(text)
    while tokens and tokens[-1].token_type == TokenType.SEMICOLON:
        tokens.pop()
    if not tokens:
        raise reject(text, "empty statement", construct="statement",
                     advice="send one SQL statement, e.g. SELECT COUNT(*) FROM <dataset>")
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            raise reject(text, "several statements in one request", token.start,
                         construct="multiple statements", advice="send one statement at a time")
    head = tokens[0].text.upper()
    if head == "SET":
        return _set(text, tokens)
    if head == "RESET":
        return ResetStatement(_name(text, tokens, "RESET"))
    if head == "SHOW":
        return ShowStatement(_name(text, tokens, "SHOW"))
    if head == "EXPLAIN":
        # sqlglot reads everything after EXPLAIN as one token: look at the text itself.
        end = tokens[-1].end + 1
        match = _PRIVACY.match(text, tokens[0].end + 1, end)
        if match is None:
            word = text[tokens[0].end + 1:end].split(None, 1)
            raise reject(text, f"EXPLAIN {word[0].upper() if word else ''}".strip()
                         + " is not allowed", tokens[0].start, construct="EXPLAIN",
                         advice="use EXPLAIN PRIVACY <query> to see a query's cost and noise")
        if not text[match.end():end].strip():
            raise reject(text, "EXPLAIN PRIVACY needs a query", match.start(),
                         construct="EXPLAIN PRIVACY", advice="EXPLAIN PRIVACY SELECT ...")
        # Blank out the prefix (keeping newlines) so positions in the query stay true.
        prefix = re.sub(r"[^\n]", " ", text[:match.end()])
        return ExplainStatement(prefix + text[match.end():end], match.end())
    if tokens[0].token_type not in _QUERY_STARTS:
        raise reject(text, f"{head} statements are not allowed", tokens[0].start,
                     construct=head, advice=f"dpsql accepts {_ALLOWED}")
    statements = parse_statements(text)
    if len(statements) != 1:
        raise reject(text, "several statements in one request", construct="multiple statements",
                     advice="send one statement at a time")
    ast = statements[0]
    if not isinstance(ast, exp.Query):
        raise reject(text, f"{ast.key.upper()} statements are not allowed", ast,
                     construct=ast.key.upper(), advice=f"dpsql accepts {_ALLOWED}")
    return QueryStatement(ast)


def _dotted(tokens: list[Token], i: int) -> tuple[str, int]:
    """A dotted name ``a.b.c`` starting at ``tokens[i]``; returns it and the next index."""
    parts: list[str] = []
    while i < len(tokens):
        parts.append(tokens[i].text)
        i += 1
        if i + 1 < len(tokens) and tokens[i].token_type == TokenType.DOT:
            i += 1
            continue
        break
    return ".".join(parts), i


def _name(text: str, tokens: list[Token], verb: str) -> str:
    """The option name of ``RESET name`` / ``SHOW name`` (nothing may follow it)."""
    if len(tokens) < 2:
        raise reject(text, f"{verb} needs an option name", tokens[0].start, construct=verb,
                     advice=f"{verb} dpsql.epsilon")
    name, i = _dotted(tokens, 1)
    if i != len(tokens):
        raise reject(text, f"unexpected text after {verb} {name}", tokens[i].start,
                     construct=verb, advice=f"{verb} dpsql.<option>")
    return name


def _set(text: str, tokens: list[Token]) -> SetStatement:
    index = 1
    if index < len(tokens) and tokens[index].text.upper() in ("SESSION", "LOCAL", "GLOBAL"):
        if tokens[index].text.upper() != "SESSION":
            raise reject(text, f"SET {tokens[index].text.upper()} is not allowed",
                         tokens[index].start, construct="SET",
                         advice="SET dpsql.<option> = value applies to this session")
        index += 1
    if index >= len(tokens):
        raise reject(text, "SET needs an option name", tokens[-1].start, construct="SET",
                     advice="SET dpsql.epsilon = 0.1")
    name, i = _dotted(tokens, index)
    if i < len(tokens) and (tokens[i].token_type == TokenType.EQ or tokens[i].text.upper() == "TO"):
        i += 1
    if i >= len(tokens):
        raise reject(text, f"SET {name} needs a value", tokens[-1].start, construct="SET",
                     advice=f"SET {name} = value")
    value_tokens = tokens[i:]
    if len(value_tokens) == 1 and value_tokens[0].token_type == TokenType.STRING:
        value = value_tokens[0].text
    else:
        value = text[value_tokens[0].start:value_tokens[-1].end + 1]
    return SetStatement(name, value)
