"""Accounting: what a query is charged, how the cost is split, the cap, the cache, the order.

Costs are checked exactly (PrivacyCost holds integer quanta), and the noise each
measure gets is checked against the value computed here from the sensitivity
and the share: scale = sensitivity / epsilon_share (Laplace), sigma^2 =
sensitivity^2 / (2 rho_share) (Gaussian), as the sampler rounds it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest

import dpsql
from dpsql import noise
from dpsql.engines.base import EngineError
from dpsql.engines.local import DuckDBEngine, _DuckDBPrepared
from dpsql.mechanisms.additive import Noise
from dpsql.privacy import PrivacyCost
from dpsql.query import dp as dp_path
from dpsql.session import Session
from tests.conftest import ADULT_POLICY
from tests.query.conftest import charges, with_budgets


def spent(session: Session) -> PrivacyCost:
    return session.budget()[0].spent


def laplace(sensitivity: int, epsilon: Fraction) -> float:
    return float(noise.used_laplace_scale(Fraction(sensitivity) / epsilon))


def test_count_charges_the_default_and_calibrates_to_it(pure_adult: Session) -> None:
    answer = pure_adult.sql("SELECT COUNT(*) FROM adult")
    assert answer.cost == PrivacyCost.pure("0.1")
    assert spent(pure_adult) == PrivacyCost.pure("0.1")
    info = answer.columns["count"]
    assert info["mechanism"] == "discrete_laplace"
    assert info["scale"] == laplace(1, Fraction(1, 10))
    assert answer.remaining == PrivacyCost.pure("4.9")
    assert "epsilon=0.1" in (answer.notice or "")
    assert "epsilon=4.9" in (answer.notice or "")


def test_avg_charges_both_its_sum_and_its_count(pure_adult: Session) -> None:
    answer = pure_adult.sql("SELECT AVG(age) FROM adult")
    assert answer.cost == PrivacyCost.pure("0.1")
    info = answer.columns["avg_age"]
    half = Fraction(1, 20)
    assert info["sum"]["cost"] == PrivacyCost.pure(half).as_dict()
    assert info["count"]["cost"] == PrivacyCost.pure(half).as_dict()
    # age in [0, 84]: the centred sum moves by at most 42 per row; the count by 1.
    assert info["sum"]["scale"] == laplace(42, half)
    assert info["count"]["scale"] == laplace(1, half)


def test_k_aggregates_split_the_cost_equally(pure_adult: Session) -> None:
    pure_adult.sql("SET dpsql.epsilon = 0.8")
    answer = pure_adult.sql("SELECT COUNT(*) AS n, SUM(capital_gain) AS s, "
                            "AVG(hours_per_week) AS h FROM adult")
    assert answer.cost == PrivacyCost.pure("0.8")
    share = Fraction(1, 5)  # four measurements: count, sum, and AVG's sum and count
    assert answer.columns["n"]["cost"] == PrivacyCost.pure(share).as_dict()
    assert answer.columns["n"]["scale"] == laplace(1, share)
    assert answer.columns["s"]["scale"] == laplace(99, share)  # capital_gain in [0, 99]
    assert answer.columns["h"]["sum"]["scale"] == laplace(49, share)  # half of [0, 98]
    assert spent(pure_adult) == PrivacyCost.pure("0.8")


def test_repeated_aggregates_are_measured_once(pure_adult: Session) -> None:
    answer = pure_adult.sql("SELECT COUNT(*), COUNT(*) * 2 AS twice FROM adult "
                            "HAVING COUNT(*) > 0 ORDER BY COUNT(*)")
    assert answer.columns["count"]["cost"] == PrivacyCost.pure("0.1").as_dict()
    row = answer.table.to_pylist()[0]
    assert row["twice"] == 2 * row["count"]


def test_zcdp_uses_the_discrete_gaussian(adult: Session) -> None:
    answer = adult.sql("SELECT SUM(capital_loss), COUNT(*) FROM adult")
    rho = adult.cost(epsilon="0.1").value
    share = PrivacyCost.from_fraction("zcdp", rho / 2, round_up=False).value
    expected = noise.used_gaussian_sigma2(Fraction(99) ** 2 / (2 * share))
    assert answer.columns["sum_capital_loss"]["mechanism"] == "discrete_gaussian"
    assert answer.columns["sum_capital_loss"]["scale"] == pytest.approx(float(expected) ** 0.5,
                                                                        rel=1e-12)


def test_max_rows_scales_the_sensitivity(build: Callable[..., Path]) -> None:
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 5},
                        cap={"epsilon": 1}, default={"epsilon": 0.5}, unit="fnlwgt",
                        max_rows=3)
    with dpsql.connect(build(text), "alice") as alice:
        answer = alice.sql("SELECT COUNT(*), SUM(age) FROM adult")
    share = Fraction(1, 4)
    assert answer.columns["count"]["scale"] == laplace(3, share)
    assert answer.columns["sum_age"]["scale"] == laplace(3 * 84, share)


def test_per_query_cap_is_enforced(pure_adult: Session) -> None:
    pure_adult.sql("SET dpsql.epsilon = 1.5")
    with pytest.raises(dpsql.BudgetExceeded, match="at most epsilon=1"):
        pure_adult.sql("SELECT COUNT(*) FROM adult")
    with pytest.raises(dpsql.BudgetExceeded):
        pure_adult.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 2) COUNT(*) "
                       "FROM adult WHERE sex = 1")
    assert charges(pure_adult) == 0
    assert pure_adult.audit(last=1)[0]["outcome"] == "refused"
    pure_adult.sql("SET dpsql.epsilon = 1")  # exactly the cap is allowed
    assert pure_adult.sql("SELECT COUNT(*) FROM adult").cost == PrivacyCost.pure(1)


def test_budget_runs_out(pure_adult: Session) -> None:
    pure_adult.sql("SET dpsql.epsilon = 1")
    for i in range(5):
        pure_adult.sql(f"SELECT COUNT(*) FROM adult WHERE age > {i}")
    with pytest.raises(dpsql.BudgetExceeded, match="has epsilon=0 left"):
        pure_adult.sql("SELECT COUNT(*) FROM adult WHERE age > 10")
    assert charges(pure_adult) == 5


def test_infinite_cost_cannot_be_requested(pure_adult: Session) -> None:
    for statement in ("SET dpsql.epsilon = inf", "SET dpsql.epsilon = 'Infinity'",
                      "SET dpsql.epsilon = 0", "SET dpsql.epsilon = -1"):
        with pytest.raises(dpsql.ConfigurationError):
            pure_adult.sql(statement)
    with pytest.raises(dpsql.QueryRejected, match="out of range"):
        pure_adult.sql("SELECT WITH DIFFERENTIAL_PRIVACY OPTIONS (epsilon = 1e999) COUNT(*) "
                       "FROM adult")


def test_cache_returns_the_same_numbers_for_free(pure_adult: Session) -> None:
    sql = "SELECT race, COUNT(*) AS n, AVG(age) AS a FROM adult GROUP BY race"
    first = pure_adult.sql(sql)
    again = pure_adult.sql(sql + " ORDER BY n DESC LIMIT 2")  # post-processing only
    assert again.cached
    assert again.cost.is_zero
    by_race = {r["race"]: r for r in first.table.to_pylist()}
    for row in again.table.to_pylist():
        assert row == by_race[row["race"]]
    assert spent(pure_adult) == PrivacyCost.pure("0.1")
    assert pure_adult.audit(last=1)[0]["outcome"] == "cached"
    assert "no cost" in (again.notice or "")
    pure_adult.sql("SET dpsql.epsilon = 0.2")  # other options: another measurement
    assert not pure_adult.sql(sql).cached
    assert spent(pure_adult) == PrivacyCost.pure("0.3")


def test_redundant_parentheses_are_the_same_measurement(pure_adult: Session) -> None:
    base = "SELECT COUNT(*) AS n FROM adult WHERE "
    first = pure_adult.sql(base + "race = 2 AND (sex = 1 OR age > 30)")
    for same in ("(race = 2) AND ((sex = 1 OR age > 30))", "((((race = 2)))) AND "
                 "(sex = 1 OR (age > 30))"):
        again = pure_adult.sql(base + same)
        assert again.cached
        assert again.table.equals(first.table)
    # The same words grouped otherwise are another condition: measured (and charged) anew.
    assert not pure_adult.sql(base + "(race = 2 AND sex = 1) OR age > 30").cached
    assert spent(pure_adult) == PrivacyCost.pure("0.2")


def test_cache_survives_a_restart(build: Callable[..., Path]) -> None:
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 5},
                        cap={"epsilon": 1}, default={"epsilon": 0.1})
    path = build(text)
    sql = "SELECT sex, COUNT(*) FROM adult GROUP BY sex"
    with dpsql.connect(path, "alice") as alice:
        first = alice.sql(sql).table
    with dpsql.connect(path, "alice") as alice:  # the store was closed in between
        again = alice.sql(sql)
        assert again.cached
        assert again.table.equals(first)
    with dpsql.connect(path, "admin") as admin:  # another user pays for their own
        assert not admin.sql(sql).cached


def test_charge_is_committed_before_the_data_is_read(pure_adult: Session,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = _DuckDBPrepared.run

    def run(self: _DuckDBPrepared) -> object:
        seen.append(charges(pure_adult))
        return real(self)

    monkeypatch.setattr(_DuckDBPrepared, "run", run)
    pure_adult.sql("SELECT COUNT(*) FROM adult")
    assert seen == [1]


def test_a_failure_after_the_charge_keeps_it_and_says_nothing_of_the_data(
        pure_adult: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: _DuckDBPrepared) -> object:
        raise EngineError("Conversion Error: could not convert 'secret value 42'")

    monkeypatch.setattr(_DuckDBPrepared, "run", broken)
    with pytest.raises(dpsql.InternalError) as caught:
        pure_adult.sql("SELECT COUNT(*) FROM adult")
    assert "42" not in str(caught.value)
    assert "secret" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert charges(pure_adult) == 1
    last = pure_adult.audit(last=1)[0]
    assert last["outcome"] == "failed"
    assert "secret" not in (last["reason"] or "")


def test_sql_that_cannot_bind_costs_nothing(
        pure_adult: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every run binds its SQL before the charge, so a bind failure (a dpsql bug), on a
    # plan's first run or a later one, costs nothing.
    def broken(self: DuckDBEngine, query: object, text: object = None) -> object:
        raise EngineError("Binder Error: column 'secret value 42' not found")

    sql = "SELECT COUNT(*) FROM adult WHERE age > 30"
    with monkeypatch.context() as patch:
        patch.setattr(DuckDBEngine, "prepare", broken)
        with pytest.raises(dpsql.InternalError) as caught:
            pure_adult.sql(sql)
    assert "secret" not in str(caught.value)
    assert charges(pure_adult) == 0
    pure_adult.sql(sql)  # binds: the plan is proven
    assert charges(pure_adult) == 1
    pure_adult.sql("SET dpsql.epsilon = 0.05")  # a new measurement of the same plan
    monkeypatch.setattr(DuckDBEngine, "prepare", broken)
    with pytest.raises(dpsql.InternalError) as caught:
        pure_adult.sql(sql)
    assert "secret" not in str(caught.value)
    assert charges(pure_adult) == 1


def test_the_noise_is_drawn_after_the_query_runs_and_a_failed_draw_keeps_the_charge(
        pure_adult: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_run, real_sample = _DuckDBPrepared.run, Noise.sample

    def run(self: _DuckDBPrepared) -> object:
        events.append("run")
        return real_run(self)

    def sample(self: Noise, size: int) -> object:
        events.append("drawn")
        return real_sample(self, size)

    sql = "SELECT COUNT(*) FROM adult WHERE age > 30"
    pure_adult.sql(sql)  # the plan's first run binds before the charge
    pure_adult.sql("SET dpsql.epsilon = 0.05")  # a new measurement: not from the cache
    monkeypatch.setattr(_DuckDBPrepared, "run", run)
    monkeypatch.setattr(Noise, "sample", sample)
    pure_adult.sql(sql)
    assert events == ["run", "drawn"]

    def broken(self: Noise, size: int) -> object:
        raise RuntimeError("sampler broke")

    pure_adult.sql("SET dpsql.epsilon = 0.06")
    monkeypatch.setattr(Noise, "sample", broken)
    with pytest.raises(dpsql.InternalError):
        pure_adult.sql(sql)
    assert charges(pure_adult) == 3
    last = pure_adult.audit(last=1)[0]
    assert (last["outcome"], last["reason"]) == ("failed", dp_path.FAILED_REASON)


def test_a_refused_charge_ends_the_statements_snapshot(
        build: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 0.15},
                        cap={"epsilon": 0.15}, default={"epsilon": 0.1})
    events: list[str] = []
    real_prepare, real_close = DuckDBEngine.prepare, DuckDBEngine.close

    def slow_prepare(self: DuckDBEngine, query: object, text: object = None) -> object:
        time.sleep(0.3)  # far longer than the refusal takes
        events.append("bound")
        return real_prepare(self, query, text)  # type: ignore[arg-type]

    def close(self: DuckDBEngine) -> None:
        events.append("closed")
        real_close(self)

    sql = "SELECT COUNT(*) FROM adult WHERE age > 30"
    with dpsql.connect(build(text), "alice") as session:
        session.sql(sql)  # the plan's first run: bound before its charge
        session.sql("SET dpsql.epsilon = 0.08")  # a new measurement: not from the cache
        monkeypatch.setattr(DuckDBEngine, "prepare", slow_prepare)
        monkeypatch.setattr(DuckDBEngine, "close", close)
        with pytest.raises(dpsql.BudgetExceeded):
            session.sql(sql)  # bound, then refused at the charge
        assert events == ["bound", "closed"]  # the snapshot ends after the bind used it
        assert charges(session) == 1
        assert session.audit(last=1)[0]["outcome"] == "refused"


def test_explain_privacy_charges_nothing_and_matches_the_answer(pure_adult: Session) -> None:
    sql = "SELECT sex, COUNT(*) AS n, AVG(age) AS a FROM adult GROUP BY sex"
    explained = pure_adult.sql("EXPLAIN PRIVACY " + sql)
    assert explained.kind == "explain"
    assert explained.cost.is_zero
    assert charges(pure_adult) == 0
    assert explained.table.column("aggregate").to_pylist() == [
        "COUNT(*)", "AVG(age) [sum]", "AVG(age) [count]"]
    answer = pure_adult.sql(sql)
    assert answer.columns == explained.columns
    assert "would cost epsilon=0.1" in (explained.notice or "")
    assert pure_adult.sql("EXPLAIN PRIVACY " + sql).cached  # the repeat would be free


def test_rejections_are_audited_without_a_charge(pure_adult: Session) -> None:
    with pytest.raises(dpsql.QueryRejected):
        pure_adult.sql("SELECT MODE(age) FROM adult")
    assert charges(pure_adult) == 0
    row = pure_adult.audit(last=1)[0]
    assert row["outcome"] == "rejected"
    assert "MODE" in row["reason"]
    assert row["cost"] is None


def test_unbounded_budget_means_no_noise(exact_adult: Session) -> None:
    answer = exact_adult.sql("SELECT COUNT(*) FROM adult WHERE sex = 0")
    assert answer.cost.infinite
    assert answer.columns["count"]["mechanism"].startswith("none")
    assert answer.columns["count"]["std"] == 0


def test_concurrent_twins_get_the_same_numbers(build: Callable[..., Path]) -> None:
    """Two sessions asking the same question at once may both pay; they see one answer."""

    text = with_budgets(ADULT_POLICY, accounting="pure", budget={"epsilon": 5},
                        cap={"epsilon": 1}, default={"epsilon": 0.1})
    path = build(text)
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    results: list[object] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def ask() -> None:
        try:
            with dpsql.connect(path, "alice") as alice:
                barrier.wait()
                results.append(alice.sql(sql).table)
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results[0].equals(results[1])  # type: ignore[attr-defined]
    with dpsql.connect(path, "alice") as alice:
        assert charges(alice) in (1, 2)
        assert alice.sql(sql).table.equals(results[0])


def test_a_twin_that_saves_after_the_first_was_written_gets_its_numbers(
        pure_adult: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    # The slower twin looked the cache up before the first answer was kept, and
    # reaches its own save after that answer is written and no longer pending.
    sql = "SELECT race, COUNT(*) FROM adult GROUP BY race"
    first = pure_adult.sql(sql).table
    real, missed = dp_path.cache.lookup, []

    def late(store: object, key: str) -> object:  # the twin's look-up, before the first save
        if not missed:
            missed.append(key)
            return None
        return real(store, key)  # type: ignore[arg-type]

    monkeypatch.setattr(dp_path.cache, "lookup", late)
    second = pure_adult.sql(sql)
    assert not second.cached
    assert charges(pure_adult) == 2  # it paid, as a twin may
    # Five noisy counts, each equal by chance with probability below 0.05.
    assert second.table.equals(first)
