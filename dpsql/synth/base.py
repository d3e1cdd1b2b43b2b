"""What every synthesizer implements, and the registry that finds them by name.

A synthesizer never touches the ledger: the release charges the budget first,
then calls ``fit`` with that budget; ``spent`` reports what the fit really used
(never more). ``sample`` returns codes of the :class:`~dpsql.domain.Domain`;
the release decodes them.

The registry reads declarations (:mod:`dpsql.synth.catalog`): the built-ins',
those of third-party plugins in the ``dpsql.synthesizers`` entry-point group,
and those :func:`register` derives from a class. Listing and policy checks
read them without importing any synthesizer; :func:`get` imports only the
module of the one it is asked for (:func:`load`), and first says which extra to
install when a package it needs is missing.

The registry fails closed: a synthesizer that does not declare ``is_dp`` as a
bool, or whose options take a release parameter's name, is refused when it is
declared or registers, and again when its class is loaded (which must then
agree with its declaration) and when a release asks for it; never treated as DP.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from dpsql.errors import ConfigurationError, DPSQLError
from dpsql.synth.catalog import (
    BUILTIN,
    RELEASE_PARAMETERS,
    Declaration,
    check_option_names,
)

if TYPE_CHECKING:
    import duckdb
    import numpy as np
    import pyarrow as pa

    from dpsql.domain import Domain
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
    ``privacy_lowering_options``, ``version``, ``check(domain, budget)``,
    ``forecast(domain, budget)`` (a :class:`~dpsql.synth.forecast.Forecast`, from
    public facts only) and ``restore(state, domain)`` (see docs/releases.md).
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

#: The entry-point group of third-party synthesizers: each entry names a class, or a
#: :class:`Declaration` (then its class is imported only when a release asks for it).
ENTRY_POINTS = "dpsql.synthesizers"
#: Names of the built-in synthesizers (known without importing them: torch, jax).
BUILTIN_NAMES = tuple(d.name for d in BUILTIN)

_declared: dict[str, Declaration] = {d.name: d for d in BUILTIN}
_registry: dict[str, Factory] = {}  # classes loaded and checked against their declaration
_refused: dict[str, str] = {}  # plugins whose entry point broke the contract: why


class SynthesizerWarning(UserWarning):
    """A warning a synthesizer also lists in ``describe()['diagnostics']['warnings']``.

    A release reports those itself, so it silences this category while fitting.
    """


# -- the contract -----------------------------------------------------------------------


def diagnostic(name: str, passed: bool, value: Any, limit: Any, meaning: str) -> dict[str, Any]:
    """One diagnostic of a fit, as ``describe()['diagnostics']['checks']`` lists it.

    A synthesizer declares what a failed fit looks like as such checks (an
    importance-sampling ESS far below the draws, chains that disagree). They read
    only the fit's DP outputs. A release whose checks do not all pass is kept
    unpublished (see :func:`failed_checks`).
    """
    return {"check": name, "passed": bool(passed), "value": value, "limit": limit,
            "meaning": meaning}


def failed_checks(description: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks of a fitted model's ``describe()`` that failed (none declared: none failed).

    Fails closed: a check passes only when its ``passed`` is the boolean True; checks
    that are not a list of dicts count as one failed check.
    """
    checks = description.get("diagnostics", {}).get("checks", [])
    if not isinstance(checks, list) or not all(isinstance(c, Mapping) for c in checks):
        return [diagnostic("checks well formed", False, repr(checks)[:80], None,
                           "the synthesizer's checks are a list of dicts")]
    return [dict(c) for c in checks if c.get("passed") is not True]




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


def option_types(factory: Factory) -> dict[str, str] | None:
    """Each option and its type as the class annotates it ("" when unknown); None: any."""
    names = option_names(factory)
    if names is None:
        return None
    types = {f.name: type_text(f.type) for f in dataclasses.fields(factory)} \
        if dataclasses.is_dataclass(factory) else {}
    return {n: types.get(n, "") for n in sorted(names)}


