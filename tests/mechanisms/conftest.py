"""The samplers are seeded per test (by its id), so every statistical test here is repeatable."""

from __future__ import annotations

import hashlib

import pytest

from dpsql import _exact
from tests.test_noise import SeededEntropy


@pytest.fixture(autouse=True)
def seeded_entropy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deterministic stand-in for the OS entropy source, seeded by the test's id."""
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:8], "little")
    monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(seed))
