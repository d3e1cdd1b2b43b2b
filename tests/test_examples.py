"""Every script under examples/ runs end to end (the slow ones under -m slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SLOW = {"napsu_adult.py", "modp_acs.py", "sds_adult.py", "aim_adult.py", "spark_engine.py",
        "held_release.py"}


def _run(script: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=1200, cwd=EXAMPLES.parent)


@pytest.mark.parametrize("script", [p for p in sorted(EXAMPLES.glob("*.py")) if p.name not in SLOW],
                         ids=lambda p: p.name)
def test_example_runs(script):
    result = _run(script)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.ci  # every example runs in CI
@pytest.mark.parametrize("script", [p for p in sorted(EXAMPLES.glob("*.py")) if p.name in SLOW],
                         ids=lambda p: p.name)
def test_slow_example_runs(script):
    result = _run(script)
    assert result.returncode == 0, result.stderr[-2000:]
