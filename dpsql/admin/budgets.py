"""Budgets: show each user's standing, grant more (``dpsql budget show``, ``budget grant``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dpsql.admin import operation
from dpsql.ledger import Budget
from dpsql.privacy import Number, PrivacyCost
from dpsql.session import Session


@dataclass(frozen=True)
class Budgets:
    """Granted, spent and remaining budget per user and dataset, under the policy's accounting."""

    budgets: list[Budget]
    accounting: str
    delta: float | None  # the policy's: a zCDP standing also shows its epsilon at it

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the accounting and each standing in both units."""
        return {"accounting": self.accounting, "delta": self.delta,
                "budgets": [b.as_dict(self.delta) for b in self.budgets]}


@operation("budget.show")
def show_budgets(session: Session, *, user: str | None = None) -> Budgets:
    """Every standing the session's user may see (an analyst: their own), or ``user``'s only."""
    policy = session.policy
    return Budgets(session.budget(user), policy.accounting, policy.delta)


@dataclass(frozen=True)
class Granted:
    """A grant: what was added and the user's standing after it."""

    user: str
    dataset: str
    added: PrivacyCost
    standing: Budget
    accounting: str
    delta: float | None

    @property
    def exceeds_total(self) -> bool:
        """Whether the user's budget is now above the dataset's total (which still caps it)."""
        return self.standing.granted > self.standing.dataset_total

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the standing, then what was added."""
        return {**self.standing.as_dict(), "added": self.added.as_dict(self.delta)}


@operation("budget.grant")
def grant(session: Session, *, user: str, dataset: str, epsilon: Number | None = None,
          delta: Number | None = None, rho: Number | None = None) -> Granted:
    """Top up ``user``'s budget on ``dataset`` by epsilon[/delta] or rho (admins only; audited)."""
    amount = session.cost(epsilon=epsilon, delta=delta, rho=rho)
    standing = session.grant(user, dataset, epsilon=epsilon, delta=delta, rho=rho)
    policy = session.policy
    return Granted(user, dataset, amount, standing, policy.accounting, policy.delta)
