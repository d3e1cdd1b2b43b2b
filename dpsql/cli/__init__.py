"""The ``dpsql`` command line: administration, queries, releases and the demo.

Every command on a store takes ``--db PATH`` (default: $DPSQL_DB). Output is a
table on a terminal and JSON with ``--json``. Exit codes follow the error
class (see :mod:`dpsql.errors`); an operating-system failure (permission
denied, disk full) exits 74 and Ctrl-C exits 130. Command modules import
DuckDB, Arrow and the rest inside their commands, so ``--help`` and
``--version`` answer at once.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

import click

from dpsql.cli import sigint
from dpsql.commands.common import cli
from dpsql.errors import OS_ERROR_EXIT, DPSQLError, os_failure
from dpsql.files import private_umask

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _load_commands() -> None:
    """Declare every command: those of any front door, then the terminal's own."""
    from dpsql import commands
    from dpsql.cli import demo, init, query, serve  # noqa: F401  (registers commands)
    from dpsql.cli.door import Terminal
    from dpsql.commands.door import set_terminal

    commands.load()
    set_terminal(Terminal)


def main() -> None:
    """Entry point: run the CLI (through ``dpsql serve`` when it owns the store)."""
    sigint.install()
    private_umask()  # stores, exports, drafts and reports: the owner's only (dpsql.files)
    run(sys.argv[1:])


def run(args: list[str]) -> None:
    """Run the command line ``args``, mapping errors to messages and exit codes (SystemExit).

    A command on a store that ``dpsql serve`` owns sends its operations there
    (:mod:`dpsql.cli.door`); it prints, prompts and writes files here.
    """
    _load_commands()
    as_json = _wants_json(args)
    try:
        code = cli.main(args=args, prog_name="dpsql", standalone_mode=False)
        if isinstance(code, int) and code:  # a script's first failure (dpsql query -f)
            sys.exit(code)
    except DPSQLError as err:
        if sigint.seen():  # the failure Ctrl-C caused (a release stopped mid-way)
            _interrupted(str(err))
        _fail(err.code, str(err), err.exit_code, as_json)
    except click.exceptions.Abort as err:  # click turns Ctrl-C into Abort
        if isinstance(err.__context__, KeyboardInterrupt):
            _interrupted()
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except BrokenPipeError:  # the reader went away (dpsql audit | head): nothing to say
        _drop_stdout()
        sys.exit(1)
    except Exception as err:
        if sigint.seen():  # Ctrl-C in disguise (DuckDB's "Query interrupted")
            _interrupted()
        io_failure = os_failure(err)
        if io_failure:
            _fail("os_error", io_failure, OS_ERROR_EXIT, as_json)
        if os.environ.get("DPSQL_DEBUG"):  # a bug: say so, without a stack trace for the user
            raise
        _fail("internal_error", f"internal error ({type(err).__name__}); this is a bug in "
              "dpsql, please report it with the command you ran", 70, as_json)


def _interrupted(detail: str = "") -> NoReturn:
    click.echo("interrupted" + (f": {detail}" if detail else ""), err=True)
    sys.exit(EXIT_INTERRUPTED)


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for JSON (--json, --format json or --format=json)."""
    pairs = zip(args, [*args[1:], ""], strict=True)
    return "--json" in args or "--format=json" in args or ("--format", "json") in pairs


def _fail(code: str, message: str, exit_code: int, as_json: bool) -> None:
    try:
        if as_json:
            from dpsql.commands.render import json_text

            click.echo(json_text({"error": code, "message": message}))
        sys.stdout.flush()
    except OSError:  # stdout itself failed (a full disk): the message still goes to stderr
        _drop_stdout()
    click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
    sys.exit(exit_code)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that what it still buffers cannot fail again at exit."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


__all__ = ["cli", "main", "run"]
