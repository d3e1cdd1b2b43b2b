"""The root click group and the options shared by commands."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from dpsql import __version__
from dpsql.errors import AccessDenied

F = TypeVar("F", bound=Callable[..., Any])


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpsql")
def cli() -> None:
    """dpsql: differentially private SQL answers and synthetic data over DuckDB.

    Administrators create a store from sensitive tables and a YAML policy, manage
    budgets and release synthetic tables; analysts ask aggregate SQL queries and
    read released tables. Every store command takes --db (default: $DPSQL_DB).
    """


@dataclass
class Caller:
    """Who runs a command in a process not their own (``dpsql serve`` running it for them).

    Their working directory resolves relative paths and their environment gives
    the options' defaults ($DPSQL_DB, $DPSQL_USER), so a command means the same
    wherever it runs. A command run locally has no Caller: the process is theirs.

    A ``remote`` caller is a SQL administrator (``CALL dpsql``, the console), not
    the server's operating-system user: its store and user are fixed (``--db``,
    ``--as`` and ``--user`` refused) and it may name no file on the server
    machine at all. A local caller (the admin socket: the same uid) may name
    files, but never the served ``store``'s own files.
    """

    cwd: str
    env: Mapping[str, str] = field(default_factory=dict)
    error: Exception | None = None  # the dpsql error that ended the command, if one did
    remote: bool = False
    store: str | None = None  # the served store's path


def _caller(ctx: click.Context | None = None) -> Caller | None:
    ctx = ctx or click.get_current_context(silent=True)
    return ctx.find_object(Caller) if ctx is not None else None


def here(path: str, ctx: click.Context | None = None, *, store: bool = False) -> str:
    """``path`` as the caller means it: relative to their working directory (- stays -).

    ``store``: the path is the --db option's default, the served store itself.
    """
    caller = _caller(ctx)
    if caller is not None and caller.remote and not store:
        raise AccessDenied(f"CALL dpsql and the console read and write no file of the server "
                           f"machine ({path}); run this command in a shell there")
    if caller is None or path == "-":
        return path
    resolved = os.path.join(caller.cwd, os.path.expanduser(path))
    if not store and caller.store is not None and _is_store_file(resolved, caller.store):
        raise AccessDenied(f"{path} is a file of the served store {caller.store}; a command "
                           "run through dpsql serve may not read or write it")
    return resolved


def _is_store_file(path: str, store: str) -> bool:
    """Whether ``path`` names the store at ``store`` or its WAL (by identity, or by name)."""
    target = Path(path).resolve()
    for own in (Path(store), Path(store + ".wal")):
        if target == own.resolve():
            return True
        with contextlib.suppress(OSError):
            if os.path.samefile(target, own):
                return True
    return False


class CallerOption(click.Option):
    """An option whose environment variable is read from the caller's environment.

    These options say who acts on which store: a remote caller may not give them.
    """

    def consume_value(self, ctx: click.Context,
                      opts: Mapping[str, Any]) -> tuple[Any, ParameterSource]:
        """The value and its source; refused on a remote caller's command line."""
        value, source = super().consume_value(ctx, opts)
        caller = _caller(ctx)
        if caller is not None and caller.remote and source == ParameterSource.COMMANDLINE:
            raise AccessDenied(f"CALL dpsql runs as you on the served store; drop {self.opts[0]}")
        return value, source

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        """The variable's value where the caller runs the command."""
        caller = _caller(ctx)
        if caller is None or not isinstance(self.envvar, str):
            return super().resolve_envvar_value(ctx)
        return caller.env.get(self.envvar) or None


class LocalPath(click.Path):
    """A path relative to the caller's working directory."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """Resolve against the caller's directory, then check as click.Path does."""
        store = isinstance(param, CallerOption)  # --db: a remote caller's is its default
        return super().convert(here(value, ctx, store=store) if isinstance(value, str)
                               else value, param, ctx)


class LocalFile(click.File):
    """A file (or - for standard input) relative to the caller's working directory."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """Resolve against the caller's directory, then open as click.File does."""
        return super().convert(here(value, ctx) if isinstance(value, str) else value,
                               param, ctx)


def store_option(*names: str, **attrs: Any) -> Callable[[F], F]:
    """--db PATH (default $DPSQL_DB, the caller's): ``click.option`` with the caller's view."""
    return click.option(*names, cls=CallerOption, envvar="DPSQL_DB", metavar="PATH",
                        type=LocalPath(dir_okay=False, readable=False), **attrs)


def db_option(f: F) -> F:
    """--db PATH, defaulting to $DPSQL_DB."""
    return store_option(
        "--db", "db", required=True,  # readable=False: an unreadable store exits 74
        help="The store (a DuckDB file). Default: $DPSQL_DB.",
    )(f)


def as_option(f: F) -> F:
    """--as USER: who acts (default $DPSQL_USER, else the policy's first admin)."""
    return click.option(
        "--as", "actor", cls=CallerOption, envvar="DPSQL_USER", metavar="USER", default=None,
        help="Act as this user (default: $DPSQL_USER, else the policy's first admin).",
    )(f)


def json_option(f: F) -> F:
    """--json: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def default_actor(actor: str | None, db: str) -> str:
    """The acting user: the one given, else the first admin of the store's policy."""
    if actor:
        return actor
    from dpsql.policies import active_policy
    from dpsql.services import open_store

    with open_store(db) as store:
        admins = [u.name for u in active_policy(store).users.values() if u.role == "admin"]
    return admins[0]
