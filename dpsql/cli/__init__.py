"""The ``dpsql`` command line: administration, queries, releases and the demo.

Every command on a store takes ``--db PATH`` (default: $DPSQL_DB). Output is a
table on a terminal and JSON with ``--json``. Exit codes follow the error
class (see :mod:`dpsql.errors`).
"""

from __future__ import annotations

import os
import sys

import click

from dpsql.cli.common import cli
from dpsql.errors import DPSQLError


def _load_commands() -> None:
    import dpsql.cli.serve  # dpsql serve (its own line keeps merges easy)
    import dpsql.cli.user  # noqa: F401  (dpsql user)
    from dpsql.cli import (  # noqa: F401  (registers commands)
        admin,
        demo,
        query,
        release,
    )


def main() -> None:
    """Entry point: run the CLI and map errors to messages and exit codes."""
    _load_commands()
    as_json = "--json" in sys.argv
    try:
        cli.main(standalone_mode=False)
    except DPSQLError as err:
        _fail(err.code, str(err), err.exit_code, as_json)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as err:  # a bug: say so, without a stack trace for the user
        if os.environ.get("DPSQL_DEBUG"):
            raise
        _fail("internal_error", f"internal error ({type(err).__name__}); this is a bug in "
              "dpsql, please report it with the command you ran", 70, as_json)


def _fail(code: str, message: str, exit_code: int, as_json: bool) -> None:
    if as_json:
        from dpsql.cli.output import emit_json

        emit_json({"error": code, "message": message})
    click.echo(click.style("error: ", fg="red", bold=True) + message, err=True)
    sys.exit(exit_code)


__all__ = ["cli", "main"]
