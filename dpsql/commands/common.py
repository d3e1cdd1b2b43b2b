"""The root group, the options commands share, and how a parsed command runs.

A command on a store is an :class:`AdminCommand`: click declares its options and
help, and its flow (a plain function of a :class:`~dpsql.commands.door.Door` and
the parsed options) runs typed operations of :mod:`dpsql.admin` and renders
their results. Click runs the flow with the terminal's door when the CLI
invokes the command; ``CALL dpsql(...)`` only parses the command line
(:func:`parse`) and runs the flow with its own door.

A remote caller (``CALL dpsql``: a SQL administrator, not the server's
operating-system user) parses with a :class:`Remote`: its store and user are
fixed (``--db``, ``--as`` and ``--user`` refused) and it may name no file at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from dpsql.commands.door import Door, terminal
from dpsql.errors import AccessDenied, ConfigurationError
from dpsql.version import __version__

F = TypeVar("F", bound=Callable[..., Any])
Flow = Callable[..., None]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dpsql")
def cli() -> None:
    """dpsql: differentially private SQL answers and synthetic data over DuckDB.

    Administrators create a store from sensitive tables and a YAML policy, manage
    budgets and release synthetic tables; analysts ask aggregate SQL queries and
    read released tables. Every store command takes --db (default: $DPSQL_DB).
    """


@dataclass(frozen=True)
class Remote:
    """A remote caller parsing a command line: runs as ``user`` on the store ``db`` only."""

    db: str
    user: str

    @property
    def env(self) -> dict[str, str]:
        """What the options that name the store and the user read instead of the environment."""
        return {"DPSQL_DB": self.db, "DPSQL_USER": self.user}


NO_FILE = ("CALL dpsql and the console read and write no file of the server machine ({}); run "
           "this command in a shell there")


def _remote(ctx: click.Context | None) -> Remote | None:
    return ctx.find_object(Remote) if ctx is not None else None


class CallerOption(click.Option):
    """An option saying who acts on which store (--db, --as, --user).

    A remote caller's are fixed: given on its command line, they are refused.
    """

    def consume_value(self, ctx: click.Context,
                      opts: Mapping[str, Any]) -> tuple[Any, ParameterSource]:
        """The value and its source; refused on a remote caller's command line."""
        value, source = super().consume_value(ctx, opts)
        if _remote(ctx) is not None and source == ParameterSource.COMMANDLINE:
            raise AccessDenied(f"CALL dpsql runs as you on the served store; drop {self.opts[0]}")
        return value, source

    def resolve_envvar_value(self, ctx: click.Context) -> str | None:
        """The environment's value; a remote caller's store or user instead."""
        remote = _remote(ctx)
        if remote is None or not isinstance(self.envvar, str):
            return super().resolve_envvar_value(ctx)
        return remote.env.get(self.envvar)


class LocalPath(click.Path):
    """A path of the caller's machine: none for a remote caller (--db's default aside)."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """Refuse a remote caller's path, then check as click.Path does."""
        if _remote(ctx) is not None and not isinstance(param, CallerOption):
            raise AccessDenied(NO_FILE.format(value))
        return super().convert(value, param, ctx)


class LocalFile(click.File):
    """A file (or - for standard input) of the caller's machine: none for a remote caller."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """Refuse a remote caller's file, then open as click.File does."""
        if _remote(ctx) is not None:
            raise AccessDenied(NO_FILE.format(value))
        return super().convert(value, param, ctx)


def store_option(*names: str, **attrs: Any) -> Callable[[F], F]:
    """--db PATH (default $DPSQL_DB): ``click.option`` for the store a command works on."""
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


class _Runs:
    """What a command on a store adds to click: its flow and the parameter naming its user."""

    flow: Flow
    actor: str | None

    def run(self, door: Door, params: Mapping[str, Any]) -> None:
        """Run the flow with ``door`` and the parsed ``params``."""
        self.flow(door, **params)

    def run_here(self, ctx: click.Context) -> None:
        """Run the flow with the door of this process's terminal (click invoked the command)."""
        params = ctx.params
        door = terminal(params.get("db"), params.get(self.actor) if self.actor else None)
        try:
            self.run(door, params)
        finally:
            door.close()


