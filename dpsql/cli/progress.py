"""The terminal's progress bar for long work (a release's fit), on standard error."""

from __future__ import annotations

import sys
from typing import Any

from dpsql.cli import sigint

COUNTED = None  # tqdm's own format: "{l_bar}{bar}| {n_fmt}/{total_fmt} [...]"
FRACTION = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"
UNKNOWN = "{desc}: {elapsed}"


def bar_format(total: float | None) -> str | None:
    """How a stage of ``total`` units shows: counted units, a percentage, or only the time.

    A stage measured in a fraction of one (AIM's share of the budget spent) reads as a
    percentage, never as ``0.05624998111252193/1.0``.
    """
    if not total:
        return UNKNOWN
    if float(total).is_integer() and total > 1:
        return COUNTED
    return FRACTION


class ProgressBar:
    """Renders :class:`dpsql.progress.Progress` callbacks as a tqdm bar per stage (stderr).

    Hidden when stderr is not a terminal or when ``enabled`` is false. A Ctrl-C
    that Python lost on the way (see :mod:`dpsql.cli.sigint`) stops the work
    at its next report of unfinished work.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._bar: Any = None
        self._stage: str | None = None

    def __call__(self, stage: str, done: float, total: float | None = None) -> None:
        """Advance (or start) the bar of ``stage``."""
        if sigint.seen() and (total is None or done < total):  # finished work stays
            raise KeyboardInterrupt
        if not self.enabled:
            return
        from tqdm import tqdm

        if stage != self._stage:
            self.close()
            self._stage = stage
            self._bar = tqdm(total=total, desc=stage, leave=False, dynamic_ncols=True,
                             file=sys.stderr, bar_format=bar_format(total))
        bar = self._bar
        if total is not None and bar.total != total:
            bar.total = total
        bar.n = done
        bar.refresh()

    def close(self) -> None:
        """Remove the current bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
            self._stage = None
