"""DP partition selection: keys released and total error against Tumult-style thresholding.

On the industry codes (``INDP``, about 270 keys, NULL included) and PUMAs of the
ACS national 2019 excerpt (shared/data/acs), one row per person (max_rows 1),
both mechanisms answer ``SELECT col, COUNT(*) ... GROUP BY col`` at the same
total (epsilon, delta), ``--reps`` times each:

- **dpsql**: discrete Gaussian counts thresholded at
  ``tau = 1 + ceil(sigma sqrt(2 ln(1 / delta_sel)))`` (dpsql/mechanisms/threshold.py),
  with delta split in halves: one for the selection, one for converting its
  rho to epsilon (rho the largest with epsilon(rho, delta / 2) <= epsilon);
- **Laplace thresholding** (Tumult Analytics' ``get_groups`` and GoogleSQL's
  partition selection in spirit): discrete Laplace counts of scale 1/epsilon,
  released at the least integer ``tau`` whose exact tail
  ``P(Z >= tau - 1) = q**(tau - 1) / (1 + q)`` (``q = exp(-epsilon)``) is at most delta.

Both use dpsql's exact samplers. The table gives the mean number of keys
released (out of the keys present), the mean total error (absolute count error
on the released keys plus the rows of the keys dropped) and the threshold.

    python benchmarks/partition_selection.py [--reps 200] [--quick]
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from typing import Any

import duckdb
import numpy as np
from _common import print_table, readme, shared_data

from dpsql import noise
from dpsql.mechanisms.additive import Noise
from dpsql.privacy import PrivacyCost, rho_from_epsilon_delta
from dpsql.query.selection import threshold

COLUMNS = ("INDP", "PUMA")
EPSILONS = (0.1, 0.5, 1.0)
DELTA = 1e-6


def key_counts(column: str, quick: bool) -> np.ndarray:
    """Rows per key of ``column`` (NULL a key like any other); the first 20,000 rows if quick."""
    path = shared_data("acs", "national2019.csv")
    limit = "LIMIT 20000" if quick else ""
    return duckdb.sql(f"SELECT count(*) AS n FROM (SELECT \"{column}\" AS k FROM "
                      f"read_csv('{path}', all_varchar = true) {limit}) GROUP BY k"
                      ).fetchnumpy()["n"].astype(np.int64)


def dpsql_mechanism(epsilon: float) -> tuple[int, Any]:
    """dpsql's threshold and noise at total (epsilon, DELTA)."""
    rho = rho_from_epsilon_delta(epsilon, DELTA / 2)
    gauss = Noise.calibrate("zcdp", 1, 0, rho)
    return threshold(gauss, 1, DELTA / 2), gauss.sample


def laplace_mechanism(epsilon: float) -> tuple[int, Any]:
    """Laplace thresholding's least threshold and noise at (epsilon, DELTA), one row a unit."""
    lap = Noise.calibrate("pure", 1, 0, PrivacyCost.pure(Fraction(epsilon)))
    q = math.exp(-1 / float(lap.param))
    gap = math.ceil(math.log(DELTA * (1 + q)) / math.log(q))
    return 1 + gap, lambda size: noise.discrete_laplace(lap.param, size)


def run(counts: np.ndarray, tau: int, sample: Any, reps: int) -> tuple[float, float]:
    """Mean keys released and mean total error over ``reps`` answers."""
    released, errors = [], []
    for _ in range(reps):
        noisy = counts + sample(counts.size)
        kept = noisy >= tau
        released.append(int(kept.sum()))
        errors.append(int(np.abs(noisy - counts)[kept].sum() + counts[~kept].sum()))
    return float(np.mean(released)), float(np.mean(errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--quick", action="store_true",
                        help="20,000 rows and 20 reps (seconds; for the tests)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    reps = 20 if args.quick else args.reps
    rows: list[dict[str, Any]] = []
    for column in COLUMNS:
        counts = key_counts(column, args.quick)
        for epsilon in EPSILONS:
            for name, mechanism in (("dpsql", dpsql_mechanism), ("laplace", laplace_mechanism)):
                tau, sample = mechanism(epsilon)
                keys, error = run(counts, tau, sample, reps)
                rows.append({"column": column, "keys": counts.size, "epsilon": epsilon,
                             "delta": DELTA, "mechanism": name, "tau": tau,
                             "released": round(keys, 1), "total_error": round(error, 1)})
            pair = rows[-2:]
            readme(f"partition selection {column} eps={epsilon}: keys "
                   f"{pair[0]['released']} vs {pair[1]['released']} of {counts.size}, "
                   f"total error {pair[0]['total_error']} vs {pair[1]['total_error']}")
    print_table(rows, args.json)


if __name__ == "__main__":
    main()
