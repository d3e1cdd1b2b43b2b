"""What every synthesizer implements, and the registry that finds them by name.

A synthesizer never touches the ledger: the release charges the budget first,
then calls ``fit`` with that budget; ``spent`` reports what the fit really used
(never more). ``sample`` returns codes of the :class:`~dpsql.domain.Domain`;
the release decodes them. Third-party synthesizers register through the
``dpsql.synthesizers`` entry-point group.

The registry fails closed: a synthesizer that does not declare ``is_dp`` as a
bool, or whose options take a release parameter's name, is refused when it
registers (and again when a release asks for it), never treated as DP.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from importlib import metadata
from typing import Any, Protocol, TypeVar, runtime_checkable

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError, DPSQLError
from dpsql.policy import did_you_mean
from dpsql.privacy import PrivacyCost
from dpsql.progress import Progress


@runtime_checkable
class FittedSynthesizer(Protocol):
    """A fitted model: everything it holds is DP (or labelled empirical)."""

    spent: PrivacyCost
    rows: int  # the synthesizer's (DP or public) estimate of the source's row count

    def sample(self, n: int, rng: np.random.Generator) -> pa.Table:
        """``n`` synthetic rows as domain codes (one int column per attribute)."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-able parameters, measurements (descriptors) and diagnostics."""
        ...


@runtime_checkable
class Synthesizer(Protocol):
    """A method that turns a bounded source and a budget into a fitted model.

    ``is_dp`` must be declared on the class (a bool, or a descriptor giving one
    per configured instance); ``False`` needs the policy's ``allow_non_dp``.
    Options are the constructor's keyword parameters and never take a name of
    :data:`RELEASE_PARAMETERS`. Optional members the release reads:
    ``output`` (``"rows"`` or ``"representation"``), ``product_suffixes``,
    ``privacy_lowering_options``, ``version``, ``check(domain, budget)`` and
    ``restore(state, domain)`` (see docs/releases.md).
    """

    name: str
    is_dp: bool

    def fit(self, source: duckdb.DuckDBPyRelation, domain: Domain, budget: PrivacyCost,
            rng: np.random.Generator, progress: Progress | None = None) -> FittedSynthesizer:
        """Fit within ``budget``; counting stays in DuckDB where the method allows."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A fitted synthesizer whose DP state can be saved, so more copies cost nothing."""

    def state(self) -> dict[str, Any]:
        """JSON-able DP state (e.g. a posterior summary) from which to sample again."""
        ...


Factory = Callable[..., Any]  # a Synthesizer class (or a function returning one)
F = TypeVar("F", bound=Factory)
_registry: dict[str, Factory] = {}
_refused: dict[str, str] = {}  # plugins whose entry point broke the contract: why
_entry_points_loaded = False

#: Parameters of a release (``Session.release``), with the CLI flag that sets each:
#: a synthesizer option of the same name could never be told apart from them.
RELEASE_PARAMETERS: dict[str, str] = {
    "dataset": "the DATASET argument", "synthesizer": "--synth", "name": "--name",
    "epsilon": "--epsilon", "delta": "--delta", "rho": "--rho", "rows": "--rows",
    "copies": "--copies", "columns": "--columns", "seed": "--seed", "replace": "--replace",
    "progress": "progress= (Python only)", "options": "one --option per synthesizer option",
}


def register(name: str) -> Callable[[F], F]:
    """Class decorator: make a synthesizer available as ``get(name)``.

    Raises ConfigurationError for a class that breaks the contract (see
    :func:`check_factory`): it is refused, not registered.
    """

    def add(factory: F) -> F:
        check_factory(name, factory)
        _registry[name] = factory
        return factory

    return add


def declared_dp(synthesizer: Any, name: str) -> bool:
    """The ``is_dp`` a synthesizer (class or instance) declares; refused unless a bool.

    Fails closed: a missing or non-bool flag is an error, never read as DP.
    """
    flag = getattr(synthesizer, "is_dp", None)
    if not isinstance(flag, bool):
        declared_by = isinstance(synthesizer, type) or inspect.isfunction(synthesizer)
        what = synthesizer if declared_by else type(synthesizer)
        raise ConfigurationError(
            f"synthesizer {name!r} ({what.__module__}.{what.__qualname__}) does not declare "
            "is_dp; its class must say is_dp = True (differentially private) or is_dp = False "
            "(a release then needs allow_non_dp: true in the policy)")
    return flag


