"""The budget ledger and the audit log: the one owner of dpsql's bookkeeping.

This module owns ``dpsql.charges``, ``dpsql.grants``, ``dpsql.audit`` and the
``dpsql.event_ids`` sequence: their schema and migrations (:data:`TABLES`), their
crash recovery, and every write; stored answers go to ``dpsql.query_cache``
(:mod:`dpsql.answers`) only as the ledger settles their request, in its
transaction. Others read through the typed reads here. A charge is
compare-and-debit inside one DuckDB transaction, one durable row committed
before the caller computes anything private: a crash afterwards loses budget,
never privacy. There are no refunds.
A refusal leaves the ledger unchanged and adds one settled audit row saying why.

A request's life is the state machine :class:`Outcome`: it is open from its
charge (``charged``: the charge row, which carries the request, is its record
until it settles; :meth:`Ledger.audit` shows it so) or from a ``started`` audit
row (:meth:`Ledger.record`); other rows are written settled at once. An open
request is settled exactly once, by :meth:`Ledger.settle`, to one of the
outcomes :data:`SETTLES` allows from its state; a settled row never changes.
Audit ids are consecutive: the next id is taken under the write lock and counts
only once its transaction commits. Opening a store audits the charges a process
that ended never settled (``charged``; :func:`_recover`), and
:func:`interrupt_open` settles the requests of jobs it left running.

Lock order: the store's write lock (:attr:`Store.lock`, re-entrant) comes
first. Every write transaction holds it (:meth:`Store.transaction`), and it
guards this module's per-store state (:class:`Books`: the next id, the summed
standings, the queued settles) and the answer cache's
(:class:`dpsql.answers.AnswerCache`). Under it only the plan cache's leaf lock
may be taken, for a dict operation. The free database's rebuild lock
(:mod:`dpsql.query.free`) is never taken under it. Readers take no lock:
DuckDB gives each cursor a snapshot.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, replace
from datetime import datetime
from enum import Enum
from fractions import Fraction
from typing import Any

import duckdb

from dpsql.answers import AnswerCache, StoredAnswer, cache_share
from dpsql.errors import AccessDenied, BudgetExceeded, InternalError
from dpsql.policy import Policy
from dpsql.privacy import Kind, PrivacyCost
from dpsql.store import Store, Tables, now


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


@dataclass(frozen=True)
class Budget:
    """One user's standing on one dataset, and the dataset's own total.

    ``delta``: the policy's, at which a zCDP standing also shows its epsilon.
    """

    user: str
    dataset: str
    granted: PrivacyCost
    spent: PrivacyCost
    dataset_total: PrivacyCost
    dataset_spent: PrivacyCost
    delta: float | None = field(default=None, compare=False)

    @property
    def remaining(self) -> PrivacyCost:
        """What this user may still spend: the lesser of their allowance and the dataset's."""
        mine = self.granted - self.spent
        theirs = self.dataset_total - self.dataset_spent
        return mine if mine <= theirs else theirs

    def describe(self) -> str:
        """One line in both units, rounded safely: granted to nearest, spent up, remaining down."""
        delta = self.delta
        return (f"{self.user} on {self.dataset}: granted {self.granted.describe(delta, 'nearest')}"
                f", spent {self.spent.describe(delta)}"
                f", remaining {self.remaining.describe(delta, 'down')}")

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"<Budget {self.describe()}>"

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able form with both units (exact rho or epsilon; epsilon at ``delta`` too)."""
        delta = self.delta if delta is None else delta
        return {
            "user": self.user,
            "dataset": self.dataset,
            "granted": self.granted.as_dict(delta),
            "spent": self.spent.as_dict(delta),
            "remaining": self.remaining.as_dict(delta),
            "dataset_total": self.dataset_total.as_dict(delta),
            "dataset_spent": self.dataset_spent.as_dict(delta),
        }


logger = logging.getLogger(__name__)

# The audit rows of charged requests not settled yet (the charge row carries them).
_UNSETTLED = ("SELECT c.audit_id, c.ts, c.user_name, c.dataset, coalesce(c.action, 'query'), "
              "c.statement, c.kind, c.units, c.infinite, CAST($outcome AS VARCHAR), "
              "CAST($reason AS VARCHAR), c.fingerprint FROM dpsql.charges c")

# The audit rows of charges whose request never settled: the process that charged them
# ended first (a charged request's audit row is written when it settles).
_REPAIR_AUDIT = (
    "INSERT INTO dpsql.audit SELECT c.audit_id, c.ts, c.user_name, c.dataset, "
    "coalesce(c.action, 'query'), c.statement, c.kind, c.units, c.infinite, "
    "'charged', 'the process ended before the outcome was recorded', c.fingerprint "
    "FROM dpsql.charges c ANTI JOIN dpsql.audit a ON a.id = c.audit_id")


def _recover(store: Store, cur: duckdb.DuckDBPyConnection) -> None:
    """Audit the charges whose request never settled (``charged``): their process ended."""
    cur.execute(_REPAIR_AUDIT)


TABLES = Tables("ledger", {
    1: ("CREATE SEQUENCE dpsql.event_ids",
        """CREATE TABLE dpsql.audit (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR, action VARCHAR NOT NULL, statement VARCHAR,
            kind VARCHAR, units HUGEINT, infinite BOOLEAN, outcome VARCHAR NOT NULL,
            reason VARCHAR, fingerprint VARCHAR)""",
        """CREATE TABLE dpsql.charges (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR NOT NULL, kind VARCHAR NOT NULL, units HUGEINT NOT NULL,
            infinite BOOLEAN NOT NULL, fingerprint VARCHAR NOT NULL, audit_id BIGINT NOT NULL)""",
        """CREATE TABLE dpsql.grants (
            id BIGINT PRIMARY KEY, ts TIMESTAMP NOT NULL, user_name VARCHAR NOT NULL,
            dataset VARCHAR NOT NULL, kind VARCHAR NOT NULL, units HUGEINT NOT NULL,
            infinite BOOLEAN NOT NULL, granted_by VARCHAR NOT NULL,
            fingerprint VARCHAR NOT NULL)"""),
    # 4: a charge carries its request, so the audit row written after the charge (off the
    # answer path) can be rebuilt if the process ends before writing it.
    4: ("ALTER TABLE dpsql.charges ADD COLUMN action VARCHAR",
        "ALTER TABLE dpsql.charges ADD COLUMN statement VARCHAR"),
    # 5: rebuild any audit row that an older dpsql (which wrote it after the charge) did
    # not live to write (the same SQL now runs at every open: _recover).
    5: (_REPAIR_AUDIT,),
    # 7: the delta a charge's partition selection spends, which the ledger sums per
    # dataset so that no policy change lets the selections pass the policy's delta.
    7: ("ALTER TABLE dpsql.charges ADD COLUMN delta DOUBLE",),
}, _recover)


@dataclass(frozen=True)
class AuditRow:
    """One row of ``dpsql.audit``, in its column order."""

    id: int
    at: datetime
    user: str
    dataset: str | None
    action: str
    statement: str | None
    kind: Kind | None
    units: int | None
    infinite: bool | None
    outcome: Outcome
    reason: str | None
    fingerprint: str

    @classmethod
    def of(cls, audit_id: int, user: str, dataset: str | None, action: str,
           statement: str | None, cost: PrivacyCost | None, outcome: Outcome,
           reason: str | None,
           fingerprint: str) -> AuditRow:
        """A row stamped now, its texts storable and cut to size."""
        return cls(audit_id, now(), user, dataset, action,
                   None if statement is None else storable(statement[:10_000]),
                   cost.kind if cost else None, cost.units if cost else None,
                   cost.infinite if cost else None, Outcome(outcome),
                   None if reason is None else storable(reason[:2000]), fingerprint)

    def insert(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Write the row in the caller's transaction."""
        values = list(astuple(self))
        values[9] = self.outcome.value
        cur.execute("INSERT INTO dpsql.audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values)


@dataclass(frozen=True)
class Charge:
    """A committed debit: its id (also its request's audit id) and what it cost."""

    id: int
    cost: PrivacyCost
    remaining: PrivacyCost


@dataclass(frozen=True)
class ChargeRow:
    """One row of ``dpsql.charges`` as the ledger's readers see it."""

    id: int
    at: datetime
    user: str
    dataset: str
    cost: PrivacyCost


# The ledger rows of one dataset summed per (source, user, kind): few rows, whatever the
# policy (which user asks and which kind is native are decided in Python).
_STANDING_SQL = """
SELECT src, user_name, kind, sum(units), bool_or(infinite), list(units)
FROM (
    SELECT 'charge' AS src, user_name, kind, units, infinite
    FROM dpsql.charges WHERE dataset = $dataset
    UNION ALL
    SELECT 'grant' AS src, user_name, kind, units, infinite
    FROM dpsql.grants WHERE dataset = $dataset
)
GROUP BY ALL
"""

#: (source, user, kind) -> [sum of units, any infinite, every row's units]
Totals = dict[tuple[str, str, str], list[Any]]


class Books:
    """What this module keeps about an open store, guarded by the store's write lock.

    ``next_id``: the next audit id (None: read it again from the table).
    ``totals``: the summed ledger rows per dataset, read once, then kept current
    by the charges and grants written here (the only writer of the file).
    ``deltas``: the same for the delta the charges' partition selections spent,
    per dataset, summed exactly (each stored float is an exact fraction).
    ``answers``: the store's stored answers (:mod:`dpsql.answers`), which a
    settle writes in the ledger's transaction.
    ``settles``: the settles of answered DP queries not yet written, in order.
    The next write transaction writes them before its own rows (one durable
    commit for both); ``writer``, one thread, writes them after
    :data:`SETTLE_DELAY_S` when no write comes first (``armed``: it will).
    """

    def __init__(self, store: Store, answers: AnswerCache) -> None:
        self.store = store
        self.answers = answers
        self.next_id: int | None = None
        self.totals: dict[str, Totals] = {}
        self.deltas: dict[str, Fraction] = {}
        self.settles: list[_Settle] = []
        self.writer: ThreadPoolExecutor | None = None
        self.armed = False
        self.closing = threading.Event()  # wakes the writer early: the store closes

    def queue(self, settle: _Settle) -> None:
        """Write ``settle`` with the next write, or soon (caller holds the write lock)."""
        self.settles.append(settle)
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="dpsql-settle")
        if not self.armed:
            self.armed = True
            self.writer.submit(_logged, lambda: _write_soon(self.store, self))

    def write(self, cur: duckdb.DuckDBPyConnection) -> list[_Settle]:
        """Write the queued settles in ``cur``'s transaction; returns them.

        If the transaction does not commit they are queued again (:meth:`undo`);
        if writing one fails, they are dropped.
        """
        settles, self.settles = self.settles, []
        try:
            for settle in settles:
                settle.write(cur, self.answers)
            shares: dict[str, int] = {}  # per user who stored: their least share
            for s in settles:
                if s.answer is not None:
                    user = s.answer.user
                    shares[user] = min(shares.get(user, s.cache_share), s.cache_share)
            for user, share in shares.items():
                self.answers.evict(user, share, cur)
        except Exception:  # a bug: dropped, or it would fail every write after it
            logger.exception("writing queued settles failed; their requests stay open")
            self.committed(settles)
            raise
        return settles

    def committed(self, settles: list[_Settle]) -> None:
        """``settles`` are durable: their answers are served from the table from now on."""
        for settle in settles:
            if settle.answer is not None:
                self.answers.written(settle.answer)

    def undo(self, settles: list[_Settle]) -> None:
        """A write failed after writing ``settles``: forget what it counted, queue them again."""
        self.next_id, self.totals, self.deltas = None, {}, {}
        self.answers.forget()
        self.settles[:0] = settles

    def close(self) -> None:
        """Write the queued settles (the store calls this before it closes)."""
        settled(self.store)
        self.closing.set()
        if self.writer is not None:
            self.writer.shutdown(wait=True)

    def take_id(self, cur: duckdb.DuckDBPyConnection) -> int:
        """The next audit id; it counts once the caller's transaction commits."""
        if self.next_id is None:
            row = cur.execute("SELECT greatest((SELECT coalesce(max(id), 0) FROM dpsql.audit), "
                              "(SELECT coalesce(max(id), 0) FROM dpsql.charges))").fetchone()
            self.next_id = int(row[0]) + 1 if row else 1
        taken, self.next_id = self.next_id, self.next_id + 1
        return taken

    def dataset_totals(self, dataset: str, cur: duckdb.DuckDBPyConnection) -> Totals:
        """The summed ledger rows of ``dataset``, read once, then kept current."""
        if dataset not in self.totals:
            rows = cur.execute(_STANDING_SQL, {"dataset": dataset}).fetchall()
            self.totals[dataset] = {(r[0], r[1], r[2]): [int(r[3]), bool(r[4]),
                                                         [int(u) for u in r[5]]] for r in rows}
        return self.totals[dataset]

    def add(self, src: str, dataset: str, user: str, cost: PrivacyCost,
            delta: float = 0.0) -> None:
        """Count one row written in the current transaction (``delta``: its selection's)."""
        totals = self.totals.get(dataset)
        if totals is not None:
            entry = totals.setdefault((src, user, cost.kind), [0, False, []])
            entry[0] += cost.units
            entry[1] = entry[1] or cost.infinite
            entry[2].append(cost.units)
        if delta and dataset in self.deltas:
            self.deltas[dataset] += Fraction(delta)

    def delta_spent(self, dataset: str, cur: duckdb.DuckDBPyConnection) -> Fraction:
        """The exact sum of the delta every charge on ``dataset`` spent on partition selection."""
        if dataset not in self.deltas:
            rows = cur.execute("SELECT delta FROM dpsql.charges WHERE dataset = ? AND delta > 0",
                               [dataset]).fetchall()
            self.deltas[dataset] = sum((Fraction(r[0]) for r in rows), Fraction(0))
        return self.deltas[dataset]


