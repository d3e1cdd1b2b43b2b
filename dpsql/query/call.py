"""An answer to one statement, and the tools one request uses (its context, ledger, engine)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dpsql.context import Context
from dpsql.engines import engine_for
from dpsql.engines.base import Engine
from dpsql.ledger import Ledger
from dpsql.policy import Dataset, Policy
from dpsql.privacy import PrivacyCost

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Answer:
    """The result of one statement, ready for any front end.

    ``table``: the rows. ``kind``: dp, released, explain, set, show or budget.
    ``cost``: what this statement was charged (zero when free). ``remaining``:
    the caller's budget left on ``dataset`` (DP answers). ``cached``: a repeat
    served from the cache. ``columns``: per output column, how it was computed
    (mechanism, scale, expected error, cost share). ``notice``: one line for
    the analyst (cost in both units, budget left). ``status``: the command tag.
    ``noise_dominated``: per aggregate column, whether each row's value is
    mostly noise (:func:`dpsql.query.post.dominated`); ``warning``: one line
    saying so when any is (the wire server sends it as a second notice).
    """

    table: pa.Table
    kind: str
    cost: PrivacyCost
    remaining: PrivacyCost | None = None
    dataset: str | None = None
    cached: bool = False
    columns: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    notice: str | None = None
    status: str = ""
    audit_id: int | None = None
    options: Mapping[str, Any] | None = None  # the session's new options after SET/RESET
    noise_dominated: Mapping[str, list[bool]] = field(default_factory=dict)
    warning: str | None = None

    def to_pandas(self) -> Any:
        """The rows as a pandas DataFrame."""
        return self.table.to_pandas()

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able form: rows, cost, remaining budget and per-column accuracy."""
        return {
            "kind": self.kind, "status": self.status, "dataset": self.dataset,
            "cost": self.cost.as_dict(delta),
            "remaining": self.remaining.as_dict(delta) if self.remaining else None,
            "cached": self.cached, "notice": self.notice, "warning": self.warning,
            "noise_dominated": dict(self.noise_dominated),
            "columns": dict(self.columns), "rows": self.table.to_pylist(),
        }


@dataclass(frozen=True)
class Call:
    """One statement: its request context, ledger and engine (one snapshot)."""

    ctx: Context
    ledger: Ledger
    engine: Engine  # the store's; a dataset on another engine gets its own
    others: dict[str, Engine] = field(default_factory=dict)

    def engine_of(self, dataset: Dataset) -> Engine:
        """The engine holding ``dataset``'s rows (one per statement and dataset)."""
        if dataset.engine is None:
            return self.engine
        if dataset.name not in self.others:
            self.others[dataset.name] = engine_for(dataset, self.ctx.store, self.ctx.interrupts,
                                                   self.ctx.links)
        return self.others[dataset.name]

    def close(self) -> None:
        """End every snapshot the statement opened."""
        self.engine.close()
        for engine in self.others.values():
            engine.close()

    @property
    def user(self) -> str:
        """Who asks."""
        return self.ctx.user

    @property
    def policy(self) -> Policy:
        """The policy the statement runs under."""
        return self.ctx.policy

    @property
    def zero(self) -> PrivacyCost:
        """No cost, in the policy's accounting."""
        return PrivacyCost.zero(self.policy.accounting)
