"""The console's actions: each form is one typed operation, run as the logged-in administrator.

A form's values go to the operation as its typed arguments, whatever they hold
(a user named ``alice --as admin`` is a user name, never an option). Every action
is audited (action ``admin_call``, statement ``console: dpsql ...``: the command
line that does the same) besides what the operation itself records; an analyst
is refused and audited so.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import click

from dpsql.admin import require_admin_call
from dpsql.commands.door import Text
from dpsql.errors import ConfigurationError
from dpsql.outcomes import Outcome
from dpsql.session import Session

_CANCEL = re.compile(r"^/jobs/(\d+)/cancel$")


@dataclass(frozen=True)
class Action:
    """What a form asks: the page to go back to, its command line, its operation."""

    back: str
    line: tuple[str, ...]  # the dpsql command that does the same (for the audit row)
    run: Callable[[Session], Text]  # the operation, its result rendered


def action(path: str, form: Mapping[str, str]) -> Action | None:
    """The action of a form posted to ``path`` (None: no such action)."""
    if path == "/grant":
        return _grant(form.get("user", ""), form.get("dataset", ""), form.get("epsilon", ""))
    if path == "/release":
        return _release(form.get("dataset", ""), form.get("synthesizer", ""),
                        form.get("epsilon", ""), form.get("name", ""),
                        dry_run=form.get("dry_run") == "1", force=form.get("force") == "on")
    match = _CANCEL.match(path)
    if match:
        return _cancel(int(match.group(1)), confirmed=form.get("confirm") == "on")
    return None


def _grant(user: str, dataset: str, epsilon: str) -> Action:
    def run(session: Session) -> Text:
        from dpsql.admin.budgets import grant
        from dpsql.commands.admin import grant_text

        return grant_text(grant(session, user=user, dataset=dataset, epsilon=epsilon))

    return Action("budgets", ("budget", "grant", "--epsilon", epsilon, "--", user, dataset), run)


def _release(dataset: str, synthesizer: str, epsilon: str, name: str, *, dry_run: bool,
             force: bool) -> Action:
    arguments: dict[str, Any] = {"dataset": dataset, "synthesizer": synthesizer, "name": name,
                                 "epsilon": epsilon, "force": force}
    flags = ("--force",) * force

    def plan(session: Session) -> Text:
        from dpsql.admin.releases import plan_release
        from dpsql.commands.release_text import dry_run_text

        return dry_run_text(plan_release(session, **arguments))

    def run(session: Session) -> Text:
        from dpsql.admin.releases import submit_release
        from dpsql.commands.release_text import forecast_text, submitted_text

        submitted = submit_release(session, **arguments)
        return forecast_text(submitted.forecast) + submitted_text(submitted.job)

    line = ("release", "--synth", synthesizer, "--epsilon", epsilon, "--name", name, *flags)
    if dry_run:
        return Action("releases", (*line, "--dry-run", "--", dataset), plan)
    return Action("jobs", (*line, "--detach", "--", dataset), run)


def _cancel(job: int, *, confirmed: bool) -> Action:
    def run(session: Session) -> Text:
        from dpsql.admin.jobs import cancel_job
        from dpsql.commands.jobs import cancel_text

        if not confirmed:  # the form's checkbox is required; a hand-made post is refused too
            raise ConfigurationError(f"job {job} was not cancelled: tick 'forfeit its charge' "
                                     "to confirm (a cancelled release keeps its charge)")
        return cancel_text(cancel_job(session, job=job).job)

    return Action("jobs", ("jobs", "cancel", str(job)), run)


def perform(session: Session, chosen: Action) -> str:
    """Run ``chosen`` as the session's administrator, audited; what it says, as plain text."""
    statement = f"console: dpsql {shlex.join(chosen.line)}"
    require_admin_call(session, statement, "the console")
    ledger = session.ledger
    try:
        said = chosen.run(session)
    except Exception as err:
        ledger.record(session.user, None, statement, Outcome.FAILED,
                      (str(err).splitlines() or [type(err).__name__])[0], action="admin_call")
        raise
    ledger.record(session.user, None, statement, Outcome.DONE, action="admin_call")
    return "\n".join(click.unstyle(line) for line in said.out + said.err).strip()