#: How long an answered query's settle waits for a write to ride with (seconds).
#: Queries that follow within it share their commit with it; if the process ends
#: first, the request stays open ("charged"): budget lost, never privacy.
SETTLE_DELAY_S = 0.05


@dataclass(frozen=True)
class _Settle:
    """The settle of one answered DP query, waiting for a write transaction."""

    audit_id: int
    outcome: Outcome
    reason: str | None
    answer: StoredAnswer | None  # the answer to store, unless a twin's is stored
    cache_share: int  # the user's share of the answer cache in bytes, under the request's policy

    def write(self, cur: duckdb.DuckDBPyConnection, answers: AnswerCache) -> None:
        if self.answer is not None:
            # no twin is stored (Ledger.settle checked, under the write lock)
            answers.insert(cur, self.answer)
        _close_open(cur, self.audit_id, self.outcome, self.reason)


def _logged(task: Callable[[], None]) -> None:
    try:
        task()
    except Exception:  # the requests stay open ("charged"); a repeat is charged again
        logger.exception("writing queued settles failed")


def _write_soon(store: Store, books: Books) -> None:
    """On the writer thread: the queued settles, unless a write took them first."""
    books.closing.wait(SETTLE_DELAY_S)
    with store.lock:
        books.armed = False
        if books.settles:
            with _writing(store):
                pass


