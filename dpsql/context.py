"""Context: what one statement or one release may use, fixed when it starts.

Query and release code receive a Context, never the Session: the user, the policy
in force when the request began (an admin applying a new one mid-request changes
nothing for it), the session's options as they were, the store, the
interrupter and the session's kept connections to other engines. It cannot
change the session, so the request's code cannot either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dpsql.engines.base import Links
from dpsql.engines.interrupt import Interrupter
from dpsql.errors import AccessDenied
from dpsql.ledger import Ledger
from dpsql.policy import Policy, User
from dpsql.privacy import Number, PrivacyCost, budget_cost
from dpsql.store import Store


@dataclass(frozen=True)
class Context:
    """One request's store, policy, user, options and interrupter (immutable)."""

    store: Store
    policy: Policy
    user: str
    options: Mapping[str, Any]  # read-only (a MappingProxyType of a copy)
    interrupts: Interrupter
    links: Links | None = None  # the session's kept connections to other engines

    @property
    def principal(self) -> User:
        """The user as the request's policy declares it."""
        try:
            return self.policy.users[self.user]
        except KeyError:
            raise AccessDenied(f"user {self.user!r} was removed from the policy") from None

    @property
    def is_admin(self) -> bool:
        """Whether the user has the admin role under the request's policy."""
        return self.principal.role == "admin"

    @property
    def ledger(self) -> Ledger:
        """The ledger under the request's policy."""
        return Ledger(self.store, self.policy)

    def require_admin(self, action: str) -> None:
        """Raise AccessDenied unless the user is an administrator."""
        if not self.is_admin:
            raise AccessDenied(f"{self.user} is an analyst and cannot {action}; ask an "
                               "administrator")

    def cost(self, *, epsilon: Number | None = None, delta: Number | None = None,
             rho: Number | None = None) -> PrivacyCost:
        """A cost in the policy's accounting from epsilon[/delta] or rho (delta: the policy's)."""
        if epsilon is not None and delta is None and self.policy.accounting == "zcdp":
            delta = self.policy.delta
        return budget_cost(self.policy.accounting, epsilon=epsilon, delta=delta, rho=rho)
