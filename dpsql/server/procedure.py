"""``CALL dpsql('budget grant alice adult --epsilon 0.5')``: dpsql commands for SQL admins.

An administrator logged in with psql or DBeaver runs the same click commands as
the ``dpsql`` CLI, in the server, as themselves, on the served store: ``--as``,
``--user`` and ``--db`` are refused, and so is any file path (a SQL administrator
is not the server's operating-system user). Analysts are
refused (AccessDenied, SQLSTATE 42501). Every CALL is audited (action
``admin_call``) besides what the command itself audits. The result has one text
column ``dpsql``, a row per output line; with ``--json`` a list of records
comes back as a table (one text column per key). What the command writes to
stderr comes as NOTICEs; a failed command is an error with its SQLSTATE. A
cancel request or the statement timeout stops the command as Ctrl-C would.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dpsql.errors import AccessDenied, ConfigurationError, DPSQLError
from dpsql.ledger import Outcome
from dpsql.server.admin import NOT_FORWARDED, Interruptible, run_for
from dpsql.server.router import StatementHandler
from dpsql.server.sqltext import strip_comments
from dpsql.session import Session

_CALL = re.compile(r"^\s*CALL\s+dpsql\s*\(\s*'((?:[^']|'')*)'\s*\)\s*;?\s*$", re.I | re.S)


class Collector(Interruptible):
    """The "terminal" of a CALL: keeps what the command writes; it reads no input.

    A cancel request or the statement timeout interrupts it like a DuckDB cursor
    of the statement: Ctrl-C for the command (a release stops; its charge stays).
    """

    def __init__(self) -> None:
        super().__init__()
        self.out: list[str] = []
        self.err: list[str] = []
        self.tty = dict.fromkeys(("in", "out", "err"), False)

    def interrupt(self) -> None:
        """Called like ``DuckDBPyConnection.interrupt`` (repeatedly) by the Interrupter."""
        self.cancel()

    def write(self, message: dict[str, Any]) -> None:
        """Keep output (a read request has no one to answer it)."""
        self.out.append(message.get("out", ""))
        self.err.append(message.get("err", ""))

    def read(self, kind: str, prompt: str = "") -> str | None:
        """No input over SQL: the end of input."""
        return None


@dataclass(frozen=True)
class CallAnswer:
    """A CALL's result as the router sends it."""

    table: pa.Table | None
    notice: str | None
    status: str = "CALL"
    warning: str | None = None


def handler(session: Session) -> StatementHandler:
    """The statement handler of a connection: CALL dpsql(...) here, the rest to the session."""
    def handle(text: str) -> Any:
        match = _CALL.match(strip_comments(text))
        if match is None:
            return session.sql(text)
        return call(session, match.group(1).replace("''", "'"))

    return handle


def call(session: Session, command: str, statement: str | None = None) -> CallAnswer:
    """Run the dpsql command line ``command`` as the session's admin; audited.

    ``statement`` is what the audit row records (default: the CALL itself).
    """
    from dpsql.cli.common import Caller

    statement = statement or f"CALL dpsql('{command}')"
    ledger = session.ledger
    if not session.is_admin:
        ledger.record(session.user, None, statement, Outcome.REFUSED, "not an administrator",
                      action="admin_call")
        raise AccessDenied(f"{session.user} is an analyst; CALL dpsql(...) runs administrator "
                           "commands; ask an administrator")
    args = _arguments(command)
    caller = Caller(cwd=str(session.store.path.parent),
                    env={"DPSQL_DB": str(session.store.path), "DPSQL_USER": session.user},
                    remote=True, store=str(session.store.path))  # no --db, --as, --user, file
    collector = Collector()
    with session.interrupts.running(collector):
        code = run_for(collector, args, caller)
    out, err = "".join(collector.out), "".join(collector.err)
    ledger.record(session.user, None, statement, Outcome.DONE if code == 0 else Outcome.FAILED,
                  None if code == 0 else (err.strip().splitlines() or ["failed"])[-1],
                  action="admin_call")
    if code != 0:
        if isinstance(caller.error, DPSQLError):
            raise caller.error
        raise ConfigurationError(err.strip().removeprefix("error: ") or
                                 f"dpsql {command} failed (exit code {code})")
    return CallAnswer(_table(out, "--json" in args), err.strip() or None)


def _arguments(command: str) -> list[str]:
    """The command line, split as a shell would (the command checks its options)."""
    try:
        args = shlex.split(command)
    except ValueError as err:
        raise ConfigurationError(f"CALL dpsql: cannot split {command!r}: {err}") from err
    if args and args[0] in NOT_FORWARDED:
        raise ConfigurationError(f"CALL dpsql: {NOT_FORWARDED[args[0]]}")
    return args


def _table(out: str, as_json: bool) -> pa.Table:
    """Output lines as a text column, or a JSON list of records as a table of text."""
    if as_json:
        try:
            data = json.loads(out)
        except ValueError:
            data = None
        if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
            keys = list(dict.fromkeys(k for record in data for k in record))
            return pa.table({k: pa.array([_text(r.get(k)) for r in data], pa.string())
                             for k in keys})
    return pa.table({"dpsql": pa.array(out.splitlines(), pa.string())})


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)
