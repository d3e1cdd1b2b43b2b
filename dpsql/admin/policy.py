"""Policies: check, show the changes, apply, show, draft (``dpsql policy ...``).

Each takes the policy's YAML text, never a path: the caller reads the file on its
own side and passes its name as ``source`` for error messages. Applying is two
steps so that a front end can ask for confirmation between them:
:func:`policy_changes` shows what would change, :func:`apply_policy` applies it,
refusing if the store's policy changed in between (``based_on``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql.admin import operation
from dpsql.draft import MAX_CATEGORIES
from dpsql.errors import ConfigurationError
from dpsql.ledger import Ledger
from dpsql.outside import Handling, Outside, refusal
from dpsql.policies import PolicyVersion, active_policy, policy_history
from dpsql.policies import check_policy as check_tables
from dpsql.policy import Policy
from dpsql.session import Session


@dataclass(frozen=True)
class DatasetSummary:
    """One dataset of a policy: its table, budget and columns."""

    name: str
    table: str
    budget: str
    columns: int
    hidden: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"name": self.name, "table": self.table, "budget": self.budget,
                "columns": self.columns, "hidden": self.hidden}


@dataclass(frozen=True)
class PolicySummary:
    """What a policy declares, in brief: accounting, datasets and users' roles."""

    fingerprint: str
    accounting: str
    datasets: list[DatasetSummary]
    users: dict[str, str]

    @classmethod
    def of(cls, policy: Policy) -> PolicySummary:
        """The summary of ``policy``."""
        return cls(policy.fingerprint, policy.accounting, [
            DatasetSummary(d.name, d.table, d.budget.describe(policy.delta, "nearest"),
                           len(d.columns), sum(c.hidden for c in d.columns.values()))
            for d in policy.datasets.values()], {u.name: u.role for u in policy.users.values()})

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (without the fingerprint, which callers name as they see fit)."""
        return {"accounting": self.accounting, "datasets": [d.as_dict() for d in self.datasets],
                "users": dict(self.users)}


def _outside(found: list[Outside]) -> list[dict[str, Any]]:
    return [{"dataset": o.dataset, "column": o.column, "rows": o.rows,
             "examples": list(o.examples)} for o in found]


@dataclass(frozen=True)
class PolicyCheck:
    """A valid policy; with a store, notes on it and the values outside its domains."""

    summary: PolicySummary
    notes: list[str]
    outside: list[Outside]  # read from the private rows, for the administrator (not DP)
    handling: Handling

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql policy check --json``)."""
        return {"valid": True, "fingerprint": self.summary.fingerprint, "notes": self.notes,
                "outside": _outside(self.outside), **self.summary.as_dict()}


@operation("policy.check")
def check_policy(session: Session | None, *, text: str, source: str = "<policy>",
                 outside: Handling = "refuse") -> PolicyCheck:
    """Validate policy ``text``; with a session, also against its store's tables and rows.

    The rows are checked against the policy's domains (admins only; audited: not
    DP); values outside raise :class:`~dpsql.outside.DomainError` (which lists them)
    unless ``outside`` says what apply would do with them.
    """
    policy = Policy.from_text(text, source=source)
    notes: list[str] = []
    found: list[Outside] = []
    if session is not None:
        found = session.check_domain(policy)
        notes = check_tables(session.store, policy) + Ledger(session.store, policy).overspent()
        error = refusal(found, outside)
        if error is not None:
            raise error
    return PolicyCheck(PolicySummary.of(policy), notes, found, outside)


@dataclass(frozen=True)
class PolicyChanges:
    """What applying a policy would change; nothing is applied yet."""

    old: str  # the fingerprint in force
    new: str
    changes: list[str]  # empty: the store already enforces this policy
    notes: list[str]
    outside: list[Outside]
    handling: Handling

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"old": self.old, "new": self.new, "changes": self.changes, "notes": self.notes,
                "outside": _outside(self.outside)}