@contextmanager
def _writing(store: Store) -> Iterator[tuple[duckdb.DuckDBPyConnection, Books]]:
    """A write transaction on ``store`` with the ledger's state, under the write lock.

    It first writes the queued settles, so they commit with the caller's rows.
    If it does not commit, the state is read again from the store next time, so
    an id it took is reused (no gap) and no uncommitted row is counted; the
    settles are queued again, unless writing them was what failed (a bug: their
    requests stay open).
    """
    with store.lock:
        books = store.services.books
        settles: list[_Settle] = []
        try:
            with store.transaction() as cur:
                settles = books.write(cur)
                yield cur, books
        except BaseException:
            books.undo(settles)
            raise
        books.committed(settles)


def _total(kind: Kind, totals: Totals, src: str, user: str | None) -> PrivacyCost:
    """The sum of the ledger rows of ``src`` (only ``user``'s unless None)."""
    picked = [(k, v) for k, v in totals.items() if k[0] == src and user in (None, k[1])]
    native = sum(v[0] for k, v in picked if k[2] == kind)
    infinite = any(v[1] for _, v in picked)
    foreign = [u for k, v in picked if k[2] != kind for u in v[2]]
    return _cost(kind, native, infinite, foreign)


def _cost(kind: Kind, units: int, infinite: bool, foreign: list[int] | None) -> PrivacyCost:
    """A sum of ledger rows in ``kind``.

    ``foreign`` rows (pure epsilon recorded before the policy switched to zCDP) each
    count as epsilon^2 / 2, so nothing spent is forgotten.
    """
    if infinite:
        return PrivacyCost.unbounded(kind)
    total = PrivacyCost(kind, int(units))
    for other in foreign or ():
        total = total + PrivacyCost("pure", int(other)).to(kind)
    return total


