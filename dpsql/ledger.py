"""The budget ledger and the audit log: the one writer of dpsql's bookkeeping.

Charges, grants, audit rows and stored answers (``dpsql.query_cache``) are
written here and nowhere else (:meth:`Store.open` only repairs what a process
that died left open). A charge is compare-and-debit inside one DuckDB
transaction, one durable row committed before the caller computes anything
private: a crash afterwards loses budget, never privacy. There are no refunds.
A refusal leaves the ledger unchanged and adds one settled audit row saying why.

A request is open from its charge (the charge row, which carries the request,
is its record until it settles: :meth:`Ledger.audit` shows it as ``charged``)
or from a ``started`` audit row (:meth:`Ledger.record`); other rows are written
settled at once. An open request is settled exactly once, by
:meth:`Ledger.settle`, which writes or updates its audit row with the outcome.
Audit ids are consecutive: the next id is taken under the write lock and counts
only once its transaction commits.

Lock order: the store's write lock (:attr:`Store.lock`, re-entrant) comes
first. Every write transaction holds it (:meth:`Store.transaction`), and it
guards this module's per-store state (:class:`_Books`: the next id and the
summed standings). Under it only leaf locks may be taken, each for a dict
operation: the store's state registry lock and the plan cache's. The free
database's rebuild lock (:mod:`dpsql.query.free`) is never taken under it.
Readers take no lock: DuckDB gives each cursor a snapshot.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, dataclass, field, replace
from datetime import datetime
from fractions import Fraction
from typing import Any

import duckdb

from dpsql.errors import AccessDenied, BudgetExceeded, InternalError
from dpsql.policy import Policy
from dpsql.privacy import Kind, PrivacyCost
from dpsql.public import load_public_tables
from dpsql.store import Store, now


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

#: Outcomes of an open request, which :meth:`Ledger.settle` closes.
OPEN = ("charged", "started")

# The audit rows of charged requests not settled yet (the charge row carries them).
_UNSETTLED = ("SELECT c.audit_id, c.ts, c.user_name, c.dataset, coalesce(c.action, 'query'), "
              "c.statement, c.kind, c.units, c.infinite, CAST($outcome AS VARCHAR), "
              "CAST($reason AS VARCHAR), c.fingerprint FROM dpsql.charges c")


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
    outcome: str
    reason: str | None
    fingerprint: str

    @classmethod
    def of(cls, audit_id: int, user: str, dataset: str | None, action: str,
           statement: str | None, cost: PrivacyCost | None, outcome: str, reason: str | None,
           fingerprint: str) -> AuditRow:
        """A row stamped now, its texts storable and cut to size."""
        return cls(audit_id, now(), user, dataset, action,
                   None if statement is None else storable(statement[:10_000]),
                   cost.kind if cost else None, cost.units if cost else None,
                   cost.infinite if cost else None, outcome,
                   None if reason is None else storable(reason[:2000]), fingerprint)

    def insert(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Write the row in the caller's transaction."""
        cur.execute("INSERT INTO dpsql.audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    list(astuple(self)))


@dataclass(frozen=True)
class Charge:
    """A committed debit: its id (also its request's audit id) and what it cost."""

    id: int
    cost: PrivacyCost
    remaining: PrivacyCost


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


class _Books:
    """What this module keeps about an open store, guarded by the store's write lock.

    ``next_id``: the next audit id (None: read it again from the table).
    ``totals``: the summed ledger rows per dataset, read once, then kept current
    by the charges and grants written here (the only writer of the file).
    ``deltas``: the same for the delta the charges' partition selections spent,
    per dataset, summed exactly (each stored float is an exact fraction).
    ``stored``: key -> size in bytes of every stored answer, committed or queued,
    oldest first (None: read them again from the table); this module is their only
    writer, and DuckDB lets one process at a time open the file, so a key not here
    is stored nowhere. ``shelves``: the same per user (user -> key -> size, oldest
    first), and ``shelf_bytes`` each user's sum: a user's answers are dropped only
    to keep that user within their share (:func:`cache_share`).
    ``settles``: the settles of answered DP queries not yet written, in order.
    The next write transaction writes them before its own rows (one durable
    commit for both); ``writer``, one thread, writes them after
    :data:`SETTLE_DELAY_S` when no write comes first (``armed``: it will).
    ``answers``: the stored answers among ``settles``, by key.
    """

    def __init__(self) -> None:
        self.next_id: int | None = None
        self.totals: dict[str, Totals] = {}
        self.deltas: dict[str, Fraction] = {}
        self.stored: dict[str, int] | None = None
        self.shelves: dict[str, dict[str, int]] = {}
        self.shelf_bytes: dict[str, int] = {}
        self.settles: list[_Settle] = []
        self.answers: dict[str, Sequence[Any]] = {}
        self.writer: ThreadPoolExecutor | None = None
        self.armed = False
        self.flush: Callable[[], None] | None = None
        self.closing = threading.Event()  # wakes the writer early: the store closes

    def queue(self, store: Store, settle: _Settle) -> None:
        """Write ``settle`` with the next write, or soon (caller holds the write lock)."""
        self.settles.append(settle)
        if settle.answer is not None:
            self.answers[settle.answer[0]] = settle.answer
        if self.writer is None:
            self.writer = ThreadPoolExecutor(1, thread_name_prefix="dpsql-settle")
            self.flush = lambda: settled(store)
        if not self.armed:
            self.armed = True
            self.writer.submit(_logged, lambda: _write_soon(store, self))

    def write(self, cur: duckdb.DuckDBPyConnection) -> list[_Settle]:
        """Write the queued settles in ``cur``'s transaction; returns them.

        If the transaction does not commit they are queued again (:meth:`undo`);
        if writing one fails, they are dropped.
        """
        settles, self.settles = self.settles, []
        try:
            for settle in settles:
                settle.write(cur)
            shares: dict[str, int] = {}  # per user who stored: their least share
            for s in settles:
                if s.answer is not None:
                    user = s.answer[1]
                    shares[user] = min(shares.get(user, s.cache_share), s.cache_share)
            for user, share in shares.items():
                self.evict(user, share, cur)
        except Exception:  # a bug: dropped, or it would fail every write after it
            logger.exception("writing queued settles failed; their requests stay open")
            self.committed(settles)
            raise
        return settles

    def committed(self, settles: list[_Settle]) -> None:
        """``settles`` are durable: their answers are served from the table from now on."""
        for settle in settles:
            if settle.answer is not None:
                self.answers.pop(settle.answer[0], None)

    def undo(self, settles: list[_Settle]) -> None:
        """A write failed after writing ``settles``: forget what it counted, queue them again."""
        self.next_id, self.totals, self.deltas, self.stored = None, {}, {}, None
        self.settles[:0] = settles

    def close(self) -> None:
        """Write the queued settles (the store calls this before it closes)."""
        if self.flush is not None:
            self.flush()
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

    def stored_answers(self, cur: duckdb.DuckDBPyConnection) -> dict[str, int]:
        """Key -> size of the stored answers, oldest first (caller holds the write lock)."""
        if self.stored is None:
            rows = cur.execute(
                "SELECT key, user_name, strlen(plan) + strlen(noise) + octet_length(measures) "
                "FROM dpsql.query_cache ORDER BY created_at, key").fetchall()
            stored: dict[str, int] = {}  # filled, then published whole: readers take no lock
            self.shelves, self.shelf_bytes = {}, {}
            for key, user, size in rows:
                self._put(stored, key, user, int(size))
            for key, row in self.answers.items():
                if key not in stored:
                    self._put(stored, key, row[1], answer_size(row))
            self.stored = stored
        return self.stored

    def _put(self, stored: dict[str, int], key: str, user: str, size: int) -> None:
        stored[key] = size
        self.shelves.setdefault(user, {})[key] = size
        self.shelf_bytes[user] = self.shelf_bytes.get(user, 0) + size

    def keep(self, key: str, user: str, size: int, cur: duckdb.DuckDBPyConnection) -> None:
        """Count ``user``'s answer stored under ``key`` (caller holds the write lock)."""
        self._put(self.stored_answers(cur), key, user, size)

    def evict(self, user: str, share: int, cur: duckdb.DuckDBPyConnection) -> list[str]:
        """Drop ``user``'s oldest answers until theirs take at most 90% of ``share`` bytes.

        Only ``user``'s own answers are dropped, and only when theirs pass ``share``,
        so what another user stores never decides what this one pays for a repeat.
        Called in a write transaction that commits the deletion; returns the keys
        dropped. Answers whose settle is still queued are kept: their rows are not
        written yet.
        """
        stored = self.stored_answers(cur)
        shelf = self.shelves.get(user, {})
        if self.shelf_bytes.get(user, 0) <= share:
            return []
        dropped = []
        for key in list(shelf):
            if self.shelf_bytes[user] <= share * 0.9:
                break
            if key in self.answers:
                continue
            self.shelf_bytes[user] -= shelf.pop(key)
            del stored[key]
            dropped.append(key)
        cur.execute("DELETE FROM dpsql.query_cache WHERE list_contains(?, key)", [dropped])
        return dropped

    def trim(self, policy: Policy, cur: duckdb.DuckDBPyConnection) -> int:
        """Drop every user's oldest answers beyond their share under ``policy``.

        A user ``policy`` does not name has no share: their answers are dropped.
        Returns how many were dropped (in ``cur``'s transaction).
        """
        self.stored_answers(cur)
        share = cache_share(policy)
        return sum(len(self.evict(user, share if user in policy.users else 0, cur))
                   for user in list(self.shelves))

    def dataset_totals(self, dataset: str, cur: duckdb.DuckDBPyConnection) -> Totals:
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
    outcome: str
    reason: str | None
    answer: Sequence[Any] | None  # the dpsql.query_cache row, unless a twin's is stored
    cache_share: int  # the user's share of the answer cache in bytes, under the request's policy

    def write(self, cur: duckdb.DuckDBPyConnection) -> None:
        if self.answer is not None:
            # no twin is stored (Ledger.settle checked, under the write lock)
            cur.execute("INSERT INTO dpsql.query_cache VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        list(self.answer))
        _close_open(cur, self.audit_id, self.outcome, self.reason)


def _logged(task: Callable[[], None]) -> None:
    try:
        task()
    except Exception:  # the requests stay open ("charged"); a repeat is charged again
        logger.exception("writing queued settles failed")


def _write_soon(store: Store, books: _Books) -> None:
    """On the writer thread: the queued settles, unless a write took them first."""
    books.closing.wait(SETTLE_DELAY_S)
    with store.lock:
        books.armed = False
        if books.settles:
            with _writing(store):
                pass


@contextmanager
def _writing(store: Store) -> Iterator[tuple[duckdb.DuckDBPyConnection, _Books]]:
    """A write transaction on ``store`` with the ledger's state, under the write lock.

    It first writes the queued settles, so they commit with the caller's rows.
    If it does not commit, the state is read again from the store next time, so
    an id it took is reused (no gap) and no uncommitted row is counted; the
    settles are queued again, unless writing them was what failed (a bug: their
    requests stay open).
    """
    with store.lock:
        books = store.state(_Books)
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
            return self._standing(self.store.state(_Books), user, dataset,
                                  self.store.cursor())

    def _standing(self, books: _Books, user: str, dataset: str,
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
        params: dict[str, Any] = {"outcome": "charged", "reason": None}
        if user:
            sql += " WHERE user_name = $user"
            params["user"] = user
        sql += " ORDER BY 1 DESC"
        if last:
            sql += f" LIMIT {int(last)}"
        out = []
        for values in reversed(self.store.cursor().execute(sql, params).fetchall()):
            row = AuditRow(*values)
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
            return _float_up(self.store.state(_Books).delta_spent(dataset, self.store.cursor()))

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
                            "refused" if reason else "charged", reason)
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
             statement: str | None, cost: PrivacyCost | None, outcome: str,
             reason: str | None) -> AuditRow:
        return AuditRow.of(audit_id, user, dataset, action, statement, cost, outcome, reason,
                           self.policy.fingerprint)

    def record(self, user: str, dataset: str | None, statement: str | None, outcome: str,
               reason: str | None = None, cost: PrivacyCost | None = None,
               action: str = "query", *, cursor: duckdb.DuckDBPyConnection | None = None
               ) -> int:
        """Add one audit row; returns its id.

        ``outcome`` settles the request at once (answered, refused, rejected,
        cached, ...), or is "started" for a request :meth:`settle` closes later.
        With ``cursor`` the row is written in the caller's open write transaction
        (which holds the write lock) and commits with the caller's other writes.
        """
        if cursor is None:
            with _writing(self.store) as (cur, books):
                row = self._row(books.take_id(cur), user, dataset, action, statement, cost,
                                outcome, reason)
                row.insert(cur)
            return row.id
        books = self.store.state(_Books)
        row = self._row(books.take_id(cursor), user, dataset, action, statement, cost,
                        outcome, reason)
        row.insert(cursor)
        books.next_id = None  # read again next time: the caller may still roll back
        return row.id

    def settle(self, audit_id: int, outcome: str, reason: str | None = None, *,
               answer: Sequence[Any] | None = None) -> bool:
        """Close the open request ``audit_id`` with its outcome: the one way a request ends.

        ``answer``: a ``dpsql.query_cache`` row (:func:`dpsql.query.cache.stored_row`)
        of an answered DP query. Its settle (the row and the outcome) is queued to
        commit with the next write, the next charge usually, so the analyst does
        not wait for a second durable commit; :func:`queued_answer` serves it
        meanwhile, and :meth:`audit` and closing the store write it first (see
        :data:`SETTLE_DELAY_S` for when no write comes). If the process ends first,
        the request stays open (``charged``) and a repeat is charged again: budget
        lost, never privacy. Returns False, queuing only the outcome, when a
        concurrent twin stored an answer under the same key first (the caller then
        serves the twin's). Without ``answer`` it commits before it returns.
        Settling a request that is not open is a bug.
        """
        settle = _Settle(audit_id, outcome, None if reason is None else storable(reason[:2000]),
                         None, cache_share(self.policy))
        if answer is None:
            with _writing(self.store) as (cur, _):
                settle.write(cur)
            return True
        with self.store.lock:
            books = self.store.state(_Books)
            twin = answer[0] in books.stored_answers(self.store.cursor())
            if not twin:
                books.keep(answer[0], answer[1], answer_size(answer), self.store.cursor())
            books.queue(self.store, replace(settle, answer=None if twin else answer))
        return not twin

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
                            amount, "granted", None)
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


