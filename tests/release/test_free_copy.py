"""The isolated database of free queries follows releases: whole, fresh, never half-written."""

from __future__ import annotations

import pytest

from dpsql.errors import QueryRejected, ReleaseError

COLUMNS = ["age", "sex", "race", "income_50k"]


def free_count(session, table="m"):
    return session.sql(f"SELECT count(*) AS n FROM released.{table}").table.to_pylist()[0]["n"]


def test_a_release_its_extension_and_its_replacement_are_seen_at_once(admin_session):
    with pytest.raises(QueryRejected, match="no released table 'm'"):
        free_count(admin_session)
    admin_session.release("adult", synthesizer="independent", epsilon=1, columns=COLUMNS,
                          rows=50, name="m")
    assert free_count(admin_session) == 50
    admin_session.release_more("m", 2, seed=3)
    assert free_count(admin_session) == 150
    admin_session.release("adult", synthesizer="independent", epsilon=1, columns=COLUMNS,
                          rows=70, name="m", replace=True)
    assert free_count(admin_session) == 70


def test_a_release_that_fails_while_writing_is_never_seen(admin_session):
    admin_session.release("adult", synthesizer="independent", epsilon=1, columns=COLUMNS,
                          rows=10, name="kept")
    assert free_count(admin_session, "kept") == 10
    with pytest.raises(ReleaseError, match="nothing was written"):
        admin_session.release("adult", synthesizer="crash_write", epsilon=1, columns=COLUMNS,
                              rows=10, name="broken")
    for table in ("broken", "broken_first"):
        with pytest.raises(QueryRejected, match="no released table"):
            free_count(admin_session, table)
