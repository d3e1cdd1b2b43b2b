"""``dpsql query``: SQL statements answered with differential privacy, and their text."""

from __future__ import annotations

import csv
import io
import re
from typing import IO, TYPE_CHECKING, Any

import click

from dpsql.commands import render
from dpsql.commands.common import (
    CallerOption,
    LocalFile,
    admin_command,
    cli,
    db_option,
    json_option,
)
from dpsql.commands.door import Door, Text
from dpsql.errors import ConfigurationError, DPSQLError, QueryRejected

if TYPE_CHECKING:
    import pyarrow as pa

    from dpsql.admin.query import QueryResult

FORMATS = ("table", "csv", "json")


def user_option(f: Any) -> Any:
    """--user U: who asks (default: $DPSQL_USER)."""
    return click.option("--user", "-u", "user", cls=CallerOption, envvar="DPSQL_USER",
                        required=True, metavar="USER",
                        help="Ask as this user (default: $DPSQL_USER).")(f)


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


def answer_text(result: QueryResult, fmt: str = "table") -> Text:
    """An answer's rows (table or CSV), with its notice (or a SET's status) for stderr."""
    body = render.arrow_table(result.table) if fmt == "table" else as_csv(result.table)
    notes = [result.notice, result.warning] if result.notice else \
        [result.status] if result.kind == "set" else []
    return Text([body] if body else [], [n for n in notes if n])


def show(door: Door, result: QueryResult, fmt: str = "table") -> None:
    """Show an answer: JSON, or its rows (table or CSV) with the notice beside them."""
    if fmt == "json":
        door.json(result.as_dict())
    else:
        door.show(answer_text(result, fmt))


def output_format(fmt: str | None, as_json: bool) -> str:
    """The format asked for by --format and its alias --json."""
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json means --format json; drop one of --json and --format {fmt}")
    return "json" if as_json else fmt or "table"


@admin_command(cli, "query", actor="user")
@click.argument("sql", required=False)
@click.option("-f", "--file", "script", type=LocalFile("r", encoding="utf-8",
              errors="surrogateescape"), default=None, metavar="FILE",
              help="Answer the statements of FILE in order (- reads standard input).")
@db_option
@user_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output: an aligned table (default), CSV of the rows, or JSON with cost "
                   "and accuracy.")
@click.option("--epsilon", type=str, default=None, metavar="X",
              help="Privacy cost of each statement, as epsilon (SET dpsql.epsilon for this "
                   "command; default: the policy's default_query).")
@json_option
def query_cmd(door: Door, sql: str | None, script: IO[str] | None, db: str, user: str,
              fmt: str | None, epsilon: str | None, as_json: bool) -> None:
    """Answer SQL statements with differential privacy: SQL, or those of a file.

    \b
    Examples:
      dpsql query "SELECT sex, COUNT(*) FROM adult GROUP BY sex" --user alice
      dpsql query "SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 0.5)
                   AVG(age) FROM adult WHERE hours_per_week > 40" --user alice
      dpsql query "EXPLAIN PRIVACY SELECT SUM(capital_gain) FROM adult" --user alice
      dpsql query "SELECT AVG(age) FROM adult" --user alice --epsilon 0.5
      dpsql query "SHOW dpsql.budget" --user alice --json
      dpsql query -f report.sql --user alice --format csv > report.csv

    The answer's rows go to stdout; its cost and your remaining budget to stderr.
    With -f, statements end with ';' and run in order in one session (a SET
    lasts to the end of the file); a failed statement is reported with its
    number and line and the others still run; the exit code is that of the
    first failure. --format json then prints a list, one entry per statement.
    """  # noqa: D301 (click needs a real \b)
    from dpsql.admin.query import query

    fmt = output_format(fmt, as_json)
    if (sql is None) == (script is None):
        raise click.UsageError("give one SQL statement or -f FILE (not both)")
    if epsilon is not None:
        door.call(query, sql=f"SET dpsql.epsilon = {_epsilon_literal(epsilon)}")
    if script is not None:
        failed = run_script(door, script.read(), script.name, fmt)
        if failed:
            raise click.exceptions.Exit(failed)
        return
    assert sql is not None
    result = door.call(query, sql=sql)
    show(door, result, fmt)
    if result.kind == "set" and fmt != "json" and not door.keeps_session:
        door.err("note: a SET lasts for this one command; use dpsql shell, -f FILE (or the "
                 "GoogleSQL OPTIONS clause) to keep it for the next queries")


def _epsilon_literal(text: str) -> str:
    """``--epsilon``'s value as a SQL number literal: checked first, never pasted as typed."""
    from dpsql.privacy import check_epsilon, to_fraction

    if not re.fullmatch(r"[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?|\.[0-9]+([eE][-+]?[0-9]+)?",
                        text.strip()):
        raise click.BadParameter(f"{text!r} is not a number", param_hint="--epsilon")
    value = check_epsilon(to_fraction(text.strip(), "--epsilon"))
    if value > 1e6:  # no policy grants more; and a float must hold it
        raise click.BadParameter(f"{text} is larger than any budget", param_hint="--epsilon")
    return format(float(value), ".17g")


def run_script(door: Door, text: str, source: str, fmt: str) -> int:
    """Answer each statement of ``text`` in order; the exit code of the first failure, or 0."""
    from dpsql.admin.query import query

    statements = numbered_statements(text)
    if not statements:
        raise ConfigurationError(f"{source} holds no SQL statement")
    results: list[Any] = []
    first_failure, printed = 0, False
    for number, (line, sql) in enumerate(statements, start=1):
        place = {"statement": number, "line": line}
        try:
            result = door.call(query, sql=sql)
        except DPSQLError as err:
            first_failure = first_failure or err.exit_code
            results.append({**place, "error": err.code, "message": str(err)})
            if fmt != "json":
                door.err(render.error(f"statement {number} (line {line} of {source}): {err}"))
            continue
        if fmt == "json":
            results.append({**place, **result.as_dict()})
            continue
        if printed and result.table.num_columns:
            door.out()  # a blank line between result sets
        printed = printed or bool(result.table.num_columns)
        show(door, result, fmt)
    if fmt == "json":
        door.json(results)
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
