"""The budget ledger and the audit log, kept as tables in the store.

A charge is compare-and-debit under the store's write lock and inside one
DuckDB transaction, committed before the caller computes anything private:
a crash afterwards loses budget, never privacy. There are no refunds. A
refusal leaves the ledger unchanged and adds one audit row saying why.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import duckdb

from dpsql.errors import AccessDenied, BudgetExceeded
from dpsql.policy import Policy
from dpsql.privacy import Kind, PrivacyCost
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


@dataclass(frozen=True)
class Charge:
    """A committed debit: its id (also the audit id) and what it cost.

    ``audit_row``: the request's audit row, when the caller writes it
    (:meth:`Ledger.close`) instead of the ledger.
    """

    id: int
    cost: PrivacyCost
    remaining: PrivacyCost
    audit_row: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)


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

T = TypeVar("T")

#: (source, user, kind) -> [sum of units, any infinite, every row's units]
Totals = dict[tuple[str, str, str], list[Any]]


class _Standings:
    """The summed ledger rows of each dataset, read once per open store, then kept current.

    This process is the file's only writer (DuckDB locks it) and the store is
    opened once per process, so every charge and grant passes through this
    module: a charge adds its row here after its COMMIT, a grant drops the
    dataset's entry (read again on next use). Reading the standing then costs
    no query on the charge path.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: dict[str, Totals] = {}

    def read(self, store: Store, dataset: str, cur: duckdb.DuckDBPyConnection,
             compute: Callable[[Totals], T]) -> T:
        """``compute`` applied to the dataset's totals, read from the store on first use."""
        with self.lock:
            totals = self.totals.get(dataset)
            if totals is not None:
                return compute(totals)
        with store.lock:  # no charge can commit between the read and keeping it
            rows = cur.execute(_STANDING_SQL, {"dataset": dataset}).fetchall()
            with self.lock:
                totals = self.totals.setdefault(dataset, {
                    (r[0], r[1], r[2]): [int(r[3]), bool(r[4]), [int(u) for u in r[5]]]
                    for r in rows})
                return compute(totals)

    def add(self, src: str, dataset: str, user: str, cost: PrivacyCost) -> None:
        """Count one committed row (nothing to do if the dataset was never read)."""
        with self.lock:
            totals = self.totals.get(dataset)
            if totals is None:
                return
            entry = totals.setdefault((src, user, cost.kind), [0, False, []])
            entry[0] += cost.units
            entry[1] = entry[1] or cost.infinite
            entry[2].append(cost.units)

    def forget(self, dataset: str) -> None:
        with self.lock:
            self.totals.pop(dataset, None)


