"""Test synthesizers (registered only for a test) and stores whose policy allows them."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.privacy import PrivacyCost
from dpsql.session import Session
from dpsql.synth import base
from dpsql.synth.histogram import FittedHistogram, Independent, Joint

from ..conftest import policy_text

ALL = ("independent, joint, range, crash_sample, crash_write, overspend, not_dp, "
       "not_dp_joint, lowering, with_products, slow, fails_checks")


class CrashingFit:
    """A fitted model whose sampling fails (a bug, or running out of memory)."""

    def __init__(self, inner: FittedHistogram) -> None:
        self.inner = inner
        self.spent = inner.spent
        self.rows = inner.rows

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        raise RuntimeError("sampling broke")

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


class BreaksMidWrite(Mapping[str, pa.Table]):
    """Products that fail after the first table was written inside the transaction."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    def __getitem__(self, key: str) -> pa.Table:
        return self.table

    def __iter__(self) -> Iterator[str]:
        return iter(["first", "second"])

    def __len__(self) -> int:
        return 2

    def items(self):  # type: ignore[override]
        yield "first", self.table
        raise RuntimeError("disk full")


@dataclass
class CrashSample(Independent):
    name: ClassVar[str] = "crash_sample"

    def fit(self, source, domain, budget, rng, progress=None):
        return CrashingFit(super().fit(source, domain, budget, rng, progress))


@dataclass
class CrashWrite(Independent):
    name: ClassVar[str] = "crash_write"
    product_suffixes: ClassVar[tuple[str, ...]] = ("first", "second")

    def fit(self, source, domain, budget, rng, progress=None):
        fitted = super().fit(source, domain, budget, rng, progress)
        fitted.products = lambda: BreaksMidWrite(pa.table({"x": [1, 2]}))  # type: ignore[attr-defined]
        return fitted


@dataclass
class Overspend(Independent):
    name: ClassVar[str] = "overspend"

    def fit(self, source, domain, budget, rng, progress=None):
        fitted = super().fit(source, domain, budget, rng, progress)
        fitted.spent = budget + budget
        return fitted


@dataclass
class NotDP(Independent):
    """Releases exact marginals: not DP at all."""

    name: ClassVar[str] = "not_dp"
    is_dp: ClassVar[bool] = False  # type: ignore[misc]

    def fit(self, source, domain, budget, rng, progress=None):
        return super().fit(source, domain, PrivacyCost.unbounded(budget.kind), rng, progress)


@dataclass
class NotDPJoint(Joint):
    """Releases the exact joint histogram: not DP at all."""

    name: ClassVar[str] = "not_dp_joint"
    is_dp: ClassVar[bool] = False  # type: ignore[misc]

    def fit(self, source, domain, budget, rng, progress=None):
        return super().fit(source, domain, PrivacyCost.unbounded(budget.kind), rng, progress)


@dataclass
class Lowering(Independent):
    name: ClassVar[str] = "lowering"
    privacy_lowering_options: ClassVar[tuple[str, ...]] = ("passthrough",)
    passthrough: float = 0.0


@dataclass
class WithProducts(Independent):
    name: ClassVar[str] = "with_products"
    product_suffixes: ClassVar[tuple[str, ...]] = ("aggregates",)

    def fit(self, source, domain, budget, rng, progress=None):
        fitted = super().fit(source, domain, budget, rng, progress)
        marginal = fitted.noisy[0]
        fitted.products = lambda: {  # type: ignore[attr-defined]
            "aggregates": pa.table({"code": np.arange(marginal.size), "count": marginal})}
        return fitted


@dataclass
class FailsChecks(WithProducts):
    """Fits like independent (with a product), and declares that its fit failed a check."""

    name: ClassVar[str] = "fails_checks"

    def fit(self, source, domain, budget, rng, progress=None):
        fitted = super().fit(source, domain, budget, rng, progress)
        described = fitted.describe()
        failed = base.diagnostic("a test check", False, 0.5, 0.1, "always fails, on purpose")
        fitted.describe = lambda: {  # type: ignore[method-assign]
            **described, "diagnostics": {**described.get("diagnostics", {}), "checks": [failed]}}
        return fitted


@dataclass
class Slow(Independent):
    """Reports stage "wait" once, waits ``seconds`` silently, then fits like independent.

    Silent like a long NUTS chain: only the worker's watch of its parent can end it.
    """

    name: ClassVar[str] = "slow"
    seconds: float = 60.0

    def fit(self, source, domain, budget, rng, progress=None):
        if progress is not None:
            progress("wait", 0, self.seconds)
        time.sleep(self.seconds)
        return super().fit(source, domain, budget, rng, progress)


TEST_SYNTHESIZERS = {"slow": Slow, "crash_sample": CrashSample, "crash_write": CrashWrite,
                     "overspend": Overspend, "not_dp": NotDP,
                     "not_dp_joint": NotDPJoint, "lowering": Lowering,
                     "with_products": WithProducts, "fails_checks": FailsChecks}


def register_test_synthesizers() -> None:
    """Register the synthesizers above (the built-ins first)."""
    base.available()
    for name, factory in TEST_SYNTHESIZERS.items():
        base.register(name)(factory)


@pytest.fixture(autouse=True)
def test_synthesizers() -> Iterator[None]:
    register_test_synthesizers()
    yield
    for name in TEST_SYNTHESIZERS:
        base.unregister(name)


def release_policy(accounting: str = "zcdp", *, allow_non_dp: bool = False,
                   allow_options: str = "[]", public_rows: int | None = None,
                   synthesizers: str = ALL, budget: str = "{epsilon: 10}",
                   user_budget: str = "{epsilon: 5}") -> str:
    extra = (f"    synthesizers: [{synthesizers}]\n    allow_non_dp: {str(allow_non_dp).lower()}\n"
             f"    allow_options: {allow_options}\n")
    if public_rows is not None:
        extra += f"    public_row_count: {public_rows}\n"
    return policy_text(accounting, budget=budget, user_budget=user_budget, extra_dataset=extra)


@pytest.fixture
def release_store(make_store) -> Path:
    return make_store(release_policy())


@pytest.fixture
def admin_session(release_store: Path) -> Iterator[Session]:
    with dpsql.connect(release_store, "admin") as session:
        yield session
