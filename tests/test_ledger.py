"""The ledger: compare-and-debit under concurrency, durability, refusals, grants, audit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import dpsql
from dpsql.errors import AccessDenied, BudgetExceeded, PolicyError
from dpsql.outcomes import Outcome
from dpsql.policies import VERSIONS
from dpsql.privacy import PrivacyCost

from .conftest import policy_text


def test_hundred_threads_exactly_ten_succeed(make_store):
    path = make_store(policy_text(budget="{epsilon: 10}", user_budget="{epsilon: 1}"))
    session = dpsql.connect(path, "alice")
    ledger = session.ledger
    cost = PrivacyCost.pure("0.1")
    results: list[str] = []
    barrier = threading.Barrier(100)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            ledger.charge("alice", "adult", cost, f"thread {i}")
            results.append("ok")
        except BudgetExceeded:
            results.append("refused")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == 10
    standing = ledger.budget("alice", "adult")
    assert standing.spent == PrivacyCost.pure(1)
    assert standing.remaining.is_zero
    audit = session.ledger.audit("alice")
    assert sum(r["outcome"] == "refused" for r in audit) == 90
    assert sum(r["outcome"] == "charged" for r in audit) == 10
    session.close()


def test_refusal_leaves_ledger_unchanged_and_says_who_can_grant(make_store):
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        ledger = alice.ledger
        ledger.charge("alice", "adult", PrivacyCost.pure("0.6"), "first")
        before = ledger.budget("alice", "adult")
        with pytest.raises(BudgetExceeded) as info:
            ledger.charge("alice", "adult", PrivacyCost.pure("0.5"), "second")
        assert ledger.budget("alice", "adult") == before
        message = str(info.value)
        assert "requested epsilon=0.5" in message
        assert "epsilon=0.4 left" in message
        assert "dpsql budget grant alice adult" in message
        assert "(admin)" in message
        last = ledger.audit("alice", last=1)[0]
        assert last["outcome"] == "refused"
        assert last["statement"] == "second"
        # exactly the remainder still fits
        ledger.charge("alice", "adult", PrivacyCost.pure("0.4"), "exact")
        assert ledger.budget("alice", "adult").remaining.is_zero
        with pytest.raises(BudgetExceeded) as mine:  # an administrator is told to self-grant
            ledger.charge("admin", "adult", PrivacyCost.pure("5"), "too much")
        assert "as an administrator you may grant yourself more: dpsql budget grant admin " \
            "adult" in str(mine.value)


def test_dataset_total_caps_all_users_together(make_store):
    text = policy_text(budget="{epsilon: 1}", user_budget="{epsilon: 1}")
    path = make_store(text)
    with dpsql.connect(path, "admin") as admin:
        admin.ledger.charge("admin", "adult", PrivacyCost.pure("0.7"), "admin release",
                            action="release")
    with dpsql.connect(path, "alice") as alice, pytest.raises(BudgetExceeded,
                                                              match="dataset's total budget"):
            alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.5"), "q")


def test_query_cap(make_store):
    path = make_store(policy_text(extra_dataset="    query_cap: {epsilon: 0.25}\n"))
    with dpsql.connect(path, "alice") as alice:
        with pytest.raises(BudgetExceeded, match=r"at most epsilon=0\.25"):
            alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.3"), "q")
        alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.25"), "q")


def test_grant_is_admin_only_and_audited(store_path):
    with dpsql.connect(store_path, "alice") as alice, pytest.raises(AccessDenied):
        alice.grant("alice", "adult", epsilon=1)
    with dpsql.connect(store_path, "admin") as admin:
        before = admin.ledger.budget("bob", "adult").granted
        after = admin.grant("bob", "adult", epsilon=1)
        assert after.granted == before + admin.cost(epsilon=1)
        entry = admin.audit(last=1)[0]
        assert entry["action"] == "grant"
        assert entry["user"] == "admin"


def test_charge_survives_sigkill(store_path):
    code = textwrap.dedent(f"""
        import os, signal, dpsql
        from dpsql.privacy import PrivacyCost
        s = dpsql.connect({str(store_path)!r}, "alice")
        s.ledger.charge("alice", "adult", s.cost(epsilon="0.5"), "before the kill")
        print("charged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == -signal.SIGKILL
    assert "charged" in result.stdout
    with dpsql.connect(store_path, "alice") as alice:
        standing = alice.ledger.budget("alice", "adult")
        assert standing.spent == alice.cost(epsilon="0.5")
        assert alice.audit(last=1)[0]["statement"] == "before the kill"


def test_audit_records_fingerprint_and_finish(store_path):
    with dpsql.connect(store_path, "alice") as alice:
        charge = alice.ledger.charge("alice", "adult", alice.cost(epsilon="0.1"), "SELECT 1")
        alice.ledger.settle(charge.id, Outcome.ANSWERED)
        entry = alice.audit(last=1)[0]
        assert entry["outcome"] == "answered"
        assert entry["fingerprint"] == alice.policy.fingerprint
        assert entry["cost"] == alice.cost(epsilon="0.1")


def test_switching_to_zcdp_counts_earlier_pure_spending(make_store, tmp_path):
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        alice.ledger.charge("alice", "adult", PrivacyCost.pure(1), "all of it")
    zcdp = tmp_path / "zcdp.yaml"
    zcdp.write_text(policy_text("zcdp", budget="{rho: 0.5}", user_budget="{rho: 0.5}"))
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(zcdp)
    with dpsql.connect(path, "alice") as alice:
        standing = alice.ledger.budget("alice", "adult")
        assert standing.spent == PrivacyCost.zcdp("0.5")  # epsilon 1 -> rho 1/2
        assert standing.remaining.is_zero
        with pytest.raises(BudgetExceeded):
            alice.ledger.charge("alice", "adult", PrivacyCost.zcdp("0.01"), "more")


def test_policy_cannot_forget_spending(make_store, tmp_path):
    path = make_store(policy_text("zcdp", budget="{rho: 0.5}", user_budget="{rho: 0.5}"))
    with dpsql.connect(path, "alice") as alice:
        alice.ledger.charge("alice", "adult", PrivacyCost.zcdp("0.1"), "q")
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text(policy_text("zcdp", budget="{rho: 0.5}", user_budget="{rho: 0.5}")
                       .replace("  adult:\n    table: adult", "  census:\n    table: adult")
                       .replace("{adult:", "{census:"))
    pure = tmp_path / "pure.yaml"
    pure.write_text(policy_text())
    with dpsql.connect(path, "admin") as admin:
        with pytest.raises(PolicyError, match="cannot drop or rename"):
            admin.apply_policy(renamed)
        with pytest.raises(PolicyError, match="pure accounting cannot count"):
            admin.apply_policy(pure)
        assert admin.store[VERSIONS].version() == 1


# -- the standing: which ledger rows count, and how ----------------------------------


def test_standing_counts_the_right_rows(make_store, tmp_path):
    """Grants: the caller's only; spent: the caller's charges; dataset: everyone's; rows
    recorded as pure epsilon before a switch to zCDP convert one by one (eps^2 / 2)."""
    path = make_store(policy_text(budget="{epsilon: 10}", user_budget="{epsilon: 1}"))
    with dpsql.connect(path, "admin") as admin:
        admin.ledger.grant("admin", "alice", "adult", PrivacyCost.pure(1))
        admin.ledger.grant("admin", "admin", "adult", PrivacyCost.pure(3))  # not alice's
        admin.ledger.charge("admin", "adult", PrivacyCost.pure(1), "theirs", action="release")
    with dpsql.connect(path, "alice") as alice:
        for _ in range(2):
            alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.5"), "mine")
    zcdp = tmp_path / "z.yaml"
    zcdp.write_text(policy_text("zcdp", budget="{rho: 10}", user_budget="{rho: 2}"))
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(zcdp)
        admin.ledger.grant("admin", "admin", "adult", PrivacyCost.unbounded("zcdp"))
        admin.ledger.charge("admin", "adult", PrivacyCost.zcdp("0.25"), "native",
                            action="release")
    with dpsql.connect(path, "alice") as alice:
        standing = alice.ledger.budget("alice", "adult")
        assert standing.granted == PrivacyCost.zcdp("2.5")  # 2 + 1^2/2; admin's excluded
        assert standing.spent == PrivacyCost.zcdp("0.25")  # 2 * 0.5^2/2, not 1^2/2
        assert standing.dataset_spent == PrivacyCost.zcdp("1")  # 0.25 + 0.5 + 0.25
        assert not standing.granted.infinite
        assert not standing.dataset_spent.infinite
        alice.ledger.charge("alice", "adult", PrivacyCost.zcdp("2.25"), "exactly the rest")
        with pytest.raises(BudgetExceeded):
            alice.ledger.charge("alice", "adult", PrivacyCost.zcdp("0.000001"), "one more")


def test_another_users_infinite_charge_exhausts_only_the_dataset(make_store):
    path = make_store(policy_text(budget="{epsilon: inf}", user_budget="{epsilon: 1}"))
    with dpsql.connect(path, "admin") as admin:
        admin.ledger.grant("admin", "admin", "adult", PrivacyCost.unbounded("pure"))
        admin.ledger.charge("admin", "adult", PrivacyCost.unbounded("pure"), "all",
                            action="release")
    with dpsql.connect(path, "alice") as alice:
        standing = alice.ledger.budget("alice", "adult")
        assert standing.spent.is_zero
        assert not standing.granted.infinite
        assert standing.dataset_spent.infinite


def test_an_infinite_pure_charge_stays_infinite_under_zcdp(make_store, tmp_path):
    path = make_store(policy_text(budget="{epsilon: inf}", user_budget="{epsilon: 1}"))
    with dpsql.connect(path, "admin") as admin:
        admin.ledger.charge("admin", "adult", PrivacyCost.unbounded("pure"), "all",
                            action="release")
    zcdp = tmp_path / "z.yaml"
    zcdp.write_text(policy_text("zcdp", budget="{rho: inf}", user_budget="{rho: 1}"))
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(zcdp)
    with dpsql.connect(path, "alice") as alice:
        assert alice.ledger.budget("alice", "adult").dataset_spent.infinite


def test_one_group_commit_of_many_long_statements(make_store):
    """50 concurrent charges share commits (multi-row INSERTs); statements are truncated."""
    path = make_store(policy_text(budget="{epsilon: 100}", user_budget="{epsilon: 100}"))
    with dpsql.connect(path, "alice") as alice:
        barrier = threading.Barrier(50)

        def charge(i: int) -> None:
            barrier.wait()
            alice.ledger.charge("alice", "adult", PrivacyCost.pure(1 if i % 2 else 2),
                                "x" * 20_000)

        threads = [threading.Thread(target=charge, args=(i,)) for i in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert alice.ledger.budget("alice", "adult").spent == PrivacyCost.pure(75)
        audit = alice.ledger.audit("alice")
        assert len(audit) == 50
        assert all(len(r["statement"]) == 10_000 for r in audit)


def test_standing_kept_in_memory_matches_the_ledger_tables(make_store):
    path = make_store(policy_text(budget="{epsilon: 10}", user_budget="{epsilon: 1}"))
    first, second = dpsql.connect(path, "alice"), dpsql.connect(path, "admin")
    assert first.store is second.store  # one open store per process: one standing
    cost = PrivacyCost.pure("0.3")
    outcomes = []
    for ledger in (first.ledger, second.ledger) * 3:  # two sessions take turns
        try:
            ledger.charge("alice", "adult", cost, "turn")
            outcomes.append("ok")
        except BudgetExceeded:
            outcomes.append("refused")
    second.ledger.grant("admin", "alice", "adult", PrivacyCost.pure("0.5"))
    first.ledger.charge("alice", "adult", cost, "after the grant")
    kept = first.ledger.budget("alice", "adult")
    first.close()
    second.close()
    with dpsql.connect(path, "alice") as reopened:  # read afresh from the tables
        assert reopened.ledger.budget("alice", "adult") == kept
    assert outcomes == ["ok", "ok", "ok", "refused", "refused", "refused"]
    assert kept.spent == PrivacyCost.pure("1.2")


def test_a_charge_is_durable_and_audited_after_a_crash(store_path):
    code = textwrap.dedent(f"""
        import os, signal, dpsql
        s = dpsql.connect({str(store_path)!r}, "alice")
        charge = s.ledger.charge("alice", "adult", s.cost(epsilon="0.5"), "SELECT 42")
        print(charge.id, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == -signal.SIGKILL
    with dpsql.connect(store_path, "alice") as alice:
        entry = alice.audit(last=1)[0]
        assert entry["id"] == int(result.stdout.split()[0])
        assert (entry["statement"], entry["outcome"]) == ("SELECT 42", "charged")  # never settled
        assert entry["reason"] == "the process ended before the outcome was recorded"
        assert entry["cost"] == alice.cost(epsilon="0.5")
        assert alice.ledger.budget("alice", "adult").spent == alice.cost(epsilon="0.5")
        later = alice.ledger.charge("alice", "adult", alice.cost(epsilon="0.1"), "later")
        assert later.id == entry["id"] + 1  # consecutive across processes


def test_refusals_are_recorded_before_the_refusal_returns(store_path):
    code = textwrap.dedent(f"""
        import os, dpsql
        from dpsql.errors import BudgetExceeded
        s = dpsql.connect({str(store_path)!r}, "bob")
        try:
            s.ledger.charge("bob", "adult", s.cost(epsilon="5"), "too much")
        except BudgetExceeded:
            os._exit(0)  # no flush, no close
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    with dpsql.connect(store_path, "bob") as bob:
        entry = bob.audit(last=1)[0]
        assert (entry["statement"], entry["outcome"]) == ("too much", "refused")


def test_an_interrupted_charge_is_counted_from_the_ledger(make_store, monkeypatch):
    """Interrupted inside its transaction, a charge rolls back: nothing counted, no id lost."""
    from dpsql.ledger import books as ledger_module

    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        alice.ledger.budget("alice", "adult")  # the totals are now kept in memory

        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt  # e.g. Ctrl-C in a notebook, after the INSERT

        before = alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.1"), "before")
        monkeypatch.setattr(ledger_module.Books, "add", interrupted)
        with pytest.raises(KeyboardInterrupt):
            alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.6"), "interrupted")
        monkeypatch.undo()
        assert alice.ledger.budget("alice", "adult").spent == PrivacyCost.pure("0.1")
        after = alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.6"), "after")
        assert after.id == before.id + 1
        with pytest.raises(BudgetExceeded):
            alice.ledger.charge("alice", "adult", PrivacyCost.pure("0.6"), "one too many")
