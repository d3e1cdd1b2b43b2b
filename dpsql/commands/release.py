"""Release commands: release, release-more, releases list/show/synthesizers, export, evaluate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from dpsql.commands import release_text as text
from dpsql.commands.common import (
    LocalPath,
    admin_command,
    as_option,
    cli,
    db_option,
    json_option,
)
from dpsql.commands.door import Door
from dpsql.errors import ConfigurationError

if TYPE_CHECKING:
    from dpsql.admin.releases import Released


def _options(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, given = value.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--option takes KEY=VALUE, got {value!r}")
        out[key.strip()] = given.strip()
    return out


def _columns(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [c.strip() for c in value.split(",") if c.strip()]
    if not names:
        raise ConfigurationError("--columns needs at least one column name")
    return names


@admin_command(cli, "release")
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
@click.option("--dry-run", is_flag=True,
              help="Run every check made before the charge and print the cost and the "
                   "forecast (the noise each measurement will carry); charge nothing.")
@click.option("--force", is_flag=True,
              help="Release even when the forecast says it cannot beat independent.")
@db_option
@as_option
@json_option
def release_cmd(door: Door, dataset: str, synthesizer: str, name: str, epsilon: str | None,
                delta: str | None, rho: str | None, rows: int | None, copies: int,
                columns: str | None, seed: int | None, options: tuple[str, ...], replace: bool,
                detach: bool, dry_run: bool, force: bool, db: str, actor: str | None,
                as_json: bool) -> None:
    """Release a DP synthetic table of DATASET as released.T (administrators only).

    The budget is charged before anything private is computed and is never
    refunded, even if fitting fails or the job is cancelled (Ctrl-C, dpsql jobs
    cancel); nothing is written unless the whole release succeeds. The fit runs
    in a worker process. Analysts then read released.T with any SQL, for free.

    Before the charge each release prints its forecast: the noise its
    measurements will carry, from public facts only. One that cannot beat the
    independent synthesizer is refused unless --force; --dry-run shows it all
    and charges nothing. A fit that fails its diagnostics is kept unpublished
    (dpsql releases show T says why; dpsql releases publish T overrides).

    \b
    Examples:
      dpsql release adult --synth independent --epsilon 1 --name adult_ind
      dpsql release adult --synth joint --epsilon 1 --columns age,sex,income_50k \\
          --name adult_joint --copies 5
      dpsql release adult --synth range --epsilon 0.5 --columns age --name age_ranges
      dpsql release adult --synth mst --epsilon 1 --name adult_mst --dry-run
    """  # noqa: D301 (click needs a real \b)
    from dpsql.admin.releases import plan_release, submit_release

    arguments: dict[str, Any] = {"dataset": dataset, "synthesizer": synthesizer, "name": name,
                                 "epsilon": epsilon, "delta": delta, "rho": rho, "rows": rows,
                                 "copies": copies, "columns": _columns(columns), "seed": seed,
                                 "replace": replace, "options": _options(options),
                                 "force": force}
    if dry_run:
        plan = door.call(plan_release, **arguments)
        if as_json:
            door.json(plan.as_dict())
        else:
            door.show(text.dry_run_text(plan))
        return
    submitted = door.call(submit_release, **arguments)
    if not as_json:
        door.show(text.forecast_text(submitted.forecast))
    if detach:
        if as_json:
            door.json(submitted.as_dict())
        else:
            door.show(text.submitted_text(submitted.job))
        return
    result = _wait(door, submitted.job, submitted.user, as_json)
    if as_json:
        door.json(result.as_dict())
    else:
        door.show(text.released_text(result))


def _wait(door: Door, job: int, user: str, as_json: bool) -> Released:
    """Follow job ``job`` with a progress bar; Ctrl-C cancels it and says what stays."""
    from dpsql.admin.audit import audit
    from dpsql.admin.releases import wait_release

    bar = door.progress(enabled=not as_json)
    try:
        return door.call(wait_release, job=job, progress=bar)
    except KeyboardInterrupt:
        bar.close()
        last = door.call(audit, user=user, last=1).entries
        kept = last[0].reason if last and last[0].outcome in ("failed", "cancelled") else None
        door.err("interrupted: nothing was written" + (
            f" ({kept.partition('; ')[2]})" if kept and "; " in kept else ""))
        raise
    finally:
        bar.close()


@admin_command(cli, "release-more")
@click.argument("name")
@click.option("--copies", type=int, required=True, help="How many copies to add.")
@click.option("--seed", type=int, default=None, help="Seed for sampling (recorded).")
@db_option
@as_option
@json_option
def release_more_cmd(door: Door, name: str, copies: int, seed: int | None, db: str,
                     actor: str | None, as_json: bool) -> None:
    """Add copies to release NAME from its stored DP state, at no privacy cost.

    Works for synthesizers that keep a state (independent, joint and others
    that say so in `dpsql releases show`). New copies get the next _copy values.
    """
    from dpsql.admin.releases import submit_more

    submitted = door.call(submit_more, name=name, copies=copies, seed=seed)
    result = _wait(door, submitted.job, submitted.user, as_json)
    if as_json:
        door.json({"name": name, "release_id": result.release_id, "record": result.record})
    else:
        door.show(text.more_text(result))


@cli.group("releases")
def releases_group() -> None:
    """List released synthetic tables and show their provenance."""


@admin_command(releases_group, "list")
@click.option("--all", "include_all", is_flag=True, help="Include superseded releases.")
@db_option
@as_option
@json_option
def releases_list(door: Door, include_all: bool, db: str, actor: str | None,
                  as_json: bool) -> None:
    """List releases (newest last) with their cost and shape."""
    from dpsql.admin.releases import list_releases

    listed = door.call(list_releases, include_superseded=include_all)
    if as_json:
        door.json(listed.as_dict()["releases"])
    else:
        door.show(text.releases_text(listed, include_all))


@admin_command(releases_group, "synthesizers", actor=None)
@json_option
def releases_synthesizers(door: Door, as_json: bool) -> None:
    """List the synthesizers and whether each can run here (a policy picks which a dataset allows).

    Reads their declarations: no synthesizer (nor torch or JAX) is imported. One
    whose extra is not installed names the command that installs it.
    """
    from dpsql.admin.releases import list_synthesizers

    listed = door.call(list_synthesizers)
    if as_json:
        door.json([s.as_dict() for s in listed.synthesizers]
                  + [{"name": n, "refused": why} for n, why in listed.refused.items()])
    else:
        door.show(text.synthesizers_text(listed))


@admin_command(releases_group, "show")
@click.argument("name")
@db_option
@as_option
@json_option
def releases_show(door: Door, name: str, db: str, actor: str | None, as_json: bool) -> None:
    """Show the provenance of release NAME (pretty, or the full record with --json)."""
    from dpsql.admin.releases import show_release

    entry = door.call(show_release, name=name)
    if as_json:
        door.json(entry.as_dict())
    else:
        door.show(text.entry_text(entry))


@admin_command(releases_group, "publish")
@click.argument("name")
@db_option
@as_option
@json_option
def releases_publish(door: Door, name: str, db: str, actor: str | None, as_json: bool) -> None:
    """Publish release NAME, held from analysts because its fit failed its diagnostics.

    A release whose fit fails a check its synthesizer declares (an importance-sampling
    ESS far below its draws, chains that disagree, a model that misses its own
    measurements) is written to held.NAME, which no analyst can read. Read 'dpsql
    releases show NAME' first: this command is your explicit decision that the table
    may reach analysts anyway. Audited.
    """
    from dpsql.admin.releases import publish_release

    published = door.call(publish_release, name=name)
    if as_json:
        door.json(published.as_dict())
    else:
        door.show(text.published_text(published))


def _file_mode(ctx: click.Context, param: click.Parameter, value: str) -> int:
    """An octal permission mode such as 600 or 0644."""
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is not an octal file mode such as 600 or 644")
    return mode


@admin_command(cli, "export")
@click.argument("name")
@click.argument("out", type=LocalPath(dir_okay=False))
@click.option("--mode", default="600", show_default=True, callback=_file_mode,
              help="The file's permissions, in octal (644 lets other local users read it).")
@db_option
@as_option
@json_option
def export_cmd(door: Door, name: str, out: str, mode: int, db: str, actor: str | None,
               as_json: bool) -> None:
    """Write released table NAME to OUT (.parquet) with its provenance in the file metadata.

    The provenance record is the Parquet key-value metadata entry
    "dpsql.provenance" (JSON); pyarrow.parquet.read_schema(OUT).metadata reads it.
    The file is readable by you only unless --mode says otherwise.
    """
    from dpsql.admin.data import export_release

    if Path(out).suffix.lower() != ".parquet":
        raise ConfigurationError(f"export writes Parquet: give a path ending in .parquet, got "
                                 f"{Path(out).name}")
    out = door.output(out)
    exported = door.call(export_release, name=name)
    data = exported.parquet_table()

    def parquet(file: BinaryIO) -> None:
        import pyarrow.parquet as pq

        pq.write_table(data, file)

    try:
        door.write(out, parquet, mode=mode)
    except OSError as err:
        raise ConfigurationError(f"cannot write {out}: {err.strerror}") from err
    if as_json:
        door.json({"name": name, "path": out, "rows": data.num_rows,
                   "release_id": exported.release_id, "mode": f"{mode:o}"})
    else:
        door.out(f"wrote {out}: {data.num_rows:,} rows of release {name}, provenance in the "
                 "Parquet metadata key dpsql.provenance")


@admin_command(cli, "evaluate")
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
def evaluate_cmd(door: Door, name: str, copy_number: int | None, out: str | None,
                 no_report: bool, seed: int, db: str, actor: str | None,
                 as_json: bool) -> None:
    """Score release NAME against the real data, next to the bootstrap ideal.

    NOT differentially private: it reads the real rows, so only administrators
    may run it, each run is audited, and its output must stay with them.
    Scores every 1-way and 2-way crosstab cell by log discrepancy, z and the
    blended figure of merit (MODP, sec. 5), plus the 2-way workload error.
    """
    from dpsql.admin.data import evaluate

    folder = None if no_report else door.output(out or f"{name}_report")  # before the work
    evaluation = door.call(evaluate, name=name, copy=copy_number, seed=seed,
                           report=folder is not None)
    paths: dict[str, str] = {}
    if folder is not None and evaluation.report is not None:
        report = evaluation.report
        paths = door.write_folder(folder, {**report.figures, "report.html": report.html})
    html = paths.get("report.html")
    if as_json:
        door.json({**evaluation.as_dict(), "report": html})
    else:
        door.show(text.evaluated_text(evaluation, html))
