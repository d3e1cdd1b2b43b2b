"""Where a parsed command runs: a :class:`Door` gives it operations, output and the caller's side.

A command's flow (see :mod:`dpsql.commands.common`) is written once against this
interface. The CLI's door (:mod:`dpsql.cli.door`) runs the operations in the
process or through ``dpsql serve``'s admin socket, prints to the terminal, asks
for passwords and confirmations and reads and writes the user's files.
``CALL dpsql(...)``'s door (:mod:`dpsql.server.procedure`) runs them on the SQL
session and collects the lines; it has no side of its own, so it refuses every
file, prompt and confirmation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from dpsql.session import Session

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class Text:
    """Rendered output: lines for standard output and lines for standard error (notes)."""

    out: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)

    def __add__(self, other: Text) -> Text:
        return Text(self.out + other.out, self.err + other.err)


class Bar(Protocol):
    """A progress display: a :class:`dpsql.progress.Progress` that can be closed."""

    def __call__(self, stage: str, done: float, total: float | None = None) -> None:
        """Show that ``done`` of ``total`` units of ``stage`` are complete."""

    def close(self) -> None:
        """Remove the display."""


class NoBar:
    """A progress display that shows nothing."""

    def __call__(self, stage: str, done: float, total: float | None = None) -> None:
        """Show nothing."""

    def close(self) -> None:
        """Nothing to remove."""


Writer = Callable[[BinaryIO], None]


class Door(ABC):
    """What a command may use: operations on its store, output, and the caller's own side."""

    #: Whether the session outlives the command (CALL dpsql runs on the SQL session).
    keeps_session = False

    @abstractmethod
    def call(self, operation: Callable[Concatenate[Session, P], R], /, *args: P.args,
             **kwargs: P.kwargs) -> R:
        """Run ``operation`` (of :mod:`dpsql.admin`) as the command's user on its store."""

    @abstractmethod
    def out(self, text: str = "", *, nl: bool = True) -> None:
        """A line (or text) of output."""

    @abstractmethod
    def err(self, text: str) -> None:
        """A line for the reader's eyes beside the output: notes, warnings, a report."""

    def show(self, text: Text) -> None:
        """Rendered output: its lines of output, then its notes."""
        for line in text.out:
            self.out(line)
        for line in text.err:
            self.err(line)

    @abstractmethod
    def json(self, data: Any) -> None:
        """The command's whole output as JSON."""

    # -- the caller's own side ----------------------------------------------------------
    @abstractmethod
    def read_text(self, path: str) -> str:
        """The text of the caller's file ``path``."""

    @abstractmethod
    def local_path(self, path: str) -> str:
        """The caller's file ``path``, for code that reads it there itself."""

    @abstractmethod
    def output(self, path: str) -> str:
        """``path`` checked as a place the caller's side may write, before any work is done."""

    @abstractmethod
    def write(self, path: str, data: str | bytes | Writer, *, mode: int = 0o600) -> None:
        """Write the caller's file ``path`` (a new private file, renamed into place)."""

    @abstractmethod
    def write_folder(self, path: str, files: dict[str, str | bytes]) -> dict[str, str]:
        """Write ``files`` (name: content) into the caller's private folder ``path``."""

    @abstractmethod
    def password(self, *, from_stdin: bool) -> str:
        """A new password, typed twice at a prompt (or the first line of standard input)."""

    @abstractmethod
    def confirm(self, question: str) -> None:
        """Go on only if the caller says yes (else abort the command)."""

    @abstractmethod
    def progress(self, enabled: bool = True) -> Bar:
        """A progress display for long work (hidden unless ``enabled``)."""

    def close(self) -> None:  # noqa: B027 (most doors hold nothing)
        """Release what the door holds (a session, a connection)."""


_terminal: Callable[[str | None, str | None], Door] | None = None


def set_terminal(factory: Callable[[str | None, str | None], Door]) -> None:
    """Register how this process runs a command that click invokes: ``factory(db, user)``.

    The CLI registers its terminal door; nothing else runs commands through click.
    """
    global _terminal
    _terminal = factory


def terminal(db: str | None, user: str | None) -> Door:
    """The door of a command that click invokes in this process (the CLI's)."""
    if _terminal is None:
        from dpsql.errors import InternalError

        raise InternalError("no front door runs dpsql commands in this process (import "
                            "dpsql.cli to run them from a terminal)")
    return _terminal(db, user)
