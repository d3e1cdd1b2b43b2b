"""The audit log: every request, its cost and outcome (``dpsql audit``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dpsql.admin import operation
from dpsql.privacy import PrivacyCost
from dpsql.session import Session


@dataclass(frozen=True)
class AuditEntry:
    """One audit row. A refused request's ``cost`` is what it asked for: nothing was charged."""

    id: int
    at: datetime
    user: str
    dataset: str | None
    action: str
    statement: str | None
    outcome: str
    reason: str | None
    fingerprint: str | None
    cost: PrivacyCost | None

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able, the cost in both units (epsilon at ``delta`` too)."""
        return {"id": self.id, "at": self.at.isoformat(timespec="seconds"), "user": self.user,
                "dataset": self.dataset, "action": self.action, "statement": self.statement,
                "outcome": self.outcome, "reason": self.reason, "fingerprint": self.fingerprint,
                "cost": self.cost.as_dict(delta) if self.cost else None}


@dataclass(frozen=True)
class AuditLog:
    """Audit entries, oldest first, and the policy's delta to show costs at."""

    entries: list[AuditEntry]
    delta: float | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the entries."""
        return {"entries": [e.as_dict(self.delta) for e in self.entries]}


@operation("audit")
def audit(session: Session, *, user: str | None = None, last: int | None = None) -> AuditLog:
    """The audit log (an admin sees everyone's, an analyst their own), ``last`` entries only."""
    rows = session.audit(user, last)
    return AuditLog([AuditEntry(**row) for row in rows], session.policy.delta)
