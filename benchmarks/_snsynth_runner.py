"""smartnoise-synth's AIM or MST on integer codes (benchmark only; run in its own venv).

    /work/venvs/smartnoise/bin/python benchmarks/_snsynth_runner.py DATA.csv DOMAIN.json \
        SYNTH EPSILON DELTA SEED

SYNTH is ``aim`` or ``mst`` (snsynth 1.0.8, which estimates with the ``mbi`` package);
DATA.csv and DOMAIN.json as for ``_mst_baseline.py``. Every column is passed as
categorical with ``preprocessor_eps=0`` (smartnoise then reads each column's categories
from the data: not DP, acceptable for a reference). Prints one JSON line: seconds (fit
and sample of as many rows as the data) and the 2-way and 3-way workload errors, computed
as in ``_mst_baseline.py``.
"""

import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from _mst_baseline import workload_error
from snsynth import Synthesizer


def main(csv: str, domain_json: str, name: str, epsilon: str, delta: str, seed: str) -> None:
    sizes = json.loads(Path(domain_json).read_text())
    real = pd.read_csv(csv)[list(sizes)]
    np.random.seed(int(seed))  # snsynth draws its noise from numpy's global generator
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    model = Synthesizer.create(name, epsilon=float(epsilon), delta=float(delta))
    model.fit(real, categorical_columns=list(sizes), preprocessor_eps=0.0)
    synthetic = pd.DataFrame(model.sample(len(real)), columns=list(sizes)).astype(np.int64)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds,
                      "workload_error": workload_error(real, synthetic, sizes),
                      "workload_error_3": workload_error(real, synthetic, sizes, 3)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
