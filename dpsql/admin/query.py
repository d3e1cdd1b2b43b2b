"""One SQL statement answered with differential privacy (``dpsql query``).

The session keeps what a ``SET`` changes, so the statements a caller sends one
after another on one session (a script, ``dpsql query -f``) share their options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dpsql.admin import operation
from dpsql.privacy import PrivacyCost
from dpsql.session import Session


@dataclass(frozen=True)
class QueryResult:
    """An answer as any front end shows it: rows, cost, budget left, accuracy, notices.

    The fields of :class:`dpsql.query.answer.Answer` a caller needs, with the
    policy's ``delta`` to show zCDP costs as epsilon too.
    """

    table: pa.Table
    kind: str  # dp, released, explain, set, show or budget
    status: str
    cost: PrivacyCost
    remaining: PrivacyCost | None
    dataset: str | None
    cached: bool
    notice: str | None
    warning: str | None
    delta: float | None
    columns: dict[str, Any] = field(default_factory=dict)
    noise_dominated: dict[str, list[bool]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: rows, cost, remaining budget and per-column accuracy."""
        return {
            "kind": self.kind, "status": self.status, "dataset": self.dataset,
            "cost": self.cost.as_dict(self.delta),
            "remaining": self.remaining.as_dict(self.delta) if self.remaining else None,
            "cached": self.cached, "notice": self.notice, "warning": self.warning,
            "noise_dominated": dict(self.noise_dominated),
            "columns": dict(self.columns), "rows": self.table.to_pylist(),
        }


@operation("query")
def query(session: Session, *, sql: str) -> QueryResult:
    """Answer the statement ``sql`` as the session's user (charged to their budget)."""
    answer = session.sql(sql)
    return QueryResult(answer.table, answer.kind, answer.status, answer.cost, answer.remaining,
                       answer.dataset, answer.cached, answer.notice, answer.warning,
                       session.policy.delta, dict(answer.columns),
                       {k: list(v) for k, v in answer.noise_dominated.items()})
