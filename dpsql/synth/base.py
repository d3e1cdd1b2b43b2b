"""What every synthesizer implements, and the registry that finds them by name.

A synthesizer never touches the ledger: the release charges the budget first,
then calls ``fit`` with that budget; ``spent`` reports what the fit really used
(never more). ``sample`` returns codes of the :class:`~dpsql.domain.Domain`;
the release decodes them. Third-party synthesizers register through the
``dpsql.synthesizers`` entry-point group.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from importlib import metadata
from typing import Any, Protocol, TypeVar, runtime_checkable

import duckdb
import numpy as np
import pyarrow as pa

from dpsql.domain import Domain
from dpsql.errors import ConfigurationError
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
    """A method that turns a bounded source and a budget into a fitted model."""

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
_entry_points_loaded = False


def register(name: str) -> Callable[[F], F]:
    """Class decorator: make a synthesizer available as ``get(name)``."""

    def add(factory: F) -> F:
        _registry[name] = factory
        return factory

    return add


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
        _registry.setdefault(entry.name, entry.load())


# Modules that register built-in synthesizers when imported.
BUILTIN_MODULES: list[str] = [
    "dpsql.synth.histogram",
    "dpsql.synth.range_tree",
    "dpsql.synth.sds",
    "dpsql.synth.napsu_mq",
    "dpsql.synth.modp",
]
_missing: dict[str, str] = {}


class SynthesizerWarning(UserWarning):
    """A warning a synthesizer also lists in ``describe()['diagnostics']['warnings']``.

    A release reports those itself, so it silences this category while fitting.
    """


#: Names the built-in modules register (known without importing them, e.g. torch).
BUILTIN_NAMES = ("independent", "joint", "range", "sds", "napsu_mq", "modp")


def known_names() -> set[str]:
    """Synthesizer names a policy may list: built-ins, installed plugins, registered ones."""
    plugins = {e.name for e in metadata.entry_points(group="dpsql.synthesizers")}
    return set(BUILTIN_NAMES) | plugins | set(_registry)


def available() -> list[str]:
    """Names of every registered synthesizer."""
    _load_builtin()
    return sorted(_registry)


def get(name: str, **options: Any) -> Synthesizer:
    """A synthesizer by name, configured with ``options`` (strings are converted)."""
    _load_builtin()
    if name not in _registry:
        hint = did_you_mean(name, list(_registry))
        extra = ""
        if _missing:
            extra = "; some synthesizers need extras: pip install 'dpsql[all]'"
        raise ConfigurationError(f"unknown synthesizer {name!r}{hint} (available: "
                                 f"{', '.join(sorted(_registry))}){extra}")
    factory = _registry[name]
    synthesizer: Synthesizer = factory(**convert_options(factory, options))
    return synthesizer


def convert_options(factory: Factory, options: dict[str, Any]) -> dict[str, Any]:
    """Check option names against a dataclass factory and convert ``--option`` strings."""
    if not dataclasses.is_dataclass(factory):
        return options
    hints = typing.get_type_hints(factory)
    fields = {f.name: f for f in dataclasses.fields(factory) if f.init}
    out = {}
    for key, value in options.items():
        if key not in fields:
            raise ConfigurationError(f"unknown option {key!r}{did_you_mean(key, list(fields))}; "
                                     f"options: {', '.join(sorted(fields))}")
        out[key] = _convert(key, value, hints.get(key, str))
    return out


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