def option_names(factory: Factory) -> set[str] | None:
    """The options ``factory`` takes (its keyword parameters); None when it takes any."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def check_factory(name: str, factory: Factory) -> None:
    """Refuse a synthesizer that breaks the contract.

    Its ``is_dp`` is undeclared, or an option is named like a release parameter
    (or ``is_dp`` itself, which a caller could then set).
    """
    declared_dp(factory, name)
    taken = sorted((option_names(factory) or set()) & {*RELEASE_PARAMETERS, "is_dp"})
    if taken:
        raise ConfigurationError(
            f"synthesizer {name!r} has options named {', '.join(taken)}, which the release "
            "itself takes; rename them")


def _load_builtin() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    import importlib

    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as err:  # an optional extra (torch, numpyro) is not installed
            _missing[module] = str(err)
    for entry in metadata.entry_points(group="dpsql.synthesizers"):
        if entry.name not in _registry:
            load_entry_point(entry)


def load_entry_point(entry: metadata.EntryPoint) -> None:
    """Register a plugin, or remember why it is refused (reported when a release names it)."""
    try:
        factory = entry.load()
        check_factory(entry.name, factory)
    except DPSQLError as err:  # one broken plugin must not take the others down
        _refused[entry.name] = str(err)
        return
    _registry[entry.name] = factory


# Modules that register built-in synthesizers when imported.
BUILTIN_MODULES: list[str] = [
    "dpsql.synth.histogram",
    "dpsql.synth.range_tree",
    "dpsql.synth.sds",
    "dpsql.synth.napsu_mq",
    "dpsql.synth.modp",
    "dpsql.synth.aim",
]
_missing: dict[str, str] = {}


class SynthesizerWarning(UserWarning):
    """A warning a synthesizer also lists in ``describe()['diagnostics']['warnings']``.

    A release reports those itself, so it silences this category while fitting.
    """


#: Names the built-in modules register (known without importing them, e.g. torch).
BUILTIN_NAMES = ("independent", "joint", "range", "sds", "napsu_mq", "modp", "aim", "mst")


def known_names() -> set[str]:
    """Synthesizer names a policy may list: built-ins, installed plugins, registered ones."""
    plugins = {e.name for e in metadata.entry_points(group="dpsql.synthesizers")}
    return set(BUILTIN_NAMES) | plugins | set(_registry)


def available() -> list[str]:
    """Names of every registered synthesizer."""
    _load_builtin()
    return sorted(_registry)


def get(name: str, /, **options: Any) -> Synthesizer:
    """A synthesizer by name, configured with ``options`` (strings are converted).

    Checks the contract again (a class put in the registry by hand is refused
    too) and the options' names before building it: all public, before any charge.
    """
    _load_builtin()
    if name in _refused:
        raise ConfigurationError(_refused[name])
    if name not in _registry:
        hint = did_you_mean(name, list(_registry))
        extra = ""
        if _missing:
            extra = "; some synthesizers need extras: pip install 'dpsql[all]'"
        raise ConfigurationError(f"unknown synthesizer {name!r}{hint} (available: "
                                 f"{', '.join(sorted(_registry))}){extra}")
    factory = _registry[name]
    check_factory(name, factory)
    synthesizer: Synthesizer = factory(**convert_options(name, factory, options))
    declared_dp(synthesizer, name)
    return synthesizer


def convert_options(name: str, factory: Factory, options: dict[str, Any]) -> dict[str, Any]:
    """Check option names against ``factory`` and convert ``--option`` strings (dataclasses)."""
    accepted = option_names(factory)
    for key in options:
        if key in RELEASE_PARAMETERS:
            raise ConfigurationError(f"{key!r} is a release parameter, not an option of {name}; "
                                     f"use {RELEASE_PARAMETERS[key]} instead")
        if accepted is not None and key not in accepted:
            raise ConfigurationError(f"unknown option {key!r} of {name} (options: "
                                     f"{', '.join(sorted(accepted)) or 'none'})"
                                     f"{did_you_mean(key, list(accepted))}")
    if not dataclasses.is_dataclass(factory):
        return options
    hints = typing.get_type_hints(factory)
    return {key: _convert(key, value, hints.get(key, str)) for key, value in options.items()}


def _convert(key: str, value: Any, hint: Any) -> Any:
    """Read an ``--option`` string as ``hint``.

    Numbers, booleans, ``a,b`` lists and ``a+b,c+d`` lists of column sets.
    """
    if not isinstance(value, str):
        return value
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if type(None) in typing.get_args(hint):
        if value.lower() in ("none", "null", ""):
            return None
        hint = args[0]
    try:
        if hint is bool:
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            return value.lower() in ("true", "1", "yes")
        if hint in (int, float, str):
            return hint(value)
        if typing.get_origin(hint) in (tuple, list):
            item = typing.get_args(hint)[0] if typing.get_args(hint) else str
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if typing.get_origin(item) in (tuple, list):
                return tuple(tuple(p.split("+")) for p in parts)
            return tuple(item(p) for p in parts)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(f"option {key}={value!r} is not a valid {hint}") from err
    return value
