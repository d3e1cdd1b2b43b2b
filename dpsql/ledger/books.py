"""The books behind the ledger: its tables, their recovery, and every write to them.

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

The API over these books is :class:`dpsql.ledger.Ledger`; a request's states are
:class:`dpsql.outcomes.Outcome`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

import duckdb

from dpsql.answers import AnswerCache, StoredAnswer
from dpsql.errors import InternalError
from dpsql.outcomes import SETTLES, Outcome
from dpsql.privacy import Kind, PrivacyCost
from dpsql.store import Store, StoreKey, Tables, now

logger = logging.getLogger(__name__)


UNSETTLED = ("SELECT c.audit_id, c.ts, c.user_name, c.dataset, coalesce(c.action, 'query'), "
              "c.statement, c.kind, c.units, c.infinite, CAST($outcome AS VARCHAR), "
              "CAST($reason AS VARCHAR), c.fingerprint FROM dpsql.charges c")


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
        self.settles: list[Settle] = []
        self.writer: ThreadPoolExecutor | None = None
        self.armed = False
        self.closing = threading.Event()  # wakes the writer early: the store closes

    def queue(self, settle: Settle) -> None:
        """Write ``settle`` with the next write, or soon (caller holds the write lock)."""
        self.settles.append(settle)
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="dpsql-settle")
        if not self.armed:
            self.armed = True
            self.writer.submit(_logged, lambda: _write_soon(self.store, self))

    def write(self, cur: duckdb.DuckDBPyConnection) -> list[Settle]:
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

    def committed(self, settles: list[Settle]) -> None:
        """``settles`` are durable: their answers are served from the table from now on."""
        for settle in settles:
            if settle.answer is not None:
                self.answers.written(settle.answer)

    def undo(self, settles: list[Settle]) -> None:
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


#: Books of each open store: ``store[BOOKS]``.
BOOKS: StoreKey[Books] = StoreKey("books")


SETTLE_DELAY_S = 0.05


@dataclass(frozen=True)
class Settle:
    """The settle of one answered DP query, waiting for a write transaction."""

    audit_id: int
    outcome: Outcome
    reason: str | None
    answer: StoredAnswer | None  # the answer to store, unless a twin's is stored
    cache_share: int  # the user's share of the answer cache in bytes, under the request's policy

    def write(self, cur: duckdb.DuckDBPyConnection, answers: AnswerCache) -> None:
        """Store the answer (if any) and close the request's audit row, in ``cur``."""
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
            with writing(store):
                pass


@contextmanager
def writing(store: Store) -> Iterator[tuple[duckdb.DuckDBPyConnection, Books]]:
    """A write transaction on ``store`` with the ledger's state, under the write lock.

    It first writes the queued settles, so they commit with the caller's rows.
    If it does not commit, the state is read again from the store next time, so
    an id it took is reused (no gap) and no uncommitted row is counted; the
    settles are queued again, unless writing them was what failed (a bug: their
    requests stay open).
    """
    with store.lock:
        books = store[BOOKS]
        settles: list[Settle] = []
        try:
            with store.transaction() as cur:
                settles = books.write(cur)
                yield cur, books
        except BaseException:
            books.undo(settles)
            raise
        books.committed(settles)


def total(kind: Kind, totals: Totals, src: str, user: str | None) -> PrivacyCost:
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
        written = cur.execute(f"INSERT INTO dpsql.audit {UNSETTLED} WHERE c.id = $id "
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


def settled(store: Store) -> None:
    """Commit every settle queued so far (read your own writes)."""
    books = store[BOOKS]
    with store.lock:
        if books.settles:
            with writing(store):
                pass


CHARGE_COLUMNS = ("dpsql.charges (id, ts, user_name, dataset, kind, units, infinite, fingerprint, "
            "audit_id, action, statement, delta)")


def storable(text: str) -> str:
    """``text`` as valid UTF-8 (DuckDB refuses lone surrogates, which stand for bad bytes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
