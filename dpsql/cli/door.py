"""The terminal's door: a command's operations run here, or in the server that owns its store.

While ``dpsql serve`` runs it holds the store's write lock, so a command on that
store sends each operation to the server's admin socket
(:mod:`dpsql.server.admin`) as its name and typed arguments, and gets the typed
result back (progress first, for a release it waits for). Otherwise it opens the
store itself. Either way the command prints here, prompts here, and reads and
writes files here, in the user's own directory. Ctrl-C while the server works
sends a cancel (the server stops the operation: a release's job is cancelled
and its charge stays); a second Ctrl-C stops waiting.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import click

from dpsql.commands.door import Bar, Door, Writer
from dpsql.commands.render import json_text
from dpsql.errors import AccessDenied, ConfigurationError, StoreError

if TYPE_CHECKING:
    from dpsql.session import Session

P = ParamSpec("P")
R = TypeVar("R")
REPLY_LIMIT = 1 << 32  # the largest frame a server may send (a released table, say)


class Terminal(Door):
    """A command run from a terminal on the store ``db`` as ``user`` (None: the first admin)."""

    def __init__(self, db: str | None, user: str | None) -> None:
        self.db, self.user = db, user
        self._session: Session | None = None
        self._channel: Channel | None = None
        if db is not None:
            from dpsql.server.admin import connect

            sock = connect(db)
            if sock is not None:
                self._channel = Channel(db, sock, user)

    @property
    def served(self) -> bool:
        """Whether ``dpsql serve`` owns the store (operations run there)."""
        return self._channel is not None

    def call(self, operation: Callable[Concatenate[Session, P], R], /, *args: P.args,
             **kwargs: P.kwargs) -> R:
        """Run ``operation`` in the server that owns the store, else on a session here."""
        if self._channel is not None:
            return self._channel.call(operation, kwargs)
        return operation(self._local(), *args, **kwargs)

    def _local(self) -> Session:
        if self._session is None and self.db is not None:
            from dpsql.admin import default_user
            from dpsql.services import open_store
            from dpsql.session import Session

            store = open_store(self.db)
            try:
                self._session = Session(store, self.user or default_user(store))
            except BaseException:
                store.close()
                raise
        return self._session  # type: ignore[return-value]  # None: an operation of no store

    def close(self) -> None:
        """Close the session or the connection to the server."""
        if self._session is not None:
            self._session.close()
            self._session = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # -- output ---------------------------------------------------------------------------
    def out(self, text: str = "", *, nl: bool = True) -> None:
        """Print to standard output (styles only on a terminal)."""
        click.echo(text, nl=nl)

    def err(self, text: str) -> None:
        """Print to standard error."""
        click.echo(text, err=True)

    def json(self, data: Any) -> None:
        """Print ``data`` as indented JSON."""
        click.echo(json_text(data))

    # -- the user's side ------------------------------------------------------------------
    def _check(self, path: str) -> str:
        """``path``, unless it names the command's own store (or its WAL)."""
        if self.db is not None and is_store_file(path, self.db):
            where = "the served store" if self.served else "the store"
            raise AccessDenied(f"{path} is a file of {where} {self.db}; a dpsql command may "
                               "not read or write it")
        return path

    def read_text(self, path: str) -> str:
        """The text of file ``path`` (UTF-8)."""
        try:
            return Path(self._check(path)).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigurationError(f"cannot read {path}: {err.strerror}") from err

    def local_path(self, path: str) -> str:
        """``path`` itself: the command reads it here."""
        return self._check(path)

    def output(self, path: str) -> str:
        """``path``, unless it names the store."""
        return self._check(path)

    def write(self, path: str, data: str | bytes | Writer, *, mode: int = 0o600) -> None:
        """Write ``path`` as a new private file (:func:`dpsql.files.write_private`)."""
        from dpsql.files import write_private

        write_private(Path(self._check(path)), data, mode=mode)

    def write_folder(self, path: str, files: dict[str, str | bytes]) -> dict[str, str]:
        """Write ``files`` into the private folder ``path`` (made if absent)."""
        from dpsql.files import private_folder, write_private

        folder = private_folder(Path(self._check(path)))
        for name, data in files.items():
            write_private(folder / name, data)
        return {name: str(folder / name) for name in files}

    def password(self, *, from_stdin: bool) -> str:
        """The first line of standard input, or a password typed twice at a hidden prompt.

        Standard input that is not a terminal (``echo "$PW" | dpsql user add alice``)
        is read as with ``--password-stdin``: its first line, and a second line, if
        any, must repeat it (no hidden prompt, which would warn and then abort).
        """
        if from_stdin or not sys.stdin.isatty():
            line = sys.stdin.readline()
            if not line:
                raise ConfigurationError("no password on standard input; type it at a "
                                         "terminal, or pipe it in (--password-stdin)")
            again = sys.stdin.readline()
            if not from_stdin and again and again.rstrip("\r\n") != line.rstrip("\r\n"):
                raise ConfigurationError("the two passwords on standard input differ; "
                                         "nothing was changed")
            return line.rstrip("\r\n")
        return str(click.prompt("password", hide_input=True, confirmation_prompt=True))

    def confirm(self, question: str) -> None:
        """Ask; anything but yes aborts."""
        click.confirm(question, abort=True)

    def progress(self, enabled: bool = True) -> Bar:
        """A progress bar on standard error, when it is a terminal (it also notices Ctrl-C)."""
        from dpsql.cli.progress import ProgressBar

        return ProgressBar(enabled)


