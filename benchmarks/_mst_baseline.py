"""Same-run MST baseline for the NAPSU-MQ benchmark (benchmark only, not a dpsql release).

A short reimplementation of the MST mechanism from McKenna, Miklau & Sheldon (2021),
"Winning the NIST Contest: A scalable and general approach to differentially private
synthetic data", written from the paper's description; the estimation (Private-PGM) and
the record generation are done by the ``mbi`` package (private-pgm 2.x, on JAX).

    /work/venvs/mbi/bin/python benchmarks/_mst_baseline.py DATA.csv DOMAIN.json RHO SEED

DATA.csv holds integer codes 0..size-1 per column; DOMAIN.json is {"column": size, ...} in
column order. RHO (zCDP; napsu_mq.py passes the rho of its own run) is split in three
equal parts:

1. every 1-way marginal with Gaussian noise (d marginals, L2 sensitivity sqrt(d));
2. per column, values whose noisy count is below 3*sigma are merged into one value (when
   there are two or more of them); the 1-way measurements are compressed accordingly;
3. a spanning tree, Kruskal-style: d-1 rounds, each an exponential mechanism (eps per round
   sqrt(8*rho/3/(d-1)), score sensitivity 1) over the pairs joining two components, scored
   by the L1 distance between the pair's true counts and the independence model's estimate;
4. the chosen 2-way marginals (compressed domains) with Gaussian noise;
5. a graphical model fitted by mbi from all measurements, n synthetic rows drawn from it,
   and merged values decompressed uniformly among their members (mbi's Dataset.decompress).

Noise comes from numpy's default_rng and mbi's sampling from numpy's global generator, both
seeded with SEED: fine for a benchmark, not a DP implementation to release anything with.
Prints one JSON line: rho, seconds (the mechanism's wall time, fit + sample), the chosen
pairs and the workload error (mean over all column pairs of half the L1 distance between
the normalised 2-way tables of the real and the synthetic data).
"""

import itertools
import json
import math
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_enable_compilation_cache", False)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from mbi import Dataset, Domain, LinearMeasurement, estimation  # noqa: E402

ITERS = 3000  # mirror-descent iterations for the final model


def measure(data: Dataset, cliques, sigma: float, rng) -> list[LinearMeasurement]:
    out = []
    for cl in cliques:
        x = data.project(cl).datavector()
        out.append(LinearMeasurement(x + rng.normal(0, sigma, x.size), cl, stddev=sigma))
    return out


def compression(one_way: list[LinearMeasurement], sigma: float) -> dict[str, np.ndarray]:
    """Per column, merge the values whose noisy count is below 3*sigma (if two or more)."""
    mapping = {}
    for m in one_way:
        small = np.asarray(m.noisy_measurement) < 3 * sigma
        if small.sum() > 1:
            keep = np.cumsum(~small) - 1
            mapping[m.clique[0]] = np.where(small, (~small).sum(), keep)
    return mapping


def select(data: Dataset, one_way, rho: float, rng) -> list[tuple[str, str]]:
    """Kruskal-style spanning tree, each edge drawn by an exponential mechanism."""
    cols = list(data.domain)
    indep = estimation.MirrorDescent().estimate(data.domain, one_way, iters=1000)
    score = {p: float(np.abs(data.project(p).datavector()
                             - np.asarray(indep.project(p).datavector())).sum())
             for p in itertools.combinations(cols, 2)}
    eps = math.sqrt(8 * rho / (len(cols) - 1))
    comp = {c: c for c in cols}

    def root(c):
        while comp[c] != c:
            c = comp[c]
        return c

    chosen = []
    for _ in range(len(cols) - 1):
        cand = [p for p in score if root(p[0]) != root(p[1])]
        s = np.array([score[p] for p in cand])
        w = np.exp(eps * (s - s.max()) / 2)
        a, b = cand[rng.choice(len(cand), p=w / w.sum())]
        comp[root(a)] = root(b)
        chosen.append((a, b))
    return chosen


def mst(data: Dataset, rho: float, rows: int, rng) -> tuple[Dataset, list]:
    cols, d = list(data.domain), len(data.domain)
    sigma1 = math.sqrt(d / (2 * rho / 3))
    one_way = measure(data, [(c,) for c in cols], sigma1, rng)
    mapping = compression(one_way, sigma1)
    small = data.compress(mapping)
    one_way = [m.compress(mapping, data.domain) for m in one_way]
    pairs = select(small, one_way, rho / 3, rng)
    sigma2 = math.sqrt((d - 1) / (2 * rho / 3))
    two_way = measure(small, pairs, sigma2, rng)
    model = estimation.MirrorDescent().estimate(small.domain, one_way + two_way, iters=ITERS)
    return model.synthetic_data(rows).decompress(mapping), pairs


def workload_error(real: pd.DataFrame, synth: pd.DataFrame, sizes: dict, k: int = 2) -> float:
    """Mean half-L1 distance of the normalised k-way tables (k = 2: private-pgm's figure)."""
    errs = []
    for columns in itertools.combinations(sizes, k):
        tables = []
        for f in (real, synth):
            t = np.zeros(tuple(sizes[c] for c in columns))
            np.add.at(t, tuple(f[c].to_numpy() for c in columns), 1)
            tables.append(t / t.sum())
        errs.append(0.5 * np.abs(tables[0] - tables[1]).sum())
    return float(np.mean(errs))


def main(csv: str, domain_json: str, rho_text: str, seed: str) -> None:
    sizes = json.loads(Path(domain_json).read_text())
    real = pd.read_csv(csv)[list(sizes)]
    data = Dataset({c: real[c].to_numpy() for c in sizes},
                   Domain(list(sizes), list(sizes.values())))
    rho = float(rho_text)
    rng = np.random.default_rng(int(seed))
    np.random.seed(int(seed))  # mbi samples records and decompresses with numpy's global RNG
    start = time.perf_counter()
    synth, pairs = mst(data, rho, len(real), rng)
    seconds = time.perf_counter() - start
    synth_df = pd.DataFrame({c: np.asarray(synth.data[c]).astype(int) for c in sizes})
    print(json.dumps({"rho": rho, "seconds": round(seconds, 2), "pairs": [list(p) for p in pairs],
                      "workload_error": workload_error(real, synth_df, sizes)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