class Ledger:
    """Charges, grants and audit rows for one store under a policy (the request's)."""

    def __init__(self, store: Store, policy: Policy) -> None:
        self.store = store
        self.policy = policy

    # -- reading ------------------------------------------------------------------------
    def budget(self, user: str, dataset: str) -> Budget:
        """The current standing of ``user`` on ``dataset``.

        Every row recorded for the dataset counts, whatever the accounting was when it
        was written (see :func:`_cost`; the store refuses a switch to pure accounting
        once zCDP costs exist).
        """
        with self.store.lock:  # the totals change as charges commit
            return self._standing(self.store.services.books, user, dataset,
                                  self.store.cursor())

    def _standing(self, books: Books, user: str, dataset: str,
                  cur: duckdb.DuckDBPyConnection) -> Budget:
        policy = self.policy
        kind = policy.accounting
        base = policy.user(user).budgets.get(dataset, PrivacyCost.zero(kind))
        totals = books.dataset_totals(dataset, cur)
        return Budget(user, dataset, base + _total(kind, totals, "grant", user),
                      _total(kind, totals, "charge", user), policy.dataset(dataset).budget,
                      _total(kind, totals, "charge", None), policy.delta)

    def budgets(self, user: str | None = None) -> list[Budget]:
        """Standing of ``user`` (or every user) on every dataset they have a budget for."""
        users = [self.policy.user(user)] if user else list(self.policy.users.values())
        out = []
        for u in users:
            for ds in self.policy.datasets:
                standing = self.budget(u.name, ds)
                if u.budgets.get(ds) or not standing.granted.is_zero:
                    out.append(standing)
        return out

    def overspent(self) -> list[str]:
        """Notes on budgets this policy sets below what is already spent (requests are refused)."""
        delta, notes, datasets = self.policy.delta, [], set()
        for b in self.budgets():
            if b.spent > b.granted:
                notes.append(f"{b.user} on {b.dataset}: the budget "
                             f"{b.granted.describe(delta, 'nearest')} is below what is spent "
                             f"({b.spent.describe(delta)}); every further request is refused")
            if b.dataset_spent > b.dataset_total and b.dataset not in datasets:
                datasets.add(b.dataset)
                notes.append(f"dataset {b.dataset}: the total "
                             f"{b.dataset_total.describe(delta, 'nearest')} is below what is "
                             f"spent ({b.dataset_spent.describe(delta)}); every further "
                             "request is refused")
        return notes

    def audit(self, user: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
        """Audit rows, newest last, optionally for one user and the last ``last`` only."""
        settled(self.store)  # outcomes settled off the answer path
        sql = (f"SELECT * FROM (SELECT * FROM dpsql.audit UNION ALL {_UNSETTLED} "
               "ANTI JOIN dpsql.audit a ON a.id = c.audit_id)")
        params: dict[str, Any] = {"outcome": Outcome.CHARGED.value, "reason": None}
        if user:
            sql += " WHERE user_name = $user"
            params["user"] = user
        sql += " ORDER BY 1 DESC"
        if last:
            sql += f" LIMIT {int(last)}"
        out = []
        for values in reversed(self.store.cursor().execute(sql, params).fetchall()):
            row = AuditRow(*values)
            row = replace(row, outcome=Outcome(row.outcome))
            entry = {"id": row.id, "at": row.at, "user": row.user, "dataset": row.dataset,
                     "action": row.action, "statement": row.statement, "outcome": row.outcome,
                     "reason": row.reason, "fingerprint": row.fingerprint}
            entry["cost"] = PrivacyCost(row.kind, int(row.units or 0), bool(row.infinite)) \
                if row.kind else None
            out.append(entry)
        return out

    def delta_spent(self, dataset: str) -> float:
        """The delta partition selection has spent on ``dataset`` so far (all users), rounded up."""
        with self.store.lock:
            books = self.store.services.books
            return _float_up(books.delta_spent(dataset, self.store.cursor()))

    def charges(self) -> list[ChargeRow]:
        """Every charge, oldest first (what each request cost, whatever its outcome)."""
        rows = self.store.cursor().execute(
            "SELECT id, ts, user_name, dataset, kind, units, infinite FROM dpsql.charges "
            "ORDER BY ts, id").fetchall()
        return [ChargeRow(int(i), at, user, dataset, PrivacyCost(kind, int(units), bool(inf)))
                for i, at, user, dataset, kind, units, inf in rows]

    # -- writing ------------------------------------------------------------------------
    def charge(self, user: str, dataset: str, cost: PrivacyCost, statement: str,
               action: str = "query", *, delta: float = 0.0) -> Charge:
        """Debit ``cost`` (one row, which opens the request), or raise BudgetExceeded.

        Must be called before any private value is computed. The check and the
        debit run under the store's write lock, so concurrent charges cannot
        overspend. A refusal commits a settled audit row ("refused") instead; a
        charge's audit row is written when :meth:`settle` closes the request.
        ``delta``: what the request's partition selection spends (0: none), kept
        with the charge; the dataset's selections never pass the policy's delta.
        """
        cost = cost.to(self.policy.accounting)
        cap = self.policy.dataset(dataset).query_cap if action == "query" else None
        with _writing(self.store) as (cur, books):
            standing = self._standing(books, user, dataset, cur)
            reason = self._refusal(standing, cost, cap) \
                or self._delta_refusal(books.delta_spent(dataset, cur), dataset, delta)
            row = self._row(books.take_id(cur), user, dataset, action, statement, cost,
                            Outcome.REFUSED if reason else Outcome.CHARGED, reason)
            if reason is not None:
                row.insert(cur)
            else:
                cur.execute(f"INSERT INTO {_CHARGES} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                            [row.id, row.at, user, dataset, cost.kind, cost.units,
                             cost.infinite, self.policy.fingerprint, row.id, action,
                             row.statement, delta or None])
                books.add("charge", dataset, user, cost, delta)
        if reason is not None:
            raise BudgetExceeded(reason)
        remaining = replace(standing, spent=standing.spent + cost,
                            dataset_spent=standing.dataset_spent + cost).remaining
        return Charge(row.id, cost, remaining)

    def _refusal(self, standing: Budget, cost: PrivacyCost, cap: PrivacyCost | None) -> str | None:
        delta = self.policy.delta
        admins = sorted(u.name for u in self.policy.users.values() if u.role == "admin")
        grant = f"dpsql budget grant {standing.user} {standing.dataset} --epsilon X"
        ask = (f"as an administrator you may grant yourself more: {grant}"
               if standing.user in admins else
               f"ask an administrator ({', '.join(admins)}) to run: {grant}")
        if cap is not None and cost > cap:
            return (f"a query on {standing.dataset} may cost at most {cap.describe(delta)}; "
                    f"requested {cost.describe(delta)}: lower epsilon")
        mine = standing.granted - standing.spent
        if cost > mine:
            return (f"requested {cost.describe(delta)} on {standing.dataset}, but "
                    f"{standing.user} has {mine.describe(delta, 'down')} left; {ask}")
        left = standing.dataset_total - standing.dataset_spent
        if cost > left:
            return (f"requested {cost.describe(delta)} on {standing.dataset}, but the dataset's "
                    f"total budget has {left.describe(delta, 'down')} left; an "
                    "administrator can raise it in the policy (dpsql policy apply)")
        return None

    def _delta_refusal(self, spent: Fraction, dataset: str, delta: float) -> str | None:
        """Why a selection spending ``delta`` on ``dataset`` is refused (None: it is not).

        Each selection spends the policy's delta times its query's share of the
        dataset's budget, so the shares sum to at most the policy's delta while the
        budget stays; a policy that raises the budget leaves the earlier, larger
        shares spent, so the lifetime sum ``spent`` (exact) is checked here. A
        dataset with an unbounded budget promises nothing finite: not checked.
        """
        policy = self.policy
        if not delta or policy.dataset(dataset).budget.infinite:
            return None
        if spent + Fraction(delta) <= Fraction(policy.delta or 0):
            return None
        return (f"the keys of this GROUP BY come from partition selection, which would spend "
                f"delta={delta:.3g} on {dataset}, but selections there have spent "
                f"delta={_float_up(spent):.4g} of the policy's "
                f"delta={policy.delta}; list the column's values in the policy (no delta is "
                "spent then), or an administrator can raise delta in the policy "
                "(dpsql policy apply)")

    def _row(self, audit_id: int, user: str, dataset: str | None, action: str,
             statement: str | None, cost: PrivacyCost | None, outcome: Outcome,
             reason: str | None) -> AuditRow:
        return AuditRow.of(audit_id, user, dataset, action, statement, cost, outcome, reason,
                           self.policy.fingerprint)

    def record(self, user: str, dataset: str | None, statement: str | None, outcome: Outcome,
               reason: str | None = None, cost: PrivacyCost | None = None,
               action: str = "query", *, cursor: duckdb.DuckDBPyConnection | None = None
               ) -> int:
        """Add one audit row; returns its id.

        ``outcome`` settles the request at once (answered, refused, rejected,
        cached, ...), or is ``STARTED`` for a request :meth:`settle` closes later
        (a request is ``CHARGED`` only by :meth:`charge`).
        With ``cursor`` the row is written in the caller's open write transaction
        (which holds the write lock) and commits with the caller's other writes.
        """
        outcome = Outcome(outcome)
        if outcome is Outcome.CHARGED:
            raise InternalError("only a charge opens a charged request; this is a bug in dpsql")
        if cursor is None:
            with _writing(self.store) as (cur, books):
                row = self._row(books.take_id(cur), user, dataset, action, statement, cost,
                                outcome, reason)
                row.insert(cur)
            return row.id
        books = self.store.services.books
        row = self._row(books.take_id(cursor), user, dataset, action, statement, cost,
                        outcome, reason)
        row.insert(cursor)
        books.next_id = None  # read again next time: the caller may still roll back
        return row.id

    def settle(self, audit_id: int, outcome: Outcome, reason: str | None = None, *,
               answer: StoredAnswer | None = None) -> bool:
        """Close the open request ``audit_id`` with its outcome: the one way a request ends.

        ``outcome`` must be one :data:`SETTLES` allows from the request's state.
        ``answer``: the stored answer (:func:`dpsql.query.cache.stored_row`)
        of an answered DP query. Its settle (the row and the outcome) is queued to
        commit with the next write, the next charge usually, so the analyst does
        not wait for a second durable commit; the answer cache serves it
        meanwhile, and :meth:`audit` and closing the store write it first (see
        :data:`SETTLE_DELAY_S` for when no write comes). If the process ends first,
        the request stays open (``charged``) and a repeat is charged again: budget
        lost, never privacy. Returns False, queuing only the outcome, when a
        concurrent twin stored an answer under the same key first (the caller then
        serves the twin's). Without ``answer`` it commits before it returns.
        Settling a request that is not open is a bug.
        """
        outcome = Outcome(outcome)
        if not any(outcome in allowed for allowed in SETTLES.values()):
            raise InternalError(f"no request settles {outcome.value}; this is a bug in dpsql")
        settle = _Settle(audit_id, outcome, None if reason is None else storable(reason[:2000]),
                         None, cache_share(self.policy))
        if answer is None:
            with _writing(self.store) as (cur, books):
                settle.write(cur, books.answers)
            return True
        with self.store.lock:
            books = self.store.services.books
            held = books.answers.hold(answer)
            books.queue(replace(settle, answer=answer if held else None))
        return held

    def grant(self, admin: str, user: str, dataset: str, amount: PrivacyCost) -> Budget:
        """Top up ``user`` on ``dataset`` by ``amount`` (admins only); audited.

        The grant row and its audit row share one id.
        """
        if self.policy.user(admin).role != "admin":
            raise AccessDenied(f"{admin} is an analyst; only an administrator can grant budget")
        self.policy.user(user)
        self.policy.dataset(dataset)
        amount = amount.to(self.policy.accounting)
        with _writing(self.store) as (cur, books):
            row = self._row(books.take_id(cur), admin, dataset, "grant",
                            f"grant {user} {dataset} {amount.describe(self.policy.delta)}",
                            amount, Outcome.GRANTED, None)
            cur.execute("INSERT INTO dpsql.grants VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [row.id, row.at, user, dataset, amount.kind, amount.units,
                         amount.infinite, admin, self.policy.fingerprint])
            row.insert(cur)
            books.add("grant", dataset, user, amount)
        return self.budget(user, dataset)


