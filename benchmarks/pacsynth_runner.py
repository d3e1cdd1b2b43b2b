"""Run pac-synth on a CSV of codes (executed by the pac-synth venv, never imports dpsql).

Usage: python pacsynth_runner.py IN.csv OUT_DIR EPSILON DELTA REPORTING_LENGTH

Empty strings are empty values. Every column is passed as a sensitive-zero
column: otherwise pac-synth drops the 0-coded category of every column.
Writes OUT_DIR/synthetic.csv, OUT_DIR/aggregates.json and OUT_DIR/run.json
(fit and sample seconds, the DP record count, peak resident memory).
"""

import json
import resource
import sys
import time
from pathlib import Path

import pandas as pd
from pacsynth import (
    AccuracyMode,
    Dataset,
    DpAggregateSeededParametersBuilder,
    DpAggregateSeededSynthesizer,
    FabricationMode,
)


def main() -> None:
    source, out, epsilon, delta, length = sys.argv[1:6]
    out_dir = Path(out)
    frame = pd.read_csv(source, dtype=str, keep_default_na=False)
    dataset = Dataset.from_data_frame(frame, sensitive_zeros=list(frame.columns))
    params = (DpAggregateSeededParametersBuilder()
              .reporting_length(int(length))
              .epsilon(float(epsilon))
              .delta(float(delta))
              .percentile_percentage(99)
              .percentile_epsilon_proportion(0.01)
              .accuracy_mode(AccuracyMode.prioritize_long_combinations())
              .number_of_records_epsilon_proportion(0.005)
              .fabrication_mode(FabricationMode.uncontrolled())
              .empty_value("")
              .use_synthetic_counts(False)
              .weight_selection_percentile(95)
              .build())
    synth = DpAggregateSeededSynthesizer(params)
    start = time.perf_counter()
    synth.fit(dataset)
    fitted = time.perf_counter()
    raw = synth.sample()
    sampled = time.perf_counter()
    pd.DataFrame(raw[1:], columns=raw[0]).to_csv(out_dir / "synthetic.csv", index=False)
    (out_dir / "aggregates.json").write_text(json.dumps(synth.get_dp_aggregates(";")))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):  # this process's own peak (ru_maxrss can be inherited)
            peak = int(line.split()[1]) / 1024
    (out_dir / "run.json").write_text(json.dumps({
        "fit_seconds": fitted - start, "sample_seconds": sampled - fitted,
        "dp_records": synth.get_dp_number_of_records(), "peak_mb": peak}))


if __name__ == "__main__":
    main()
