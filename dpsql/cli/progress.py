"""The terminal's progress bar for long work (a release's fit), on standard error."""

from __future__ import annotations

import sys
from typing import Any

from dpsql.cli import sigint


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
                             file=sys.stderr, bar_format=None if total else "{desc}: {elapsed}")
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
