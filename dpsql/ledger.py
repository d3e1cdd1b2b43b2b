"""The budget ledger and the audit log, kept as tables in the store.

A charge is compare-and-debit under the store's write lock and inside one
DuckDB transaction, committed before the caller computes anything private:
a crash afterwards loses budget, never privacy. There are no refunds. A
refusal leaves the ledger unchanged and adds one audit row saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from dpsql.errors import AccessDenied, BudgetExceeded
from dpsql.policy import Policy
from dpsql.privacy import Kind, PrivacyCost
from dpsql.store import Store, now


@dataclass(frozen=True)
class Budget:
    """One user's standing on one dataset, and the dataset's own total."""

    user: str
    dataset: str
    granted: PrivacyCost
    spent: PrivacyCost
    dataset_total: PrivacyCost
    dataset_spent: PrivacyCost

    @property
    def remaining(self) -> PrivacyCost:
        """What this user may still spend: the lesser of their allowance and the dataset's."""
        mine = self.granted - self.spent
        theirs = self.dataset_total - self.dataset_spent
        return mine if mine <= theirs else theirs

    def as_dict(self, delta: float | None = None) -> dict[str, Any]:
        """JSON-able form with both units."""
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
    """A committed debit: its id (also the audit id) and what it cost."""

    id: int
    cost: PrivacyCost
    remaining: PrivacyCost


# One row per (source, mine, native): few rows, and about half the planning of one
# row of FILTERed aggregates (the standing is read on every charge).
_STANDING_SQL = """
SELECT src, user_name = $user AS mine, kind = $kind AS native,
       sum(units), bool_or(infinite), list(units)
FROM (
    SELECT 'charge' AS src, user_name, kind, units, infinite
    FROM dpsql.charges WHERE dataset = $dataset
    UNION ALL
    SELECT 'grant' AS src, user_name, kind, units, infinite
    FROM dpsql.grants WHERE dataset = $dataset
)
GROUP BY ALL
"""


def _total(kind: Kind, rows: list[tuple[Any, ...]], src: str, mine_only: bool) -> PrivacyCost:
    """The sum of the ledger rows of ``src`` (only the caller's with ``mine_only``)."""
    picked = [r for r in rows if r[0] == src and (r[1] or not mine_only)]
    native = sum(int(r[3]) for r in picked if r[2])
    infinite = any(r[4] for r in picked)
    foreign = [int(u) for r in picked if not r[2] for u in r[5]]
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
        rows = cur.execute(_STANDING_SQL, {"user": user, "dataset": dataset,
                                           "kind": kind}).fetchall()
        return Budget(user, dataset, base + _total(kind, rows, "grant", True),
                      _total(kind, rows, "charge", True), ds.budget,
                      _total(kind, rows, "charge", False))

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

    # -- writing ------------------------------------------------------------------------
    def charge(self, user: str, dataset: str, cost: PrivacyCost, statement: str,
               action: str = "query") -> Charge:
        """Debit ``cost`` and commit, or raise BudgetExceeded and audit the refusal.

        Must be called before any private value is computed. Concurrent charges
        share one commit (group commit): whoever holds the store's write lock
        debits every pending request in order, each checked against the running
        totals, so none can overspend and each is durable when this returns.
        """
        request = _Request(self, user, dataset, cost.to(self.policy.accounting), statement,
                           action)
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
        ask = (f"ask an administrator ({', '.join(admins)}) to run: dpsql budget grant "
               f"{standing.user} {standing.dataset} --epsilon X")
        if cap is not None and cost > cap:
            return (f"a query on {standing.dataset} may cost at most {cap.describe(delta)}; "
                    f"requested {cost.describe(delta)}: lower epsilon")
        mine = standing.granted - standing.spent
        if cost > mine:
            return (f"requested {cost.describe(delta)} on {standing.dataset}, but "
                    f"{standing.user} has {mine.describe(delta, budget=True)} left; {ask}")
        left = standing.dataset_total - standing.dataset_spent
        if cost > left:
            return (f"requested {cost.describe(delta)} on {standing.dataset}, but the dataset's "
                    f"total budget has {left.describe(delta, budget=True)} left; an "
                    "administrator can raise it in the policy (dpsql policy apply)")
        return None

    def record(self, user: str, dataset: str | None, statement: str, outcome: str,
               reason: str | None = None, cost: PrivacyCost | None = None,
               action: str = "query") -> int:
        """Add one audit row (answered, refused, rejected, cached, ...); returns its id."""
        with self.store.transaction() as cur:
            audit_id = self.store.next_id(cur)
            self._audit(cur, audit_id, user, dataset, action, statement, cost, outcome, reason)
        return audit_id

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
        with self.store.transaction() as cur:
            cur.execute(sql, [outcome, reason, audit_id])

    def _audit(self, cur: duckdb.DuckDBPyConnection, audit_id: int, user: str,
               dataset: str | None, action: str, statement: str, cost: PrivacyCost | None,
               outcome: str, reason: str | None) -> None:
        cur.execute(
            "INSERT INTO dpsql.audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [audit_id, now(), user, dataset, action, statement[:10_000],
             cost.kind if cost else None, cost.units if cost else None,
             cost.infinite if cost else None, outcome, reason, self.policy.fingerprint],
        )

    def grant(self, admin: str, user: str, dataset: str, amount: PrivacyCost) -> Budget:
        """Top up ``user`` on ``dataset`` by ``amount`` (admins only); audited."""
        if self.policy.user(admin).role != "admin":
            raise AccessDenied(f"{admin} is an analyst; only an administrator can grant budget")
        self.policy.user(user)
        self.policy.dataset(dataset)
        amount = amount.to(self.policy.accounting)
        with self.store.lock, self.store.transaction() as cur:
            event = self.store.next_id(cur)
            cur.execute("INSERT INTO dpsql.grants VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [event, now(), user, dataset, amount.kind, amount.units, amount.infinite,
                         admin, self.policy.fingerprint])
            self._audit(cur, self.store.next_id(cur), admin, dataset, "grant",
                        f"grant {user} {dataset} {amount.describe(self.policy.delta)}", amount,
                        "granted", None)
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
    finished: bool = False
    result: Charge | None = None
    error: BaseException | None = None


