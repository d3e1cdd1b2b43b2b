"""Administration commands: init, policy, budget, audit."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from dpsql.cli.common import (
    LocalPath,
    as_option,
    cli,
    db_option,
    default_actor,
    json_option,
    store_option,
)
from dpsql.cli.output import arrow_table, emit_json, heading, table
from dpsql.draft import MAX_CATEGORIES
from dpsql.errors import ConfigurationError
from dpsql.files import write_private
from dpsql.outside import HANDLINGS, DomainError, Handling, Outside, refusal, summary

if TYPE_CHECKING:  # each command imports what it runs, so --help and --version stay fast
    from dpsql.ledger import Budget
    from dpsql.policy import Policy


def outside_option(f: Any) -> Any:
    """--outside: what to do with values outside the policy's domains (init, check, apply)."""
    return click.option(
        "--outside", type=click.Choice(list(HANDLINGS)), default="refuse", show_default=True,
        help="Values outside a column's declared domain (an unlisted category or NULL, a "
             "number outside its bounds) are reported per column with a few examples, "
             "then: " + "; ".join(
                 f"{k}: {v}" for k, v in HANDLINGS.items()) + ".")(f)


def _report(found: list[Outside], handling: Handling, done: bool = True) -> None:
    """Show the administrator what lies outside the domains (read from the private rows)."""
    if found:
        click.echo("values outside the declared domain (read from the private rows; not DP):",
                   err=True)
    for line in summary(found, handling, done=done):
        click.echo(f"  {line}", err=True)


