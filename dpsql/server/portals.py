"""A connection's prepared statements and portals: the extended query protocol's state.

Parse, Bind and Close change only this state; Describe and Execute, which run
statements, are the connection's (:mod:`dpsql.server.connection`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dpsql.server import messages as m
from dpsql.server.pgtypes import BadParameter, parameter_literal
from dpsql.server.router import Outcome, StatementError
from dpsql.server.sqltext import SQLTextError, bind_parameters, max_parameter, split_statements


@dataclass
class Prepared:
    """A statement from Parse: its text, declared parameter types, a cached describe result."""

    text: str
    param_types: tuple[int, ...]
    param_count: int
    cached: Outcome | None = None

    def param_type(self, index: int) -> int:
        """The declared type of parameter ``index`` (0-based); 0 when undeclared."""
        return self.param_types[index] if index < len(self.param_types) else 0


@dataclass
class Portal:
    """A bound statement ready to execute (Bind), with its result once computed."""

    text: str
    result_formats: Callable[[int], int]
    outcome: Outcome | None = None
    rows: list[bytes] | None = None
    sent: int = 0
    notices_sent: bool = False
    statement: Prepared | None = field(default=None, repr=False)


class Portals:
    """The prepared statements and portals of one connection, by name ('' is unnamed)."""

    def __init__(self) -> None:
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}

    def parse(self, parse: m.Parse) -> None:
        """Keep one statement under its name (Parse): one statement, a new name."""
        try:
            pieces = split_statements(parse.query)
        except SQLTextError as err:
            raise StatementError("42601", str(err)) from err
        if len(pieces) > 1:
            raise StatementError("42601", "cannot insert multiple commands into a prepared "
                                 "statement")
        if parse.name and parse.name in self.statements:
            raise StatementError("42P05", f'prepared statement "{parse.name}" already exists')
        count = max(len(parse.param_types), max_parameter(parse.query))
        self.statements[parse.name] = Prepared(parse.query, parse.param_types, count)

    def statement(self, name: str) -> Prepared:
        """The prepared statement called ``name``."""
        try:
            return self.statements[name]
        except KeyError:
            raise StatementError("26000", f'prepared statement "{name}" does not exist') \
                from None

    def portal(self, name: str) -> Portal:
        """The portal called ``name``."""
        try:
            return self.portals[name]
        except KeyError:
            raise StatementError("34000", f'portal "{name}" does not exist') from None

    def bind(self, bind: m.Bind) -> None:
        """Make a portal of a statement with its parameters bound as literals (Bind)."""
        statement = self.statement(bind.statement)
        if len(bind.params) != statement.param_count:
            raise StatementError("08P01", f"bind message supplies {len(bind.params)} "
                                 f"parameters, but prepared statement \"{bind.statement}\" "
                                 f"requires {statement.param_count}")
        if bind.portal and bind.portal in self.portals:
            raise StatementError("42P03", f'cursor "{bind.portal}" already exists')

        def literal(n: int) -> str:
            if n < 1 or n > len(bind.params):
                raise StatementError("42P02", f"there is no parameter ${n}")
            return parameter_literal(bind.params[n - 1], statement.param_type(n - 1),
                                     bind.param_format(n - 1) == 1)

        try:
            text = bind_parameters(statement.text, literal)
        except BadParameter as err:
            raise StatementError("22P02", str(err)) from err
        portal = Portal(text, bind.result_format, statement=statement)
        if statement.cached is not None and not bind.params:
            portal.outcome, statement.cached = statement.cached, None
        self.portals[bind.portal] = portal

    def close(self, which: str, name: str) -> None:
        """Close a statement ('S', with its portals) or a portal ('P'); unknown names too."""
        if which == "S":
            statement = self.statements.pop(name, None)
            for key in [k for k, p in self.portals.items() if p.statement is statement]:
                del self.portals[key]
        else:
            self.portals.pop(name, None)

    def deallocate(self, name: str | None) -> None:
        """What a DEALLOCATE statement asked for: one statement, or ``'ALL'``."""
        if name == "ALL":
            self.statements.clear()
            self.portals.clear()
        elif name:
            self.statements.pop(name, None)
