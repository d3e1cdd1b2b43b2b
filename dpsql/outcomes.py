"""Where a request stands in the audit log: its outcomes, and which settles each open one allows."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """Where a request stands: open (``started``, ``charged``) or settled, for good.

    A request opens ``charged`` (:meth:`Ledger.charge`) or ``started``
    (:meth:`Ledger.record`) and moves once, by :meth:`Ledger.settle`, to one of
    :data:`SETTLES`; every other outcome is written settled at once. The values
    are what ``dpsql.audit.outcome`` holds.
    """

    STARTED = "started"  # open: a request with no charge (a zero-cost release, an evaluation)
    CHARGED = "charged"  # open: charged, its private work not done yet
    ANSWERED = "answered"  # a query (DP or free) answered
    CACHED = "cached"  # a repeat served from a stored answer, free
    EXPLAINED = "explained"  # EXPLAIN PRIVACY: priced, nothing computed
    REFUSED = "refused"  # over budget, or not allowed: nothing computed, nothing charged
    REJECTED = "rejected"  # a query dpsql does not accept, free
    FAILED = "failed"  # failed after its charge or start: the charge stays
    CANCELLED = "cancelled"  # cancelled after its charge or start: the charge stays
    INTERRUPTED = "interrupted"  # the process running it ended: the charge stays
    RELEASED = "released"  # a release written
    HELD = "held"  # a release written unpublished: its fit failed its diagnostics
    PUBLISHED = "published"  # a held release published by an administrator
    EVALUATED = "evaluated"  # a release's fidelity evaluated
    GRANTED = "granted"  # budget granted
    APPLIED = "applied"  # a policy version applied
    READ = "read"  # raw rows read by an administrator (not DP)
    DONE = "done"  # an administrative command ran
    SET = "set"  # a password set
    REMOVED = "removed"  # a password removed

    def __str__(self) -> str:
        return self.value

    @property
    def is_open(self) -> bool:
        """Whether a request in this state still waits for its settle."""
        return self in SETTLES


#: The settles allowed from each open state: every other move is a bug.
SETTLES: dict[Outcome, frozenset[Outcome]] = {
    Outcome.CHARGED: frozenset({Outcome.ANSWERED, Outcome.FAILED, Outcome.CANCELLED,
                                Outcome.INTERRUPTED, Outcome.RELEASED, Outcome.HELD}),
    Outcome.STARTED: frozenset({Outcome.FAILED, Outcome.CANCELLED, Outcome.INTERRUPTED,
                                Outcome.RELEASED, Outcome.HELD, Outcome.EVALUATED}),
}
