"""The console's HTML: small server-rendered pages, every value escaped, charts in inline SVG."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from html import escape
from itertools import pairwise
from typing import Any

COLOURS = ("#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#975a16")
NAV = (("budgets", "Budgets"), ("audit", "Audit"), ("releases", "Releases"),
       ("policy", "Policy"), ("jobs", "Jobs"))  # links relative to the page's <base>
STYLE = """
body { font-family: system-ui, sans-serif; margin: 0; color: #1a202c; background: #f7fafc; }
header { background: #2d3748; color: #fff; padding: .6em 1.5em; display: flex; gap: 1.2em;
         align-items: center; }
header a { color: #e2e8f0; text-decoration: none; } header a:hover { color: #fff; }
header form { margin-left: auto; } main { padding: 1em 1.5em; max-width: 1100px; }
table { border-collapse: collapse; margin: .8em 0; background: #fff; }
td, th { border: 1px solid #cbd5e0; padding: .25em .6em; text-align: left; font-size: .9em; }
th { background: #edf2f7; } .flash { background: #e6fffa; border: 1px solid #81e6d9;
padding: .5em 1em; white-space: pre-wrap; } .error { background: #fff5f5;
border: 1px solid #feb2b2; padding: .5em 1em; white-space: pre-wrap; }
form.inline { display: inline; }
table.bars td, table.bars th { border: none; }
fieldset { background: #fff; border: 1px solid #cbd5e0; }
pre.diff { background: #fff; border: 1px solid #cbd5e0; padding: .5em; overflow-x: auto; }
.add { color: #276749; } .del { color: #9b2c2c; } input, select { margin: .2em .4em .2em 0; }
"""


def layout(title: str, body: str, *, user: str | None = None, csrf: str | None = None,
           flash: str | None = None, error: str | None = None, root: str | None = None) -> str:
    """A whole page: navigation and logout for a logged-in admin, then ``body``.

    Links are relative (``releases``), to ``root``, the console's secret prefix.
    """
    nav = ""
    if user is not None:
        links = "".join(f'<a href="{href}">{text}</a>' for href, text in NAV)
        nav = (f"<header><strong>dpsql console</strong>{links}"
               f'<form method="post" action="logout">{hidden(csrf)}'
               f"{escape(user)} <button>Log out</button></form></header>")
    base = f'<base href="{escape(root)}">' if root else ""
    notes = (f'<p class="flash">{escape(flash)}</p>' if flash else "") + \
        (f'<p class="error">{escape(error)}</p>' if error else "")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"{base}"
            f"<title>{escape(title)} · dpsql console</title><style>{STYLE}</style></head>"
            f"<body>{nav}<main><h1>{escape(title)}</h1>{notes}{body}</main></body></html>")


def hidden(csrf: str | None) -> str:
    """The CSRF field every POST form carries."""
    return f'<input type="hidden" name="csrf" value="{escape(csrf or "")}">'


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], raw: int | None = None) -> str:
    """An HTML table of escaped cells (column ``raw`` holds ready-made HTML)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(
        f"<td>{cell if i == raw else escape('' if cell is None else str(cell))}</td>"
        for i, cell in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def select(name: str, options: Iterable[str], chosen: str | None = None,
           blank: str | None = None) -> str:
    """A drop-down of ``options`` (a first empty choice labelled ``blank`` when given)."""
    items = [("", blank)] if blank is not None else []
    items += [(o, o) for o in options]
    return f'<select name="{escape(name)}">' + "".join(
        f'<option value="{escape(v)}"{" selected" if v == chosen else ""}>{escape(t)}</option>'
        for v, t in items) + "</select>"


def login_page(csrf: str, error: str | None = None) -> str:
    """The login form (the SQL password of an administrator)."""
    body = ('<form method="post" action="login">' + hidden(csrf) +
            '<p><label>User <input name="user" autocomplete="username" autofocus></label></p>'
            '<p><label>Password <input name="password" type="password" '
            'autocomplete="current-password"></label></p><p><button>Log in</button></p>'
            "</form><p>Administrators log in with their SQL password (dpsql user add).</p>")
    return layout("Log in", body, error=error)


# -- charts -------------------------------------------------------------------------------
def bars(rows: Iterable[tuple[str, float, float, str]]) -> str:
    """Budget bars, one row each: (label, used, total, text)."""
    return '<table class="bars">' + "".join(bar(*row) for row in rows) + "</table>"


def bar(label: str, used: float, total: float, text: str) -> str:
    """A horizontal bar: the share of ``total`` that is ``used`` (full when over)."""
    share = 0.0 if total == float("inf") else 1.0 if total <= 0 else min(used / total, 1.0)
    colour = "#c53030" if share >= 0.9 else "#dd6b20" if share >= 0.6 else "#38a169"
    width = round(300 * share, 1)
    return (f'<tr><th>{escape(label)}</th><td><svg width="300" height="16" role="img" '
            f'aria-label="{escape(label)}: {share:.1%} spent" data-share="{share:.6f}">'
            f'<rect width="300" height="16" fill="#e2e8f0"/>'
            f'<rect width="{width}" height="16" fill="{colour}"/></svg></td>'
            f"<td>{escape(text)}</td></tr>")


def spend_chart(series: Mapping[str, Sequence[tuple[datetime, float]]], unit: str) -> str:
    """Cumulative spend per dataset over time: one polyline each, with a legend."""
    points = [p for s in series.values() for p in s]
    if not points:
        return "<p>Nothing spent yet.</p>"
    w, h, pad = 640, 220, 40
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    top = max(p[1] for p in points) or 1.0
    span = (t1 - t0).total_seconds() or 1.0

    def xy(at: datetime, value: float) -> tuple[float, float]:
        x = pad + (w - 2 * pad) * ((at - t0).total_seconds() / span if t1 > t0 else 0.5)
        return x, h - pad - (h - 2 * pad) * value / top

    lines, legend = [], []
    for i, (dataset, data) in enumerate(sorted(series.items())):
        colour = COLOURS[i % len(COLOURS)]
        corners = [xy(at, v) for at, v in [(data[0][0], 0.0), *data]]  # from zero
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                     + " ".join(f"{x:.1f},{y:.1f}" for x, y in corners) + '"/>'
                     + "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>'
                               for x, y in corners[1:]))
        legend.append(f'<text x="{pad + 150 * i}" y="16" fill="{colour}">{escape(dataset)}'
                      "</text>")
    axes = (f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#718096"/>'
            f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#718096"/>'
            f'<text x="4" y="{pad - 4}" font-size="11">{top:.3g} {escape(unit)}</text>'
            f'<text x="{pad}" y="{h - 8}" font-size="11">{escape(f"{t0:%Y-%m-%d %H:%M}")}</text>'
            f'<text x="{w - pad}" y="{h - 8}" font-size="11" text-anchor="end">'
            f'{escape(f"{t1:%Y-%m-%d %H:%M}")}</text>')
    return (f'<svg width="{w}" height="{h}" role="img" aria-label="spend over time" '
            f'style="background:#fff">{axes}{"".join(lines)}{"".join(legend)}</svg>')


# -- policy -------------------------------------------------------------------------------
def policy_diffs(versions: Sequence[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    """Each version's unified diff against the one before it, newest first."""
    out = []
    for (old, before), (new, after) in pairwise(versions):
        diff = difflib.unified_diff(before.splitlines(), after.splitlines(),
                                    f"version {old}", f"version {new}", lineterm="")
        out.append((new, list(diff)))
    return out[::-1]


def diff_html(lines: Sequence[str]) -> str:
    """A unified diff, added and removed lines coloured."""
    def cls(line: str) -> str:
        return "add" if line.startswith("+") else "del" if line.startswith("-") else ""

    return '<pre class="diff">' + "\n".join(
        f'<span class="{cls(line)}">{escape(line)}</span>' for line in lines) + "</pre>"