def is_store_file(path: str, store: str) -> bool:
    """Whether ``path`` names the store at ``store`` or its WAL (by identity, or by name)."""
    target = Path(path).resolve()
    for own in (Path(store), Path(store + ".wal")):
        if target == own.resolve():
            return True
        with contextlib.suppress(OSError):
            if os.path.samefile(target, own):
                return True
    return False


class Channel:
    """Operations sent to the server that owns the store ``db``, over its admin socket.

    One connection carries the command's operations in turn, as one session per
    user in the server (a ``SET`` lasts to the end of a script).
    """

    def __init__(self, db: str, sock: socket.socket, user: str | None) -> None:
        self.db, self.user = db, user
        self.sock: socket.socket | None = sock

    def _connection(self) -> socket.socket:
        if self.sock is None:  # left after a second Ctrl-C: its reply may still come
            from dpsql.server.admin import connect

            sock = connect(self.db)
            if sock is None:
                raise StoreError("dpsql serve stopped before the command ended")
            self.sock = sock
        return self.sock

    def call(self, operation: Callable[..., Any], arguments: dict[str, Any]) -> Any:
        """Send ``operation`` with ``arguments``; its result (progress goes to ``progress=``).

        Ctrl-C sends a cancel and waits for the operation to end: an operation that
        still finished returns its result, one stopped raises KeyboardInterrupt. A
        second Ctrl-C stops waiting.
        """
        from dpsql import admin
        from dpsql.admin import wire
        from dpsql.server.admin import receive, send

        progress = arguments.get("progress")
        sock = self._connection()
        send(sock, {"op": admin.name_of(operation), "user": self.user,
                    "args": wire.encode_arguments(operation, arguments)})
        cancelled = False
        while True:
            try:
                message = receive(sock, REPLY_LIMIT)
                if message is not None and "progress" in message:
                    if progress is not None and not cancelled:
                        progress(*message["progress"])  # a bar that saw Ctrl-C raises
                    continue
            except KeyboardInterrupt:
                if cancelled:  # a second Ctrl-C: stop waiting
                    self.close()  # the server sees the connection go, and stops too
                    raise
                cancelled = True
                with contextlib.suppress(OSError):
                    send(sock, {"cancel": True})
                continue
            if message is None:
                raise StoreError("dpsql serve stopped before the command ended")
            if "result" in message:
                return wire.decode_result(operation, message["result"])
            error = wire.error_of(message)
            if cancelled:
                raise KeyboardInterrupt from error
            raise error

    def close(self) -> None:
        """Hang up (the server closes the sessions it opened for us)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
