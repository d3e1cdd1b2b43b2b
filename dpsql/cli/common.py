"""The root click group and the options shared by commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from dpsql import __version__

F = TypeVar("F", bound=Callable[..., Any])


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpsql")
def cli() -> None:
    """dpsql: differentially private SQL answers and synthetic data over DuckDB.

    Administrators create a store from sensitive tables and a YAML policy, manage
    budgets and release synthetic tables; analysts ask aggregate SQL queries and
    read released tables. Every store command takes --db (default: $DPSQL_DB).
    """


def db_option(f: F) -> F:
    """--db PATH, defaulting to $DPSQL_DB."""
    return click.option(
        "--db", "db", envvar="DPSQL_DB", required=True, metavar="PATH",
        type=click.Path(dir_okay=False, readable=False),  # an unreadable store: exit 74
        help="The store (a DuckDB file). Default: $DPSQL_DB.",
    )(f)


def as_option(f: F) -> F:
    """--as USER: who acts (default $DPSQL_USER, else the policy's first admin)."""
    return click.option(
        "--as", "actor", envvar="DPSQL_USER", metavar="USER", default=None,
        help="Act as this user (default: $DPSQL_USER, else the policy's first admin).",
    )(f)


def json_option(f: F) -> F:
    """--json: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def default_actor(actor: str | None, db: str) -> str:
    """The acting user: the one given, else the first admin of the store's policy."""
    if actor:
        return actor
    from dpsql.store import Store

    with Store.open(db) as store:
        admins = [u.name for u in store.active_policy().users.values() if u.role == "admin"]
    return admins[0]
