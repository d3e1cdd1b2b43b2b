"""The budget ledger and the audit log: charge, settle, record, grant, and the reads.

:class:`Ledger` is the one way a request touches dpsql's bookkeeping: a charge is
compare-and-debit inside one DuckDB transaction, one durable row committed
before the caller computes anything private (a crash afterwards loses budget,
never privacy; there are no refunds), and a refusal leaves the books unchanged
with one settled audit row saying why. The tables, their recovery and the
writes are :mod:`dpsql.ledger.books`'s; the states of a request :mod:`dpsql.outcomes`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import duckdb

from dpsql.answers import StoredAnswer, cache_share
from dpsql.errors import AccessDenied, BudgetExceeded, InternalError
from dpsql.ledger.books import (
    BOOKS,
    CHARGE_COLUMNS,
    UNSETTLED,
    AuditRow,
    Books,
    Charge,
    ChargeRow,
    Settle,
    settled,
    storable,
    total,
    writing,
)
from dpsql.outcomes import SETTLES, Outcome
from dpsql.policy import Policy
from dpsql.privacy import PrivacyCost
from dpsql.store import Store


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
            return self._standing(self.store[BOOKS], user, dataset,
                                  self.store.cursor())

    def _standing(self, books: Books, user: str, dataset: str,
                  cur: duckdb.DuckDBPyConnection) -> Budget:
        policy = self.policy
        kind = policy.accounting
        base = policy.user(user).budgets.get(dataset, PrivacyCost.zero(kind))
        totals = books.dataset_totals(dataset, cur)
        return Budget(user, dataset, base + total(kind, totals, "grant", user),
                      total(kind, totals, "charge", user), policy.dataset(dataset).budget,
                      total(kind, totals, "charge", None), policy.delta)

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
        sql = (f"SELECT * FROM (SELECT * FROM dpsql.audit UNION ALL {UNSETTLED} "
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
            books = self.store[BOOKS]
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
        with writing(self.store) as (cur, books):
            standing = self._standing(books, user, dataset, cur)
            reason = self._refusal(standing, cost, cap) \
                or self._delta_refusal(books.delta_spent(dataset, cur), dataset, delta)
            row = self._row(books.take_id(cur), user, dataset, action, statement, cost,
                            Outcome.REFUSED if reason else Outcome.CHARGED, reason)
            if reason is not None:
                row.insert(cur)
            else:
                cur.execute(f"INSERT INTO {CHARGE_COLUMNS} "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            with writing(self.store) as (cur, books):
                row = self._row(books.take_id(cur), user, dataset, action, statement, cost,
                                outcome, reason)
                row.insert(cur)
            return row.id
        books = self.store[BOOKS]
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
        settle = Settle(audit_id, outcome, None if reason is None else storable(reason[:2000]),
                         None, cache_share(self.policy))
        if answer is None:
            with writing(self.store) as (cur, books):
                settle.write(cur, books.answers)
            return True
        with self.store.lock:
            books = self.store[BOOKS]
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
        with writing(self.store) as (cur, books):
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


def recorded_datasets(store: Store) -> list[tuple[str, bool]]:
    """Each dataset with charges or grants, and whether any of them is in zCDP (by name)."""
    rows = store.cursor().execute(
        "SELECT dataset, bool_or(kind = 'zcdp') FROM (SELECT dataset, kind FROM "
        "dpsql.charges UNION ALL SELECT dataset, kind FROM dpsql.grants) GROUP BY dataset "
        "ORDER BY dataset").fetchall()
    return [(str(dataset), bool(zcdp)) for dataset, zcdp in rows]
