"""The answer cache is split per user: one user's answers never push out another's (issue 40).

Each answer here (race counts) takes about 560 bytes; a 3 kB cache split over
three users gives each 1 kB: one answer each.
"""

from __future__ import annotations

from pathlib import Path

import dpsql
from dpsql.answers import cache_share
from dpsql.ledger.books import settled

from ..conftest import policy_text

RACE = "SELECT race, COUNT(*) FROM adult GROUP BY race"
BOB = "  bob: {role: analyst, budgets: {adult: {epsilon: 1}}}\n"


def _shelves(session: dpsql.Session) -> dict[str, int]:
    """Bytes of stored answers per user, as committed."""
    settled(session.store)
    rows = session.store.cursor().execute(
        "SELECT user_name, sum(strlen(plan) + strlen(noise) + octet_length(measures)) "
        "FROM dpsql.query_cache GROUP BY ALL").fetchall()
    return {user: int(size) for user, size in rows}


def _store(make_store, cache_mb: float) -> Path:
    return make_store(f"answer_cache_mb: {cache_mb}\n" + policy_text() + BOB)


def test_one_users_flood_leaves_anothers_repeat_free(make_store) -> None:
    path = _store(make_store, 0.003)
    with dpsql.connect(path, "bob") as bob, dpsql.connect(path, "alice") as alice:
        assert cache_share(bob.policy) == 1000
        bob.sql("SET dpsql.epsilon = 0.01")
        first = bob.sql(RACE)
        spent = bob.ledger.budget("bob", "adult").spent
        for i in range(12):  # a new epsilon each time: a new answer to store
            alice.sql(f"SET dpsql.epsilon = {i + 1}e-3")
            alice.sql(RACE)
            shelves = _shelves(alice)
            assert shelves["alice"] <= 1000  # alice's own oldest go
            assert sum(shelves.values()) <= 3000
        again = bob.sql(RACE)
        assert again.cached  # before issue 40: dropped by alice's answers, charged again
        assert again.table.equals(first.table)
        assert bob.ledger.budget("bob", "adult").spent == spent
        alice.sql("SET dpsql.epsilon = 1e-3")
        assert not alice.sql(RACE).cached  # alice's first was dropped: charged again


def test_a_policy_naming_more_users_trims_each_to_the_new_share(make_store, tmp_path) -> None:
    path = _store(make_store, 0.004)  # 1,333 bytes each: two answers of 560 fit
    with dpsql.connect(path, "alice") as alice:
        for i in range(2):
            alice.sql(f"SET dpsql.epsilon = {i + 1}e-3")
            alice.sql(RACE)
        assert _shelves(alice)["alice"] > 1000
    more = tmp_path / "more.yaml"  # five users: 800 bytes each, one answer
    more.write_text("answer_cache_mb: 0.004\n" + policy_text() + BOB
                    + "  carol: {role: analyst}\n  dave: {role: analyst}\n")
    with dpsql.connect(path, "admin") as admin:
        changes = admin.apply_policy(more)
        assert any("answer cache" in line for line in changes)
        assert _shelves(admin)["alice"] <= 800
