"""The one progress callback long work reports through (fits, NUTS, releases)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Called as work advances: ``stage`` names the step, ``done`` of ``total`` units.

    ``total`` is None when the amount of work is unknown. The CLI renders this as
    a progress bar; library callers may pass any callable or None.
    """

    def __call__(self, stage: str, done: float, total: float | None = None) -> None:
        """Report that ``done`` of ``total`` units of ``stage`` are complete."""


def silent(stage: str, done: float, total: float | None = None) -> None:
    """A Progress that reports nothing."""