def _commit_batch(store: Store, batch: list[_Request]) -> None:
    """Debit a batch of requests in order inside one transaction (caller holds store.lock)."""
    cur = store.cursor()
    user_extra: dict[tuple[str, str], PrivacyCost] = {}
    dataset_extra: dict[str, PrivacyCost] = {}
    standings: dict[tuple[str, str, str], Budget] = {}
    audit_rows: list[list[Any]] = []
    charge_rows: list[list[Any]] = []
    try:
        cur.execute("BEGIN TRANSACTION")
        ids = [int(r[0]) for r in cur.execute(
            "SELECT nextval('dpsql.event_ids') FROM range(?)", [len(batch)]).fetchall()]
        for request, event in zip(batch, ids, strict=True):
            ledger, policy = request.ledger, request.ledger.policy
            key = (request.user, request.dataset, policy.fingerprint)
            if key not in standings:
                standings[key] = ledger.budget(request.user, request.dataset, cur)
            base = standings[key]
            zero = PrivacyCost.zero(policy.accounting)
            spent = base.spent + user_extra.get((request.user, request.dataset), zero)
            total = base.dataset_spent + dataset_extra.get(request.dataset, zero)
            standing = Budget(request.user, request.dataset, base.granted, spent,
                              base.dataset_total, total)
            cap = policy.dataset(request.dataset).query_cap
            reason = ledger._refusal(standing, request.cost,
                                     cap if request.action == "query" else None)
            cost = request.cost
            audit_rows.append([event, now(), request.user, request.dataset, request.action,
                               request.statement[:10_000], cost.kind, cost.units, cost.infinite,
                               "refused" if reason else "charged", reason, policy.fingerprint])
            if reason:
                request.error = BudgetExceeded(reason)
                continue
            charge_rows.append([event, now(), request.user, request.dataset, cost.kind,
                                cost.units, cost.infinite, policy.fingerprint, event])
            user_extra[(request.user, request.dataset)] = \
                user_extra.get((request.user, request.dataset), zero) + cost
            dataset_extra[request.dataset] = dataset_extra.get(request.dataset, zero) + cost
            after = Budget(request.user, request.dataset, base.granted, spent + cost,
                           base.dataset_total, total + cost)
            request.result = Charge(event, cost, after.remaining)
        _insert(cur, "dpsql.audit", audit_rows)
        _insert(cur, "dpsql.charges", charge_rows)
        cur.execute("COMMIT")
    except BaseException as err:
        cur.execute("ROLLBACK")
        for request in batch:
            request.result, request.error = None, err
        raise
    finally:
        cur.close()
        for request in batch:
            request.finished = True


def _insert(cur: duckdb.DuckDBPyConnection, table: str, rows: list[list[Any]]) -> None:
    """Insert ``rows`` with one statement (``executemany`` runs one per row)."""
    if not rows:
        return
    marks = "(" + ", ".join("?" * len(rows[0])) + ")"
    cur.execute(f"INSERT INTO {table} VALUES " + ", ".join([marks] * len(rows)),
                [value for row in rows for value in row])
