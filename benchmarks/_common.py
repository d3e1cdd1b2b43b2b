"""Small helpers the benchmarks share: timing medians, peak memory, tables."""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def shared_data(*parts: str) -> Path:
    """A file under the shared data directory: ``$DPSQL_SHARED_DATA``, or the first
    ``shared/data`` found above this checkout (a clone or a worktree)."""
    override = os.environ.get("DPSQL_SHARED_DATA")
    roots = [Path(override)] if override else [
        d / "shared" / "data" for d in Path(__file__).resolve().parents]
    for root in roots:
        if root.joinpath(*parts).exists():
            return root.joinpath(*parts)
    raise SystemExit(f"{Path(*parts)} not found under {', '.join(map(str, roots[:3]))}, ...: "
                     "set DPSQL_SHARED_DATA to the directory holding adult/ and acs/")


def median_time(fn: Callable[[], Any], runs: int = 5) -> tuple[float, list[float]]:
    """Median wall time of ``runs`` calls of ``fn`` (and every time)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return usage / 1024 if sys.platform != "darwin" else usage / 2**20


def readme(text: str) -> None:
    """Print the figures as README.md's "Measured" table quotes them, on a ``README:`` line,
    so that a re-run can be compared with the table."""
    print(f"README: {text}", flush=True)


def span(values: Iterable[float], spec: str) -> str:
    """``lo-hi`` of ``values`` in the format ``spec`` (one number when they round alike)."""
    listed = list(values)
    lo, hi = format(min(listed), spec), format(max(listed), spec)
    return lo if lo == hi else f"{lo}-{hi}"


def print_table(rows: list[dict[str, Any]], as_json: bool = False) -> None:
    """Rows as an aligned table, or JSON with ``as_json``."""
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        return
    headers = list(rows[0])
    text = [[f"{r[h]:.4g}" if isinstance(r[h], float) else str(r[h]) for h in headers]
            for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in text)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for t in text:
        print("  ".join(v.rjust(w) for v, w in zip(t, widths, strict=True)))


# The 10 Adult columns of the NAPSU-MQ paper (Supplement E), as the benchmarks compare
# synthesizers on them: age and hours in 5 buckets, capital gain and loss as "positive
# or not"; the other columns hidden.
ADULT10_COLUMNS = """\
      age: {type: integer, bounds: [0, 84], bins: [0, 17, 34, 51, 68, 84]}
      workclass: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8]}
      education_num: {type: integer, bounds: [0, 15], bins: 1}
      marital_status: {type: categorical, values: [0, 1, 2, 3, 4, 5, 6]}
      race: {type: categorical, values: [0, 1, 2, 3, 4]}
      sex: {type: categorical, values: [0, 1]}
      capital_gain: {type: integer, bounds: [0, 99], bins: [0, 1, 99]}
      capital_loss: {type: integer, bounds: [0, 99], bins: [0, 1, 99]}
      hours_per_week: {type: integer, bounds: [0, 98], bins: [0, 20, 40, 60, 80, 98]}
      income_50k: {type: categorical, values: [0, 1]}
      fnlwgt: {type: hidden}
      occupation: {type: hidden}
      relationship: {type: hidden}
      native_country: {type: hidden}
"""


def adult10_policy(budget: str, extra: str = "") -> str:
    """A zCDP policy (delta 1e-6) over :data:`ADULT10_COLUMNS` with one admin.

    ``budget`` is YAML for the dataset's and the admin's budget (``{epsilon: 10}``);
    ``extra`` is more YAML for the dataset (indented four spaces).
    """
    return (f"version: 1\naccounting: zcdp\ndelta: 1.0e-6\ndatasets:\n  adult:\n"
            f"    table: adult\n    budget: {budget}\n    columns:\n{ADULT10_COLUMNS}{extra}"
            f"users:\n  admin: {{role: admin, budgets: {{adult: {budget}}}}}\n")
