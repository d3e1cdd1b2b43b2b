"""One owner of the bookkeeping: consecutive audit ids, exact charges, settled requests."""

from __future__ import annotations

import ast
import dataclasses
import re
import threading
from pathlib import Path

import pytest

import dpsql
from dpsql.ledger import books as ledger_module
from dpsql.ledger.books import settled
from dpsql.outcomes import SETTLES, Outcome
from dpsql.privacy import PrivacyCost
from dpsql.query.answer import run_statement

from .conftest import policy_text

THREADS, QUERIES = 8, 4


def _ask_concurrently(path: Path) -> tuple[list[dpsql.Answer], list[BaseException]]:
    """THREADS sessions (alice and admin in turn) each send QUERIES DP queries and a rejection."""
    answers: list[dpsql.Answer] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def client(t: int) -> None:
        try:
            with dpsql.connect(path, "alice" if t % 2 else "admin") as session:
                barrier.wait()
                for i in range(QUERIES):  # a new epsilon each time: never from the cache
                    session.sql(f"SET dpsql.epsilon = {t * QUERIES + i + 1}e-3")
                    answers.append(session.sql("SELECT sex, COUNT(*) FROM adult GROUP BY sex"))
                with pytest.raises(dpsql.QueryRejected):
                    session.sql("SELECT age FROM adult")
        except BaseException as err:  # surfaced by the caller
            errors.append(err)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return answers, errors


def test_concurrent_requests_get_consecutive_audit_ids_and_exact_charges(make_store):
    path = make_store(policy_text(budget="{epsilon: 100}", user_budget="{epsilon: 100}"))
    with dpsql.connect(path, "admin") as admin:  # open throughout: the totals kept in memory
        first = admin.audit()[-1]["id"]
        answers, errors = _ask_concurrently(path)
        assert errors == []
        assert len(answers) == THREADS * QUERIES
        audit = admin.audit()
        ids = [row["id"] for row in audit]
        assert ids == list(range(1, len(ids) + 1))  # consecutive from the store's first
        mine = [row for row in audit if row["id"] > first]
        assert len(mine) == THREADS * (QUERIES + 1)
        assert sorted(row["outcome"] for row in mine) == \
            ["answered"] * THREADS * QUERIES + ["rejected"] * THREADS
        charges = admin.store.cursor().execute(
            "SELECT audit_id, user_name, kind, units FROM dpsql.charges").fetchall()
        by_audit = {row["id"]: row for row in mine}
        assert sorted(c[0] for c in charges) == sorted(a.audit_id for a in answers)
        for answer in answers:  # each answer's charge, exactly, under its own audit row
            row = by_audit[answer.audit_id]
            assert (row["outcome"], row["cost"]) == ("answered", answer.cost)
        for user in ("alice", "admin"):
            spent = sum((PrivacyCost(c[2], int(c[3])) for c in charges if c[1] == user),
                        PrivacyCost.pure(0))
            expected = sum((PrivacyCost.pure(f"{t * QUERIES + i + 1}e-3")
                            for t in range(THREADS) if (t % 2 == 1) == (user == "alice")
                            for i in range(QUERIES)), PrivacyCost.pure(0))
            assert spent == expected
            assert admin.ledger.budget(user, "adult").spent == expected


def test_a_failed_settle_leaves_no_gap_and_a_request_settles_once(make_store):
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        ledger = alice.ledger
        charge = ledger.charge("alice", "adult", PrivacyCost.pure("0.1"), "SELECT 1")
        ledger.settle(charge.id, Outcome.ANSWERED)
        with pytest.raises(dpsql.InternalError, match="not open"):
            ledger.settle(charge.id, Outcome.FAILED, "again")  # rolled back: no id was taken
        refused = ledger.record("alice", "adult", "SELECT 2", Outcome.REJECTED, "no")
        assert refused == charge.id + 1
        rows = {r["id"]: r for r in alice.audit()}
        assert (rows[charge.id]["outcome"], rows[charge.id]["reason"]) == ("answered", None)


def test_query_code_cannot_change_the_context_or_the_session(make_store):
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        ctx = alice.context()
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.user = "admin"  # type: ignore[misc]
        with pytest.raises(TypeError):
            ctx.options["epsilon"] = "1"  # type: ignore[index]
        answer = run_statement(ctx, "SET dpsql.epsilon = 0.2")
        assert (dict(ctx.options), alice.options) == ({}, {})  # nothing changed in place
        assert answer.options is not None
        assert "epsilon" in answer.options
        alice.sql("SET dpsql.epsilon = 0.2")  # the Session keeps what the answer carries
        assert alice.options == dict(answer.options)
        assert alice.sql("SELECT COUNT(*) FROM adult").cost == PrivacyCost.pure("0.2")


