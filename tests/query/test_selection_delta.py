"""The delta partition selection spends is kept in the ledger: its lifetime sum per dataset
never passes the policy's delta, even after a policy apply raises the budget (issue 40)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql.privacy import PrivacyCost
from dpsql.query.selection import selection_delta
from tests.query.conftest import charges
from tests.query.test_partition import _policy, _store

DELTA = 1e-6


def _select(session: dpsql.Session, k: int) -> dpsql.Answer:
    """A selection query (a new one for each ``k``: never from the cache)."""
    return session.sql(f"SELECT zip, COUNT(*) FROM t WHERE hours > {-k} GROUP BY zip")


def test_a_selection_past_the_policys_delta_is_refused_after_the_budget_grows(
        tmp_path: Path) -> None:
    # Budget rho 2, rho 0.5 a query: each selection spends a quarter of delta 1e-6.
    path = _store(tmp_path, _policy("zcdp", "2", query="0.5"))
    with dpsql.connect(path, "alice") as alice:
        for k in range(2):
            _select(alice, k)
        assert alice.ledger.delta_spent("t") == pytest.approx(DELTA / 2)
    raised = tmp_path / "raised.yaml"
    raised.write_text(_policy("zcdp", "4", query="0.5"))  # an eighth of delta a query now
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(raised)
    with dpsql.connect(path, "alice") as alice:
        for k in range(2, 6):  # half + 4 eighths: exactly the policy's delta
            _select(alice, k)
        assert alice.ledger.delta_spent("t") == pytest.approx(DELTA)
        before, spent = charges(alice), alice.ledger.budget("alice", "t").spent
        # rho is left (3 of 4 spent), delta is not: refused before any charge
        with pytest.raises(dpsql.BudgetExceeded, match="partition selection"):
            _select(alice, 6)
        assert charges(alice) == before
        assert alice.ledger.budget("alice", "t").spent == spent
        assert alice.audit()[-1]["outcome"] == "refused"
        assert alice.sql("SELECT COUNT(*) FROM t").cost.value == Fraction(1, 2)  # no delta
    with dpsql.connect(path, "alice") as alice:  # durable: read again from the ledger
        assert alice.ledger.delta_spent("t") == pytest.approx(DELTA)
        with pytest.raises(dpsql.BudgetExceeded, match="partition selection"):
            _select(alice, 7)


@pytest.mark.parametrize("parts", [3, 13, 15, 25, 49])
def test_equal_shares_of_the_budget_spend_at_most_the_policys_delta_exactly(parts: int) -> None:
    """The ledger sums the stored floats exactly: each share must round down, not to nearest
    (13, 15 and 25 parts of delta 1e-6 rounded to nearest sum past it)."""
    total = PrivacyCost.zcdp(Fraction(2))
    share = total.split([1] * parts)[0]  # rounded down: ``parts`` of them fit the budget
    spent = sum(Fraction(selection_delta(DELTA, share, total)) for _ in range(parts))
    assert spent <= Fraction(DELTA)
    assert float(spent) == pytest.approx(DELTA)
