"""Tab completion for ``dpsql shell``: SQL keywords, datasets, columns, released tables, options.

Every name offered is one the analyst may already list (``SHOW dpsql.datasets``,
``SHOW dpsql.released``, ``SHOW ALL``): the policy's visible columns and the
released tables, never a value of the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpsql.session import Session

KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", "AS", "AND", "OR",
    "NOT", "IN", "BETWEEN", "IS", "NULL", "LIKE", "CASE", "WHEN", "THEN", "ELSE", "END",
    "DISTINCT", "COUNT", "SUM", "AVG", "WITH DIFFERENTIAL_PRIVACY OPTIONS", "EXPLAIN PRIVACY",
    "SHOW", "SET", "ALL", "dp_bin",
)
# Readline splits words at these; '.' and '\' stay inside a word (released.t, \budget).
DELIMITERS = " \t\n,;()=<>+-*/'\""


class Completer:
    """Readline's completer over one session's public names."""

    def __init__(self, session: Session, commands: Sequence[str]) -> None:
        self.session = session
        self.commands = tuple(commands)
        self._matches: list[str] = []

    def candidates(self, text: str, before: str) -> list[str]:
        """The completions of the word ``text``, given the line ``before`` it."""
        if not before.strip() and text.startswith("\\"):
            return sorted(c for c in self.commands if c.startswith(text))
        lowered = text.lower()
        if lowered.startswith("released."):
            names = self.released()
        elif lowered.startswith("dpsql."):
            names = self.options(showing=before.strip().upper().endswith("SHOW"))
        else:
            datasets, columns = self.datasets()
            names = [*KEYWORDS, *datasets, *columns, "released.", "dpsql."]
        matches = sorted({n for n in names if n.lower().startswith(lowered)})
        return [_same_case(n, text) for n in matches]

    def datasets(self) -> tuple[list[str], list[str]]:
        """Dataset names and their visible (never hidden) columns."""
        policy = self.session.policy
        columns = {c.name for d in policy.datasets.values() for c in d.visible_columns}
        return list(policy.datasets), sorted(columns)

    def released(self) -> list[str]:
        """``released.<name>`` of every released table (what SHOW dpsql.released lists)."""
        from dpsql.query.meta import released_table

        table = released_table(self.session.context())
        return [str(name) for name in table.column("table").to_pylist()]

    def options(self, *, showing: bool = False) -> list[str]:
        """``dpsql.<option>``, and after SHOW the tables SHOW also answers."""
        from dpsql.query.options import OPTIONS

        shown = ("budget", "datasets", "released") if showing else ()
        return [f"dpsql.{name}" for name in (*OPTIONS, *shown)]

    def complete(self, text: str, state: int) -> str | None:
        """Readline's protocol: the ``state``-th completion of ``text``."""
        if state == 0:
            import readline

            before = readline.get_line_buffer()[:readline.get_begidx()]
            self._matches = self.candidates(text, before)
        return self._matches[state] if state < len(self._matches) else None

    def install(self, readline: Any) -> None:
        """Make this readline's completer, on Tab (GNU readline or libedit)."""
        readline.set_completer(self.complete)
        readline.set_completer_delims(DELIMITERS)
        if "libedit" in (readline.__doc__ or ""):
            readline.parse_and_bind("bind ^I rl_complete")
        else:
            readline.parse_and_bind("tab: complete")


def _same_case(name: str, text: str) -> str:
    """Keywords follow the case the user started typing (``sel`` -> ``select``)."""
    if name.isupper() and text and text.islower():
        return name.lower()
    return name
