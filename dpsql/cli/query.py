"""``dpsql shell``: an interactive SQL session at the terminal (the CLI's own command).

``dpsql query`` (statements answered one by one, by any front door) is declared
in :mod:`dpsql.commands.query`; the shell keeps one session open in this
process, so it runs in the terminal only.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dpsql.cli import sigint
from dpsql.cli.complete import Completer
from dpsql.commands.common import cli, db_option
from dpsql.commands.query import split_statements, user_option
from dpsql.commands.render import arrow_table
from dpsql.errors import DPSQLError

if TYPE_CHECKING:  # the session loads with the command that runs
    from dpsql.session import Session

HISTORY = Path(os.environ.get("DPSQL_HISTORY", "~/.dpsql_history")).expanduser()
SHELL_HELP = """\
Statements end with ';' and may span lines. Besides SQL:
  \\budget            your remaining budget (same as SHOW dpsql.budget)
  \\explain QUERY     cost, noise and expected error of QUERY, without spending budget
  \\datasets          datasets, their columns and public domains
  \\released          released synthetic tables (free to query as released.<name>)
  \\set               dpsql options in force (SET dpsql.epsilon = 0.5; SET dpsql.ci = 0.95)
  \\help              this text
  \\q                 quit (also Ctrl-D)
See docs/sql.md for the SQL dpsql accepts."""
BACKSLASH_COMMANDS = ("\\budget", "\\explain", "\\datasets", "\\released", "\\set", "\\help",
                      "\\q")
_SHORTCUTS = {"\\budget": "SHOW dpsql.budget", "\\datasets": "SHOW dpsql.datasets",
              "\\released": "SHOW dpsql.released", "\\set": "SHOW ALL"}


def render(answer: Any) -> str:
    """An answer's rows as an aligned text table (numbers right-aligned)."""
    return arrow_table(answer.table)


def show(answer: Any) -> None:
    """Print an answer's rows, with its notice (or a SET's status) on stderr."""
    text = render(answer)
    if text:
        click.echo(text)
    if answer.notice:
        click.echo(answer.notice, err=True)
        if answer.warning:
            click.echo(answer.warning, err=True)
    elif answer.kind == "set":
        click.echo(answer.status, err=True)


@cli.command("shell")
@db_option
@user_option
def shell_cmd(db: str, user: str) -> None:
    r"""An interactive SQL shell (history, \budget, \explain, \help, \q).

    Options set with SET dpsql.<option> last for the session. Tab completes
    keywords, datasets, columns, released tables and options; Ctrl-C clears the
    line at the prompt and stops a running statement (exit 130); Ctrl-D quits.
    """
    from dpsql.server.admin import refuse_if_served
    from dpsql.session import connect

    refuse_if_served(db, "dpsql shell cannot run through dpsql serve; connect with psql instead")
    sigint.install(interactive=True)
    if isinstance(sys.stdin, io.TextIOWrapper):  # bad bytes reach the statement, refused there
        sys.stdin.reconfigure(errors="surrogateescape")
    with connect(db, user) as session:
        Shell(session).loop()


class Shell:
    """A read-eval-print loop over one session."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def loop(self) -> None:
        """Read statements until quit or end of input; errors are printed, not raised."""
        _load_history(Completer(self.session, BACKSLASH_COMMANDS))
        try:
            self._read_eval_print()
        finally:  # also when Ctrl-C stops a statement and ends the shell
            _save_history()

    def _read_eval_print(self) -> None:
        click.echo(f"dpsql shell: {self.session.user} on {self.session.store.path.name}. "
                   "Type \\help for help, \\q to quit.")
        buffer = ""
        while True:
            try:
                line = input("dpsql> " if not buffer.strip() else "  ...> ")
            except EOFError:
                if buffer.strip():  # the last statement needs no ';'
                    self.run(buffer)
                click.echo()
                break
            except KeyboardInterrupt:
                sigint.handled()
                click.echo()
                buffer = ""
                continue
            stripped = line.strip()
            if not buffer.strip() and stripped.startswith("\\"):
                if not self.command(stripped):
                    break
                continue
            buffer += line + "\n"
            if ";" not in line:  # only a ';' can end a statement: no need to read it yet
                continue
            statements, buffer = split_statements(buffer)
            for statement in statements:
                self.run(statement)

    def command(self, line: str) -> bool:
        """Run a backslash command; False means quit."""
        word, _, rest = line.partition(" ")
        if word in ("\\q", "\\quit"):
            return False
        if word in ("\\help", "\\h", "\\?"):
            click.echo(SHELL_HELP)
        elif word == "\\explain":
            if rest.strip():
                self.run("EXPLAIN PRIVACY " + rest.strip())
            else:
                click.echo("usage: \\explain SELECT ...", err=True)
        elif word in _SHORTCUTS:
            self.run(_SHORTCUTS[word])
        else:
            click.echo(f"unknown command {word}; \\help lists them", err=True)
        return True

    def run(self, sql: str) -> None:
        """Answer one statement and print it."""
        try:
            answer = self.session.sql(sql)
        except Exception as err:
            if sigint.seen():  # Ctrl-C stopped the statement (DuckDB says RuntimeError)
                raise KeyboardInterrupt from err
            if not isinstance(err, DPSQLError) and os.environ.get("DPSQL_DEBUG"):
                raise
            message = str(err) if isinstance(err, DPSQLError) else (  # a bug: keep the session
                f"internal error ({type(err).__name__}); this is a bug in dpsql, please "
                "report it with your statement")
            click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
            return
        show(answer)


def _load_history(completer: Completer | None = None) -> None:
    try:
        import readline

        if completer is not None:
            completer.install(readline)
        if HISTORY.exists():
            readline.read_history_file(str(HISTORY))
        readline.set_history_length(1000)
    except (ImportError, OSError):
        pass


def _save_history() -> None:
    try:
        import readline

        readline.write_history_file(str(HISTORY))
    except (ImportError, OSError):
        pass