def _close_open(cur: duckdb.DuckDBPyConnection, audit_id: int, outcome: str,
                reason: str | None) -> None:
    """Write the settled audit row of open request ``audit_id``.

    A charged request's row is made from its charge row (the primary key refuses
    a second); a ``started`` row is updated. A request that is not open is a bug:
    it raises, and the transaction does not commit.
    """
    try:
        written = cur.execute(f"INSERT INTO dpsql.audit {_UNSETTLED} WHERE c.id = $id",
                              {"outcome": outcome, "reason": reason, "id": audit_id}).fetchone()
    except duckdb.ConstraintException:
        pass  # its audit row exists: settled already
    else:
        if written and written[0] == 1:
            return
        done = cur.execute(f"UPDATE dpsql.audit SET outcome = ?, reason = coalesce(?, reason) "
                           f"WHERE id = ? AND outcome IN {OPEN}", [outcome, reason, audit_id]
                           ).fetchone()
        if done and done[0] == 1:
            return
    raise InternalError(f"request {audit_id} is not open; this is a bug in dpsql")


def settled(store: Store) -> None:
    """Commit every settle queued so far (read your own writes)."""
    books = store.state(_Books)
    with store.lock:
        if books.settles:
            with _writing(store):
                pass


def answer_stored(store: Store, key: str) -> bool:
    """Whether an answer is stored under ``key`` (committed, or its settle queued)."""
    books = store.state(_Books)
    stored = books.stored  # one attribute read: atomic
    if stored is None:
        with store.lock:
            stored = books.stored_answers(store.cursor())
    return key in stored  # a dict look-up: atomic, no lock needed