def _float_up(value: Fraction) -> float:
    """The least float at least ``value``: a sum of deltas shown never under-counts."""
    shown = float(value)
    return shown if Fraction(shown) >= value else math.nextafter(shown, math.inf)


def _close_open(cur: duckdb.DuckDBPyConnection, audit_id: int, outcome: Outcome,
                reason: str | None) -> None:
    """Write the settled audit row of open request ``audit_id``.

    A charged request's row is made from its charge row (the primary key refuses
    a second); a ``started`` row (or the ``charged`` row the open repaired) is
    updated. A request that is not open, or cannot move to ``outcome``, is a bug:
    it raises, and the transaction does not commit.
    """
    sources = [state.value for state, allowed in SETTLES.items() if outcome in allowed]
    try:
        written = cur.execute(f"INSERT INTO dpsql.audit {_UNSETTLED} WHERE c.id = $id "
                              "AND $charged", {"outcome": outcome.value, "reason": reason,
                                               "id": audit_id, "charged": Outcome.CHARGED.value
                                               in sources}).fetchone()
    except duckdb.ConstraintException:
        pass  # its audit row exists: settled already
    else:
        if written and written[0] == 1:
            return
        done = cur.execute("UPDATE dpsql.audit SET outcome = ?, reason = coalesce(?, reason) "
                           "WHERE id = ? AND list_contains(?, outcome)",
                           [outcome.value, reason, audit_id, sources]).fetchone()
        if done and done[0] == 1:
            return
    raise InternalError(f"request {audit_id} is not open as {outcome.value} needs; this is a "
                        "bug in dpsql")