class AdminCommand(_Runs, click.Command):
    """A command whose flow runs typed operations through a door (see the module's docstring)."""

    def __init__(self, name: str | None, callback: Flow | None = None, *,
                 actor: str | None = "actor", **attrs: Any) -> None:
        assert callback is not None
        super().__init__(name, callback=None, **attrs)
        self.flow, self.actor = callback, actor

    def invoke(self, ctx: click.Context) -> Any:
        """Run the flow with the terminal's door."""
        self.run_here(ctx)


class AdminGroup(_Runs, click.Group):
    """A group that, called without a subcommand, runs its own flow (``dpsql jobs``)."""

    def __init__(self, name: str | None, callback: Flow | None = None, *,
                 actor: str | None = "actor", **attrs: Any) -> None:
        assert callback is not None
        super().__init__(name, callback=self._without_subcommand,
                         invoke_without_command=True, **attrs)
        self.flow, self.actor = callback, actor

    def _without_subcommand(self, **params: Any) -> None:
        ctx = click.get_current_context()
        if ctx.invoked_subcommand is None:
            self.run_here(ctx)


def admin_command(group: click.Group, name: str, *, actor: str | None = "actor",
                  **attrs: Any) -> Callable[[Flow], AdminCommand]:
    """Declare ``flow`` (decorated with its options) as command ``name`` of ``group``.

    ``actor``: the parameter naming the user it acts as (None: the policy's first admin).
    """
    def declare(flow: Flow) -> AdminCommand:
        command = click.command(name, cls=AdminCommand, actor=actor, **attrs)(flow)
        group.add_command(command)
        return command

    return declare


def admin_group(group: click.Group, name: str, *, actor: str | None = "actor",
                **attrs: Any) -> Callable[[Flow], AdminGroup]:
    """Declare ``flow`` as group ``name`` of ``group`` that also runs alone."""
    def declare(flow: Flow) -> AdminGroup:
        command = click.command(name, cls=AdminGroup, actor=actor, **attrs)(flow)
        group.add_command(command)
        return command

    return declare


# -- a remote caller's command line -------------------------------------------------------
def find(args: list[str]) -> tuple[click.Command | None, str, list[str]]:
    """The command ``args`` name (None for a typo), its name, and the arguments after it."""
    command: click.Command | None = cli
    name, position = "dpsql", 0
    while (isinstance(command, click.Group) and position < len(args)
           and not args[position].startswith("-")):  # an option ends the descent
        name = args[position]
        command = command.get_command(click.Context(command), name)
        position += 1
    return command, name, args[position:]


def parse(args: list[str], remote: Remote) -> tuple[_Runs, dict[str, Any]]:
    """The command of the command line ``args`` and its options, parsed for ``remote``.

    Nothing runs: neither a click callback nor an eager option (``--help`` is
    refused here; :func:`help_text` gives it). Usage errors raise ConfigurationError.
    """
    command, name, rest = find(args)
    if not isinstance(command, _Runs) or (isinstance(command, AdminGroup) and rest
                                          and not rest[0].startswith("-")):
        known = " ".join(args[:2]) if args else "(nothing)"
        raise ConfigurationError(f"CALL dpsql: no command {known!r} runs over SQL; CALL "
                                 "dpsql('--help') lists the commands")
    assert isinstance(command, click.Command)
    try:
        ctx = command.make_context(name, list(rest), obj=remote)
    except click.ClickException as err:
        raise ConfigurationError(f"CALL dpsql: {err.format_message()}") from err
    return command, dict(ctx.params)


def help_text(args: list[str]) -> str:
    """The help of the command (or group) ``args`` name, as ``--help`` prints it."""
    words = [a for a in args if a not in ("-h", "--help")]
    command, _, rest = find(words)
    if command is None:
        raise ConfigurationError(f"CALL dpsql: no command {' '.join(args[:2])!r}")
    named = " ".join(["dpsql", *words[:len(words) - len(rest)]])  # as the CLI says it
    ctx = click.Context(command, info_name=named, resilient_parsing=True)
    return command.get_help(ctx)
