"""The console's HTML escapes every value; bars, charts and diffs draw what they are given."""

from __future__ import annotations

from datetime import datetime

from dpsql.console import pages

EVIL = '<script>alert("x")</script>'


def test_values_are_escaped() -> None:
    page = pages.layout(EVIL, pages.table([[EVIL, 1]], [EVIL, "n"]), user=EVIL, csrf='"><b>',
                        flash=EVIL, error=EVIL)
    assert "<script>" not in page
    assert page.count("&lt;script&gt;") == 7  # title, h1, user, header, cell, 2 notes
    assert 'value="&quot;&gt;&lt;b&gt;"' in page
    assert "<script>" not in pages.bars([(EVIL, 1, 2, EVIL)])
    assert "<script>" not in pages.select(EVIL, [EVIL], EVIL, EVIL)
    assert "<script>" not in pages.diff_html([f"+{EVIL}"])


def test_bar_share_is_spent_over_total_capped_at_one() -> None:
    assert 'data-share="0.250000"' in pages.bar("a", 1, 4, "")
    assert 'data-share="1.000000"' in pages.bar("a", 5, 4, "")  # overspent: full
    assert 'data-share="0.000000"' in pages.bar("a", 5, float("inf"), "")  # unbounded


def test_spend_chart_draws_a_line_per_dataset() -> None:
    t = datetime(2026, 1, 1)
    chart = pages.spend_chart({"adult": [(t, 0.1), (t.replace(hour=1), 0.3)],
                               "acs": [(t, 0.2)]}, "epsilon")
    assert chart.count("<polyline") == 2
    assert chart.count("<circle") == 3
    assert "0.3 epsilon" in chart  # the axis tops at the largest total
    assert pages.spend_chart({}, "rho") == "<p>Nothing spent yet.</p>"


def test_policy_diffs_compare_each_version_with_the_one_before() -> None:
    diffs = pages.policy_diffs([(1, "a: 1\nb: 2\n"), (2, "a: 1\nb: 3\n"), (3, "a: 2\nb: 3\n")])
    assert [version for version, _ in diffs] == [3, 2]  # newest first
    assert "-b: 2" in diffs[1][1]
    assert "+b: 3" in diffs[1][1]
    assert "+a: 2" in diffs[0][1]
