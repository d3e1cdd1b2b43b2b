"""What each console page shows: what ``budget show``, ``audit`` and ``releases`` show an admin.

Each view reads as its CLI command reads (``policy show`` and ``jobs`` too), nothing more.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from datetime import date, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from dpsql.console import pages
from dpsql.outcomes import Outcome
from dpsql.policies import policy_history
from dpsql.privacy import PrivacyCost
from dpsql.session import Session

AUDIT_ROWS = 500  # the newest rows a filtered audit page shows


def budgets(session: Session, csrf: str) -> str:
    """Per-dataset and per-user budget bars, spend over time and the grant form."""
    policy, delta = session.policy, session.policy.delta
    ledger = session.ledger
    datasets = [ledger.budget(session.user, name) for name in policy.datasets]
    dataset_bars = pages.bars((
        b.dataset, float(b.dataset_spent), float(b.dataset_total),
        f"spent {b.dataset_spent.describe(delta)} of "
        f"{b.dataset_total.describe(delta, 'nearest')}") for b in datasets)
    user_bars = pages.bars((
        f"{b.user} on {b.dataset}", float(b.spent), float(b.granted),
        f"spent {b.spent.describe(delta)} of {b.granted.describe(delta, 'nearest')}, "
        f"remaining {b.remaining.describe(delta, 'down')}") for b in session.budget())
    unit = "epsilon" if policy.accounting == "pure" else "rho"
    form = ('<form method="post" action="grant"><fieldset><legend>Grant budget</legend>'
            + pages.hidden(csrf) + pages.select("user", policy.users)
            + pages.select("dataset", policy.datasets)
            + '<label>epsilon <input name="epsilon" size="6"></label>'
            + "<button>Grant</button></fieldset></form>")
    return (f"<h2>Datasets</h2>{dataset_bars}<h2>Users</h2>{user_bars}"
            f"<h2>Spend over time ({unit})</h2>{pages.spend_chart(spend(session), unit)}"
            f"{form}")


def spend(session: Session) -> dict[str, list[tuple[datetime, float]]]:
    """Cumulative spend per dataset after each charge, in the policy's unit."""
    kind = session.policy.accounting
    totals: dict[str, PrivacyCost] = {}
    series: dict[str, list[tuple[datetime, float]]] = {}
    for charge in session.ledger.charges():
        if charge.cost.infinite:
            continue
        total = totals.get(charge.dataset, PrivacyCost.zero(kind)) + charge.cost.to(kind)
        totals[charge.dataset] = total
        series.setdefault(charge.dataset, []).append((charge.at, float(total)))
    return series


def audit(session: Session, query: Mapping[str, str]) -> str:
    """The audit log, newest first, filtered by user, dataset, kind (action) and dates."""
    policy, delta = session.policy, session.policy.delta
    user, dataset, action = query.get("user", ""), query.get("dataset", ""), query.get("kind", "")
    since, until = _day(query.get("from")), _day(query.get("to"))
    rows = session.audit(user or None)
    actions = sorted({r["action"] for r in rows})
    picked = [r for r in reversed(rows)
              if (not dataset or r["dataset"] == dataset) and (not action or r["action"] == action)
              and (since is None or r["at"].date() >= since)
              and (until is None or r["at"].date() <= until)][:AUDIT_ROWS]
    form = ('<form method="get" action="audit">'
            + pages.select("user", policy.users, user, "any user")
            + pages.select("dataset", policy.datasets, dataset, "any dataset")
            + pages.select("kind", actions, action, "any kind")
            + f'<label>from <input type="date" name="from" value="{escape(str(since or ""))}">'
            f'</label><label>to <input type="date" name="to" value="{escape(str(until or ""))}">'
            "</label><button>Filter</button></form>")
    body = pages.table(
        ([r["id"], f"{r['at']:%Y-%m-%d %H:%M:%S}", r["user"], r["dataset"] or "", r["action"],
          r["outcome"], ("asked " if r["outcome"] is Outcome.REFUSED else "")
          + r["cost"].describe(delta) if r["cost"] else "",
          _short(r["reason"] or r["statement"] or "")] for r in picked),
        ["id", "at", "user", "dataset", "kind", "outcome", "cost", "statement / reason"])
    return f"{form}<p>{len(picked)} row(s)</p>{body}"