@operation("policy.changes")
def policy_changes(session: Session, *, text: str, source: str = "<policy>",
                   outside: Handling = "refuse") -> PolicyChanges:
    """The changes applying policy ``text`` would make, checked as apply checks (admins only).

    A policy that cannot apply to the store raises before any change is shown;
    rows outside its domains raise DomainError unless ``outside`` handles them.
    """
    session.require_admin("change the policy")
    new = Policy.from_text(text, source=source)
    old = session.policy
    changes = old.diff(new)
    if not changes:
        return PolicyChanges(old.fingerprint, new.fingerprint, [], [], [], outside)
    check_tables(session.store, new)
    found = session.check_domain(new)
    error = refusal(found, outside)
    if error is not None:
        raise error
    return PolicyChanges(old.fingerprint, new.fingerprint, changes,
                         Ledger(session.store, new).overspent(), found, outside)


@dataclass(frozen=True)
class PolicyApplied:
    """The outcome of applying a policy (``applied`` False: it was already in force)."""

    applied: bool
    fingerprint: str
    changes: list[str]

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql policy apply --json``)."""
        if not self.applied:
            return {"applied": False, "changes": []}
        return {"applied": True, "fingerprint": self.fingerprint, "changes": self.changes}


@operation("policy.apply")
def apply_policy(session: Session, *, text: str, source: str = "<policy>",
                 outside: Handling = "refuse", based_on: str | None = None) -> PolicyApplied:
    """Make policy ``text`` the store's active policy (admins only; audited).

    ``based_on``: the fingerprint the caller saw the changes against; if another
    policy was applied since, nothing is applied. Rows outside the new domains
    are handled as ``outside`` says, in the same transaction.
    """
    session.require_admin("change the policy")
    new = Policy.from_text(text, source=source)
    old = session.policy
    if based_on is not None and old.fingerprint != based_on:
        raise ConfigurationError(f"the store's policy changed to {old.fingerprint} since the "
                                 "changes were shown; run dpsql policy apply again")
    changes = old.diff(new)
    if not changes:
        return PolicyApplied(False, old.fingerprint, [])
    session.apply_policy(new, outside)
    return PolicyApplied(True, new.fingerprint, changes)


@dataclass(frozen=True)
class PolicyShown:
    """The active policy (its text and summary) and every version applied, oldest first."""

    text: str
    summary: PolicySummary
    history: list[PolicyVersion]  # each version's text too

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (``dpsql policy show --json``)."""
        return {"active": self.summary.fingerprint, **self.summary.as_dict(), "history": [
            {"version": h.version, "fingerprint": h.fingerprint, "applied_by": h.applied_by,
             "applied_at": h.applied_at.isoformat(timespec="seconds"), "changes": h.changes}
            for h in self.history]}


@operation("policy.show")
def show_policy(session: Session) -> PolicyShown:
    """The store's active policy and its history."""
    policy = active_policy(session.store)
    return PolicyShown(policy.text, PolicySummary.of(policy), policy_history(session.store))


@dataclass(frozen=True)
class Draft:
    """A complete policy drafted from the raw rows (not DP: every bound comes from them)."""

    text: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"text": self.text}


@operation("policy.draft")
def draft_policy(session: Session, *, table: str, dataset: str | None = None,
                 max_categories: int = MAX_CATEGORIES) -> Draft:
    """Draft a policy from the store's table ``table`` (admins only; audited: not DP)."""
    from dpsql.domain import quote
    from dpsql.draft import draft
    from dpsql.imports import tables
    from dpsql.outcomes import Outcome
    from dpsql.store import check_identifier

    session.require_admin("draft a policy from the raw rows")
    check_identifier(table, "table name")
    if table not in tables(session.store):
        raise ConfigurationError(f"no table {table!r} in the store; import it with dpsql init "
                                 f"--import {table}=FILE")
    session.ledger.record(session.user, None, f"draft a policy from table {table}",
                          Outcome.READ,
                          "not DP: an administrator drafted a policy from the raw rows",
                          action="draft_policy")
    return Draft(draft(session.store.cursor(), f"main.{quote(table)}", dataset=dataset or table,
                       table=table, source=f"table {table} of {session.store.path.name}",
                       max_categories=max_categories))
