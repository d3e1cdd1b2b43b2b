"""A fit that fails its diagnostics: charged, recorded, kept from analysts until published."""

from __future__ import annotations

import pytest

import dpsql
from dpsql.errors import AccessDenied, QueryRejected, ReleaseError
from dpsql.provenance import export
from dpsql.synth import base

COLUMNS = ["age", "sex", "race", "income_50k"]


def tables(session, schema):
    rows = session.store.cursor().execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = ?",
        [schema]).fetchall()
    return sorted(r[0] for r in rows)


def free_count(session, table):
    return session.sql(f"SELECT count(*) AS n FROM released.{table}").table.to_pylist()[0]["n"]


def release_bad(admin):
    return admin.release("adult", synthesizer="fails_checks", epsilon=1, columns=COLUMNS,
                         rows=40, name="bad")


def test_a_failed_fit_is_charged_recorded_and_kept_from_analysts(admin_session, release_store,
                                                                 tmp_path):
    before = admin_session.ledger.budget("admin", "adult").spent
    result = release_bad(admin_session)
    assert result.held.startswith("unpublished: the fit failed a test check")
    assert result.table == "held.bad"
    assert any(w.startswith("NOT PUBLISHED: held.bad") for w in result.warnings)
    record = result.record
    assert record["published"] is False
    assert record["products"] == ["held.bad_aggregates"]
    assert record["diagnostics"]["checks"][0]["passed"] is False
    # the charge stays, and the audit log says why nothing was published
    assert admin_session.ledger.budget("admin", "adult").spent > before
    audit = admin_session.audit(last=1)[0]
    assert (audit["outcome"], audit["action"]) == ("held", "release")
    assert "a test check" in audit["reason"]
    assert tables(admin_session, "held") == ["bad", "bad_aggregates"]
    assert tables(admin_session, "released") == []
    with dpsql.connect(release_store, "alice") as alice:
        for table in ("bad", "bad_aggregates"):
            with pytest.raises(QueryRejected, match="no released table"):
                free_count(alice, table)
        listed = alice.sql("SHOW dpsql.released").table.column("table").to_pylist()
        assert not [t for t in listed if "bad" in t]
        with pytest.raises(ReleaseError, match="held from analysts"):
            export(alice.store, "bad", tmp_path / "bad.parquet")
    # the administrator reads it, to decide
    info = export(admin_session.store, "bad", tmp_path / "bad.parquet", admin=True)
    assert info["rows"] == 40


def test_publishing_is_explicit_audited_and_seen_by_analysts_at_once(admin_session,
                                                                   release_store):
    release_bad(admin_session)
    with dpsql.connect(release_store, "alice") as alice:
        with pytest.raises(QueryRejected, match="no released table"):
            free_count(alice, "bad")
        with pytest.raises(AccessDenied):
            alice.publish("bad")
        assert alice.audit(last=1)[0]["outcome"] == "refused"
        published = admin_session.publish("bad")
        assert published.table == "released.bad"
        assert free_count(alice, "bad") == 40
        assert free_count(alice, "bad_aggregates") > 0
    record = published.record
    assert (record["published"], record["published_by"]) == (True, "admin")
    assert record["products"] == ["released.bad_aggregates"]
    assert record["diagnostics"]["checks"][0]["passed"] is False  # the record keeps why
    assert tables(admin_session, "held") == []
    audit = admin_session.audit("admin", last=1)[0]
    assert (audit["outcome"], audit["action"]) == ("published", "publish")
    with pytest.raises(ReleaseError, match="published already"):
        admin_session.publish("bad")
    with pytest.raises(ReleaseError, match="no release named"):
        admin_session.publish("nothing")


def test_a_release_that_passes_is_published_and_one_replacing_a_held_one_drops_it(
        admin_session):
    release_bad(admin_session)
    good = admin_session.release("adult", synthesizer="independent", epsilon=1,
                                 columns=COLUMNS, rows=30, name="bad", replace=True)
    assert (good.held, good.table, good.record["published"]) == ("", "released.bad", True)
    assert tables(admin_session, "held") == []
    assert tables(admin_session, "released") == ["bad"]
    assert free_count(admin_session, "bad") == 30


def test_an_undeclared_or_malformed_check_fails_closed():
    assert base.failed_checks({}) == []  # a synthesizer that declares no check
    passed = base.diagnostic("fine", True, 1, 1, "")
    malformed = {"check": "says nothing"}  # no "passed": never read as a pass
    assert base.failed_checks({"diagnostics": {"checks": [passed, malformed]}}) == [malformed]
