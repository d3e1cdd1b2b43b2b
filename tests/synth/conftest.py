"""Fixtures for synthesizer tests: a policy with fine bins and the statistical helpers."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import dpsql
from dpsql.session import Session

from ..conftest import ADULT_SAMPLE, policy_text

# One statistical check fails by chance with at most this probability (CLT bounds).
FALSE_POSITIVE_RATE = 1e-6
Z_BOUND = 4.892  # two-sided normal quantile for 1e-6

SYNTHESIZERS = "    synthesizers: [independent, joint, range]\n"
FINE_COLUMNS = """
      age: {{type: integer, bounds: [0, 84], bins: 1}}
      workclass: {{type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8]}}
      occupation: {{type: categorical, values: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]}}
      native_country: {{type: categorical, values: [{}]}}
      hours_per_week: {{type: integer, bounds: [0, 98], bins: 7}}
      sex: {{type: categorical, values: [0, 1]}}
      race: {{type: categorical, values: [0, 1, 2, 3, 4]}}
      income_50k: {{type: categorical, values: [0, 1]}}
      fnlwgt: {{type: hidden}}""".format(", ".join(str(i) for i in range(42)))


def mean_square_ratio_ok(residuals: np.ndarray, variance: float, excess_kurtosis: float
                         ) -> tuple[bool, float]:
    """Whether mean(r^2) / variance is within the CLT bound around 1 at FALSE_POSITIVE_RATE.

    Var(r^2) = (2 + excess_kurtosis) variance^2, so the ratio has sd sqrt((2 + k) / n).
    """
    ratio = float(np.mean(residuals.astype(float) ** 2) / variance)
    bound = Z_BOUND * math.sqrt((2 + excess_kurtosis) / residuals.size)
    return abs(ratio - 1) <= bound, ratio


@pytest.fixture
def fine_store(make_store) -> Path:
    """A zCDP store over the Adult sample with 1-year age bins and large categoricals."""
    return make_store(policy_text("zcdp", budget="{epsilon: 100}",
                                  user_budget="{epsilon: 100}", columns=FINE_COLUMNS,
                                  extra_dataset=SYNTHESIZERS))


@pytest.fixture
def fine_admin(fine_store: Path) -> Iterator[Session]:
    with dpsql.connect(fine_store, "admin") as session:
        yield session


@pytest.fixture
def pure_admin(make_store) -> Iterator[Session]:
    path = make_store(policy_text("pure", budget="{epsilon: 100}", user_budget="{epsilon: 100}",
                                  columns=FINE_COLUMNS, extra_dataset=SYNTHESIZERS))
    with dpsql.connect(path, "admin") as session:
        yield session


__all__ = ["ADULT_SAMPLE", "FALSE_POSITIVE_RATE", "mean_square_ratio_ok"]