def test_nothing_under_query_imports_the_session():
    package = Path(dpsql.__file__).parent / "query"
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text("utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
            {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not imported & {"dpsql.session", "dpsql.release"}, module.name


def test_a_queued_settle_serves_repeats_and_commits_before_the_store_closes(make_store):
    path = make_store(policy_text())
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SET dpsql.epsilon = 0.1")
        first = alice.sql(sql)
        again = alice.sql(sql)  # served from the queued answer or the committed one
        assert again.cached
        assert again.table.equals(first.table)
    with dpsql.connect(path, "alice") as alice:  # the close committed the settle
        outcome = alice.store.cursor().execute(
            "SELECT outcome FROM dpsql.audit WHERE id = ?", [first.audit_id]).fetchone()
        assert outcome == ("answered",)
        alice.sql("SET dpsql.epsilon = 0.1")
        assert alice.sql(sql).cached


def _written_outcome(session: dpsql.Session, audit_id: int) -> str | None:
    """The outcome committed to ``dpsql.audit`` for ``audit_id`` (None: not written yet)."""
    row = session.store.cursor().execute(
        "SELECT outcome FROM dpsql.audit WHERE id = ?", [audit_id]).fetchone()
    return None if row is None else row[0]


def test_an_answered_query_settles_in_the_next_charges_commit(make_store, monkeypatch):
    # The writer thread waits an hour here, so only a write can commit a settle:
    # one durable commit per query (issue 29), and the close still writes the last.
    monkeypatch.setattr(ledger_module, "SETTLE_DELAY_S", 3600)
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        alice.sql("SET dpsql.epsilon = 0.1")
        first = alice.sql("SELECT race, COUNT(*) FROM adult GROUP BY race")
        assert _written_outcome(alice, first.audit_id) is None  # queued, not committed
        assert alice.sql("SELECT race, COUNT(*) FROM adult GROUP BY race").cached
        second = alice.sql("SELECT sex, COUNT(*) FROM adult GROUP BY sex")
        assert _written_outcome(alice, first.audit_id) == "answered"  # with second's charge
        assert _written_outcome(alice, second.audit_id) is None
        assert [r["outcome"] for r in alice.audit()[-3:]] == ["answered", "cached", "answered"]
    with dpsql.connect(path, "alice") as alice:  # the close wrote the last settle at once
        assert _written_outcome(alice, second.audit_id) == "answered"


def _cache_bytes(session: dpsql.Session) -> tuple[int, int]:
    settled(session.store)
    rows, size = session.store.cursor().execute(
        "SELECT count(*), coalesce(sum(strlen(plan) + strlen(noise) + octet_length(measures)), "
        "0) FROM dpsql.query_cache").fetchone()  # type: ignore[misc]
    return int(rows), int(size)


def test_the_answer_cache_keeps_under_its_limit_by_dropping_the_oldest(make_store):
    # Each answer here takes about 1 kB: a 4 kB limit keeps the last few of twelve.
    path = make_store("answer_cache_mb: 0.004\n" + policy_text())
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    with dpsql.connect(path, "alice") as alice:
        firsts = []
        for i in range(12):  # a new epsilon each time: a new measurement
            alice.sql(f"SET dpsql.epsilon = {i + 1}e-3")
            firsts.append(alice.sql(sql).table)
            rows, size = _cache_bytes(alice)
            assert size <= 4000
        assert 1 <= rows < 12
        alice.sql("SET dpsql.epsilon = 12e-3")
        last = alice.sql(sql)
        assert last.cached  # the newest is kept
        assert last.table.equals(firsts[-1])
        alice.sql("SET dpsql.epsilon = 1e-3")
        dropped = alice.sql(sql)
        assert not dropped.cached  # dropped: measured and charged again
        assert dropped.cost == alice.cost(epsilon="1e-3")
    with dpsql.connect(path, "alice") as alice:  # the sizes are read again at open
        alice.sql("SET dpsql.epsilon = 1e-3")
        assert alice.sql(sql).cached
        assert _cache_bytes(alice)[1] <= 4000


def test_a_request_moves_only_as_the_state_machine_allows(make_store):
    path = make_store(policy_text())
    with dpsql.connect(path, "alice") as alice:
        ledger = alice.ledger
        with pytest.raises(dpsql.InternalError, match="only a charge"):
            ledger.record("alice", "adult", "SELECT 1", Outcome.CHARGED)
        started = ledger.record("alice", "adult", "evaluate", Outcome.STARTED)
        with pytest.raises(dpsql.InternalError, match="no request settles"):
            ledger.settle(started, Outcome.REFUSED)  # refused is written at once, never settled
        with pytest.raises(dpsql.InternalError, match="not open"):
            ledger.settle(started, Outcome.ANSWERED)  # a started request is never answered
        ledger.settle(started, Outcome.EVALUATED)
        charge = ledger.charge("alice", "adult", PrivacyCost.pure("0.1"), "SELECT 2")
        with pytest.raises(dpsql.InternalError, match="not open"):
            ledger.settle(charge.id, Outcome.EVALUATED)  # only a started request is evaluated
        ledger.settle(charge.id, Outcome.ANSWERED)
        rows = {r["id"]: r["outcome"] for r in alice.audit()}
        assert (rows[started], rows[charge.id]) == (Outcome.EVALUATED, Outcome.ANSWERED)
        assert all(isinstance(outcome, Outcome) for outcome in rows.values())
    assert {state for state in Outcome if state.is_open} == {Outcome.STARTED, Outcome.CHARGED}
    assert all(not target.is_open for targets in SETTLES.values() for target in targets)


def test_no_module_but_a_tables_owner_names_it_in_sql():
    package = Path(dpsql.__file__).parent
    owners = {"meta": "store.py", "policies": "policies.py", "charges": "ledger/",
              "grants": "ledger/", "audit": "ledger/", "event_ids": "ledger/",
              "query_cache": "answers.py", "releases": "provenance.py",
              "release_states": "provenance.py", "credentials": "credentials.py",
              "jobs": "jobs.py", "job_ids": "jobs.py"}
    sql = re.compile(r"(?:FROM|INTO|UPDATE|JOIN|TABLE|SEQUENCE|nextval\(')\s*dpsql\.(\w+)")
    for module in package.rglob("*.py"):
        for table in sql.findall(module.read_text("utf-8")):
            if table in owners:
                where = module.relative_to(package).as_posix()  # a module, or a package/
                assert where == owners[table] or (owners[table].endswith("/") and where.startswith(
                    owners[table])), (module, table)
