"""Administration commands on a store: policy check/apply/draft/show, budget show/grant, audit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dpsql.commands import render
from dpsql.commands.common import (
    LocalPath,
    admin_command,
    as_option,
    cli,
    db_option,
    json_option,
    store_option,
)
from dpsql.commands.door import Door, Text
from dpsql.draft import MAX_CATEGORIES
from dpsql.errors import ConfigurationError
from dpsql.outside import HANDLINGS, DomainError, Handling, Outside, summary

if TYPE_CHECKING:  # each command imports what it runs, so --help and --version stay fast
    from dpsql.admin.audit import AuditLog
    from dpsql.admin.budgets import Budgets, Granted
    from dpsql.admin.policy import PolicyChanges, PolicyCheck, PolicyShown


def outside_option(f: Any) -> Any:
    """--outside: what to do with values outside the policy's domains (init, check, apply)."""
    return click.option(
        "--outside", type=click.Choice(list(HANDLINGS)), default="refuse", show_default=True,
        help="Values outside a column's declared domain (an unlisted category or NULL, a "
             "number outside its bounds) are reported per column with a few examples, "
             "then: " + "; ".join(
                 f"{k}: {v}" for k, v in HANDLINGS.items()) + ".")(f)


def outside_report(found: list[Outside], handling: Handling, done: bool = True) -> Text:
    """What lies outside the domains, for the administrator (read from the private rows)."""
    head = ["values outside the declared domain (read from the private rows; not DP):"]
    return Text(err=(head if found else []) + [f"  {line}" for line in summary(
        found, handling, done=done)])


@cli.group()
def policy() -> None:
    """Check, apply and show policies."""


@admin_command(policy, "check")
@click.argument("path", type=LocalPath(exists=True, dir_okay=False))
@store_option("--db", default=None,
              help="Also check the policy against this store's tables and their rows "
                   "(administrators only; audited).")
@outside_option
@as_option
@json_option
def policy_check(door: Door, path: str, db: str | None, outside: Handling, actor: str | None,
                 as_json: bool) -> None:
    """Validate the policy file PATH (and, with --db, against the store's tables).

    With --db the rows are checked against the policy's domains: values outside
    are reported and fail the check unless --outside says what apply would do.
    """
    from dpsql.admin.policy import check_policy

    text = door.read_text(path)
    try:
        checked = door.call(check_policy, text=text, source=path, outside=outside)
    except DomainError as err:
        door.show(outside_report(err.found, outside, done=False))
        raise
    door.show(outside_report(checked.outside, outside, done=False))
    if as_json:
        door.json(checked.as_dict())
        return
    door.show(check_text(checked, path))


def check_text(checked: PolicyCheck, path: str) -> Text:
    """``policy check``'s lines: valid, its datasets and the notes."""
    summary = checked.summary
    return Text([f"{path}: valid (fingerprint {summary.fingerprint}, accounting "
                 f"{summary.accounting})"]
                + [f"  dataset {ds.name}: table {ds.table}, budget {ds.budget}, "
                   f"{ds.columns} columns ({ds.hidden} hidden)" for ds in summary.datasets]
                + [f"  note: {note}" for note in checked.notes])


@admin_command(policy, "apply")
@click.argument("path", type=LocalPath(exists=True, dir_okay=False))
@db_option
@as_option
@click.option("--yes", "-y", is_flag=True, help="Apply without asking for confirmation.")
@outside_option
@json_option
def policy_apply(door: Door, path: str, db: str, actor: str | None, yes: bool,
                 outside: Handling, as_json: bool) -> None:
    """Make the policy at PATH the store's active policy (shows and records the changes).

    The rows are checked against the new domains first (see --outside); when
    refused, nothing changes.
    """
    from dpsql.admin.policy import apply_policy, policy_changes

    text = door.read_text(path)
    try:
        changes = door.call(policy_changes, text=text, source=path, outside=outside)
    except DomainError as err:
        door.show(outside_report(err.found, outside, done=False))
        raise
    if not changes.changes:
        if as_json:
            door.json({"applied": False, "changes": []})
        else:
            door.out("no changes: the store already enforces this policy")
        return
    door.show(outside_report(changes.outside, outside, done=False))
    if not as_json:
        door.show(changes_text(changes))
        if not yes:
            door.confirm("apply these changes?")
    applied = door.call(apply_policy, text=text, source=path, outside=outside,
                        based_on=changes.old)
    if as_json:
        door.json(applied.as_dict())
    else:
        door.out(f"applied {applied.fingerprint}" if applied.applied else
                 "no changes: the store already enforces this policy")


