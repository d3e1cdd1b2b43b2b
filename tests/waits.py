"""Waiting on a condition in tests, with a deadline that only guards against a hang.

Tests wait for what they need (a query running, a process gone), never for a time;
the deadline is generous, so a slow machine does not fail them, and only a hang does.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def until(condition: Callable[[], object], what: str, within: float = 120,
          every: float = 0.05) -> None:
    """Return once ``condition()`` is true; fail with ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(every)