def _standings_of(store: Store) -> _Standings:
    return store.state(_Standings)


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
    """Charges, grants and audit rows for one store under its active policy."""

    def __init__(self, store: Store, policy: Policy) -> None:
        self.store = store
        self.policy = policy

    # -- reading ------------------------------------------------------------------------
    def budget(self, user: str, dataset: str,
               cur: duckdb.DuckDBPyConnection | None = None) -> Budget:
        """The current standing of ``user`` on ``dataset`` (one query).

        Every row recorded for the dataset counts, whatever the accounting was when it
        was written (see :func:`_cost`; the store refuses a switch to pure accounting
        once zCDP costs exist).
        """
        cur = cur or self.store.cursor()
        policy = self.policy
        ds = policy.dataset(dataset)
        kind = policy.accounting
        base = policy.user(user).budgets.get(dataset, PrivacyCost.zero(kind))
        def standing(totals: Totals) -> Budget:
            return Budget(user, dataset, base + _total(kind, totals, "grant", user),
                          _total(kind, totals, "charge", user), ds.budget,
                          _total(kind, totals, "charge", None), policy.delta)

        return _standings_of(self.store).read(self.store, dataset, cur, standing)

    def budgets(self, user: str | None = None) -> list[Budget]:
        """Standing of ``user`` (or every user) on every dataset they have a budget for."""
        users = [self.policy.user(user)] if user else list(self.policy.users.values())
        out = []
        cur = self.store.cursor()
        for u in users:
            for ds in self.policy.datasets:
                standing = self.budget(u.name, ds, cur)
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

    # -- writing ------------------------------------------------------------------------
    def charge(self, user: str, dataset: str, cost: PrivacyCost, statement: str,
               action: str = "query", *, caller_audits: bool = False) -> Charge:
        """Debit ``cost`` and commit, or raise BudgetExceeded and audit the refusal.

        Must be called before any private value is computed. Concurrent charges
        share one commit (group commit): whoever holds the store's write lock
        debits every pending request in order, each checked against the running
        totals, so none can overspend and each is durable when this returns.
        The request's audit row ("charged") is written soon after by the store's
        writer; with ``caller_audits`` the caller writes it once the request is
        over, with its outcome (:meth:`close`), so nothing else runs meanwhile.
        """
        request = _Request(self, user, dataset, cost.to(self.policy.accounting), statement,
                           action, caller_audits)
        self.policy.dataset(dataset)
        store = self.store
        with store.pending_lock:
            store.pending.append(request)
        with store.lock:
            if not request.finished:
                with store.pending_lock:
                    batch, store.pending[:] = list(store.pending), []
                _commit_batch(store, batch)
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

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

    def record(self, user: str, dataset: str | None, statement: str, outcome: str,
               reason: str | None = None, cost: PrivacyCost | None = None,
               action: str = "query") -> int:
        """Add one audit row (answered, refused, rejected, cached, ...); returns its id."""
        with self.store.transaction() as cur:
            audit_id = self.store.next_id()
            self._audit(cur, audit_id, user, dataset, action, statement, cost, outcome, reason)
        return audit_id

    def close(self, charge: Charge, outcome: str, reason: str | None = None,
              cursor: duckdb.DuckDBPyConnection | None = None) -> None:
        """Write the audit row of a charge taken with ``caller_audits``, with its outcome.

        With ``cursor`` (inside the caller's open transaction) it commits with the
        caller's other writes, e.g. the stored answer of a DP query.
        """
        assert charge.audit_row is not None, "the ledger already wrote this charge's row"
        row = list(charge.audit_row)
        row[9], row[10] = outcome, reason
        if cursor is not None:
            _insert(cursor, "dpsql.audit", [row])
            return
        with self.store.transaction() as cur:
            _insert(cur, "dpsql.audit", [row])

    def finish(self, audit_id: int, outcome: str, reason: str | None = None,
               cursor: duckdb.DuckDBPyConnection | None = None) -> None:
        """Set the outcome of a charged request once it is answered or has failed.

        With ``cursor`` (inside the caller's open transaction) the update commits with the
        caller's other writes, e.g. the stored answer of a DP query.
        """
        sql = "UPDATE dpsql.audit SET outcome = ?, reason = coalesce(?, reason) WHERE id = ?"
        if cursor is not None:
            cursor.execute(sql, [outcome, reason, audit_id])
            return
        self.store.flush()  # a charge's audit row is written by the store's writer
        with self.store.transaction() as cur:
            cur.execute(sql, [outcome, reason, audit_id])

    def _audit(self, cur: duckdb.DuckDBPyConnection, audit_id: int, user: str,
               dataset: str | None, action: str, statement: str, cost: PrivacyCost | None,
               outcome: str, reason: str | None) -> None:
        cur.execute(
            "INSERT INTO dpsql.audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [audit_id, now(), user, dataset, action, storable(statement[:10_000]),
             cost.kind if cost else None, cost.units if cost else None,
             cost.infinite if cost else None, outcome,
             None if reason is None else storable(reason), self.policy.fingerprint],
        )

    def grant(self, admin: str, user: str, dataset: str, amount: PrivacyCost) -> Budget:
        """Top up ``user`` on ``dataset`` by ``amount`` (admins only); audited."""
        if self.policy.user(admin).role != "admin":
            raise AccessDenied(f"{admin} is an analyst; only an administrator can grant budget")
        self.policy.user(user)
        self.policy.dataset(dataset)
        amount = amount.to(self.policy.accounting)
        with self.store.lock, self.store.transaction() as cur:
            event = self.store.next_id()
            cur.execute("INSERT INTO dpsql.grants VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [event, now(), user, dataset, amount.kind, amount.units, amount.infinite,
                         admin, self.policy.fingerprint])
            self._audit(cur, self.store.next_id(), admin, dataset, "grant",
                        f"grant {user} {dataset} {amount.describe(self.policy.delta)}", amount,
                        "granted", None)
            _standings_of(self.store).forget(dataset)
        return self.budget(user, dataset)

    def audit(self, user: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
        """Audit rows, newest last, optionally for one user and the last ``last`` only."""
        self.store.flush()  # outcomes of answered requests are written off the answer path
        sql = ("SELECT id, ts, user_name, dataset, action, statement, kind, units, infinite, "
               "outcome, reason, fingerprint FROM dpsql.audit")
        params: list[Any] = []
        if user:
            sql += " WHERE user_name = ?"
            params.append(user)
        sql += " ORDER BY id DESC"
        if last:
            sql += f" LIMIT {int(last)}"
        rows = self.store.cursor().execute(sql, params).fetchall()
        keys = ("id", "at", "user", "dataset", "action", "statement", "kind", "units",
                "infinite", "outcome", "reason", "fingerprint")
        out = []
        for row in reversed(rows):
            entry = dict(zip(keys, row, strict=False))
            kind, units, infinite = entry.pop("kind"), entry.pop("units"), entry.pop("infinite")
            entry["cost"] = PrivacyCost(kind, int(units), bool(infinite)) if kind else None
            out.append(entry)
        return out


@dataclass
class _Request:
    """One pending charge and, once its batch commits, its outcome."""

    ledger: Ledger
    user: str
    dataset: str
    cost: PrivacyCost
    statement: str
    action: str
    caller_audits: bool = False
    finished: bool = False
    result: Charge | None = None
    error: BaseException | None = None


def _commit_batch(store: Store, batch: list[_Request]) -> None:
    """Debit a batch of requests in order with one durable INSERT (caller holds store.lock).

    The charges are committed when this returns, and so are the audit rows of
    refused requests (nothing else would record them). The audit rows of
    charged requests follow on the store's writer thread (or from the caller,
    with ``caller_audits``), off the answer path; if the process ends first,
    reopening the store rebuilds them from the charges, which carry their
    request (:meth:`dpsql.store.Store.open`).
    """
    cur = store.cursor()
    user_extra: dict[tuple[str, str], PrivacyCost] = {}
    dataset_extra: dict[str, PrivacyCost] = {}
    standings: dict[tuple[str, str, str], Budget] = {}
    audit_rows: list[list[Any]] = []
    charge_rows: list[list[Any]] = []
    try:
        ids = store.next_ids(len(batch))
        for request, event in zip(batch, ids, strict=True):
            ledger, policy = request.ledger, request.ledger.policy
            key = (request.user, request.dataset, policy.fingerprint)
            if key not in standings:
                standings[key] = ledger.budget(request.user, request.dataset, cur)
            base = standings[key]
            zero = PrivacyCost.zero(policy.accounting)
            spent = base.spent + user_extra.get((request.user, request.dataset), zero)
            total = base.dataset_spent + dataset_extra.get(request.dataset, zero)
            standing = replace(base, spent=spent, dataset_spent=total)
            cap = policy.dataset(request.dataset).query_cap
            reason = ledger._refusal(standing, request.cost,
                                     cap if request.action == "query" else None)
            cost = request.cost
            statement = storable(request.statement[:10_000])
            audit_rows.append([event, now(), request.user, request.dataset, request.action,
                               statement, cost.kind, cost.units, cost.infinite,
                               "refused" if reason else "charged", reason, policy.fingerprint])
            if reason:
                request.error = BudgetExceeded(reason)
                continue
            charge_rows.append([event, now(), request.user, request.dataset, cost.kind,
                                cost.units, cost.infinite, policy.fingerprint, event,
                                request.action, statement])
            user_extra[(request.user, request.dataset)] = \
                user_extra.get((request.user, request.dataset), zero) + cost
            dataset_extra[request.dataset] = dataset_extra.get(request.dataset, zero) + cost
            after = replace(base, spent=spent + cost, dataset_spent=total + cost)
            audit_row = None
            if request.caller_audits:
                audit_row = tuple(audit_rows.pop())
            request.result = Charge(event, cost, after.remaining, audit_row)
        kept = _standings_of(store)
        counted = False
        try:
            _insert(cur, _CHARGES, charge_rows)  # one statement, committed on its own
            for request in batch:
                if request.result is not None:
                    kept.add("charge", request.dataset, request.user, request.cost)
            counted = True
        finally:
            if not counted:  # interrupted: the INSERT may have committed, so read it again
                for request in batch:
                    kept.forget(request.dataset)
        _insert(cur, "dpsql.audit", [r for r in audit_rows if r[9] == "refused"])
    except BaseException as err:
        for request in batch:
            request.result, request.error = None, err
        raise
    finally:
        cur.close()
        for request in batch:
            request.finished = True
    charged = [r for r in audit_rows if r[9] != "refused"]
    if charged:
        store.defer(lambda c: _insert(c, "dpsql.audit", charged))


_CHARGES = ("dpsql.charges (id, ts, user_name, dataset, kind, units, infinite, fingerprint, "
            "audit_id, action, statement)")


def storable(text: str) -> str:
    """``text`` as valid UTF-8 (DuckDB refuses lone surrogates, which stand for bad bytes)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _insert(cur: duckdb.DuckDBPyConnection, table: str, rows: list[list[Any]]) -> None:
    """Insert ``rows`` with one statement (``executemany`` runs one per row)."""
    if not rows:
        return
    marks = "(" + ", ".join("?" * len(rows[0])) + ")"
    cur.execute(f"INSERT INTO {table} VALUES " + ", ".join([marks] * len(rows)),
                [value for row in rows for value in row])