def changes_text(changes: PolicyChanges) -> Text:
    """The changes a policy would make, and the budgets it would leave overspent."""
    return Text([render.heading(f"changes from {changes.old} to {changes.new}:")]
                + [f"  {line}" for line in changes.changes]
                + [f"  note: {note}" for note in changes.notes])


@admin_command(policy, "draft")
@click.argument("file", required=False, type=LocalPath(exists=True, dir_okay=False))
@store_option("--db", default=None,
              help="Draft from a table of this store instead of a file (with --table; "
                   "administrators only; audited).")
@click.option("--table", default=None, help="The store's table to draft from (with --db).")
@click.option("--dataset", default=None,
              help="Dataset (and table) name in the draft (default: the file or table name).")
@click.option("--na", default=None, metavar="STR", help="Read this string as NULL (e.g. N).")
@click.option("--keep-names", is_flag=True,
              help="Keep column names as in the file (default: lower-case identifiers, as "
                   "dpsql init names them).")
@click.option("--max-categories", type=click.IntRange(min=1), default=MAX_CATEGORIES,
              show_default=True, help="List the values of text and integer columns with at "
                                      "most this many distinct values.")
@click.option("--output", "-o", type=LocalPath(dir_okay=False), default=None,
              help="Write the draft to this file (default: standard output).")
@as_option
def policy_draft(door: Door, file: str | None, db: str | None, table: str | None,
                 dataset: str | None, na: str | None, keep_names: bool, max_categories: int,
                 output: str | None, actor: str | None) -> None:
    """Draft a policy from FILE (CSV or Parquet) or from --db DB --table T.

    The draft is a complete, valid policy: column types (integer, float,
    categorical), numeric bounds rounded outward to round numbers with about
    10 bins, the list of values of columns with few of them, hidden for what
    looks like an identifier (nearly all values distinct) or free text, and a
    comment on each column saying what was read from the data. Budgets and the
    one admin user are placeholders to replace.

    Not DP: every bound and category list is read from the private rows, and
    whatever the policy keeps becomes public (analysts see the domains). The
    administrator decides, column by column, what may be public.

    Example: dpsql policy draft adult.csv -o policies/adult.yaml
    """
    from dpsql.admin.policy import draft_policy
    from dpsql.draft import draft_file

    if (file is None) == (db is None or table is None):
        raise ConfigurationError("draft from either FILE or --db DB --table TABLE")
    if output is not None:
        output = door.output(output)
    if file is not None:  # the caller's own file: read where it is, no store needed
        text = draft_file(door.local_path(file), na=na, normalize=not keep_names,
                          dataset=dataset, max_categories=max_categories)
    else:
        assert table is not None
        text = door.call(draft_policy, table=table, dataset=dataset,
                         max_categories=max_categories).text
    if output is None:
        door.out(text, nl=False)
        return
    door.write(output, text)  # it holds facts read from the private rows
    door.err(f"wrote {output}: a draft read from the private data; decide what may be public "
             "before applying it")


@admin_command(policy, "show", actor=None)
@db_option
@json_option
def policy_show(door: Door, db: str, as_json: bool) -> None:
    """Show the active policy and the history of applied versions."""
    from dpsql.admin.policy import show_policy

    shown = door.call(show_policy)
    if as_json:
        door.json(shown.as_dict())
    else:
        door.show(policy_text(shown))


def policy_text(shown: PolicyShown) -> Text:
    """``policy show``'s lines: the policy's text, then its history."""
    return Text([shown.text.rstrip(), "", render.heading("history"), render.table(
        [[h.version, h.fingerprint, h.applied_by, h.applied_at,
          (h.changes or "").replace("\n", "; ")[:60]] for h in shown.history],
        ["version", "fingerprint", "by", "at", "changes"], right=[0])])


@cli.group()
def budget() -> None:
    """Show and grant privacy budgets."""


@admin_command(budget, "show")
@db_option
@click.option("--user", default=None, help="Only this user (default: everyone you may see).")
@as_option
@json_option
def budget_show(door: Door, db: str, user: str | None, actor: str | None,
                as_json: bool) -> None:
    """Show granted, spent and remaining budget per user and dataset."""
    from dpsql.admin.budgets import show_budgets

    shown = door.call(show_budgets, user=user)
    if as_json:
        door.json(shown.as_dict()["budgets"])
    else:
        door.show(budgets_text(shown))


