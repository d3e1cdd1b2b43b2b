"""SDS through the release path: the CLI end to end, provenance, products, more copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dpsql
from dpsql.errors import ConfigurationError
from dpsql.privacy import PrivacyCost
from tests.conftest import policy_text


def run(*args: str, db: Path, user: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}
    if user:
        env["DPSQL_USER"] = user
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def spent_units(db: Path) -> int:
    with dpsql.connect(db, "admin") as admin:
        row = admin.store.cursor().execute(
            "SELECT coalesce(sum(units), 0) FROM dpsql.charges").fetchone()
    assert row is not None
    return int(row[0])


def test_release_through_the_cli(store_path: Path) -> None:
    made = run("release", "adult", "--synth", "sds", "--epsilon", "1", "--name", "adult_sds",
               "--columns", "age,workclass,race,sex,income_50k", "--seed", "3",
               "--option", "reporting_length=3", "--option", "thresholds=1,0.5,1", "--json",
               db=store_path)
    assert made.returncode == 0, made.stderr
    out = json.loads(made.stdout)
    record = out["record"]
    assert out["table"] == "released.adult_sds"
    assert record["synthesizer"]["name"] == "sds"
    assert record["synthesizer"]["options"] == {"reporting_length": "3",
                                               "thresholds": "1,0.5,1"}
    assert record["products"] == ["released.adult_sds_aggregates"]
    assert record["resumable"] is True
    with dpsql.connect(store_path, "admin") as admin:
        cur = admin.store.cursor()
        rows = cur.execute("SELECT count(*) FROM released.adult_sds").fetchone()
        assert rows is not None
        assert rows[0] == record["rows"]
        lengths = cur.execute("SELECT length, count(*), min(noisy_count) FROM "
                              "released.adult_sds_aggregates GROUP BY 1 ORDER BY 1").fetchall()
        assert [k for k, _, _ in lengths] == [1, 2, 3]
        assert all(low >= 1 for _, _, low in lengths)
        sample = cur.execute("SELECT tuple FROM released.adult_sds_aggregates "
                             "WHERE length = 2 LIMIT 1").fetchone()
        assert sample is not None
        assert sample[0].count(";") == 1
    parameters = record["parameters"]  # every option in force, defaults included
    assert parameters["thresholds"] == [1.0, 0.5, 1.0]
    assert parameters["sigma_proportions"] == [1.0, 0.5, 1.0]
    assert parameters["prune_uncovered"] is True
    assert parameters["paired_pass"] is True
    assert parameters["weight_selection_percentile"] == 95
    kinds = [m["measure"] for m in record["measurements"]]
    assert kinds == ["record_count", "k_tuples", "k_tuples", "k_tuples"]
    assert [isinstance(m.get("uncovered"), int) for m in record["measurements"][1:]] == \
        [False, True, True]  # tuples dropped by pruning, per length from 2 on
    synthesis = record["diagnostics"]["synthesis"]  # the sampling's counters reach provenance
    assert sum(synthesis["cells_filled"].values()) == record["rows"] * 5
    assert 0 <= synthesis["records_outside_aggregates"] <= record["rows"]
    shown = run("releases", "show", "adult_sds", "--json", db=store_path, user="alice")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["record"] == record
    more = run("release-more", "adult_sds", "--copies", "1", db=store_path)
    assert more.returncode == 0, more.stderr
    assert "no budget spent" in more.stdout


def test_a_pure_policy_is_refused_before_any_charge(make_store) -> None:
    db = make_store(policy_text("pure", budget="{epsilon: 5}", user_budget="{epsilon: 5}",
                                extra_dataset="    synthesizers: [sds]\n"))
    refused = run("release", "adult", "--synth", "sds", "--epsilon", "1", "--name", "x",
                  "--json", db=db)
    assert refused.returncode == ConfigurationError.exit_code
    assert "zcdp" in json.loads(refused.stdout)["message"]
    assert spent_units(db) == 0


def test_restored_model_samples_the_same_records(store_path: Path) -> None:
    import numpy as np

    from dpsql.domain import Domain
    from dpsql.engines.source import bounded_relation
    from dpsql.synth.sds import SDS

    with dpsql.connect(store_path, "admin") as admin:
        dataset = admin.policy.dataset("adult")
        domain = Domain.from_dataset(dataset, ["age", "sex", "race", "income_50k"])
        synth = SDS()
        fitted = synth.fit(bounded_relation(admin.store, dataset), domain,
                           PrivacyCost.zcdp("0.05"), np.random.default_rng(0))
    state = json.loads(json.dumps(fitted.state()))
    restored = synth.restore(state, domain)
    assert restored.spent == fitted.spent
    assert restored.rows == fitted.rows
    a = fitted.sample(300, np.random.default_rng(9))
    b = restored.sample(300, np.random.default_rng(9))
    assert a.equals(b)
    assert restored.products()["aggregates"].equals(fitted.products()["aggregates"])
    older = synth.restore({**state, "version": "2"}, domain)  # sampled as it was released
    older.sample(50, np.random.default_rng(9))
    assert "paired" not in older.diagnostics["cells_filled"]
    assert "paired" in restored.diagnostics["cells_filled"]
