"""``dpsql serve``: the PostgreSQL-wire server for psql, DBeaver, psycopg and pandas."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import click

from dpsql import passwords
from dpsql.commands.common import cli, db_option
from dpsql.errors import ConfigurationError
from dpsql.files import OTHERS, runtime_dir, write_private

PREFIX_VARIABLE = "DPSQL_CONSOLE_PREFIX"


def _prefix_on_command_line(ctx: click.Context, param: click.Parameter,
                            value: str | None) -> None:
    """Refuse ``--console-prefix SECRET``: every user of the machine reads it in ``ps``."""
    if value is not None:
        raise click.UsageError("the console's prefix is a secret and every user of this "
                               "machine can read a command line (ps): set "
                               "DPSQL_CONSOLE_PREFIX or use --console-prefix-file")


def console_prefix(path: Path | None) -> str | None:
    """The console's prefix from ``path`` (a private file) or $DPSQL_CONSOLE_PREFIX, else None.

    None makes the console draw a random one.
    """
    given = os.environ.get(PREFIX_VARIABLE)
    if path is None:
        return given or None
    if given:
        raise ConfigurationError(f"give the console's prefix once: {PREFIX_VARIABLE} or "
                                 "--console-prefix-file, not both")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as err:
        raise ConfigurationError(f"cannot read the console prefix file {path}: "
                                 f"{err.strerror}") from err
    with open(descriptor, encoding="utf-8") as file:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or \
                info.st_mode & OTHERS:
            raise ConfigurationError(
                f"{path} holds a secret but is not a private file of yours (owner uid "
                f"{info.st_uid}, mode {stat.filemode(info.st_mode)}): chmod 600 {path}")
        return file.read().strip()


def url_file(port: int, url: str) -> Path:
    """Write the console's ``url`` to a file only its owner may read; the file's path.

    The address holds the secret prefix, so it is never printed (terminals and
    logs keep what is printed).
    """
    path = runtime_dir() / f"console-{port}.url"
    write_private(path, url + "\n")
    return path


@cli.command("serve")
@db_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=5433, show_default=True,
              help="TCP port (0 picks a free one).")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="PEM certificate chain: enables TLS (then required).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="PEM private key for --tls-cert.")
@click.option("--allow-plaintext", is_flag=True,
              help="With TLS configured, still accept unencrypted connections.")
@click.option("--max-clients", type=click.IntRange(min=1), default=200, show_default=True,
              help="Logged-in connections at once (each user is also limited by the policy's "
                   "max_connections).")
@click.option("--max-pending-logins", type=click.IntRange(min=1), default=64,
              show_default=True, help="Connections still logging in at once (they do not take "
                                      "the slots of --max-clients; when all are taken, a "
                                      "newcomer takes the slot of one that waits).")
@click.option("--login-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True, help="Seconds a connection has to log in.")
@click.option("--login-step-timeout", type=click.FloatRange(min=0.1), default=1.0,
              show_default=True, help="Seconds a connection logging in has to send each "
                                      "message (startup packet, each SASL step).")
@click.option("--statement-timeout", type=click.FloatRange(min=0), default=300.0,
              show_default=True, help="Seconds a statement may run (0: no limit); clients may "
                                      "lower it with SET statement_timeout.")
@click.option("--max-message-size", type=click.IntRange(min=1024), default=1 << 20,
              show_default=True, help="Largest protocol message accepted, in bytes.")
@click.option("--workers", type=click.IntRange(min=1), default=8, show_default=True,
              help="Threads running DuckDB work.")
@click.option("--console", "console", is_flag=True,
              help="Also serve the administrators' web console on 127.0.0.1 (docs/console.md).")
@click.option("--console-port", type=click.IntRange(0, 65535), default=5480, show_default=True,
              help="TCP port of the web console (0 picks a free one).")
@click.option("--console-prefix-file", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A file (yours, mode 0600) holding the console's secret path "
                                 "prefix, 32 or more letters, digits, - or _ (or set "
                                 "DPSQL_CONSOLE_PREFIX; default: a random one).")
@click.option("--console-prefix", hidden=True, expose_value=False,
              callback=_prefix_on_command_line)
@click.option("--free-query-memory", default=None, metavar="SIZE",
              help="The most memory one free or catalog query may use: the address-space "
                   "limit of the process it runs in, as 512MiB or 4GiB (default: an eighth of "
                   "the machine's memory; at most 4 run at once).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True, help="Server log verbosity (stderr).")
def serve_cmd(db: str, host: str, port: int, tls_cert: Path | None, tls_key: Path | None,
              allow_plaintext: bool, max_clients: int, max_pending_logins: int,
              login_timeout: float, login_step_timeout: float,
              statement_timeout: float, max_message_size: int, workers: int, console: bool,
              console_port: int, console_prefix_file: Path | None, free_query_memory: str | None,
              log_level: str) -> None:
    """Serve the store to PostgreSQL clients (psql, DBeaver, psycopg, pandas).

    Analysts log in with SCRAM-SHA-256 passwords set by `dpsql user add`; each
    connection acts as that policy user. Aggregate queries are answered with
    differential privacy and charged to the user's budget (a NOTICE after each
    answer shows the cost and what is left); released synthetic tables are read
    free of charge under schema `released`.

    The server owns the store while it runs: every other dpsql command on it
    (budget grant, policy apply, user add, release, ...) runs inside the server
    through a local admin channel, and admins on psql can run them as
    CALL dpsql('budget show'). Stop it with Ctrl-C or SIGTERM.

    \b
    Example:
      dpsql serve --db adult.duckdb --port 5433
      psql "host=127.0.0.1 port=5433 user=alice dbname=adult"
    """  # noqa: D301 (click needs a real \b)
    from dpsql.server.admin import refuse_if_served
    from dpsql.server.server import Server, ServerConfig, run
    from dpsql.sizes import parse_size

    refuse_if_served(db, "dpsql serve already runs on this store (it is the store's owner)")

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    config = ServerConfig(db=Path(db), host=host, port=port, tls_cert=tls_cert, tls_key=tls_key,
                          allow_plaintext=allow_plaintext, max_clients=max_clients,
                          max_pending_logins=max_pending_logins,
                          login_timeout=login_timeout, login_step_timeout=login_step_timeout,
                          statement_timeout=statement_timeout,
                          max_message=max_message_size, workers=workers,
                          console_port=console_port if console else None,
                          console_prefix=console_prefix(console_prefix_file) if console else None,
                          free_query_memory=None if free_query_memory is None
                          else parse_size(free_query_memory))
    written: list[Path] = []

    def ready(server: Server) -> None:
        users = passwords.list_users(server.store)
        tls = "TLS required" if server.tls_context is not None and not allow_plaintext else \
            "TLS available" if server.tls_context is not None else "no TLS"
        click.echo(f"dpsql serve: listening on {host}:{server.port} for {db} ({tls}); "
                   f"{len(users)} user(s) with a password", err=True)
        click.echo(f"dpsql commands on {db} now run in this server (admin channel "
                   f"{server.admin.path})", err=True)
        if not users:
            click.echo("no user can log in yet: add one with dpsql user add NAME", err=True)
        click.echo(f'connect with: psql "host={host} port={server.port} user=USER '
                   f'dbname={Path(db).stem}"', err=True)
        if server.console is not None:
            written.append(url_file(server.console.port, server.console.url))
            click.echo(f"console (administrators): its address is in {written[0]} (readable "
                       "by you only: it holds the console's secret prefix)", err=True)

    try:
        run(config, ready=ready)
    finally:
        for path in written:
            path.unlink(missing_ok=True)