def type_text(hint: Any) -> str:
    """An annotation as source text (``int | None``), whether postponed (a string) or not."""
    if isinstance(hint, str):
        return " ".join(hint.split())
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return str(hint).replace("typing.", "").replace("NoneType", "None")


def check_factory(name: str, factory: Factory) -> None:
    """Refuse a synthesizer that breaks the contract.

    Its ``is_dp`` is undeclared, or an option is named like a release parameter
    (or ``is_dp`` itself, which a caller could then set).
    """
    declared_dp(factory, name)
    check_option_names(name, option_names(factory) or ())


def describe(name: str, factory: Factory) -> Declaration:
    """The declaration of a loaded class (what :func:`register` and class plugins get)."""
    check_factory(name, factory)
    doc = (factory.__doc__ or "").strip().splitlines()
    return Declaration(name, f"{factory.__module__}:{factory.__qualname__}",
                       declared_dp(factory, name), doc[0] if doc else "",
                       output=getattr(factory, "output", "rows"), options=option_types(factory))


def check_matches(declaration: Declaration, factory: Factory) -> None:
    """Refuse a class that disagrees with its declaration (is_dp, output or options)."""
    actual = describe(declaration.name, factory)
    where = f"{factory.__module__}.{factory.__qualname__}"
    for field in ("is_dp", "output", "options"):
        said, found = getattr(declaration, field), getattr(actual, field)
        if field == "options" and said is not None and found is not None:
            said = {k: type_text(v) for k, v in said.items()}
        if said != found:
            raise ConfigurationError(
                f"synthesizer {declaration.name!r} is declared with {field} {_shown(said)}, but "
                f"its class {where} has {_shown(found)}; the declaration and the class must "
                "agree: refused")


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k}: {v}" if v else k for k, v in value.items()) + ")"
    return "any options" if value is None else repr(value)


# -- declaring and registering ------------------------------------------------------------


def register(name: str) -> Callable[[F], F]:
    """Class decorator: make a synthesizer available as ``get(name)``.

    Raises ConfigurationError for a class that breaks the contract (see
    :func:`check_factory`): it is refused, not registered. A class that
    implements a declared synthesizer must agree with its declaration.
    """

    def add(factory: F) -> F:
        declared = _declared.get(name)
        target = f"{factory.__module__}:{factory.__qualname__}"
        if declared is not None and declared.target == target:
            check_factory(name, factory)
            check_matches(declared, factory)
        else:
            declared = describe(name, factory)
        _declared[name] = declared
        _registry[name] = factory
        _refused.pop(name, None)
        return factory

    return add


def declare(declaration: Declaration) -> None:
    """Declare a synthesizer whose class is imported only when a release asks for it."""
    _declared[declaration.name] = declaration
    _registry.pop(declaration.name, None)
    _refused.pop(declaration.name, None)


def unregister(name: str) -> None:
    """Forget a registered or declared synthesizer (a built-in falls back to its declaration)."""
    _registry.pop(name, None)
    _refused.pop(name, None)
    _declared.pop(name, None)
    builtin = {d.name: d for d in BUILTIN}
    if name in builtin:
        _declared[name] = builtin[name]


def load_entry_point(entry: metadata.EntryPoint) -> None:
    """Declare a plugin, or remember why it is refused (reported when a release names it).

    An entry point naming a :class:`Declaration` costs an import of the module that
    holds it; its class loads on use. One naming a class loads it now.
    """
    try:
        target = entry.load()
        if isinstance(target, Declaration):
            if target.name != entry.name:
                raise ConfigurationError(f"entry point {entry.name!r} ({entry.value}) declares "
                                         f"a synthesizer named {target.name!r}; the names must "
                                         "agree")
            _declared[entry.name] = target
            return
        _declared[entry.name] = describe(entry.name, target)
        _registry[entry.name] = target
    except (DPSQLError, ImportError, AttributeError) as err:  # one broken plugin must not
        _refused[entry.name] = (str(err) if isinstance(err, DPSQLError) else  # take the others
                                f"synthesizer {entry.name!r} ({entry.value}) could not be "
                                f"loaded: {err}")


