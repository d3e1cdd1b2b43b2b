"""Fixtures for the DP SQL tests: real stores over the Adult sample and the ACS excerpt."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
import yaml

import dpsql
from dpsql import _exact
from dpsql.engines.local import DuckDBEngine
from dpsql.session import Session
from tests.conftest import ADULT_POLICY, ADULT_SAMPLE

ROOT = Path(__file__).resolve().parents[2]
ACS_POLICY = ROOT / "policies" / "acs.yaml"
# A 3,000-row sample of the ACS excerpt ships with the tests (tests/data/README.md).
ACS_DATA = ROOT / "tests" / "data" / "acs_sample.csv"
# A public lookup table keyed by Adult's education_num (code 15 left out; tests/data/README.md).
EDUCATION_LEVELS = ROOT / "tests" / "data" / "education_levels.csv"
EDUCATION_TABLE = {"edu": {"path": str(EDUCATION_LEVELS), "key": "education_num"}}


class SeededEntropy:
    """A deterministic stand-in for the OS entropy source, so noisy tests are reproducible."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.Generator(np.random.PCG64(seed))

    def take(self, nbytes: int) -> bytes:
        return self._rng.bytes(nbytes)


@pytest.fixture(autouse=True)
def seeded_noise(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed the secure sampler from the test id (tests only; production reads the OS)."""
    seed = int.from_bytes(hashlib.sha256(request.node.nodeid.encode()).digest()[:8], "little")
    monkeypatch.setattr(_exact, "ENTROPY", SeededEntropy(seed))


def with_budgets(policy_path: Path, *, budget: Any = None, cap: Any = None,
                 default: Any = None, max_rows: int | None = None, unit: str | None = None,
                 accounting: str | None = None, extra_columns: dict[str, Any] | None = None
                 ) -> str:
    """The YAML of a shipped policy with every dataset's and user's budgets replaced."""
    raw = yaml.safe_load(policy_path.read_text())
    if accounting is not None:
        raw["accounting"] = accounting
        if accounting == "pure":
            raw.pop("delta", None)
        else:
            raw.setdefault("delta", 1e-6)
    for ds in raw["datasets"].values():
        if budget is not None:
            ds["budget"] = budget
        for key, value in (("query_cap", cap), ("default_query", default)):
            if value is not None:
                ds[key] = value
            elif budget is not None:
                ds.pop(key, None)
        if unit is not None:
            ds["privacy_unit"] = unit
        if max_rows is not None:
            ds["max_rows"] = max_rows
        if extra_columns:
            ds["columns"].update(extra_columns)
    if budget is not None:
        for user in raw["users"].values():
            user["budgets"] = {name: budget for name in raw["datasets"]}
    return yaml.safe_dump(raw, sort_keys=False)


INFINITE = {"epsilon": float("inf")}


def table_policy(columns: str) -> str:
    """A pure-DP policy over one table ``t`` with unbounded budgets and ``columns`` (YAML)."""
    return f"""version: 1
accounting: pure
datasets:
  t:
    table: t
    budget: {INFINITE}
    query_cap: {INFINITE}
    default_query: {INFINITE}
    columns:
{columns}
users:
  admin: {{role: admin, budgets: {{t: {INFINITE}}}}}
"""


def apply_adult_bounds(path: Path, directory: Path, column: str, bounds: list[float]) -> None:
    """Apply the unbounded-budget Adult policy with ``column``'s bounds changed, as admin."""
    raw = yaml.safe_load(with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))
    raw["datasets"]["adult"]["columns"][column]["bounds"] = bounds
    policy = directory / f"{column}_bounds.yaml"
    policy.write_text(yaml.safe_dump(raw))
    with dpsql.connect(path, "admin") as admin:
        admin.apply_policy(policy, outside="keep")  # rows outside stay, for queries to clamp


def _init(directory: Path, name: str, text: str, data: dict[str, Path] | None = None,
          na: str | None = None, enforce_bounds: bool = False) -> Path:
    policy = directory / f"{name}.yaml"
    policy.write_text(text)
    path = directory / f"{name}.duckdb"
    store, _ = dpsql.init(path, policy, data or {"adult": ADULT_SAMPLE}, na=na,
                          enforce_bounds=enforce_bounds)
    store.close()
    return path


