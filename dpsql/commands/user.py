"""``dpsql user``: passwords for the SQL server (SCRAM-SHA-256 verifiers in the store)."""

from __future__ import annotations

import click

from dpsql.commands import render
from dpsql.commands.common import admin_command, cli, db_option, json_option
from dpsql.commands.door import Door, Text
from dpsql.errors import ConfigurationError
from dpsql.passwords import DEFAULT_ITERATIONS


@cli.group()
def user() -> None:
    """Passwords for SQL clients of dpsql serve.

    A user must be declared in the store's active policy; the store keeps only a
    SCRAM-SHA-256 verifier, never the password. On a served store they run in
    the server, and a new password works at once.
    """


@admin_command(user, "add", actor=None)
@click.argument("name")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (for scripts).")
@click.option("--iterations", type=click.IntRange(min=DEFAULT_ITERATIONS),
              default=DEFAULT_ITERATIONS, show_default=True,
              help="PBKDF2 iterations of the verifier (clients pay this once per login).")
@db_option
@json_option
def user_add(door: Door, name: str, password_stdin: bool, iterations: int, db: str,
             as_json: bool) -> None:
    """Set (or replace) the SQL password of NAME, a user of the active policy.

    \b
    Examples:
      dpsql user add alice                       # prompts twice
      echo "$PASSWORD" | dpsql user add alice --password-stdin
    """  # noqa: D301 (click needs a real \b)
    from dpsql.admin.policy import show_policy
    from dpsql.admin.users import add_user

    if name not in door.call(show_policy).summary.users:  # before asking for a password
        raise ConfigurationError(f"no user {name!r} in the store's policy; declare it under "
                                 "users: and run dpsql policy apply first")
    password = door.password(from_stdin=password_stdin)
    added = door.call(add_user, name=name, password=password, iterations=iterations)
    if as_json:
        door.json(added.as_dict())
    else:
        door.out(f"password set for {added.user}; once dpsql serve runs, connect with: psql "
                 f"\"host=HOST port=5433 user={added.user} dbname={added.database}\" (the port "
                 "dpsql serve prints)")


@admin_command(user, "remove", actor=None)
@click.argument("name")
@db_option
@json_option
def user_remove(door: Door, name: str, db: str, as_json: bool) -> None:
    """Remove NAME's SQL password (the user can no longer connect to dpsql serve)."""
    from dpsql.admin.users import remove_user

    removed = door.call(remove_user, name=name)
    if as_json:
        door.json(removed.as_dict())
        return
    if not removed.removed:
        raise ConfigurationError(f"{name} has no SQL password; nothing to remove")
    door.out(f"removed the SQL password of {name}")


@admin_command(user, "list", actor=None)
@db_option
@json_option
def user_list(door: Door, db: str, as_json: bool) -> None:
    """List users who have an SQL password, with their role in the active policy."""
    from dpsql.admin.users import list_users

    listed = door.call(list_users)
    if as_json:
        door.json(listed.as_dict()["users"])
        return
    if not listed.users:
        door.out("no SQL users yet; add one with: dpsql user add NAME")
        return
    door.show(Text([render.table([[u.user, u.role or "(not in policy: cannot log in)",
                                   u.created_at] for u in listed.users],
                                 ["user", "role", "password set"])]))
