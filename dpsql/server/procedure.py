"""``CALL dpsql('budget grant alice adult --epsilon 0.5')``: dpsql commands for SQL admins.

An administrator logged in with psql or DBeaver runs the same commands as the
``dpsql`` CLI (declared once in :mod:`dpsql.commands`), in the server, as
themselves, on the served store: the command line is parsed for a remote caller
(:func:`dpsql.commands.common.parse`: ``--as``, ``--user`` and ``--db`` refused,
and any file path, since a SQL administrator is not the server's
operating-system user) and its flow runs with a door (:class:`SqlDoor`) that
runs the typed operations on the SQL session and collects their text; it
reads no file and asks no question. Analysts are refused (AccessDenied,
SQLSTATE 42501). Every CALL is audited (action ``admin_call``) besides what the
command itself audits. The result has one text column ``dpsql``, a row per
output line; with ``--json`` a list of records comes back as a table (one text
column per key). What the command writes beside its output comes as NOTICEs; a
failed command is an error with its SQLSTATE. A cancel request or the statement
timeout interrupts the session's statement: a release being waited for is
cancelled and its charge stays.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
import pyarrow as pa

from dpsql.admin import require_admin_call
from dpsql.commands.door import Bar, Door, NoBar, Writer
from dpsql.errors import AccessDenied, ConfigurationError, DPSQLError
from dpsql.outcomes import Outcome
from dpsql.server.router import StatementHandler
from dpsql.server.sqltext import strip_comments
from dpsql.session import Session

_CALL = re.compile(r"^\s*CALL\s+dpsql\s*\(\s*'((?:[^']|'')*)'\s*\)\s*;?\s*$", re.I | re.S)
HELP = ("-h", "--help")


class SqlDoor(Door):
    """Where a CALL's command runs: on the SQL session, its text collected, no side of its own."""

    keeps_session = True  # a SET lasts for the connection

    def __init__(self, session: Session) -> None:
        self.session = session
        self.stdout = ""
        self.notes: list[str] = []

    def call(self, operation: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``operation`` on the SQL session (inside the CALL's statement: interruptible)."""
        return operation(self.session, *args, **kwargs)

    def out(self, text: str = "", *, nl: bool = True) -> None:
        """Keep output (styles dropped)."""
        self.stdout += click.unstyle(text) + ("\n" if nl else "")

    def err(self, text: str) -> None:
        """Keep a note (sent as a NOTICE)."""
        self.notes.append(click.unstyle(text))

    def json(self, data: Any) -> None:
        """Keep the JSON text."""
        from dpsql.commands.render import json_text

        self.out(json_text(data))

    def _no_file(self, path: str) -> AccessDenied:
        from dpsql.commands.common import NO_FILE

        return AccessDenied(NO_FILE.format(path))

    def read_text(self, path: str) -> str:
        """Refused: no file of the server machine."""
        raise self._no_file(path)

    def local_path(self, path: str) -> str:
        """Refused: no file of the server machine."""
        raise self._no_file(path)

    def output(self, path: str) -> str:
        """Refused: no file of the server machine."""
        raise self._no_file(path)

    def write(self, path: str, data: str | bytes | Writer, *, mode: int = 0o600) -> None:
        """Refused: no file of the server machine."""
        raise self._no_file(path)

    def write_folder(self, path: str, files: dict[str, str | bytes]) -> dict[str, str]:
        """Refused: no file of the server machine."""
        raise self._no_file(path)

    def password(self, *, from_stdin: bool) -> str:
        """Refused: a CALL has no terminal to type a password at."""
        raise ConfigurationError("aborted: CALL dpsql reads no input, so it cannot ask for a "
                                 "password; run this command in a shell on the server")

    def confirm(self, question: str) -> None:
        """Refused: a CALL cannot answer a question (give --yes where the command takes it)."""
        raise ConfigurationError(f"aborted: CALL dpsql cannot answer {question!r}; give --yes "
                                 "where the command takes it")

    def progress(self, enabled: bool = True) -> Bar:
        """No progress display over SQL."""
        return NoBar()


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
    statement = statement or f"CALL dpsql('{command}')"
    require_admin_call(session, statement, "CALL dpsql(...)")
    ledger = session.ledger
    door = SqlDoor(session)
    args: list[str] = []
    try:
        args = _arguments(command)
        _run(door, args, session)
    except DPSQLError as err:
        ledger.record(session.user, None, statement, Outcome.FAILED, str(err),
                      action="admin_call")
        raise
    except Exception:
        ledger.record(session.user, None, statement, Outcome.FAILED, "failed",
                      action="admin_call")
        raise
    ledger.record(session.user, None, statement, Outcome.DONE, None, action="admin_call")
    notes = "\n".join(door.notes).strip()
    return CallAnswer(_table(door.stdout, "--json" in args), notes or None)


def _run(door: SqlDoor, args: list[str], session: Session) -> None:
    """Parse ``args`` for the session's remote caller and run the command's flow."""
    from dpsql import commands
    from dpsql.commands.common import Remote, help_text, parse

    commands.load()
    if not args or any(a in HELP for a in args):
        door.out(click.unstyle(help_text(args)))
        return
    command, params = parse(args, Remote(str(session.store.path), session.user))
    try:
        command.run(door, params)
    except click.exceptions.Exit as done:  # a script's exit code (no script runs remotely)
        if done.exit_code:
            raise ConfigurationError(f"CALL dpsql: the command failed (exit code "
                                     f"{done.exit_code})") from None
    except click.exceptions.Abort:
        raise ConfigurationError("aborted") from None
    except click.ClickException as err:
        raise ConfigurationError(f"CALL dpsql: {err.format_message()}") from err


#: The longest command line CALL dpsql splits (a real one is a few hundred characters).
MAX_COMMAND = 64 * 1024


def _arguments(command: str) -> list[str]:
    """The command line, split as a shell would (the command checks its options).

    A line over :data:`MAX_COMMAND` is refused unsplit: splitting is pure Python
    that no statement timeout or cancel stops.
    """
    if len(command) > MAX_COMMAND:
        raise ConfigurationError(f"CALL dpsql: the command is {len(command):,} characters long; "
                                 f"at most {MAX_COMMAND:,} are read")
    try:
        return shlex.split(command)
    except ValueError as err:
        raise ConfigurationError(f"CALL dpsql: cannot split {command!r}: {err}") from err


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
