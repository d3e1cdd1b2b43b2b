"""Analyst commands: ``dpsql query`` (statements) and ``dpsql shell`` (interactive)."""

from __future__ import annotations

import csv
import io
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from dpsql.cli import sigint
from dpsql.cli.common import CallerOption, LocalFile, cli, db_option, json_option
from dpsql.cli.complete import Completer
from dpsql.cli.output import arrow_table, emit_json
from dpsql.errors import ConfigurationError, DPSQLError, QueryRejected

if TYPE_CHECKING:  # Arrow, sqlglot and the session load with the command that runs
    import pyarrow as pa

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
FORMATS = ("table", "csv", "json")
_SHORTCUTS = {"\\budget": "SHOW dpsql.budget", "\\datasets": "SHOW dpsql.datasets",
              "\\released": "SHOW dpsql.released", "\\set": "SHOW ALL"}


def user_option(f: Any) -> Any:
    """--user U: who asks (default: $DPSQL_USER)."""
    return click.option("--user", "-u", "user", cls=CallerOption, envvar="DPSQL_USER",
                        required=True, metavar="USER",
                        help="Ask as this user (default: $DPSQL_USER).")(f)


def render(answer: Any) -> str:
    """An answer's rows as an aligned text table (numbers right-aligned)."""
    return arrow_table(answer.table)


def as_csv(data: pa.Table) -> str:
    """An answer's rows as plain CSV: a header line, then one line per row."""
    if data.num_columns == 0:
        return ""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(data.column_names)
    writer.writerows([_csv_cell(v) for v in row.values()] for row in data.to_pylist())
    return out.getvalue().rstrip("\n")


def _csv_cell(value: Any) -> Any:
    return str(value).lower() if isinstance(value, bool) else value


def show(answer: Any, delta: float | None, fmt: str = "table") -> None:
    """Print an answer: JSON, or its rows (table or CSV) with the notice on stderr."""
    if fmt == "json":
        emit_json(answer.as_dict(delta))
        return
    text = render(answer) if fmt == "table" else as_csv(answer.table)
    if text:
        click.echo(text)
    if answer.notice:
        click.echo(answer.notice, err=True)
        if answer.warning:
            click.echo(answer.warning, err=True)
    elif answer.kind == "set":
        click.echo(answer.status, err=True)


def output_format(fmt: str | None, as_json: bool) -> str:
    """The format asked for by --format and its alias --json."""
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json means --format json; drop one of --json and --format {fmt}")
    return "json" if as_json else fmt or "table"


@cli.command("query")
@click.argument("sql", required=False)
@click.option("-f", "--file", "script", type=LocalFile("r", encoding="utf-8",
              errors="surrogateescape"), default=None, metavar="FILE",
              help="Answer the statements of FILE in order (- reads standard input).")
@db_option
@user_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output: an aligned table (default), CSV of the rows, or JSON with cost "
                   "and accuracy.")
@json_option
def query_cmd(sql: str | None, script: IO[str] | None, db: str, user: str, fmt: str | None,
              as_json: bool) -> None:
    """Answer SQL statements with differential privacy: SQL, or those of a file.

    \b
    Examples:
      dpsql query "SELECT sex, COUNT(*) FROM adult GROUP BY sex" --user alice
      dpsql query "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5)
                   AVG(age) FROM adult WHERE hours_per_week > 40" --user alice
      dpsql query "EXPLAIN PRIVACY SELECT SUM(capital_gain) FROM adult" --user alice
      dpsql query "SHOW dpsql.budget" --user alice --json
      dpsql query -f report.sql --user alice --format csv > report.csv

    The answer's rows go to stdout; its cost and your remaining budget to stderr.
    With -f, statements end with ';' and run in order in one session (a SET
    lasts to the end of the file); a failed statement is reported with its
    number and line and the others still run; the exit code is that of the
    first failure. --format json then prints a list, one entry per statement.
    """  # noqa: D301 (click needs a real \b)
    from dpsql.session import connect

    fmt = output_format(fmt, as_json)
    if (sql is None) == (script is None):
        raise click.UsageError("give one SQL statement or -f FILE (not both)")
    with connect(db, user) as session:
        if script is not None:
            failed = run_script(session, script.read(), script.name, fmt)
            if failed:
                sys.exit(failed)
            return
        assert sql is not None
        answer = session.sql(sql)
        show(answer, session.policy.delta, fmt)
        if answer.kind == "set" and fmt != "json":
            click.echo("note: a SET lasts for this one command; use dpsql shell, -f FILE (or "
                       "the GoogleSQL OPTIONS clause) to keep it for the next queries", err=True)


def run_script(session: Session, text: str, source: str, fmt: str) -> int:
    """Answer each statement of ``text`` in order; the exit code of the first failure, or 0."""
    statements = numbered_statements(text)
    if not statements:
        raise ConfigurationError(f"{source} holds no SQL statement")
    delta = session.policy.delta
    results: list[dict[str, Any]] = []
    first_failure, printed = 0, False
    for number, (line, sql) in enumerate(statements, start=1):
        place = {"statement": number, "line": line}
        try:
            answer = session.sql(sql)
        except DPSQLError as err:
            first_failure = first_failure or err.exit_code
            results.append({**place, "error": err.code, "message": str(err)})
            if fmt != "json":
                click.echo(click.style("error: ", fg="red", bold=True) + f"statement {number} "
                           f"(line {line} of {source}): {err}", err=True)
            continue
        if fmt == "json":
            results.append({**place, **answer.as_dict(delta)})
            continue
        if printed and answer.table.num_columns:
            click.echo()  # a blank line between result sets
        printed = printed or bool(answer.table.num_columns)
        show(answer, delta, fmt)
    if fmt == "json":
        emit_json(results)
    return first_failure


def numbered_statements(text: str) -> list[tuple[int, str]]:
    """The statements of a script with the line each starts on (the last needs no ';')."""
    statements, rest = split_statements(text)
    if rest.strip():
        statements.append(rest)
    out, offset = [], 0
    for statement in statements:
        begin = offset + len(statement) - len(statement.lstrip())
        out.append((text.count("\n", 0, begin) + 1, statement.strip()))
        offset += len(statement)
    return out


@cli.command("shell")
@db_option
@user_option
def shell_cmd(db: str, user: str) -> None:
    r"""An interactive SQL shell (history, \budget, \explain, \help, \q).

    Options set with SET dpsql.<option> last for the session. Tab completes
    keywords, datasets, columns, released tables and options; Ctrl-C clears the
    line at the prompt and stops a running statement (exit 130); Ctrl-D quits.
    """
    from dpsql.session import connect

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
        show(answer, self.session.policy.delta)


def split_statements(text: str) -> tuple[list[str], str]:
    """The complete statements in ``text`` (each ending at a ';') and the unfinished rest.

    Semicolons inside strings, quoted names and comments do not end a statement;
    text with an unterminated string or comment is unfinished.
    """
    from sqlglot.tokens import TokenType

    from dpsql.query.dialect import tokenize

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