@pytest.fixture
def build(tmp_path: Path) -> Callable[..., Path]:
    """A fresh store: ``build(policy_yaml, data={'adult': path}, na=None, enforce_bounds)``."""
    counter = iter(range(1000))

    def make(text: str, data: dict[str, Path] | None = None, na: str | None = None,
             enforce_bounds: bool = False) -> Path:
        return _init(tmp_path, f"store{next(counter)}", text, data, na, enforce_bounds)

    return make


@pytest.fixture(scope="session")
def exact_adult_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store over the Adult sample with unbounded budgets, shared by read-only tests."""
    return _init(tmp_path_factory.mktemp("exact"), "adult",
                 with_budgets(ADULT_POLICY, budget=INFINITE, default=INFINITE))


@pytest.fixture
def exact_adult(exact_adult_path: Path) -> Iterator[Session]:
    """Alice on the Adult sample with unbounded budgets: answers carry no noise."""
    with dpsql.connect(exact_adult_path, "alice") as session:
        yield session


@pytest.fixture
def adult(store_path: Path) -> Iterator[Session]:
    """Alice on a fresh demo store (zcdp, default epsilon 0.1, cap 1, budget 2)."""
    with dpsql.connect(store_path, "alice") as session:
        yield session


@pytest.fixture
def pure_adult(build: Callable[..., Path]) -> Iterator[Session]:
    """Alice under pure accounting: budget 5, cap 1, default 0.1."""
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 5},
                        cap={"epsilon": 1}, default={"epsilon": 0.1})
    with dpsql.connect(build(text), "alice") as session:
        yield session


@pytest.fixture(scope="session")
def acs_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ACS excerpt (strings, NULLs, floats) with unbounded budgets, shared."""
    return _init(tmp_path_factory.mktemp("acs"), "acs",
                 with_budgets(ACS_POLICY, budget=INFINITE, default=INFINITE),
                 {"acs": ACS_DATA}, na="N")


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every SQL text the query engine hands to DuckDB (bound or run), in order."""
    calls: list[str] = []
    real_prepare = DuckDBEngine.prepare

    def prepare(self: DuckDBEngine, query: Any, text: str | None = None) -> Any:
        calls.append(self.render(query))
        return real_prepare(self, query, text)

    monkeypatch.setattr(DuckDBEngine, "prepare", prepare)
    return calls


@pytest.fixture(scope="session")
def both_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store with both datasets (Adult and ACS), zcdp, finite budgets; ``indp`` has no list."""
    adult = yaml.safe_load(ADULT_POLICY.read_text())
    acs = yaml.safe_load(ACS_POLICY.read_text())
    del acs["datasets"]["acs"]["columns"]["indp"]["values"]  # keys by partition selection
    adult["datasets"].update(acs["datasets"])
    for name, user in adult["users"].items():
        user["budgets"].update(acs["users"].get(name, {}).get("budgets", {}))
    return _init(tmp_path_factory.mktemp("both"), "both", with_public_table(yaml.safe_dump(adult)),
                 {"adult": ADULT_SAMPLE, "acs": ACS_DATA}, na="N")


def plain(session: Session, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` with plain DuckDB on a copy of the store's tables (the reference answer)."""
    con = duckdb.connect(":memory:")
    for ds in session.policy.datasets.values():
        data = session.store.cursor().sql(f'SELECT * FROM main."{ds.table}"').to_arrow_table()
        con.register(f"_{ds.table}", data)
        con.execute(f'CREATE TABLE "{ds.table}" AS SELECT * FROM "_{ds.table}"')
    for name in session.policy.public_tables:  # public tables under their own names
        data = session.store.cursor().sql(f'SELECT * FROM public_tables."{name}"').to_arrow_table()
        con.register(f"_{name}", data)
        con.execute(f'CREATE TABLE "{name}" AS SELECT * FROM "_{name}"')
    con.execute("CREATE MACRO dp_bin(x, width) AS width * floor(x / width)")
    return con.execute(sql).fetchall()


def with_public_table(text: str) -> str:
    """A policy's YAML with the public table ``edu`` (:data:`EDUCATION_TABLE`) added."""
    raw = yaml.safe_load(text)
    raw["public_tables"] = EDUCATION_TABLE
    return yaml.safe_dump(raw, sort_keys=False)


def charges(session: Session) -> int:
    """Number of charges in the store's ledger."""
    row = session.store.cursor().execute("SELECT count(*) FROM dpsql.charges").fetchone()
    assert row is not None
    return int(row[0])