def budgets_text(shown: Budgets) -> Text:
    r"""The same table and line as ``SHOW dpsql.budget`` (the shell's \budget), per user."""
    import pyarrow as pa

    from dpsql.query.meta import budget_note, budget_rows

    if not shown.budgets:
        return Text(["no budgets"])
    data = budget_rows(shown.budgets, shown.accounting, shown.delta)
    data = data.add_column(0, "user", pa.array([b.user for b in shown.budgets], pa.string()))
    return Text([render.arrow_table(data), budget_note(shown.accounting)])


@admin_command(budget, "grant")
@click.argument("user")
@click.argument("dataset")
@click.option("--epsilon", type=str, default=None, help="Amount to add, as epsilon.")
@click.option("--delta", type=str, default=None,
              help="Delta for the epsilon (zcdp policies; default: the policy's).")
@click.option("--rho", type=str, default=None, help="Amount to add, as zCDP rho.")
@db_option
@as_option
@json_option
def budget_grant(door: Door, user: str, dataset: str, epsilon: str | None, delta: str | None,
                 rho: str | None, db: str, actor: str | None, as_json: bool) -> None:
    """Top up USER's budget on DATASET (administrators only; audited)."""
    from dpsql.admin.budgets import grant

    granted = door.call(grant, user=user, dataset=dataset, epsilon=epsilon, delta=delta,
                        rho=rho)
    if as_json:
        door.json(granted.as_dict())
    else:
        door.show(grant_text(granted))


def grant_text(granted: Granted) -> Text:
    """What a grant added, the standing after it, and what caps it."""
    from dpsql.query.meta import budget_note

    delta, standing = granted.delta, granted.standing
    lines = [f"granted {granted.added.describe(delta, 'nearest')} to {granted.user} on "
             f"{granted.dataset}", standing.describe()]
    if granted.accounting == "zcdp":
        lines.append(budget_note(granted.accounting))
        lines += _zcdp_grant_arithmetic(granted)
    if granted.exceeds_total:
        mine = standing.granted.describe(delta, "nearest")
        total = standing.dataset_total.describe(delta, "nearest")
        lines.append(f"note: {granted.user}'s budget on {granted.dataset} ({mine}) now exceeds "
                     f"the dataset's total ({total}), which still caps what anyone spends")
    return Text(lines)


def _zcdp_grant_arithmetic(granted: Granted) -> list[str]:
    """Why a zCDP grant of epsilon e raised the granted epsilon by less (or more) than e."""
    delta, after, added = granted.delta, granted.standing.granted, granted.added
    if delta is None or after.infinite or added.infinite or added.is_zero:
        return []
    before = after - added
    if before.is_zero:
        return []
    return [f"note: the grant added rho {float(added.value):.4g} to rho "
            f"{float(before.value):.4g}; at delta {delta:g} that is epsilon "
            f"{after.epsilon(delta):.4g} in all, not {before.epsilon(delta):.4g} + "
            f"{added.epsilon(delta):.4g} (epsilons under zCDP do not add)"]


@admin_command(cli, "audit")
@db_option
@click.option("--user", default=None, help="Only requests by this user.")
@click.option("--last", type=click.IntRange(min=1, max=2**63 - 1), default=None,
              help="Only the last N entries.")
@as_option
@json_option
def audit_cmd(door: Door, db: str, user: str | None, last: int | None, actor: str | None,
              as_json: bool) -> None:
    """Show the audit log: every request, its cost and outcome.

    A refused request shows the cost it asked for ("asked ..."): nothing was charged.
    """
    from dpsql.admin.audit import audit

    log = door.call(audit, user=user, last=last)
    if as_json:
        door.json(log.as_dict()["entries"])
    else:
        door.show(audit_text(log))


def audit_text(log: AuditLog) -> Text:
    """The audit log as a table, one entry a line."""
    if not log.entries:
        return Text(["no audit entries"])
    delta = log.delta
    return Text([render.table(
        [[e.id, e.at, e.user, e.dataset or "", e.action, e.outcome,
          ("asked " if e.outcome == "refused" else "") + e.cost.describe(delta)
          if e.cost else "", render.short((e.reason or e.statement or ""), 70)]
         for e in log.entries],
        ["id", "at", "user", "dataset", "action", "outcome", "cost", "statement / reason"],
        right=[0])])
