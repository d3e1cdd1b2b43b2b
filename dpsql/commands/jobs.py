"""``dpsql jobs``: list release jobs with their progress, cancel one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dpsql.commands import render
from dpsql.commands.common import (
    admin_command,
    admin_group,
    as_option,
    cli,
    db_option,
    json_option,
    store_option,
)
from dpsql.commands.door import Door, Text

if TYPE_CHECKING:
    from dpsql.admin.jobs import Job, Jobs

HEADERS = ["id", "state", "progress", "kind", "name", "dataset", "synthesizer", "user",
           "submitted", "error"]


@admin_group(cli, "jobs")
@store_option("--db", "db", help="The store (a DuckDB file). Default: $DPSQL_DB.")
@as_option
@json_option
def jobs_group(door: Door, db: str | None, actor: str | None, as_json: bool) -> None:
    """List release jobs, newest first, with their progress (administrators only).

    \b
    Examples:
      dpsql jobs
      dpsql jobs cancel 3
    """  # noqa: D301 (click needs a real \b)
    from dpsql.admin.jobs import list_jobs

    if db is None:
        raise click.UsageError("Missing option '--db' (or set $DPSQL_DB).")
    listed = door.call(list_jobs)
    if as_json:
        door.json(listed.as_dict()["jobs"])
    else:
        door.show(jobs_text(listed))


def jobs_text(listed: Jobs) -> Text:
    """The jobs as a table, newest first."""
    if not listed.jobs:
        return Text(["no release jobs yet; dpsql release starts one"])
    return Text([render.table([_row(j) for j in listed.jobs], HEADERS, right=[0])])


def _row(job: Job) -> list[object]:
    stage, fraction = job.stage, job.fraction
    progress = "" if stage is None else stage + ("" if fraction is None or job.state not in (
        "queued", "running") else f" {fraction:.0%}")
    return [job.id, job.state, progress, job.kind, job.name, job.dataset, job.synthesizer,
            job.user, job.submitted_at, job.error or ""]


@admin_command(jobs_group, "cancel")
@click.argument("job", type=int)
@db_option
@as_option
@json_option
def jobs_cancel(door: Door, job: int, db: str, actor: str | None, as_json: bool) -> None:
    """Cancel queued or running job JOB: nothing is written, the charge stays."""
    from dpsql.admin.jobs import cancel_job

    cancelled = door.call(cancel_job, job=job)
    if as_json:
        door.json(cancelled.as_dict())
    else:
        door.show(cancel_text(cancelled.job))


def cancel_text(job: int) -> Text:
    """What a cancel did."""
    return Text([f"job {job} cancelled: nothing was written; its charge stays"])
