"""Analyst commands: ``dpsql query`` (one statement) and ``dpsql shell`` (interactive)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
from sqlglot.tokens import TokenType

from dpsql.cli.common import cli, db_option, json_option
from dpsql.cli.output import emit_json, table
from dpsql.errors import DPSQLError, QueryRejected
from dpsql.query.dialect import tokenize
from dpsql.session import Session, connect

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
_SHORTCUTS = {"\\budget": "SHOW dpsql.budget", "\\datasets": "SHOW dpsql.datasets",
              "\\released": "SHOW dpsql.released", "\\set": "SHOW ALL"}


def user_option(f: Any) -> Any:
    """--user U: who asks (default: $DPSQL_USER)."""
    return click.option("--user", "-u", "user", envvar="DPSQL_USER", required=True,
                        metavar="USER", help="Ask as this user (default: $DPSQL_USER).")(f)


def render(answer: Any) -> str:
    """An answer's rows as an aligned text table (numbers right-aligned)."""
    data: pa.Table = answer.table
    if data.num_columns == 0:
        return ""
    right = [i for i, f in enumerate(data.schema)
             if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    rows = [list(r.values()) for r in data.to_pylist()]
    return table(rows, data.column_names, right=right)


def show(answer: Any, delta: float | None, as_json: bool) -> None:
    """Print an answer: JSON, or the table with the notice on stderr."""
    if as_json:
        emit_json(answer.as_dict(delta))
        return
    text = render(answer)
    if text:
        click.echo(text)
    if answer.notice:
        click.echo(answer.notice, err=True)
    elif answer.kind == "set":
        click.echo(answer.status, err=True)


@cli.command("query")
@click.argument("sql")
@db_option
@user_option
@json_option
def query_cmd(sql: str, db: str, user: str, as_json: bool) -> None:
    """Answer one SQL statement with differential privacy.

    \b
    Examples:
      dpsql query "SELECT sex, COUNT(*) FROM adult GROUP BY sex" --user alice
      dpsql query "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5)
                   AVG(age) FROM adult WHERE hours_per_week > 40" --user alice
      dpsql query "EXPLAIN PRIVACY SELECT SUM(capital_gain) FROM adult" --user alice
      dpsql query "SHOW dpsql.budget" --user alice --json

    The answer's rows go to stdout; its cost and your remaining budget to stderr.
    """  # noqa: D301 (click needs a real \b)
    with connect(db, user) as session:
        answer = session.sql(sql)
        show(answer, session.policy.delta, as_json)
        if answer.kind == "set" and not as_json:
            click.echo("note: a SET lasts for this one command; use dpsql shell (or the "
                       "GoogleSQL OPTIONS clause) to keep it for the next queries", err=True)


@cli.command("shell")
@db_option
@user_option
def shell_cmd(db: str, user: str) -> None:
    r"""An interactive SQL shell (history, \budget, \explain, \help, \q).

    Options set with SET dpsql.<option> last for the session.
    """
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
        _load_history()
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
        _save_history()

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
        except DPSQLError as err:
            click.echo(click.style("error: ", fg="red", bold=True) + str(err), err=True)
            return
        except Exception as err:  # a bug: say so and keep the session
            if os.environ.get("DPSQL_DEBUG"):
                raise
            click.echo(click.style("error: ", fg="red", bold=True) + f"internal error "
                       f"({type(err).__name__}); this is a bug in dpsql, please report it "
                       "with your statement", err=True)
            return
        show(answer, self.session.policy.delta, as_json=False)


def split_statements(text: str) -> tuple[list[str], str]:
    """The complete statements in ``text`` (each ending at a ';') and the unfinished rest.

    Semicolons inside strings, quoted names and comments do not end a statement;
    text with an unterminated string or comment is unfinished.
    """
    try:
        tokens = tokenize(text)
    except QueryRejected:
        return [], text
    statements, start = [], 0
    for token in tokens:
        if token.token_type == TokenType.SEMICOLON:
            statement = text[start:token.end + 1]
            if statement.strip() != ";":
                statements.append(statement)
            start = token.end + 1
    rest = text[start:]
    return statements, rest if rest.strip() else ""


def _load_history() -> None:
    try:
        import readline

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
