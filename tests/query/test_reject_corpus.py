"""The rejection corpus: every statement in tests/query/reject/*.sql must be refused.

Each file starts with ``-- <what it attacks>`` and ``-- expect: <text of the error>``,
and may give ``-- at: <line>:<column>`` where the error must point.
A refusal must come before DuckDB sees anything (the engine is never called),
must charge nothing, must be audited as ``rejected``, and must say where and
what to do instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dpsql
from dpsql.session import Session
from tests.query.conftest import charges

CORPUS = sorted((Path(__file__).parent / "reject").glob("*.sql"))


def expectation(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("-- expect:"):
            return line.removeprefix("-- expect:").strip()
    raise AssertionError(f"{path.name} has no '-- expect:' line")


def position(path: Path) -> tuple[int, int] | None:
    """The ``-- at: line:column`` the error must point to, if the file gives one."""
    for line in path.read_text().splitlines():
        if line.startswith("-- at:"):
            where, _, column = line.removeprefix("-- at:").strip().partition(":")
            return int(where), int(column)
    return None


@pytest.fixture(scope="module")
def session(both_path: Path) -> Iterator[Session]:
    with dpsql.connect(both_path, "alice") as alice:
        yield alice


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 60


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_statement_is_rejected_before_duckdb(session: Session, engine_calls: list[str],
                                             path: Path) -> None:
    text = path.read_text()
    before = charges(session)
    with pytest.raises(dpsql.QueryRejected) as caught:
        session.sql(text)
    err = caught.value
    assert expectation(path).lower() in str(err).lower()
    assert engine_calls == [], "the engine ran SQL for a rejected statement"
    assert charges(session) == before
    last = session.audit(last=1)[0]
    assert last["outcome"] == "rejected"
    assert last["statement"] == text
    assert err.construct, "a rejection names the construct"
    assert err.advice, "a rejection says what to do instead"
    assert err.sqlstate == "42000"
    expected = position(path)
    if expected is not None:
        assert (err.line, err.column) == expected, str(err)
