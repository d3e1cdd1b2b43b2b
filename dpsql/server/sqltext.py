"""Lexical work on SQL text the server must do before any parsing.

Splitting a simple-query string into statements, finding ``$n`` parameter
markers and replacing them with literals all need to know where strings,
quoted identifiers, dollar-quoted bodies and comments begin and end, so they
share one scanner that follows PostgreSQL's lexical rules.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_PARAM = re.compile(r"\$([0-9]+)")


class SQLTextError(ValueError):
    """The text has an unterminated string, identifier or comment."""


def _spans(text: str) -> Iterator[tuple[str, int, int]]:
    """Yield (kind, start, end) for every lexical piece that matters.

    Kinds: 'quote' (strings, identifiers, comments: opaque), 'semicolon', 'param' ($n).
    """
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "'" or ch == '"':
            escapes = ch == "'" and i > 0 and text[i - 1] in "eE" and (
                i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_"))
            j = i + 1
            while True:
                if j >= n:
                    raise SQLTextError("unterminated quoted string or identifier")
                if escapes and text[j] == "\\":
                    j += 2
                    continue
                if text[j] == ch:
                    if j + 1 < n and text[j + 1] == ch:
                        j += 2
                        continue
                    break
                j += 1
            yield "quote", i, j + 1
            i = j + 1
        elif ch == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end + 1
            yield "quote", i, end
            i = end
        elif ch == "/" and text.startswith("/*", i):
            depth, j = 1, i + 2
            while depth:
                if j >= n:
                    raise SQLTextError("unterminated /* comment")
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            yield "quote", i, j
            i = j
        elif ch == "$":
            param = _PARAM.match(text, i)
            prev_ident = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
            if param and not prev_ident:
                yield "param", i, param.end()
                i = param.end()
                continue
            tag = _DOLLAR_TAG.match(text, i)
            if tag and not prev_ident:
                close = text.find(tag.group(0), tag.end())
                if close < 0:
                    raise SQLTextError("unterminated dollar-quoted string")
                end = close + len(tag.group(0))
                yield "quote", i, end
                i = end
                continue
            i += 1
        elif ch == ";":
            yield "semicolon", i, i + 1
            i += 1
        else:
            i += 1


def split_statements(text: str) -> list[str]:
    """The statements of a simple-query string, without their terminating semicolons.

    Statements that are empty (or only comments) are dropped.
    """
    out, start = [], 0
    for kind, begin, end in _spans(text):
        if kind == "semicolon":
            out.append(text[start:begin])
            start = end
    out.append(text[start:])
    return [s for s in out if strip_comments(s).strip()]


def strip_comments(text: str) -> str:
    """The text with comments replaced by a space (strings kept)."""
    pieces, last = [], 0
    for kind, begin, end in _spans(text):
        if kind == "quote" and text.startswith(("--", "/*"), begin):
            pieces.append(text[last:begin] + " ")
            last = end
    pieces.append(text[last:])
    return "".join(pieces)


def max_parameter(text: str) -> int:
    """The highest ``$n`` used in the text (0 when there are none)."""
    found = [int(text[b + 1:e]) for kind, b, e in _spans(text) if kind == "param"]
    return max(found, default=0)


def bind_parameters(text: str, literal: Callable[[int], str]) -> str:
    """Replace every ``$n`` marker by ``literal(n)`` (1-based)."""
    pieces, last = [], 0
    for kind, begin, end in _spans(text):
        if kind == "param":
            pieces.append(text[last:begin] + literal(int(text[begin + 1:end])))
            last = end
    pieces.append(text[last:])
    return "".join(pieces)
