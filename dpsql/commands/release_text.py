"""Text of release results: a release, added copies, the list, one provenance, a fidelity score.

Shared by the CLI, ``CALL dpsql`` and the console (which shows the same facts as HTML).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dpsql.commands import render
from dpsql.commands.door import Text

if TYPE_CHECKING:
    from dpsql.admin.data import Evaluated
    from dpsql.admin.releases import (
        Published,
        Released,
        ReleaseEntry,
        Releases,
        Synthesizers,
    )
    from dpsql.release import DryRun


def cost_text(cost: dict[str, Any]) -> str:
    """A recorded cost (a provenance record's) in both units."""
    from dpsql.provenance import cost_text as text

    return text(cost)


def released_text(result: Released) -> Text:
    """What a release wrote, what it cost and what is left."""
    record = result.record
    if record["output"] == "representation":
        shape = f"{record['rows']:,} rows of counts (query them with udfs.dp_range_count)"
    else:
        copies = record["copies"]
        shape = (f"{record['rows']:,} rows" + (f" x {copies} copies (column _copy)"
                                               if copies > 1 else ""))
    verb = "kept unpublished" if result.held else "released"
    lines = [f"{verb} {result.table}: {shape}, from {record['dataset']['name']} by "
             f"{record['synthesizer']['name']}",
             f"  release id {result.release_id}; privacy: {record['privacy']}; charged "
             f"{cost_text(record['cost']['charged'])}"]
    if result.remaining is not None:
        left = result.remaining.describe(result.delta, "down")
        lines.append(f"  {record['released_by']} has {left} left on "
                     f"{record['dataset']['name']}")
    lines += [f"  also {verb} {product}" for product in record.get("products", [])]
    return Text(lines, [render.warning(w) for w in result.warnings])


def forecast_text(lines: list[str]) -> Text:
    """A release's forecast (public arithmetic), as notes beside its progress."""
    return Text([], [f"forecast: {line}" for line in lines])


def dry_run_text(plan: DryRun) -> Text:
    """What ``dpsql release --dry-run`` found: the checks passed, the cost, the forecast."""
    verdict = f"would be refused: {plan.refused}" if plan.refused else \
        "every check before the charge passed; nothing was charged"
    shape = "" if plan.rows is None else f", {plan.rows:,} rows"
    copies = f" x {plan.copies} copies" if plan.copies > 1 else ""
    lines = [f"dry run: release {plan.dataset} by {plan.synthesizer} as {plan.name}",
             f"  {verdict}",
             f"  would charge {plan.cost}" if plan.dp else
             "  not DP: would charge nothing and be labelled privacy: empirical",
             f"  columns ({len(plan.columns)}, {plan.cells:,} cells jointly): "
             f"{', '.join(plan.columns)}{shape}{copies}",
             "  forecast:"]
    lines += [f"    {line}" for line in plan.forecast.lines()]
    return Text(lines, [render.warning(w) for w in plan.warnings])


def submitted_text(job: int) -> Text:
    """A release charged and queued (``--detach``)."""
    return Text([f"job {job}: charged and queued; dpsql jobs shows its progress, "
                 f"dpsql jobs cancel {job} stops it (the charge stays)"])


def more_text(result: Released) -> Text:
    """The copies ``release-more`` added."""
    added = result.record["extensions"][-1]["copies"]
    held = " (still held from analysts)" if result.held else ""
    return Text([f"added {'copy' if len(added) == 1 else 'copies'} {numbers(added)} to "
                 f"{result.table}{held} (now {result.record['copies']} copies of "
                 f"{result.record['rows']:,} rows); no budget spent"])


def releases_text(listed: Releases, include_all: bool) -> Text:
    """The releases as a table (with what superseded each, when ``include_all``)."""
    if not listed.releases:
        return Text(["no releases yet; make one with: dpsql release DATASET --synth "
                     "independent --epsilon 1 --name T"])
    body = []
    for r in listed.releases:
        rec = r.record
        body.append([r.name, r.dataset, r.synthesizer, r.privacy, f"{rec['rows']:,}",
                     rec["copies"], cost_text(rec["cost"]["charged"]), r.released_by,
                     r.released_at, "yes" if rec.get("published", True) else "NO (held)"]
                    + ([r.superseded_by or ""] if include_all else []))
    headers = ["name", "dataset", "synthesizer", "privacy", "rows", "copies", "cost", "by", "at",
               "published"]
    return Text([render.table(body, headers + (["superseded by"] if include_all else []),
                              right=[4, 5])])


def synthesizers_text(listed: Synthesizers) -> Text:
    """The synthesizers, whether each is DP and installed, and the refused plugins."""
    rows = [[s.name, "dp" if s.dp else f"not DP (DP with {s.dp_when})" if s.dp_when
             else "not DP", s.output, s.install or "yes", s.summary]
            for s in listed.synthesizers]
    return Text([render.table(rows, ["name", "privacy", "output", "installed",
                                     "what it does"])],
                [f"refused plugin {name}: {why}" for name, why in listed.refused.items()])


def entry_text(entry: ReleaseEntry) -> Text:
    """One release's provenance: its facts, measurements, diagnostics and warnings."""
    rec = entry.record
    facts = release_facts(entry)
    width = max(len(k) for k, _ in facts)
    lines = [f"{key.ljust(width)}  {value}" for key, value in facts]
    measurements = rec.get("measurements", [])
    if measurements:
        lines += ["", render.heading("measurements"), render.table(
            [[", ".join(m.get("columns", [])) or "(row count)", m.get("cells", ""),
              m.get("mechanism", ""), m.get("scale", ""),
              cost_text(m["cost"]) if isinstance(m.get("cost"), dict) else ""]
             for m in measurements], ["columns", "cells", "mechanism", "scale", "cost"],
            right=[1, 3])]
    diagnostics = {k: v for k, v in rec.get("diagnostics", {}).items() if k != "warnings"}
    if diagnostics:
        lines += ["", render.heading("diagnostics")]
        for key, value in diagnostics.items():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                lines.append(f"  {key}:")
                lines += ["    " + ", ".join(f"{k}={_short(v)}" for k, v in item.items())
                          for item in value]
            elif isinstance(value, dict):
                lines.append(f"  {key}: " + ", ".join(f"{k}={_short(v)}"
                                                      for k, v in value.items()))
            else:
                lines.append(f"  {key}: {_short(value)}")
    lines += [render.warning(w) for w in rec.get("diagnostics", {}).get("warnings", [])]
    return Text(lines)


def release_facts(entry: ReleaseEntry) -> list[tuple[str, str]]:
    """The provenance of a release as (fact, value) lines (releases show, the console)."""
    rec = entry.record
    facts = [
        ("table", rec["table"]), ("release id", rec["release_id"]),
        ("dataset", f"{rec['dataset']['name']} (table {rec['dataset']['table']}, fingerprint "
                    f"{rec['dataset']['fingerprint']})"),
        ("privacy unit", f"{rec['dataset']['privacy_unit']}, at most "
                         f"{rec['dataset']['max_rows']} row(s) each"),
        ("policy", rec["policy_fingerprint"]),
        ("synthesizer", f"{rec['synthesizer']['name']} {rec['synthesizer']['version']} "
                        f"({rec['synthesizer']['module']})"),
        ("options", ", ".join(f"{k}={v}" for k, v in rec["synthesizer"]["options"].items())
         or "(defaults)"),
        ("parameters", ", ".join(f"{k}={v}" for k, v in rec["parameters"].items())),
        ("privacy", rec["privacy"]),
        ("cost charged", cost_text(rec["cost"]["charged"])),
        ("cost spent", cost_text(rec["cost"]["spent"])),
        ("columns", ", ".join(rec["columns"])),
        ("rows", copies(rec['rows'], rec['copies']) if rec["output"] == "rows"
         else f"{rec['rows']:,} rows of counts"),
        ("seed", f"{rec['seed']['value']} ({rec['seed']['source']})"),
        ("products", ", ".join(rec.get("products", [])) or "none"),
        ("resumable", "yes (dpsql release-more)" if rec.get("resumable") else "no"),
        ("released", f"by {rec['released_by']} at {rec['released_at'][:19]}"),
        ("published", publication(rec)),
    ]
    for ext in rec.get("extensions", []):
        facts.append(("more copies", f"{numbers(ext['copies'])} by {ext['by']} "
                                     f"at {ext['at']}"))
    if entry.superseded_by:
        facts.append(("superseded by", entry.superseded_by))
    return facts


def publication(rec: dict[str, Any]) -> str:
    """Whether analysts can read the release, and why not (a fit that failed its checks)."""
    failed = ", ".join(c["check"] for c in rec.get("diagnostics", {}).get("checks", [])
                       if not c.get("passed", False))
    if not rec.get("published", True):
        return (f"NO: held from analysts, the fit failed {failed}; publish it anyway with "
                f"dpsql releases publish {rec['name']}")
    if "published_by" in rec:
        return (f"yes, by {rec['published_by']} at {rec['published_at']}, despite the failed "
                f"{failed}")
    return "yes"


def published_text(result: Published) -> Text:
    """A held release published by an administrator."""
    return Text([f"published {result.table} (release {result.release_id}): analysts can read "
                 "it now; its record keeps the failed checks and says you published it"])


def evaluated_text(evaluation: Evaluated, report: str | None) -> Text:
    """A fidelity score next to the bootstrap ideal (NOT DP), and where its report went."""
    from dpsql.analysis.report import METRICS

    synthetic, ideal = evaluation.synthetic, evaluation.ideal
    lines = [render.heading(f"fidelity of released.{evaluation.name} (NOT DP: computed from the "
                            "real data)"),
             render.table([[label, f"{synthetic[key]:.4f}", f"{ideal[key]:.4f}"]
                           for key, label in METRICS],
                          ["measure", "release", "bootstrap ideal"], right=[1, 2]),
             f"{int(synthetic['cells']):,} crosstab cells; {evaluation.rows_synthetic:,} "
             f"synthetic vs {evaluation.rows_true:,} true rows"]
    if report:
        lines.append(f"report: {report}")
    return Text(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ",".join(_short(v) for v in value)
    return str(value)


def numbers(values: list[int]) -> str:
    """Copy numbers as ``3`` or ``2-5``."""
    return str(values[0]) if len(values) == 1 else f"{values[0]}-{values[-1]}"


def copies(rows: int, count: int) -> str:
    """``4,984`` or ``4,984 x 3 copies``."""
    return f"{rows:,}" + (f" x {count} copies" if count > 1 else "")