def _imports(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ConfigurationError(f"--import takes TABLE=FILE, got {value!r}")
        out[name] = path
    return out


@cli.command("init")
@click.argument("db", type=LocalPath(dir_okay=False))
@click.option("--policy", "policy_path", required=True, type=LocalPath(exists=True,
              dir_okay=False), help="The policy YAML to apply first.")
@click.option("--import", "imports", multiple=True, metavar="TABLE=FILE",
              help="Import a CSV or Parquet file as a sensitive table (repeatable).")
@click.option("--na", default=None, metavar="STR", help="Read this string as NULL (e.g. N).")
@click.option("--keep-names", is_flag=True,
              help="Keep column names as in the file (default: lower-case identifiers).")
@click.option("--enforce-bounds", is_flag=True,
              help="Make the policy's numeric bounds CHECK constraints of the imported "
                   "tables: every value must fit, and DP queries skip clamping (faster).")
@outside_option
@json_option
def init_cmd(db: str, policy_path: str, imports: tuple[str, ...], na: str | None,
             keep_names: bool, enforce_bounds: bool, outside: Handling, as_json: bool) -> None:
    """Create the store DB, import sensitive tables and apply the first policy.

    Imported rows are checked against the policy's domains (see --outside); when
    refused, no store is created.

    Example: dpsql init adult.duckdb --policy policies/adult.yaml --import adult=adult.csv
    """
    from dpsql.policy import Policy
    from dpsql.session import init

    policy = Policy.load(policy_path)
    try:
        store, notes = init(db, policy, _imports(imports), na=na, normalize=not keep_names,
                            enforce_bounds=enforce_bounds, outside=outside)
    except DomainError as err:
        _report(err.found, "refuse")
        raise
    from dpsql.imports import tables as store_tables

    tables = store_tables(store)
    store.close()
    if as_json:
        emit_json({"store": db, "policy": policy.fingerprint, "tables": tables, "notes": notes})
        return
    click.echo(f"created {db} with tables {', '.join(tables) or '(none)'}; "
               f"policy {policy.fingerprint} applied")
    for note in notes:
        click.echo(f"  note: {note}")


@cli.group()
def policy() -> None:
    """Check, apply and show policies."""


@policy.command("check")
@click.argument("path", type=LocalPath(exists=True, dir_okay=False))
@store_option("--db", default=None,
              help="Also check the policy against this store's tables and their rows "
                   "(administrators only; audited).")
@outside_option
@as_option
@json_option
def policy_check(path: str, db: str | None, outside: Handling, actor: str | None,
                 as_json: bool) -> None:
    """Validate the policy file PATH (and, with --db, against the store's tables).

    With --db the rows are checked against the policy's domains: values outside
    are reported and fail the check unless --outside says what apply would do.
    """
    from dpsql.ledger import Ledger
    from dpsql.policies import check_policy
    from dpsql.policy import Policy
    from dpsql.session import connect

    pol = Policy.load(path)
    notes: list[str] = []
    found: list[Outside] = []
    if db:
        with connect(db, default_actor(actor, db)) as session:
            found = session.check_domain(pol)
            notes = check_policy(session.store, pol) + Ledger(session.store, pol).overspent()
        _report(found, outside, done=False)
        error = refusal(found, outside)
        if error is not None:
            raise error
    summary = _policy_summary(pol)
    if as_json:
        emit_json({"valid": True, "fingerprint": pol.fingerprint, "notes": notes,
                   "outside": [{"dataset": o.dataset, "column": o.column, "rows": o.rows,
                                "examples": list(o.examples)} for o in found], **summary})
        return
    click.echo(f"{path}: valid (fingerprint {pol.fingerprint}, accounting {pol.accounting})")
    for ds in summary["datasets"]:
        click.echo(f"  dataset {ds['name']}: table {ds['table']}, budget {ds['budget']}, "
                   f"{ds['columns']} columns ({ds['hidden']} hidden)")
    for note in notes:
        click.echo(f"  note: {note}")


def _policy_summary(pol: Policy) -> dict[str, Any]:
    return {
        "accounting": pol.accounting,
        "datasets": [
            {"name": d.name, "table": d.table, "budget": d.budget.describe(pol.delta, "nearest"),
             "columns": len(d.columns), "hidden": sum(c.hidden for c in d.columns.values())}
            for d in pol.datasets.values()
        ],
        "users": {u.name: u.role for u in pol.users.values()},
    }


@policy.command("apply")
@click.argument("path", type=LocalPath(exists=True, dir_okay=False))
@db_option
@as_option
@click.option("--yes", "-y", is_flag=True, help="Apply without asking for confirmation.")
@outside_option
@json_option
def policy_apply(path: str, db: str, actor: str | None, yes: bool, outside: Handling,
                 as_json: bool) -> None:
    """Make the policy at PATH the store's active policy (shows and records the changes).

    The rows are checked against the new domains first (see --outside); when
    refused, nothing changes.
    """
    from dpsql.ledger import Ledger
    from dpsql.policies import check_policy
    from dpsql.policy import Policy
    from dpsql.session import connect

    new = Policy.load(path)
    with connect(db, default_actor(actor, db)) as session:
        session.require_admin("change the policy")
        old = session.policy
        changes = old.diff(new)
        if not changes:
            if as_json:
                emit_json({"applied": False, "changes": []})
            else:
                click.echo("no changes: the store already enforces this policy")
            return
        check_policy(session.store, new)  # a policy that cannot apply shows no diff first
        found = session.check_domain(new)
        _report(found, outside, done=False)
        error = refusal(found, outside)
        if error is not None:
            raise error
        if not as_json:
            click.echo(heading(f"changes from {old.fingerprint} to {new.fingerprint}:"))
            for line in changes:
                click.echo(f"  {line}")
            for note in Ledger(session.store, new).overspent():
                click.echo(f"  note: {note}")
            if not yes:
                click.confirm("apply these changes?", abort=True)
        session.apply_policy(new, outside)
    if as_json:
        emit_json({"applied": True, "fingerprint": new.fingerprint, "changes": changes})
    else:
        click.echo(f"applied {new.fingerprint}")


@policy.command("draft")
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
def policy_draft(file: str | None, db: str | None, table: str | None, dataset: str | None,
                 na: str | None, keep_names: bool, max_categories: int, output: str | None,
                 actor: str | None) -> None:
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
    from dpsql.draft import draft_file, draft_table
    from dpsql.session import connect

    if (file is None) == (db is None or table is None):
        raise ConfigurationError("draft from either FILE or --db DB --table TABLE")
    if file is not None:
        text = draft_file(file, na=na, normalize=not keep_names, dataset=dataset,
                          max_categories=max_categories)
    else:
        assert db is not None
        assert table is not None
        with connect(db, default_actor(actor, db)) as session:
            text = draft_table(session, table, dataset=dataset, max_categories=max_categories)
    if output is None:
        click.echo(text, nl=False)
        return
    write_private(Path(output), text)  # it holds facts read from the private rows
    click.echo(f"wrote {output}: a draft read from the private data; decide what may be public "
               "before applying it", err=True)


@policy.command("show")
@db_option
@json_option
def policy_show(db: str, as_json: bool) -> None:
    """Show the active policy and the history of applied versions."""
    from dpsql.policies import active_policy, policy_history
    from dpsql.services import open_store

    with open_store(db) as store:
        pol = active_policy(store)
        history = policy_history(store)
    if as_json:
        emit_json({"active": pol.fingerprint, **_policy_summary(pol), "history": [
            {"version": h.version, "fingerprint": h.fingerprint, "applied_by": h.applied_by,
             "applied_at": h.applied_at, "changes": h.changes} for h in history]})
        return
    click.echo(pol.text.rstrip())
    click.echo()
    click.echo(heading("history"))
    click.echo(table([[h.version, h.fingerprint, h.applied_by, h.applied_at,
                       (h.changes or "").replace("\n", "; ")[:60]] for h in history],
                     ["version", "fingerprint", "by", "at", "changes"], right=[0]))


@cli.group()
def budget() -> None:
    """Show and grant privacy budgets."""


def _print_budgets(rows: list[Budget], accounting: str, delta: float | None) -> None:
    r"""The same table and line as ``SHOW dpsql.budget`` (the shell's \budget), per user."""
    import pyarrow as pa

    from dpsql.query.meta import budget_note, budget_rows

    if not rows:
        click.echo("no budgets")
        return
    data = budget_rows(rows, accounting, delta)
    data = data.add_column(0, "user", pa.array([b.user for b in rows], pa.string()))
    click.echo(arrow_table(data))
    click.echo(budget_note(accounting))


@budget.command("show")
@db_option
@click.option("--user", default=None, help="Only this user (default: everyone you may see).")
@as_option
@json_option
def budget_show(db: str, user: str | None, actor: str | None, as_json: bool) -> None:
    """Show granted, spent and remaining budget per user and dataset."""
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        rows = session.budget(user)
        policy = session.policy
    if as_json:
        emit_json([b.as_dict() for b in rows])
        return
    _print_budgets(rows, policy.accounting, policy.delta)


@budget.command("grant")
@click.argument("user")
@click.argument("dataset")
@click.option("--epsilon", type=str, default=None, help="Amount to add, as epsilon.")
@click.option("--delta", type=str, default=None,
              help="Delta for the epsilon (zcdp policies; default: the policy's).")
@click.option("--rho", type=str, default=None, help="Amount to add, as zCDP rho.")
@db_option
@as_option
@json_option
def budget_grant(user: str, dataset: str, epsilon: str | None, delta: str | None,
                 rho: str | None, db: str, actor: str | None, as_json: bool) -> None:
    """Top up USER's budget on DATASET (administrators only; audited)."""
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        amount = session.cost(epsilon=epsilon, delta=delta, rho=rho)
        standing = session.grant(user, dataset, epsilon=epsilon, delta=delta, rho=rho)
        policy = session.policy
    if as_json:
        emit_json({**standing.as_dict(), "added": amount.as_dict(policy.delta)})
        return
    click.echo(f"granted {amount.describe(policy.delta, 'nearest')} to {user} on {dataset}")
    click.echo(standing.describe())
    if policy.accounting == "zcdp":
        from dpsql.query.meta import budget_note

        click.echo(budget_note(policy.accounting))
    if standing.granted > standing.dataset_total:
        mine = standing.granted.describe(policy.delta, "nearest")
        total = standing.dataset_total.describe(policy.delta, "nearest")
        click.echo(f"note: {user}'s budget on {dataset} ({mine}) now exceeds the dataset's "
                   f"total ({total}), which still caps what anyone spends")


@cli.command("audit")
@db_option
@click.option("--user", default=None, help="Only requests by this user.")
@click.option("--last", type=click.IntRange(min=1), default=None, help="Only the last N entries.")
@as_option
@json_option
def audit_cmd(db: str, user: str | None, last: int | None, actor: str | None,
              as_json: bool) -> None:
    """Show the audit log: every request, its cost and outcome.

    A refused request shows the cost it asked for ("asked ..."): nothing was charged.
    """
    from dpsql.ledger import Outcome
    from dpsql.session import connect

    with connect(db, default_actor(actor, db)) as session:
        rows = session.audit(user, last)
        delta = session.policy.delta
    if as_json:
        emit_json([{**r, "cost": r["cost"].as_dict(delta) if r["cost"] else None} for r in rows])
        return
    if not rows:
        click.echo("no audit entries")
        return
    click.echo(table(
        [[r["id"], r["at"], r["user"], r["dataset"] or "", r["action"], r["outcome"],
          ("asked " if r["outcome"] is Outcome.REFUSED else "") + r["cost"].describe(delta)
          if r["cost"] else "",
          _short((r["reason"] or r["statement"] or ""), 70)] for r in rows],
        ["id", "at", "user", "dataset", "action", "outcome", "cost", "statement / reason"],
        right=[0],
    ))


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