def _plugins() -> dict[str, metadata.EntryPoint]:
    """Installed plugins by name (a built-in's name wins), without loading them."""
    builtin = set(BUILTIN_NAMES)
    return {e.name: e for e in metadata.entry_points(group=ENTRY_POINTS) if e.name not in builtin}


def _load_plugins() -> None:
    for name, entry in _plugins().items():
        if name not in _declared and name not in _refused:
            load_entry_point(entry)


# -- reading the declarations ---------------------------------------------------------------


def known_names() -> set[str]:
    """Synthesizer names a policy may list: declared ones and installed plugins (none loaded)."""
    return set(_declared) | set(_registry) | set(_refused) | set(_plugins())


def declarations() -> list[Declaration]:
    """Every declared synthesizer, built-ins and plugins, by name (none of their classes loaded)."""
    _load_plugins()
    return [_declared[n] for n in sorted(_declared)]


def refused() -> dict[str, str]:
    """Plugins refused when they were declared: name -> why."""
    _load_plugins()
    return dict(_refused)


def available() -> list[str]:
    """Names of the synthesizers that can be loaded here (the packages they need are found)."""
    loadable = {d.name for d in declarations() if d.unavailable() is None}
    return sorted(loadable | set(_registry))


def unavailable(name: str) -> str | None:
    """Why synthesizer ``name`` cannot run here (unknown, refused, an extra missing), or None."""
    try:
        declared = declaration(name)
    except ConfigurationError as err:
        return str(err)
    return None if name in _registry else declared.unavailable()


def declaration(name: str) -> Declaration:
    """The declaration of ``name`` (an installed plugin's entry point is read first)."""
    if name not in _declared and name not in _refused:
        entry = _plugins().get(name)
        if entry is not None:
            load_entry_point(entry)
    if name in _refused:
        raise ConfigurationError(_refused[name])
    if name not in _declared:
        from dpsql.policy import did_you_mean

        known = sorted(known_names())
        raise ConfigurationError(f"unknown synthesizer {name!r}{did_you_mean(name, known)} "
                                 f"(known: {', '.join(known)})")
    return _declared[name]


def load(name: str) -> Factory:
    """The class of synthesizer ``name``, importing only its module, checked.

    Refused (ConfigurationError, before any charge) when a package it needs is
    missing (naming the extra to install), when it breaks the contract, or when
    it disagrees with its declaration. A class put in the registry by hand is
    checked again too.
    """
    factory = _registry.get(name)
    if factory is not None:
        check_factory(name, factory)
        if name in _declared:
            check_matches(_declared[name], factory)
        return factory
    declared = declaration(name)
    problem = declared.unavailable()
    if problem is not None:
        raise ConfigurationError(problem)
    try:
        found: Any = importlib.import_module(declared.module)
        for part in declared.qualname.split("."):
            found = getattr(found, part)
    except ImportError as err:
        raise ConfigurationError(f"synthesizer {name!r} could not be loaded ({err}); "
                                 f"reinstall what it needs: {declared.install()}") from err
    except AttributeError as err:
        raise ConfigurationError(f"synthesizer {name!r} is declared as {declared.target}, "
                                 f"which does not exist ({err})") from err
    check_factory(name, found)
    check_matches(declared, found)
    _registry[name] = found
    return typing.cast(Factory, found)


def get(name: str, /, **options: Any) -> Synthesizer:
    """A synthesizer by name, configured with ``options`` (strings are converted).

    Imports only that synthesizer's module (:func:`load`), checks the contract
    again and the options' names before building it: all public, before any charge.
    """
    factory = load(name)
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
            from dpsql.policy import did_you_mean

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
