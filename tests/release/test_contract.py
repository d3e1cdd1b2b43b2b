"""The synthesizer contract fails closed: an undeclared ``is_dp`` or a colliding option is
refused by name, before any charge, and never read as DP."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pytest

import dpsql
from dpsql.errors import ConfigurationError, ReleaseError
from dpsql.privacy import PrivacyCost
from dpsql.session import Session
from dpsql.synth import base

from .conftest import release_policy


class FittedUniform:
    """Uniform codes over the public domain, 20 rows: nothing of the source."""

    def __init__(self, domain, kind: str) -> None:
        self.domain = domain
        self.spent = PrivacyCost.zero(kind)
        self.rows = 20

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        return pa.table({a.name: rng.integers(0, a.size, n) for a in self.domain.attributes})

    def describe(self) -> dict:
        return {"parameters": {}}


class Undeclared:
    """A plugin that forgets to say whether it is DP (reads no row, but must still say so)."""

    name = "uniform"

    def __init__(self, spread: int = 1) -> None:
        self.spread = spread

    def fit(self, source, domain, budget, rng, progress=None):
        return FittedUniform(domain, budget.kind)


class Declared(Undeclared):
    is_dp: ClassVar[bool] = True


class DeclaredNotDP(Undeclared):
    is_dp: ClassVar[bool] = False


class SaysYes(Undeclared):
    is_dp = "yes"  # truthy, but not a declaration


def make_uniform(spread: int = 1) -> Declared:
    """A factory function: it cannot declare is_dp for what it returns, so it is refused."""
    return Declared(spread)


class TakesSeed(Declared):
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    base.available()
    yield
    for name in ("uniform", "uniform_not_dp", "slipped", "broken", "seeded", "says_yes"):
        base.unregister(name)


def plugin_store(make_store, synthesizer: str, **policy) -> Session:
    """An admin session on a store whose policy allows ``synthesizer`` (registered first)."""
    return dpsql.connect(make_store(release_policy(synthesizers=synthesizer, **policy)), "admin")


def audited_refusal(session: Session) -> bool:
    return session.audit(last=1)[0]["outcome"] == "refused"


# -- is_dp must be declared ---------------------------------------------------------------------


@pytest.mark.parametrize("factory", [Undeclared, SaysYes, make_uniform],
                         ids=["missing", "not-a-bool", "function"])
def test_registration_refuses_an_undeclared_is_dp(factory):
    with pytest.raises(ConfigurationError, match=f"{factory.__qualname__}.*does not declare "
                                                 "is_dp"):
        base.register("says_yes")(factory)
    assert "says_yes" not in base.available()


def test_a_declared_plugin_registers_and_releases(make_store):
    base.register("uniform")(Declared)
    with plugin_store(make_store, "uniform") as admin:
        result = admin.release("adult", synthesizer="uniform", epsilon=1, name="u",
                               columns=["sex"], spread="2")
        assert result.record["privacy"] == "dp"
        assert not admin.ledger.budget("admin", "adult").spent.is_zero


def test_a_plugin_that_slipped_into_the_registry_is_refused_at_release(make_store):
    base._registry["slipped"] = Undeclared  # bypassing register()
    with plugin_store(make_store, "slipped") as admin:
        with pytest.raises(ConfigurationError, match=r"'slipped'.*Undeclared\) does not declare"):
            admin.release("adult", synthesizer="slipped", epsilon=1, name="u")
        assert admin.ledger.budget("admin", "adult").spent.is_zero
        assert audited_refusal(admin)


def test_an_entry_point_without_is_dp_is_refused_and_says_why():
    entry = metadata.EntryPoint(name="broken", value=f"{__name__}:Undeclared",
                                group="dpsql.synthesizers")
    base.load_entry_point(entry)
    assert "broken" not in base.available()
    with pytest.raises(ConfigurationError, match=r"'broken'.*does not declare is_dp"):
        base.get("broken")


def test_not_dp_still_needs_the_policys_allowance(make_store):
    base.register("uniform_not_dp")(DeclaredNotDP)
    with plugin_store(make_store, "uniform_not_dp") as admin:
        with pytest.raises(ReleaseError, match="allow_non_dp: true"):
            admin.release("adult", synthesizer="uniform_not_dp", epsilon=1, name="u")
        assert audited_refusal(admin)
    with plugin_store(make_store, "uniform_not_dp", allow_non_dp=True) as admin:
        result = admin.release("adult", synthesizer="uniform_not_dp", epsilon=1, name="u",
                               columns=["sex"])
        assert result.record["privacy"] == "empirical"
        assert admin.ledger.budget("admin", "adult").spent.is_zero


# -- options never collide with release parameters ----------------------------------------------


def test_release_parameters_are_the_signature_of_session_release():
    signature = inspect.signature(Session.release).parameters
    named = {n for n, p in signature.items() if p.kind is not p.VAR_KEYWORD} - {"self"}
    assert named == set(base.RELEASE_PARAMETERS)


def test_registration_refuses_an_option_named_like_a_release_parameter():
    with pytest.raises(ConfigurationError, match="options named seed"):
        base.register("seeded")(TakesSeed)
    assert "seeded" not in base.available()


@pytest.mark.parametrize("key", sorted(base.RELEASE_PARAMETERS))
def test_a_release_parameter_given_as_an_option_is_refused_before_the_charge(admin_session,
                                                                              key):
    with pytest.raises(ConfigurationError,
                       match=rf"'{key}' is a release parameter.*use {base.RELEASE_PARAMETERS[key]}"
                             .replace("(", r"\(").replace(")", r"\)")):
        admin_session.release("adult", synthesizer="independent", epsilon=1, name="x",
                              options={key: "3"})
    assert admin_session.ledger.budget("admin", "adult").spent.is_zero
    assert audited_refusal(admin_session)


def test_options_come_one_way(admin_session):
    with pytest.raises(ConfigurationError, match="not both"):
        admin_session.release("adult", synthesizer="joint", epsilon=1, name="x",
                              options={"postprocess": "clip"}, max_cells="10")


def test_an_unknown_option_of_a_plain_class_lists_the_accepted_ones(make_store):
    base.register("uniform")(Declared)
    with plugin_store(make_store, "uniform") as admin:
        with pytest.raises(ConfigurationError,
                           match=r"unknown option 'sprad' of uniform \(options: spread\); "
                                 "did you mean 'spread'"):
            admin.release("adult", synthesizer="uniform", epsilon=1, name="u",
                          options={"sprad": "2"})
        assert admin.ledger.budget("admin", "adult").spent.is_zero
        assert audited_refusal(admin)


def dpsql_cli(*args, db):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DPSQL_DB": str(db)}
    return subprocess.run([sys.executable, "-m", "dpsql", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize(("option", "message"), [
    pytest.param("seed=3", "'seed' is a release parameter, not an option of independent; use "
                           "--seed instead", id="release-parameter"),
    pytest.param("count_shar=0.1", "unknown option 'count_shar' of independent (options: "
                                   "count_share, postprocess); did you mean 'count_share'?",
                 id="unknown"),
])
def test_the_cli_refuses_a_bad_option_as_usage_and_charges_nothing(store_path, option,
                                                                     message):
    done = dpsql_cli("release", "adult", "--synth", "independent", "--epsilon", "1", "--name",
                     "x", "--option", option, db=store_path)
    assert done.returncode == ConfigurationError.exit_code, done.stderr
    assert message in done.stderr
    assert "internal error" not in done.stderr
    with dpsql.connect(store_path, "admin") as admin:
        assert admin.ledger.budget("admin", "adult").spent.is_zero
        assert audited_refusal(admin)
