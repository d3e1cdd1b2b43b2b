"""Run a command through ``dpsql serve`` when it owns the command's store.

The server holds the store's write lock, so a command that opened the file
itself would fail; instead it sends its command line to the server's admin
channel (:mod:`dpsql.server.admin`), which runs the same command against its
open store, and relays what it writes, its prompts and its exit code. Ctrl-C
cancels the command in the server (a second one stops waiting for it).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import sys
from typing import Any

import click

from dpsql.cli.common import cli


def forward(args: list[str]) -> int | None:
    """Run ``args`` in the server that owns its store: the exit code, or None if none does."""
    from dpsql.server import admin

    db = store_of(args)
    if db is None:
        return None
    sock = admin.connect(db)
    if sock is None:
        return None
    with sock:
        return _converse(sock, args)


def leaf_context(args: list[str], obj: Any = None) -> click.Context | None:
    """The parsed context of the command ``args`` name, not run (None for a group or a typo)."""
    command: click.Command | None = cli
    name, position = "dpsql", 0
    while (isinstance(command, click.Group) and position < len(args)
           and not args[position].startswith("-")):  # an option ends the descent
        name = args[position]
        command = command.get_command(click.Context(command), name)
        position += 1
    if command is None or (isinstance(command, click.Group)
                           and not command.invoke_without_command):
        return None  # a group that only dispatches (or a typo): nothing to forward
    try:
        return command.make_context(name, args[position:], obj=obj,
                                    resilient_parsing=True)
    except click.ClickException:  # run locally, where click reports it
        return None


def store_of(args: list[str]) -> str | None:
    """The store the command line ``args`` works on, if any (--db or $DPSQL_DB)."""
    ctx = leaf_context(args)
    if ctx is None:
        return None
    with ctx:
        db = ctx.params.get("db")
    return str(db) if db else None


def _converse(sock: socket.socket, args: list[str]) -> int:
    from dpsql.server.admin import FORWARDED_ENV, receive, send

    send(sock, {"argv": args, "cwd": os.getcwd(),
                "env": {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ},
                "width": shutil.get_terminal_size().columns,
                "tty": [s.isatty() for s in (sys.stdin, sys.stdout, sys.stderr)]})
    cancelled = False
    while True:
        try:
            message = receive(sock)
            if message is None:
                click.echo("error: dpsql serve stopped before the command ended", err=True)
                return 1
            if "exit" in message:
                return int(message["exit"])
            if "read" in message:
                send(sock, {"input": _read(message["read"], str(message.get("prompt", "")))})
            for kind, stream in (("out", sys.stdout), ("err", sys.stderr)):
                if kind in message:
                    stream.write(message[kind])
                    stream.flush()
        except KeyboardInterrupt:
            if cancelled:  # a second Ctrl-C: stop waiting
                return 130
            cancelled = True
            send(sock, {"cancel": True})


def _read(kind: str, prompt: str) -> str | None:
    """What the server's command reads from this terminal (None at the end of input)."""
    if kind == "secret":
        try:
            return getpass.getpass(prompt)
        except EOFError:
            return None
    text = sys.stdin.readline() if kind == "line" else sys.stdin.read()
    return text or None
