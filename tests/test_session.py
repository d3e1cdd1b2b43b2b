"""Sessions: roles enforced, the policy comes from the store, budgets per principal."""

from __future__ import annotations

import contextlib
import threading

import pytest

import dpsql
from dpsql.errors import AccessDenied, ConfigurationError, QueryCanceled
from dpsql.ledger import Ledger

from .conftest import ADULT_POLICY, ENDLESS_FREE, SLOW_DP, slow_store


def test_unknown_user_is_denied(store_path):
    with pytest.raises(AccessDenied, match="no user 'mallory'"):
        dpsql.connect(store_path, "mallory")


def test_analyst_cannot_read_raw_tables_grant_or_change_policy(alice):
    with pytest.raises(AccessDenied):
        alice.table("adult")
    with pytest.raises(AccessDenied):
        alice.grant("alice", "adult", epsilon=1)
    with pytest.raises(AccessDenied):
        alice.apply_policy(ADULT_POLICY)
    with pytest.raises(AccessDenied):
        alice.budget("bob")
    with pytest.raises(AccessDenied):
        alice.audit(user="bob")


def test_admin_reads_raw_rows(admin):
    assert admin.table("adult").num_rows == 5000


def test_analyst_sees_only_own_budget(alice):
    rows = alice.budget()
    assert [(b.user, b.dataset) for b in rows] == [("alice", "adult")]
    assert rows[0].granted == alice.cost(epsilon=2)
    assert rows[0].spent.is_zero


def test_admin_sees_everyone(admin):
    assert {b.user for b in admin.budget()} == {"admin", "alice", "bob"}


def test_cost_uses_policy_delta(alice):
    cost = alice.cost(epsilon=1)
    assert cost.kind == "zcdp"
    assert cost.epsilon(alice.policy.delta) <= 1


def test_apply_policy_cannot_remove_own_admin_role(admin, tmp_path):
    demoted = tmp_path / "p.yaml"
    demoted.write_text(ADULT_POLICY.read_text().replace("  admin:\n    role: admin",
                                                        "  admin:\n    role: analyst\n"
                                                        "  root:\n    role: admin", 1))
    with pytest.raises(ConfigurationError, match="admin role"):
        admin.apply_policy(demoted)


def test_policy_comes_from_the_store(store_path, tmp_path):
    with dpsql.connect(store_path, "admin") as admin:
        newer = tmp_path / "p.yaml"
        newer.write_text(ADULT_POLICY.read_text().replace("adult: {epsilon: 1}",
                                                          "adult: {epsilon: 0.5}"))
        admin.apply_policy(newer)
    with dpsql.connect(store_path, "bob") as bob:
        assert bob.budget()[0].granted == bob.cost(epsilon="0.5")


@pytest.mark.timeout(120)  # only an interrupt ends ENDLESS_FREE: a hang guard
def test_interrupt_stops_free_and_dp_queries_and_the_charge_stands(tmp_path, monkeypatch):
    with dpsql.connect(slow_store(tmp_path / "slow.duckdb"), "alice") as alice:
        alice.interrupt()  # no statement runs: nothing to stop, and the next one runs
        assert alice.sql("SELECT count(*) FROM released.r").table.num_rows == 1
        # The interrupt comes once the statement's query runs: for the DP query, its
        # measurement after the charge (DuckDB also runs small queries before the charge).
        charged, measuring = threading.Event(), threading.Event()
        charge, running = Ledger.charge, alice.interrupts.running

        def charging(self, *args, **kwargs):
            made = charge(self, *args, **kwargs)
            charged.set()
            return made

        @contextlib.contextmanager
        def watched(cursor):
            with running(cursor):
                if charged.is_set():
                    measuring.set()
                yield

        monkeypatch.setattr(Ledger, "charge", charging)
        monkeypatch.setattr(alice.interrupts, "running", watched)
        for text, cost in ((ENDLESS_FREE, 0), (SLOW_DP, 0.1)):
            before = alice.budget()[0].spent.epsilon()
            measuring.clear()
            if cost:
                charged.clear()
            else:
                charged.set()  # a free query has no charge: its first query is the one
            interrupter = threading.Thread(target=lambda: measuring.wait() and alice.interrupt(),
                                           daemon=True)
            interrupter.start()
            with pytest.raises(QueryCanceled) as caught:
                alice.sql(text)  # SLOW_DP would end in seconds, ENDLESS_FREE never
            interrupter.join()
            assert str(caught.value) == ("canceling statement due to statement timeout or user "
                                         "request")
            assert alice.budget()[0].spent.epsilon() == pytest.approx(before + cost)
        # The DP request was stopped, not answered: it never reached its answer's settle.
        last = alice.audit(last=1)[0]
        assert (last["action"], last["outcome"], last["reason"]) == (
            "query", "failed", str(caught.value))
