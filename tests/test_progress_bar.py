"""The terminal's progress bar: a stage measured in a fraction of one reads as a percentage."""

from __future__ import annotations

import io

from tqdm import tqdm

from dpsql.cli.progress import COUNTED, FRACTION, UNKNOWN, bar_format


def _render(done: float, total: float | None) -> str:
    out = io.StringIO()
    bar = tqdm(total=total, desc="select", file=out, bar_format=bar_format(total), ncols=80,
               mininterval=0)
    bar.n = done
    bar.refresh()
    bar.close()
    return out.getvalue()


def test_a_fraction_of_one_is_a_percentage_not_a_long_float() -> None:
    assert bar_format(1.0) == bar_format(1) == FRACTION
    shown = _render(0.05624998111252193, 1.0)
    assert "6%" in shown
    assert "0.0562" not in shown


def test_counted_units_stay_counted_and_unknown_totals_show_the_time() -> None:
    assert bar_format(200) is COUNTED
    assert "3/200" in _render(3, 200)
    assert bar_format(None) == bar_format(0) == UNKNOWN
    assert "select: 00:00" in _render(5, None)
