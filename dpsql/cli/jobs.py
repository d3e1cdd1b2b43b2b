"""``dpsql jobs``: list release jobs with their progress, cancel one."""

from __future__ import annotations

from typing import Any

import click

from dpsql.cli.common import as_option, cli, db_option, default_actor, json_option, store_option
from dpsql.cli.output import emit_json, table

HEADERS = ["id", "state", "progress", "kind", "name", "dataset", "synthesizer", "user",
           "submitted", "error"]


@cli.group("jobs", invoke_without_command=True)
@store_option("--db", "db", help="The store (a DuckDB file). Default: $DPSQL_DB.")
@as_option
@json_option
@click.pass_context
def jobs_group(context: click.Context, db: str | None, actor: str | None,
               as_json: bool) -> None:
    """List release jobs, newest first, with their progress (administrators only).

    \b
    Examples:
      dpsql jobs
      dpsql jobs cancel 3
    """  # noqa: D301 (click needs a real \b)
    if context.invoked_subcommand is not None:
        return
    if db is None:
        raise click.UsageError("Missing option '--db' (or set $DPSQL_DB).")
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        session.require_admin("list release jobs")
        rows = session.jobs().list()
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no release jobs yet; dpsql release starts one")
        return
    click.echo(table([_row(r) for r in rows], HEADERS, right=[0]))


def _row(job: dict[str, Any]) -> list[Any]:
    stage, fraction = job["stage"], job["fraction"]
    progress = "" if stage is None else stage + ("" if fraction is None or job["state"] not in (
        "queued", "running") else f" {fraction:.0%}")
    return [job["id"], job["state"], progress, job["kind"], job["name"], job["dataset"],
            job["synthesizer"], job["user"], job["submitted_at"], job["error"] or ""]


@jobs_group.command("cancel")
@click.argument("job", type=int)
@db_option
@as_option
@json_option
def jobs_cancel(job: int, db: str, actor: str | None, as_json: bool) -> None:
    """Cancel queued or running job JOB: nothing is written, the charge stays."""
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        session.require_admin("cancel release jobs")
        session.jobs().cancel(job, session.user)
    if as_json:
        emit_json({"job": job, "state": "cancelled", "written": False, "charge": "stays"})
        return
    click.echo(f"job {job} cancelled: nothing was written; its charge stays")
