"""Stores written by an older dpsql keep opening: migrations, recovery and the rows they hold."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

import dpsql

DATA = Path(__file__).parent / "data"


def _unpack(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name.removesuffix(".gz")
    with gzip.open(DATA / name) as packed, target.open("wb") as out:
        shutil.copyfileobj(packed, out)
    target.chmod(0o600)
    return target


def _version(session: dpsql.Session) -> int:
    row = session.store.cursor().execute(
        "SELECT value FROM dpsql.meta WHERE key = 'schema_version'").fetchone()
    assert row is not None
    return int(row[0])


def test_a_version_7_store_opens_recovers_and_keeps_its_books(tmp_path):
    path = _unpack("store_v7.duckdb.gz", tmp_path)
    with dpsql.connect(path, "admin") as admin:
        assert _version(admin) >= 7
        audit = {row["id"]: row for row in admin.audit()}
        assert [audit[i]["outcome"] for i in sorted(audit)] == [
            "applied", "read", "released", "granted", "set", "answered", "refused",
            "charged", "interrupted"]
        # the charge a killed process never settled: audited from its charge row
        assert audit[8]["statement"] == "SELECT SUM(x) FROM t"
        assert audit[8]["reason"] == "the process ended before the outcome was recorded"
        assert audit[8]["cost"] == admin.cost(epsilon="0.1")
        # the release job it left running: interrupted, its charge kept
        jobs = {job["id"]: job for job in admin.jobs().list()}
        assert (jobs[1]["state"], jobs[2]["state"]) == ("succeeded", "interrupted")
        assert audit[9]["reason"] == "the process running the release ended; nothing was written"
        assert [r["name"] for r in dpsql.provenance.releases(admin.store)] == ["r"]
        spent = admin.budget("alice")[0]
        assert spent.granted == admin.cost(epsilon=1) + admin.cost(epsilon="0.25")
        assert spent.spent == admin.cost(epsilon="0.5") + admin.cost(epsilon="0.1")
        assert admin.sql("SELECT COUNT(*) FROM released.r").table.column(0).to_pylist() == [20]
    with dpsql.connect(path, "alice") as alice:
        repeat = alice.sql("SELECT k, COUNT(*) FROM t GROUP BY k")  # the stored answer
        assert repeat.cached
        assert repeat.audit_id == 11  # ids go on from the old store's (10: the free query)
    with dpsql.connect(path, "admin") as admin:  # a second open changes nothing more
        outcomes = [row["outcome"] for row in admin.audit()]
        assert outcomes[7:] == ["charged", "interrupted", "answered", "cached"]


def test_a_version_5_store_is_migrated_and_its_unsettled_charge_audited(tmp_path):
    path = _unpack("store_v5.duckdb.gz", tmp_path)
    with dpsql.connect(path, "alice") as alice:
        assert _version(alice) >= 7
        entry = alice.audit()[-1]
        assert (entry["id"], entry["outcome"]) == (2, "charged")
        assert alice.jobs().list() == []
        answer = alice.sql("SELECT COUNT(*) FROM t")
        assert answer.audit_id == 3
        assert alice.ledger.delta_spent("t") == 0


@pytest.mark.parametrize("name", ["store_v7.duckdb.gz", "store_v5.duckdb.gz"])
def test_an_old_store_takes_a_new_policy_version(tmp_path, name):
    path = _unpack(name, tmp_path)
    with dpsql.connect(path, "admin") as admin:
        text = admin.store.cursor().execute(
            "SELECT text FROM dpsql.policies ORDER BY version DESC LIMIT 1").fetchone()
        assert text is not None
        policy = dpsql.policy.Policy.from_text(text[0].replace("epsilon: 10}", "epsilon: 20}"),
                                               source="raised.yaml")
        changes = admin.apply_policy(policy)
        assert changes
        assert admin.policy.dataset("t").budget == admin.cost(epsilon=20)
