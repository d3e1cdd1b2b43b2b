"""Under CI a missing component fails its tests instead of skipping them (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SAMPLE = '''
import pytest

def test_needs_a_component():
    pytest.importorskip("no_such_component_dpsql")

def test_needs_root():
    pytest.skip("making a folder of another uid needs root")

def test_needs_the_shared_data():
    pytest.skip("the shared data (shared/data/acs) is not here")

@pytest.mark.xfail(reason="an expected failure is not a skip", strict=True)
def test_expected_failure():
    assert False
'''
MODULE = 'import pytest\npytest.importorskip("no_such_module_dpsql")\n\ndef test_x():\n    pass\n'


def run_sample(tmp_path: Path, name: str, text: str, **env: str
               ) -> subprocess.CompletedProcess[str]:
    """Run one sample test file under this suite's hooks (``tests/conftest.py``)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport\n")
    (tmp_path / name).write_text(text)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "DPSQL_NO_SHARED_DATA")}
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           name], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**clean, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
                               **env})


def outcomes(tmp_path: Path, **env: str) -> dict[str, str]:
    """Each sample test's outcome (PASSED, FAILED, SKIPPED, XFAIL)."""
    run = run_sample(tmp_path, "test_sample.py", SAMPLE, **env)
    return dict(re.findall(r"::(test_\w+) (PASSED|FAILED|SKIPPED|XFAIL)", run.stdout))


def test_outside_ci_a_missing_component_skips(tmp_path: Path) -> None:
    found = outcomes(tmp_path)
    assert found["test_needs_a_component"] == "SKIPPED"
    assert found["test_needs_the_shared_data"] == "SKIPPED"
    module = run_sample(tmp_path, "test_module.py", MODULE)
    assert module.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, module.stdout
    assert "1 skipped" in module.stdout


def test_under_ci_a_missing_component_fails(tmp_path: Path) -> None:
    found = outcomes(tmp_path, CI="true")
    assert found["test_needs_a_component"] == "FAILED"
    assert found["test_needs_the_shared_data"] == "FAILED"
    assert found["test_needs_root"] == "SKIPPED"  # what the machine is, not what it lacks
    assert found["test_expected_failure"] == "XFAIL"
    module = run_sample(tmp_path, "test_module.py", MODULE, CI="true")  # importorskip
    assert module.returncode != 0
    assert "under CI a missing component fails instead of skipping" in module.stdout
    assert "no_such_module_dpsql" in module.stdout


def test_only_ci_run_can_excuse_the_shared_data(tmp_path: Path) -> None:
    found = outcomes(tmp_path, CI="true", DPSQL_NO_SHARED_DATA="1")
    assert found["test_needs_the_shared_data"] == "SKIPPED"
    assert found["test_needs_a_component"] == "FAILED"


@pytest.mark.skipif(not (ROOT / ".ci" / "run").exists(), reason="not a git checkout")
def test_ci_run_fails_loudly_and_runs_the_readme_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    assert "|| true" not in script  # an install that fails must stop CI
    assert "export CI=true" in script
    assert 'bash -c "$test_command"' in script
    for step in ("ruff check", "mypy", "-m \"slow and ci\""):
        assert step in script, step
