"""``dpsql user``: passwords for the SQL server (SCRAM-SHA-256 verifiers in the store)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from dpsql.cli.common import cli, db_option, json_option
from dpsql.cli.output import emit_json, table
from dpsql.errors import ConfigurationError
from dpsql.server import auth


@cli.group()
def user() -> None:
    """Passwords for SQL clients of dpsql serve.

    A user must be declared in the store's active policy; the store keeps only a
    SCRAM-SHA-256 verifier, never the password. On a served store they run in
    the server, and a new password works at once.
    """


def _read_password(from_stdin: bool) -> str:
    if from_stdin:
        line = sys.stdin.readline()
        if not line:
            raise ConfigurationError("--password-stdin: no password on standard input")
        return line.rstrip("\r\n")
    return str(click.prompt("password", hide_input=True, confirmation_prompt=True))


@user.command("add")
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (for scripts).")
@click.option("--iterations", type=click.IntRange(min=auth.DEFAULT_ITERATIONS),
              default=auth.DEFAULT_ITERATIONS, show_default=True,
              help="PBKDF2 iterations of the verifier (clients pay this once per login).")
@db_option
@json_option
def user_add(name: str, password_stdin: bool, iterations: int, db: str, as_json: bool) -> None:
    """Set (or replace) the SQL password of NAME, a user of the active policy.

    \b
    Examples:
      dpsql user add alice                       # prompts twice
      echo "$PASSWORD" | dpsql user add alice --password-stdin
    """  # noqa: D301 (click needs a real \b)
    from dpsql.policies import active_policy
    from dpsql.services import open_store

    with open_store(db) as store:
        if name not in active_policy(store).users:
            raise ConfigurationError(f"no user {name!r} in the store's policy; declare it under "
                                     "users: and run dpsql policy apply first")
        password = _read_password(password_stdin)
        auth.set_password(store, name, password, iterations=iterations)
    if as_json:
        emit_json({"user": name, "set": True})
    else:
        click.echo(f"password set for {name}; once dpsql serve runs, connect with: psql "
                   f"\"host=HOST port=5433 user={name} dbname={Path(db).stem}\" (the port "
                   "dpsql serve prints)")


@user.command("remove")
@click.argument("name")
@db_option
@json_option
def user_remove(name: str, db: str, as_json: bool) -> None:
    """Remove NAME's SQL password (the user can no longer connect to dpsql serve)."""
    from dpsql.services import open_store

    with open_store(db) as store:
        found = auth.remove_user(store, name)
    if as_json:
        emit_json({"user": name, "removed": found})
        return
    if not found:
        raise ConfigurationError(f"{name} has no SQL password; nothing to remove")
    click.echo(f"removed the SQL password of {name}")


@user.command("list")
@db_option
@json_option
def user_list(db: str, as_json: bool) -> None:
    """List users who have an SQL password, with their role in the active policy."""
    from dpsql.services import open_store

    with open_store(db) as store:
        rows = auth.list_users(store)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no SQL users yet; add one with: dpsql user add NAME")
        return
    click.echo(table([[r["user"], r["role"] or "(not in policy: cannot log in)", r["created_at"]]
                      for r in rows], ["user", "role", "password set"]))
