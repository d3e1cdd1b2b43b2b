"""A fit that fails its diagnostics: charged, recorded, kept from analysts until published."""

from __future__ import annotations

import json

import pytest

import dpsql
from dpsql.errors import AccessDenied, QueryRejected, ReleaseError
from dpsql.provenance import export
from dpsql.synth import base

from .test_cli import run

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


def test_the_cli_says_plainly_what_is_held_and_publishes_it(admin_session, release_store):
    release_bad(admin_session)
    admin_session.close()  # the CLI opens the store itself
    shown = run("releases", "show", "bad", db=release_store)
    assert shown.returncode == 0, shown.stderr
    assert "NO: held from analysts, the fit failed a test check" in shown.stdout
    listed = run("releases", "list", db=release_store)
    assert "NO (held)" in listed.stdout
    published = run("releases", "publish", "bad", "--json", db=release_store)
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["table"] == "released.bad"
    again = run("releases", "show", "bad", db=release_store)
    assert "yes, by admin at" in again.stdout
    assert "despite the failed a test check" in again.stdout
    refused = run("releases", "publish", "bad", db=release_store)
    assert refused.returncode != 0
    assert "published already" in refused.stderr


def test_no_name_of_another_release_is_taken_over_held_or_not(admin_session):
    """--replace replaces a release of that name, never another release's table."""
    admin_session.release("adult", synthesizer="with_products", epsilon=1, columns=COLUMNS,
                          rows=20, name="w")
    with pytest.raises(ReleaseError, match=r"released\.w_aggregates belongs to another"):
        admin_session.release("adult", synthesizer="fails_checks", epsilon=1, columns=COLUMNS,
                              rows=20, name="w_aggregates", replace=True)
    release_bad(admin_session)
    with pytest.raises(ReleaseError, match=r"held\.bad_aggregates belongs to another"):
        admin_session.release("adult", synthesizer="independent", epsilon=1, columns=COLUMNS,
                              rows=20, name="bad_aggregates", replace=True)
    assert tables(admin_session, "released") == ["w", "w_aggregates"]
    assert tables(admin_session, "held") == ["bad", "bad_aggregates"]
    admin_session.publish("bad")  # still whole
    assert tables(admin_session, "released") == ["bad", "bad_aggregates", "w", "w_aggregates"]


def test_more_copies_of_a_held_release_stay_held_and_say_so(admin_session, release_store):
    release_bad(admin_session)
    more = admin_session.release_more("bad", 1, seed=1)
    assert more.table == "held.bad"
    assert more.held.startswith("unpublished")
    assert admin_session.audit("admin", last=1)[0]["outcome"] == "held"
    with dpsql.connect(release_store, "alice") as alice, \
            pytest.raises(QueryRejected, match="no released table"):
        free_count(alice, "bad")


def test_the_sql_catalog_names_no_held_release(admin_session):
    from dpsql.server.catalog import relations

    release_bad(admin_session)  # held: bad, bad_aggregates
    admin_session.release("adult", synthesizer="with_products", epsilon=1, columns=COLUMNS,
                          rows=20, name="bad_b")  # its product starts with "bad_"
    described = {r.name: r.description for r in relations(admin_session.store)
                 if r.schema == "released"}
    assert set(described) == {"bad_b", "bad_b_aggregates"}
    assert described["bad_b_aggregates"] == \
        "a DP product of release bad_b (see dpsql releases bad_b)"
    assert "release bad " not in " ".join(described.values())


@pytest.mark.parametrize("passed", ["false", "nan", 1, None])
def test_a_check_passes_only_when_it_says_true(passed):
    assert base.failed_checks({"diagnostics": {"checks": [{"check": "c", "passed": passed}]}})
    assert base.failed_checks({"diagnostics": {"checks": "all good"}})[0]["check"] == \
        "checks well formed"


def test_the_console_lists_a_held_release_as_unpublished(admin_session):
    from dpsql.console import views

    release_bad(admin_session)
    page = views.releases(admin_session, "csrf-token")
    assert "<th>published</th>" in page
    assert "NO (held: its fit failed)" in page
    shown = views.release(admin_session, "bad")
    assert "NO: held from analysts, the fit failed a test check" in shown
