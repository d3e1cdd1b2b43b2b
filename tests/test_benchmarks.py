"""Every figure in the README's "Measured" table names its conditions and the scripts that
print it on a ``README:`` line, so that a re-run can be compared with the table."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def measured_rows() -> list[list[str]]:
    """The cells of each row of the README's "Measured" table (header and rule left out)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Measured\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def calls_readme(script: Path) -> bool:
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id == "readme" for node in ast.walk(tree))


def test_each_figure_has_conditions_and_a_script_that_prints_it() -> None:
    rows = measured_rows()
    assert len(rows) >= 10
    for what, figure, script, conditions in rows:
        names = re.fullmatch(r"`[\w.]+\.py`(, `[\w.]+\.py`)*", script)
        assert names, f"{what}: the script cell {script!r} names no script"
        for name in re.findall(r"`([\w.]+\.py)`", script):
            path = ROOT / "benchmarks" / name
            assert path.is_file(), f"{what}: {path} does not exist"
            assert calls_readme(path), f"{what}: {path.name} prints no README: line"
        assert figure, f"{what}: no figure"
        assert conditions, f"{what}: no conditions"


@pytest.mark.slow
def test_scale_runs_in_a_quick_mode() -> None:
    """``benchmarks/scale.py`` on small sizes prints every figure and its README: line."""
    result = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--rows", "20000", "--sds-rows", "20000",
         "--runs", "1", "--sds-runs", "1"], cwd=ROOT, capture_output=True, text=True,
        timeout=900)
    if "not found under" in result.stderr:
        pytest.skip("the shared data (shared/data/adult) is not here (set DPSQL_SHARED_DATA)")
    assert result.returncode == 0, result.stderr
    assert re.search(r"init +20,000 rows: dpsql +\d+ MB, plain DuckDB +\d+ MB, ratio "
                     r"[\d.]+x +\(load [\d.]+\)", result.stdout)
    assert re.search(r"sds +20,000 rows: +[\d.]+ s +\(load [\d.]+\)", result.stdout)
    assert re.search(r"README: init peak memory \d+ MB vs plain DuckDB \d+ MB at 20,000 rows; "
                     r"sds [\d.]+ s at 20,000 rows", result.stdout)
    assert re.search(r"sds +20,000 rows, run 0: fit +[\d.]+ s, sample +[\d.]+ s +\(load",
                     result.stdout)
    only = subprocess.run(
        [sys.executable, "benchmarks/scale.py", "--skip-init", "--sds-rows", "20000",
         "--sds-runs", "1"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert only.returncode == 0, only.stderr
    assert "init" not in only.stdout
    assert re.search(r"README: sds [\d.]+ s at 20,000 rows", only.stdout)


def test_sql_breadth_quick_mode_prints_its_figures() -> None:
    """``benchmarks/sql_breadth.py --quick`` (about 15 s): DP quantiles against OpenDP, the
    new aggregates beside smartnoise-sql (where its venv exists; "not run" otherwise) and
    their overhead over DuckDB, on the shared Adult and ACS data (skipped where absent)."""
    if not any((d / "shared" / "data" / "acs" / "national2019.csv").exists()
               for d in ROOT.parents) and "DPSQL_SHARED_DATA" not in os.environ:
        pytest.skip("the shared data (shared/data/acs) is not here")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sql_breadth.py"),
                             "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "README: DP quantile abs. error, 1000 Adult and ACS rows" in result.stdout
    assert "acs.AGEP q=0.5" in result.stdout
    assert re.search(r"README: DP aggregates vs smartnoise-sql, 5,000 Adult rows, age, eps 1 "
                     r"\(.*\): median \d[\d.]*/\d[\d.]*/", result.stdout)
    assert "README: DP quantile and distinct count overhead on 100,000 rows: count (reference)" \
        in result.stdout
    assert "count distinct by sex, race" in result.stdout


def test_import_time_quick_mode_prints_its_figures() -> None:
    """``benchmarks/import_time.py --quick`` (about 10 s): one fresh process each for
    ``import dpsql``, ``get('independent')`` and an ``independent`` release of the bundled
    Adult sample; none of them, nor the release's worker, imports torch, jax, numpyro, mbi
    or scipy.stats."""
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "import_time.py"),
                             "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    number = r"\d+(\.\d+)?"
    assert re.search(
        rf"README: fresh process, median of 1: import dpsql {number} s; get\('independent'\) "
        rf"{number} s import time, {number} MB, heavy: none; independent release of the "
        rf"Adult sample {number} s import time \+ worker {number} s, {number} MB, heavy: none; "
        rf"{number} s end to end, {number} MB, heavy: none \(load [\d.-]+\)", result.stdout)


def test_partition_selection_quick_mode_prints_its_figures() -> None:
    """``benchmarks/partition_selection.py --quick`` (a few seconds): keys released and total
    error against Laplace thresholding on the shared ACS data (skipped where it is absent)."""
    if not any((d / "shared" / "data" / "acs" / "national2019.csv").exists()
               for d in ROOT.parents) and "DPSQL_SHARED_DATA" not in os.environ:
        pytest.skip("the shared data (shared/data/acs) is not here")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "partition_selection.py"),
                             "--quick"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert re.search(r"README: partition selection INDP eps=1.0: keys [\d.]+ vs [\d.]+ of \d+",
                     result.stdout)


def test_synth_quality_coverage_check_is_near_95_for_posterior_copies_only() -> None:
    # Copies made as NAPSU-MQ makes them (a posterior draw of the shares, then rows
    # from it) must be covered about 95% of the time; copies of a wrong distribution
    # must not (30 copies: with few, the intervals' own df is small and they are wide).
    # Fixed seeds: deterministic; with fresh seeds, 20 cells x 10 repeats
    # put the first mean outside [0.85, 1] far less than once in 10^4.
    import numpy as np

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from synth_quality import cell_coverage

    rng = np.random.default_rng(7)
    shape, n = (8, 12), 3000
    probs = [rng.dirichlet(np.ones(k) * 2) for k in shape]
    true = np.stack([rng.choice(k, n, p=p) for k, p in zip(shape, probs, strict=True)], axis=1)

    def copies(shift: float) -> list[np.ndarray]:
        out = []
        for _ in range(30):
            columns = []
            for col, k in enumerate(shape):
                counts = np.bincount(true[:, col], minlength=k)
                drawn = rng.dirichlet(counts + 1)
                drawn = np.roll(drawn, 1) * shift + drawn * (1 - shift)
                columns.append(rng.choice(k, n, p=drawn / drawn.sum()))
            out.append(np.stack(columns, axis=1))
        return out

    right = [cell_coverage(true, copies(0.0), shape) for _ in range(10)]
    assert right[0][1] == sum(shape)
    assert 0.85 <= float(np.mean([r[0] for r in right])) <= 1.0
    wrong = [cell_coverage(true, copies(1.0), shape) for _ in range(5)]  # shares moved a cell
    assert float(np.mean([w[0] for w in wrong])) < 0.6
