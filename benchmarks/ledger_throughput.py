"""Ledger throughput: committed charges per second with 1 and 8 threads.

Each charge is a compare-and-debit in one DuckDB transaction under the store's
write lock, committed before anything private would be computed.

    python benchmarks/ledger_throughput.py [--charges 400] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from importlib import resources
from pathlib import Path

from _common import median_time, peak_rss_mb, print_table, readme

import dpsql
from dpsql.privacy import PrivacyCost

POLICY = """version: 1
accounting: pure
datasets:
  adult:
    table: adult
    budget: {epsilon: 1000000}
    columns:
      sex: {type: categorical, values: [0, 1]}
users:
  admin: {role: admin, budgets: {adult: {epsilon: 1000000}}}
"""


def charge_all(session: dpsql.Session, charges: int, threads: int) -> None:
    per_thread = charges // threads
    cost = PrivacyCost.pure("0.001")

    def work() -> None:
        for _ in range(per_thread):
            session.ledger.charge("admin", "adult", cost, "benchmark charge")

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--charges", type=int, default=400)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sample = Path(str(resources.files("dpsql").joinpath("data/adult_sample.csv")))
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "p.yaml"
        policy.write_text(POLICY)
        store, _ = dpsql.init(Path(tmp) / "bench.duckdb", policy, {"adult": sample})
        store.close()
        session = dpsql.connect(Path(tmp) / "bench.duckdb", "admin")
        rows = []
        baseline = None
        for threads in (1, 8):
            med, _ = median_time(lambda t=threads: charge_all(session, args.charges, t),
                                 args.runs)
            rate = args.charges / med
            baseline = baseline or rate
            rows.append({"threads": threads, "charges": args.charges, "median_s": med,
                         "charges_per_s": rate, "ratio_vs_1_thread": rate / baseline,
                         "peak_rss_mb": peak_rss_mb()})
        spent = session.ledger.budget("admin", "adult").spent
        expected = PrivacyCost.pure("0.001").times(args.charges * args.runs * 2)
        assert spent == expected, "the ledger lost or invented a charge"
        session.close()
    print_table(rows, args.json)
    if not args.json:
        readme(f"{rows[0]['charges_per_s']:.0f}/s on 1 thread, {rows[1]['charges_per_s']:.0f}/s "
               f"with 8 threads ({args.charges} charges, median of {args.runs} runs)")


if __name__ == "__main__":
    main()
