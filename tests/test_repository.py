"""The repository tells the truth: links resolve, the top-level udfs/ shows the macros."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (an installed copy has no repository to check)")
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_every_tracked_link_resolves() -> None:
    links = [p for p in tracked() if p.is_symlink()]
    dangling = [str(p.relative_to(ROOT)) for p in links if not p.exists()]
    assert not dangling


def test_the_top_level_udfs_shows_the_shipped_macros() -> None:
    shown = sorted(p.name for p in (ROOT / "udfs").glob("*.sql"))
    shipped = sorted(p.name for p in (ROOT / "dpsql" / "udfs").glob("*.sql"))
    assert shown == shipped
    assert shown
    assert "CREATE OR REPLACE MACRO udfs.dp_bin" in (ROOT / "udfs" / "binning.sql").read_text()
