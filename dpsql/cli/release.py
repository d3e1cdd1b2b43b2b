"""Release commands: release, releases list/show, export, evaluate, release-more."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dpsql.cli import sigint
from dpsql.cli.common import (
    LocalPath,
    as_option,
    cli,
    db_option,
    default_actor,
    here,
    json_option,
)
from dpsql.cli.output import emit_json, heading, table
from dpsql.errors import ConfigurationError

if TYPE_CHECKING:  # each command imports what it runs, so --help and --version stay fast
    from dpsql.release import Release


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


def _options(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--option takes KEY=VALUE, got {value!r}")
        out[key.strip()] = text.strip()
    return out


def _columns(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [c.strip() for c in value.split(",") if c.strip()]
    if not names:
        raise ConfigurationError("--columns needs at least one column name")
    return names


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ",".join(_short(v) for v in value)
    return str(value)


def _print_release(result: Release, remaining: str | None) -> None:
    from dpsql.provenance import cost_text

    record = result.record
    if record["output"] == "representation":
        shape = f"{record['rows']:,} rows of counts (query them with udfs.dp_range_count)"
    else:
        copies = record["copies"]
        shape = (f"{record['rows']:,} rows" + (f" x {copies} copies (column _copy)"
                                               if copies > 1 else ""))
    verb = "kept unpublished" if result.held else "released"
    click.echo(f"{verb} {result.table}: {shape}, from {record['dataset']['name']} by "
               f"{record['synthesizer']['name']}")
    click.echo(f"  release id {result.release_id}; privacy: {record['privacy']}; charged "
               f"{cost_text(record['cost']['charged'])}")
    if remaining:
        click.echo(f"  {record['released_by']} has {remaining} left on "
                   f"{record['dataset']['name']}")
    for product in record.get("products", []):
        click.echo(f"  also released {product}")
    for warning in result.warnings:
        click.echo(click.style("warning: ", fg="yellow", bold=True) + warning, err=True)


@cli.command("release")
@click.argument("dataset")
@click.option("--synth", "synthesizer", required=True, metavar="NAME",
              help="The synthesizer (`dpsql releases synthesizers` lists them).")
@click.option("--name", required=True, metavar="T", help="Write the table released.T.")
@click.option("--epsilon", type=str, default=None,
              help="Budget to spend, as epsilon (with --delta under zcdp; default delta: the "
                   "policy's).")
@click.option("--delta", type=str, default=None, help="Delta for --epsilon (zcdp policies).")
@click.option("--rho", type=str, default=None, help="Budget to spend, as zCDP rho.")
@click.option("--rows", type=int, default=None,
              help="Rows per copy (default: the synthesizer's DP estimate of the row count).")
@click.option("--copies", type=int, default=1, show_default=True,
              help="Synthetic copies, told apart by a _copy column (for Rubin's rules).")
@click.option("--columns", default=None, metavar="A,B,...",
              help="Columns to synthesize (default: every column with a public domain).")
@click.option("--seed", type=int, default=None,
              help="Seed for sampling (recorded in the provenance; privacy noise never uses it).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="A synthesizer option (repeatable), e.g. --option postprocess=project.")
@click.option("--replace", is_flag=True,
              help="Replace an existing release of that name (its provenance is kept, marked "
                   "superseded).")
@click.option("--detach", is_flag=True,
              help="Print the job id once charged and return (dpsql jobs shows its progress).")
@db_option
@as_option
@json_option
def release_cmd(dataset: str, synthesizer: str, name: str, epsilon: str | None,
                delta: str | None, rho: str | None, rows: int | None, copies: int,
                columns: str | None, seed: int | None, options: tuple[str, ...], replace: bool,
                detach: bool, db: str, actor: str | None, as_json: bool) -> None:
    """Release a DP synthetic table of DATASET as released.T (administrators only).

    The budget is charged before anything private is computed and is never
    refunded, even if fitting fails or the job is cancelled (Ctrl-C, dpsql jobs
    cancel); nothing is written unless the whole release succeeds. The fit runs
    in a worker process. Analysts then read released.T with any SQL, for free.

    \b
    Examples:
      dpsql release adult --synth independent --epsilon 1 --name adult_ind
      dpsql release adult --synth joint --epsilon 1 --columns age,sex,income_50k \\
          --name adult_joint --copies 5
      dpsql release adult --synth range --epsilon 0.5 --columns age --name age_ranges
    """  # noqa: D301 (click needs a real \b)
    from dpsql.release import ReleaseRequest
    from dpsql.session import connect

    bar = ProgressBar(enabled=not as_json)
    request = ReleaseRequest(dataset, synthesizer, name, epsilon, delta, rho, rows, copies,
                             _columns(columns), seed, replace, _options(options))
    with connect(db, default_actor(actor, db)) as session:
        job = session.submit(request)
        if detach:
            if as_json:
                emit_json({"job": job})
            else:
                click.echo(f"job {job}: charged and queued; dpsql jobs shows its progress, "
                           f"dpsql jobs cancel {job} stops it (the charge stays)")
            return
        try:
            result = session.jobs().wait(job, bar)
        except KeyboardInterrupt:
            bar.close()
            last = session.audit(session.user, last=1)
            kept = last[0]["reason"] if last and last[0]["outcome"] in ("failed", "cancelled") \
                else None
            click.echo("interrupted: nothing was written" + (
                f" ({kept.partition('; ')[2]})" if kept and "; " in kept else ""), err=True)
            raise
        finally:
            bar.close()
        standing = session.ledger.budget(session.user, dataset)
        delta_policy = session.policy.delta
    if as_json:
        emit_json({"name": result.name, "table": result.table, "release_id": result.release_id,
                   "record": result.record, "warnings": result.warnings,
                   "remaining": standing.remaining.as_dict(delta_policy)})
        return
    _print_release(result, standing.remaining.describe(delta_policy, "down"))


@cli.command("release-more")
@click.argument("name")
@click.option("--copies", type=int, required=True, help="How many copies to add.")
@click.option("--seed", type=int, default=None, help="Seed for sampling (recorded).")
@db_option
@as_option
@json_option
def release_more_cmd(name: str, copies: int, seed: int | None, db: str, actor: str | None,
                     as_json: bool) -> None:
    """Add copies to release NAME from its stored DP state, at no privacy cost.

    Works for synthesizers that keep a state (independent, joint and others
    that say so in `dpsql releases show`). New copies get the next _copy values.
    """
    from dpsql.session import connect

    bar = ProgressBar(enabled=not as_json)
    with connect(db, default_actor(actor, db)) as session:
        try:
            result = session.release_more(name, copies, seed=seed, progress=bar)
        finally:
            bar.close()
    if as_json:
        emit_json({"name": name, "release_id": result.release_id, "record": result.record})
        return
    added = result.record["extensions"][-1]["copies"]
    click.echo(f"added {'copy' if len(added) == 1 else 'copies'} {_numbers(added)} to "
               f"released.{name} "
               f"(now {result.record['copies']} copies of {result.record['rows']:,} rows); "
               "no budget spent")


@cli.group("releases")
def releases_group() -> None:
    """List released synthetic tables and show their provenance."""


@releases_group.command("list")
@click.option("--all", "include_all", is_flag=True, help="Include superseded releases.")
@db_option
@as_option
@json_option
def releases_list(include_all: bool, db: str, actor: str | None, as_json: bool) -> None:
    """List releases (newest last) with their cost and shape."""
    from dpsql.provenance import cost_text, releases
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        rows = releases(session.store, include_superseded=include_all)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no releases yet; make one with: dpsql release DATASET --synth independent "
                   "--epsilon 1 --name T")
        return
    body = []
    for r in rows:
        rec = r["record"]
        body.append([r["name"], r["dataset"], r["synthesizer"], r["privacy"],
                     f"{rec['rows']:,}", rec["copies"], cost_text(rec["cost"]["charged"]),
                     r["released_by"], r["released_at"],
                     "yes" if rec.get("published", True) else "NO (held)"]
                    + ([r["superseded_by"] or ""] if include_all else []))
    headers = ["name", "dataset", "synthesizer", "privacy", "rows", "copies", "cost", "by", "at",
               "published"]
    click.echo(table(body, headers + (["superseded by"] if include_all else []),
                     right=[4, 5]))


@releases_group.command("synthesizers")
@json_option
def releases_synthesizers(as_json: bool) -> None:
    """List the synthesizers and whether each can run here (a policy picks which a dataset allows).

    Reads their declarations: no synthesizer (nor torch or JAX) is imported. One
    whose extra is not installed names the command that installs it.
    """
    from dpsql.synth import base

    rows = []
    for d in base.declarations():
        problem = d.unavailable()
        rows.append({"name": d.name, "dp": d.is_dp, "dp_when": d.dp_when or None,
                     "output": d.output, "summary": d.summary, "extra": d.extra or None,
                     "loadable": problem is None,
                     "install": None if problem is None else d.install()})
    refused = base.refused()
    if as_json:
        emit_json(rows + [{"name": n, "refused": why} for n, why in sorted(refused.items())])
        return
    click.echo(table([[r["name"], "dp" if r["dp"] else
                       f"not DP (DP with {r['dp_when']})" if r["dp_when"] else "not DP",
                       r["output"], r["install"] or "yes", r["summary"]] for r in rows],
                     ["name", "privacy", "output", "installed", "what it does"]))
    for name, why in sorted(refused.items()):
        click.echo(f"refused plugin {name}: {why}", err=True)


@releases_group.command("show")
@click.argument("name")
@db_option
@as_option
@json_option
def releases_show(name: str, db: str, actor: str | None, as_json: bool) -> None:
    """Show the provenance of release NAME (pretty, or the full record with --json)."""
    from dpsql.provenance import cost_text, find
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        entry = find(session.store, name)
    if as_json:
        emit_json(entry)
        return
    rec = entry["record"]
    facts = release_facts(entry)
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        click.echo(f"{key.ljust(width)}  {value}")
    measurements = rec.get("measurements", [])
    if measurements:
        click.echo()
        click.echo(heading("measurements"))
        click.echo(table([[", ".join(m.get("columns", [])) or "(row count)", m.get("cells", ""),
                           m.get("mechanism", ""), m.get("scale", ""),
                           cost_text(m["cost"]) if isinstance(m.get("cost"), dict) else ""]
                          for m in measurements],
                         ["columns", "cells", "mechanism", "scale", "cost"], right=[1, 3]))
    diagnostics = {k: v for k, v in rec.get("diagnostics", {}).items() if k != "warnings"}
    if diagnostics:
        click.echo()
        click.echo(heading("diagnostics"))
        for key, value in diagnostics.items():
            if isinstance(value, list) and all(isinstance(v, dict) for v in value):
                click.echo(f"  {key}:")
                for item in value:
                    click.echo("    " + ", ".join(f"{k}={_short(v)}" for k, v in item.items()))
            elif isinstance(value, dict):
                click.echo(f"  {key}: " + ", ".join(f"{k}={_short(v)}" for k, v in value.items()))
            else:
                click.echo(f"  {key}: {_short(value)}")
    for warning in rec.get("diagnostics", {}).get("warnings", []):
        click.echo(click.style("warning: ", fg="yellow", bold=True) + warning)


@releases_group.command("publish")
@click.argument("name")
@db_option
@as_option
@json_option
def releases_publish(name: str, db: str, actor: str | None, as_json: bool) -> None:
    """Publish release NAME, held from analysts because its fit failed its diagnostics.

    A release whose fit fails a check its synthesizer declares (an importance-sampling
    ESS far below its draws, chains that disagree) is written to held.NAME, which no
    analyst can read. Read 'dpsql releases show NAME' first: this command is your
    explicit decision that the table may reach analysts anyway. Audited.
    """
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        result = session.publish(name)
    if as_json:
        emit_json({"name": result.name, "table": result.table,
                   "release_id": result.release_id, "record": result.record})
        return
    click.echo(f"published {result.table} (release {result.release_id}): analysts can read it "
               "now; its record keeps the failed checks and says you published it")


def _file_mode(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """An octal permission mode such as 600 or 0644."""
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is not an octal file mode such as 600 or 644")
    return mode


@cli.command("export")
@click.argument("name")
@click.argument("out", type=LocalPath(dir_okay=False))
@click.option("--mode", default="600", show_default=True, callback=_file_mode,
              help="The file's permissions, in octal (644 lets other local users read it).")
@db_option
@as_option
@json_option
def export_cmd(name: str, out: str, mode: int, db: str, actor: str | None,
               as_json: bool) -> None:
    """Write released table NAME to OUT (.parquet) with its provenance in the file metadata.

    The provenance record is the Parquet key-value metadata entry
    "dpsql.provenance" (JSON); pyarrow.parquet.read_schema(OUT).metadata reads it.
    The file is readable by you only unless --mode says otherwise.
    """
    from dpsql.provenance import export
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        info = export(session.store, name, out, mode=mode, admin=session.is_admin)
    if as_json:
        emit_json(info)
        return
    click.echo(f"wrote {info['path']}: {info['rows']:,} rows of release {name}, provenance in "
               "the Parquet metadata key dpsql.provenance")


@cli.command("evaluate")
@click.argument("name")
@click.option("--copy", "copy_number", type=int, default=None,
              help="Which synthetic copy to score (default: the first).")
@click.option("--out", type=LocalPath(file_okay=False), default=None,
              help="Directory for report.html and its PNG figures (default: NAME_report).")
@click.option("--no-report", is_flag=True, help="Print the table only; write no HTML report.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the bootstrap resample (the ideal).")
@db_option
@as_option
@json_option
def evaluate_cmd(name: str, copy_number: int | None, out: str | None, no_report: bool,
                 seed: int, db: str, actor: str | None, as_json: bool) -> None:
    """Score release NAME against the real data, next to the bootstrap ideal.

    NOT differentially private: it reads the real rows, so only administrators
    may run it, each run is audited, and its output must stay with them.
    Scores every 1-way and 2-way crosstab cell by log discrepancy, z and the
    blended figure of merit (MODP, sec. 5), plus the 2-way workload error.
    """
    from dpsql.analysis.fidelity import evaluate_release
    from dpsql.analysis.report import METRICS, write_report
    from dpsql.session import connect

    report = None if no_report else Path(here(out or f"{name}_report"))  # before the work
    with connect(db, default_actor(actor, db)) as session:
        evaluation = evaluate_release(session, name, copy=copy_number, seed=seed)
    paths = {} if report is None else write_report(evaluation, report)
    if as_json:
        emit_json({**evaluation.as_dict(), "report": str(paths["html"]) if paths else None})
        return
    synthetic, ideal = evaluation.synthetic.summary(), evaluation.ideal.summary()
    click.echo(heading(f"fidelity of released.{name} (NOT DP: computed from the real data)"))
    click.echo(table([[label, f"{synthetic[key]:.4f}", f"{ideal[key]:.4f}"]
                      for key, label in METRICS],
                     ["measure", "release", "bootstrap ideal"], right=[1, 2]))
    click.echo(f"{int(synthetic['cells']):,} crosstab cells; "
               f"{evaluation.synthetic.rows_synthetic:,} synthetic vs "
               f"{evaluation.synthetic.rows_true:,} true rows")
    if paths:
        click.echo(f"report: {paths['html']}")


def release_facts(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """The provenance of a release as (fact, value) lines (releases show, the console)."""
    from dpsql.provenance import cost_text

    rec = entry["record"]
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
        ("rows", _copies(rec['rows'], rec['copies']) if rec["output"] == "rows"
         else f"{rec['rows']:,} rows of counts"),
        ("seed", f"{rec['seed']['value']} ({rec['seed']['source']})"),
        ("products", ", ".join(rec.get("products", [])) or "none"),
        ("resumable", "yes (dpsql release-more)" if rec.get("resumable") else "no"),
        ("released", f"by {rec['released_by']} at {rec['released_at'][:19]}"),
        ("published", publication(rec)),
    ]
    for ext in rec.get("extensions", []):
        facts.append(("more copies", f"{_numbers(ext['copies'])} by {ext['by']} "
                                     f"at {ext['at']}"))
    if entry["superseded_by"]:
        facts.append(("superseded by", entry["superseded_by"]))
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


def _numbers(numbers: list[int]) -> str:
    """Copy numbers as ``3`` or ``2-5``."""
    return str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"


def _copies(rows: int, copies: int) -> str:
    """``4,984`` or ``4,984 x 3 copies``."""
    return f"{rows:,}" + (f" x {copies} copies" if copies > 1 else "")