def releases(session: Session, csrf: str) -> str:
    """Every release (superseded ones too) with its cost and copies, and the release form."""
    from dpsql.provenance import cost_text, releases
    from dpsql.synth.base import unavailable

    policy = session.policy
    rows = []
    for r in releases(session.store, include_superseded=True):
        rec, name = r["record"], r["name"]
        link = escape(name) if r["superseded_by"] else \
            f'<a href="releases/{quote(name)}">{escape(name)}</a>'
        rows.append([link, r["dataset"], r["synthesizer"], r["privacy"], f"{rec['rows']:,}",
                     rec["copies"], cost_text(rec["cost"]["charged"]), r["released_by"],
                     f"{r['released_at']:%Y-%m-%d %H:%M}",
                     "yes" if rec.get("published", True) else "NO (held: its fit failed)",
                     r["superseded_by"] or ""])
    allowed = sorted({s for ds in policy.datasets.values() for s in ds.synthesizers})
    why = {s: unavailable(s) for s in allowed}  # declarations only: no synthesizer imported
    form = ('<form method="post" action="release"><fieldset><legend>Release a synthetic table'
            "</legend>" + pages.hidden(csrf) + pages.select("dataset", policy.datasets)
            + pages.select("synthesizer", [s for s in allowed if why[s] is None])
            + '<label>epsilon <input name="epsilon" size="6"></label>'
            '<label>name <input name="name" size="16"></label>'
            '<label><input type="checkbox" name="force"> force (past a forecast that says '
            "it cannot beat independent)</label>"
            '<button name="dry_run" value="1">Dry run (charges nothing)</button>'
            "<button>Release</button></fieldset></form>"
            + "".join(f"<p>{escape(s)} cannot run here: {escape(w)}</p>"
                      for s, w in why.items() if w is not None))
    headers = ["name", "dataset", "synthesizer", "privacy", "rows", "copies", "cost", "by",
               "at", "published", "superseded by"]
    return (pages.table(rows, headers, raw=0) if rows else "<p>no releases yet</p>") + form


def release(session: Session, name: str) -> str:
    """One release's provenance (as ``releases show``) with a link to its fidelity report."""
    from dpsql.admin.releases import show_release
    from dpsql.commands.release_text import release_facts
    from dpsql.provenance import cost_text

    entry = show_release(session, name=name)
    measurements = entry.record.get("measurements", [])
    body = pages.table(release_facts(entry), ["fact", "value"])
    if measurements:
        body += "<h2>Measurements</h2>" + pages.table(
            ([", ".join(m.get("columns", [])) or "(row count)", m.get("cells", ""),
              m.get("mechanism", ""), m.get("scale", ""),
              cost_text(m["cost"]) if isinstance(m.get("cost"), dict) else ""]
             for m in measurements), ["columns", "cells", "mechanism", "scale", "cost"])
    if entry.record.get("output") == "rows":
        body += (f'<p><a href="releases/{quote(name)}/report">Fidelity report</a> (not DP: '
                 "computed from the real data; audited, as dpsql evaluate)</p>")
    return body


def report(session: Session, name: str) -> str:
    """The fidelity report of ``dpsql evaluate`` (a whole page; audited by the evaluation)."""
    from dpsql.analysis.fidelity import evaluate_release
    from dpsql.analysis.report import write_report

    evaluation = evaluate_release(session.context(), name, seed=0)
    with tempfile.TemporaryDirectory(prefix="dpsql-console-") as folder:
        return write_report(evaluation, folder)["html"].read_text()


def policy(session: Session) -> str:
    """The active policy, its history and each version's diff against the one before."""
    history = policy_history(session.store)
    diffs = "".join(f"<h3>version {version}</h3>{pages.diff_html(lines)}"
                    for version, lines in pages.policy_diffs(
                        [(h.version, h.text) for h in history]))
    return (f"<h2>Active (version {history[-1].version}, "
            f"{escape(history[-1].fingerprint)})</h2>"
            f'<pre class="diff">{escape(session.policy.text)}</pre><h2>History</h2>'
            + pages.table(([h.version, h.fingerprint, h.applied_by,
                            f"{h.applied_at:%Y-%m-%d %H:%M}", h.changes or ""]
                           for h in reversed(history)),
                          ["version", "fingerprint", "by", "at", "changes"])
            + f"<h2>Changes</h2>{diffs or '<p>only one version</p>'}")


def jobs(session: Session, csrf: str) -> str:
    """Release jobs, newest first, with a cancel button on those still queued or running."""
    rows = session.jobs().list()

    def cancel(job: dict[str, Any]) -> str:
        if not job["state"].live:
            return ""
        return (f'<form class="inline" method="post" action="jobs/{int(job["id"])}/cancel">'
                f"{pages.hidden(csrf)}"
                '<label><input type="checkbox" name="confirm" required> forfeit its charge'
                "</label><button>Cancel</button></form>")

    return pages.table(
        ([cancel(j), j["id"], j["state"], j["stage"] or "", j["kind"], j["name"], j["dataset"],
          j["synthesizer"], j["user"], j["submitted_at"], j["error"] or ""] for j in rows),
        ["", "id", "state", "stage", "kind", "name", "dataset", "synthesizer", "user",
         "submitted", "error"], raw=0) if rows else "<p>no release jobs yet</p>"


def _day(text: str | None) -> date | None:
    try:
        return date.fromisoformat(text) if text else None
    except ValueError:
        return None


def _short(text: str, width: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