def interrupt_open(cur: duckdb.DuckDBPyConnection, audit_ids: list[int], reason: str) -> None:
    """Settle the open requests among ``audit_ids`` ``interrupted``: their process ended.

    For recoveries at open (:func:`dpsql.jobs._recover`), in the open's
    transaction, after :func:`_recover` audited every charge; a request already
    settled keeps its outcome.
    """
    opened = [state.value for state, allowed in SETTLES.items() if Outcome.INTERRUPTED in allowed]
    cur.execute("UPDATE dpsql.audit SET outcome = ?, reason = ? WHERE list_contains(?, id) "
                "AND list_contains(?, outcome)",
                [Outcome.INTERRUPTED.value, reason, audit_ids, opened])


def recorded_datasets(store: Store) -> list[tuple[str, bool]]:
    """Each dataset with charges or grants, and whether any of them is in zCDP (by name)."""
    rows = store.cursor().execute(
        "SELECT dataset, bool_or(kind = 'zcdp') FROM (SELECT dataset, kind FROM "
        "dpsql.charges UNION ALL SELECT dataset, kind FROM dpsql.grants) GROUP BY dataset "
        "ORDER BY dataset").fetchall()
    return [(str(dataset), bool(zcdp)) for dataset, zcdp in rows]


def settled(store: Store) -> None:
    """Commit every settle queued so far (read your own writes)."""
    books = store.services.books
    with store.lock:
        if books.settles:
            with _writing(store):
                pass


_CHARGES = ("dpsql.charges (id, ts, user_name, dataset, kind, units, infinite, fingerprint, "
            "audit_id, action, statement, delta)")


def storable(text: str) -> str:
    """``text`` as valid UTF-8 (DuckDB refuses lone surrogates, which stand for bad bytes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
