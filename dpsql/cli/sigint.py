"""Ctrl-C that nothing swallows or disguises.

Python raises KeyboardInterrupt wherever the main thread is. Raised inside a
garbage-collector callback (JAX registers one) it is printed and lost; raised
inside a DuckDB query it comes back as ``RuntimeError("Query interrupted")``.
The CLI's handler also remembers it, so that a command can tell an interrupt
from a failure and stop with exit code 130.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

_seen = False


def install(interactive: bool = False) -> None:
    """Remember every Ctrl-C (unless the parent process chose to ignore them).

    ``interactive`` (the shell, where Ctrl-C clears the line, as in psql): take
    Ctrl-C even if the parent ignored or blocked it, since a user at the
    prompt presses it on purpose.
    """
    if interactive:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if signal.getsignal(signal.SIGINT) is not _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = _quiet(sys.unraisablehook)


def seen() -> bool:
    """Whether Ctrl-C was pressed (and not yet handled)."""
    return _seen


def handled() -> None:
    """Forget a Ctrl-C the caller acted on (the shell clearing its line)."""
    global _seen
    _seen = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _seen
    _seen = True
    raise KeyboardInterrupt


def _quiet(hook: Any) -> Any:
    """A hook that drops lost KeyboardInterrupts: they are remembered, not lost."""
    def unraisable(info: Any) -> None:
        if not issubclass(info.exc_type, KeyboardInterrupt):
            hook(info)

    return unraisable
