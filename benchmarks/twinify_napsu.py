"""Time twinify 2.0's NAPSU-MQ (the authors' code) on the Adult configuration.

Runs inside /work/venvs/twinify (never imports dpsql). Mirrors
``twinify.napsu_mq.NapsuMQModel.fit`` with timers around each phase, so a run cut
short by the caller's time limit still shows how far it got.

    /work/venvs/twinify/bin/python benchmarks/twinify_napsu.py ADULT_CSV
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd


def adult(path: str) -> pd.DataFrame:
    raw = pd.read_csv(path)
    frame = pd.DataFrame({
        "age": np.digitize(raw["age"], [17, 34, 51, 68]),
        "workclass": raw["workclass"],
        "education": raw["education-num"],
        "marital": raw["marital-status"],
        "race": raw["race"],
        "sex": raw["sex"],
        "gain": (raw["capital-gain"] > 0).astype(int),
        "loss": (raw["capital-loss"] > 0).astype(int),
        "hours": np.digitize(raw["hours-per-week"], [20, 40, 60, 80]),
        "income": raw["income>50K"],
    })
    return frame.astype("category")


def main() -> None:
    import d3p.random
    import jax
    import twinify.napsu_mq.maximum_entropy_inference as mei
    import twinify.napsu_mq.privacy_accounting as accounting
    from twinify.dataframe_data import DataFrameData
    from twinify.mst import MST_selection
    from twinify.napsu_mq.marginal_query import FullMarginalQuerySet
    from twinify.napsu_mq.markov_network import MarkovNetwork
    from twinify.napsu_mq.private_pgm.dataset import Dataset
    from twinify.napsu_mq.private_pgm.domain import Domain

    data = adult(sys.argv[1])
    n = len(data)
    epsilon, delta = 1.0, n ** -2.0
    required = [("hours", "age"), ("hours", "race"), ("hours", "sex"), ("hours", "income"),
                ("race", "sex")]
    t0 = time.perf_counter()
    frame = DataFrameData(data)
    names = list(frame.columns)
    domain = Domain(names, [len(frame.values_by_col[c]) for c in names])
    query_sets = MST_selection(Dataset(frame.int_df, domain), epsilon, delta,
                               cliques_to_include=required)
    queries = FullMarginalQuerySet(query_sets, frame.values_by_col).get_canonical_queries()
    network = MarkovNetwork(frame.values_by_col, queries)
    stat = np.sum(queries.flatten()(frame.int_df.to_numpy()), axis=0)
    sigma = accounting.sigma(epsilon, delta, np.sqrt(2 * len(query_sets)))
    rng = d3p.random.PRNGKey(0)
    noisy = stat + np.random.default_rng(0).normal(0, sigma, stat.shape)
    print(f"twinify setup (MST + canonical queries): {time.perf_counter() - t0:.1f} s, "
          f"{len(query_sets)} cliques, {len(noisy)} queries", flush=True)
    key = d3p.random.convert_to_jax_rng_key(rng)
    approx_key, mcmc_key = jax.random.split(key)
    t1 = time.perf_counter()
    laplace, ok = mei.run_numpyro_laplace_approximation(approx_key, noisy, n, sigma, network)
    print(f"twinify Laplace: {time.perf_counter() - t1:.1f} s (success={ok})", flush=True)
    t2 = time.perf_counter()
    mei.run_numpyro_mcmc_normalised(mcmc_key, noisy, n, sigma, network, laplace,
                                    num_samples=2000, num_warmup=800, num_chains=4)
    print(f"twinify NUTS: {time.perf_counter() - t2:.1f} s", flush=True)


if __name__ == "__main__":
    main()