def cache_share(policy: Policy) -> int:
    """Each user's share of the answer cache in bytes: ``answer_cache_mb`` split equally.

    Every user the policy names (administrators too) gets the same share, a
    public figure no query changes; a user's answers are dropped only to keep
    that user within it, so one user's answers never push out another's.
    """
    return int(policy.answer_cache_mb * 1e6) // max(1, len(policy.users))


def answer_size(row: Sequence[Any]) -> int:
    """The bytes a ``dpsql.query_cache`` row counts against the cache's limit."""
    return len(row[6].encode()) + len(row[7].encode()) + len(row[8])


def queued_answer(store: Store, key: str) -> Sequence[Any] | None:
    """The stored answer under ``key`` whose settle is still queued, if any."""
    return store.state(_Books).answers.get(key)  # one dict read: atomic, no lock needed


def apply_policy(store: Store, policy: Policy, applied_by: str,
                 prepare: Callable[[duckdb.DuckDBPyConnection], list[str]] | None = None
                 ) -> list[str]:
    """Make ``policy`` the store's active one, audited in the same transaction.

    Its public tables are copied into the store in that transaction too
    (:func:`dpsql.public.load_public_tables`), and each user's stored answers are
    trimmed to their share under it (:func:`cache_share`), so that the cache stays
    within ``answer_cache_mb`` when the policy shrinks it or names more users.
    """
    def audit(cur: duckdb.DuckDBPyConnection, changes: list[str]) -> None:
        Ledger(store, policy).record(applied_by, None, f"policy apply {policy.source}",
                                     "applied", "; ".join(changes), action="policy",
                                     cursor=cur)

    def prepared(cur: duckdb.DuckDBPyConnection) -> list[str]:
        changes = prepare(cur) if prepare is not None else []
        dropped = books.trim(policy, cur)
        if dropped:
            changes.append(f"answer cache: {dropped} stored answers beyond their user's new "
                           "share dropped (a repeat of one is charged again)")
        return changes + load_public_tables(cur, policy)

    with store.lock:
        books = store.state(_Books)
        try:
            return store.apply_policy(policy, applied_by, prepared, audit=audit)
        except BaseException:
            books.stored = None  # the trim rolled back: read the answers again
            raise


_CHARGES = ("dpsql.charges (id, ts, user_name, dataset, kind, units, infinite, fingerprint, "
            "audit_id, action, statement, delta)")


def storable(text: str) -> str:
    """``text`` as valid UTF-8 (DuckDB refuses lone surrogates, which stand for bad bytes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
