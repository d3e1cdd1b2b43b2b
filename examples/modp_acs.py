"""MODP on ACS person records: the paper's empirical mode with its privacy diagnostics,
then the DP mode within a zCDP budget.

    python examples/modp_acs.py [path/to/national2019.csv]

Uses a handful of ACS columns so it runs in a minute or two on a laptop CPU.
The empirical mode runs through the synthesizer protocol (policies/acs.yaml
does not allow non-DP releases); the DP mode is a real release: the ledger is
charged first, then the table and its provenance are written.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import dpsql
from dpsql.domain import Domain
from dpsql.engines.source import bounded_relation
from dpsql.privacy import PrivacyCost
from dpsql.synth import get

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (a clone, or the folder of worktrees); else the 3,000-row
# ACS sample bundled for the tests, so the tour runs from any clone.
DEFAULT_DATA = next((d / "shared" / "data" / "acs" / "national2019.csv" for d in ROOT.parents
                     if (d / "shared" / "data" / "acs" / "national2019.csv").exists()),
                    ROOT / "tests" / "data" / "acs_sample.csv")
COLUMNS = ["agep", "sex", "msp", "rac1p", "hisp", "edu", "pincp_decile", "own_rent", "dear",
           "deye", "dphy", "drem"]


def main(data: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "acs.duckdb"
        store, _ = dpsql.init(path, ROOT / "policies" / "acs.yaml", {"acs": data}, na="N")
        store.close()
        with dpsql.connect(path, "admin") as admin:
            dataset = admin.policy.dataset("acs")
            domain = Domain.from_dataset(dataset, COLUMNS)
            source = bounded_relation(admin.store, dataset)
            rng = np.random.default_rng(7)

            def show(stage: str, done: float, total: float | None = None) -> None:
                if (total and done == total) or "epoch" in stage:
                    print(f"  {stage} {done:g}/{total:g}" if total else f"  {stage}")

            print("empirical mode (Press 2024, not DP): 3 blades, 15 epochs")
            empirical = get("modp", blades=3, epochs=15).fit(
                source, domain, PrivacyCost.zero("zcdp"), rng, show)
            sample = domain.decode(empirical.sample(5, rng), rng)
            print(sample.to_pandas().to_string(index=False))
            diag = empirical.describe()["diagnostics"]
            print(f"  entropy per synthetic row: median "
                  f"{diag['entropy_bits']['quantiles']['0.5']} bits")
            print(f"  causal true row is the nearest in "
                  f"{100 * diag['hamming_rank']['fraction_nearest']:.1f}% of rows, "
                  f"in the nearest 10 in {100 * diag['hamming_rank']['fraction_within_10']:.1f}%")

            print("\nDP mode, released: DP-SGD within epsilon=4 (delta from the policy)")
            done = admin.release("acs", synthesizer="modp", name="acs_modp", epsilon=4,
                                 columns=COLUMNS, seed=11, progress=show, mode="dp", blades=1,
                                 steps=60)
            record = done.record
            params = record["parameters"]
            print(f"  charged {record['cost']['charged']}, spent {record['cost']['spent']}; "
                  f"seeds rho {params['seeds']['spent']['rho']}, DP-SGD noise multiplier "
                  f"{params['dpsgd']['noise_multiplier']:.3g} over {params['dpsgd']['steps']} "
                  f"full-batch steps; {record['rows']} rows (a DP count)")
            print(admin.store.cursor().execute(
                f"SELECT {', '.join(COLUMNS)} FROM released.acs_modp LIMIT 5").df()
                .to_string(index=False))
            try:
                admin.release("acs", synthesizer="modp", name="acs_modp_empirical",
                              columns=COLUMNS)
            except dpsql.DPSQLError as err:
                print(f"\nthe empirical mode is refused by this policy: {err}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA)
