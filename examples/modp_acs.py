"""MODP on ACS person records: the paper's empirical mode with its privacy diagnostics,
then the DP mode within a zCDP budget.

    python examples/modp_acs.py [path/to/national2019.csv]

Uses a handful of ACS columns so it runs in a minute or two on a laptop CPU.
Until releases land, it calls the synthesizer directly through its protocol
(the release path will charge the ledger first and write the table).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import dpsql
from dpsql.domain import Domain
from dpsql.privacy import PrivacyCost
from dpsql.source import bounded_relation
from dpsql.synth import get

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "acs" / "national2019.csv"
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

            budget = admin.cost(epsilon=4)  # zCDP, from the policy's delta
            print(f"\nDP mode: DP-SGD within {budget.describe(admin.policy.delta)}")
            private = get("modp", mode="dp", blades=1, steps=60).fit(
                source, domain, budget, rng, show)
            described = private.describe()
            print(f"  spent {private.spent.describe(admin.policy.delta)}; seeds "
                  f"{described['seed_cost']['rho']}, DP-SGD noise multiplier "
                  f"{described['dpsgd']['noise_multiplier']:.3g} over "
                  f"{described['dpsgd']['steps']} full-batch steps; DP row count {private.rows}")
            print(domain.decode(private.sample(5, rng), rng).to_pandas().to_string(index=False))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA)
