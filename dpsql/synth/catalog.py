"""The synthesizers dpsql ships, declared by name, without importing their code.

A :class:`Declaration` says what a release, a policy check and a listing need
to know before a synthesizer's module is loaded: whether it is DP, what it
outputs, its options (with the types ``--option`` strings convert to), a
one-line summary, the extra it needs and the class that implements it.
:func:`dpsql.synth.get` imports only the module of the synthesizer it is asked
for, and refuses a class that disagrees with its declaration; whether an extra
is installed is read with :func:`importlib.util.find_spec`, which imports
nothing. This module imports only the standard library and :mod:`dpsql.errors`,
so the server, every release worker and ``dpsql releases synthesizers`` read it
for free (torch, JAX and NumPyro load only for the synthesizers that need them).

A declaration fails closed, like a class (:func:`dpsql.synth.base.check_factory`):
``is_dp`` must be a bool, and no option may take a release parameter's name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dpsql.errors import ConfigurationError

#: Parameters of a release (``Session.release``), with the CLI flag that sets each:
#: a synthesizer option of the same name could never be told apart from them.
RELEASE_PARAMETERS: dict[str, str] = {
    "dataset": "the DATASET argument", "synthesizer": "--synth", "name": "--name",
    "epsilon": "--epsilon", "delta": "--delta", "rho": "--rho", "rows": "--rows",
    "copies": "--copies", "columns": "--columns", "seed": "--seed", "replace": "--replace",
    "progress": "progress= (Python only)", "options": "one --option per synthesizer option",
    "force": "--force",
}

#: Options no synthesizer may take: a caller could then set them.
RESERVED_OPTIONS = frozenset({*RELEASE_PARAMETERS, "is_dp"})

#: The packages (import names) each extra of pyproject.toml brings that a synthesizer needs.
EXTRAS: dict[str, tuple[str, ...]] = {
    "modp": ("torch", "dp_accounting"),
    "napsu": ("jax", "numpyro", "threadpoolctl"),
    "synth": ("mbi", "opt_einsum"),
}

OUTPUTS = ("rows", "representation")


@dataclass(frozen=True)
class Declaration:
    """A synthesizer by name: its metadata, and where its class lives (``module:Class``).

    ``options`` maps each option to its type as the class annotates it (``""`` when
    the class does not say; None when it takes any keyword). ``is_dp`` is what the
    class says; a synthesizer that decides per configured instance (MODP's
    ``mode``) declares its class's answer (False) and says in ``dp_when`` which
    setting makes it DP. ``extra`` names the dpsql extra it needs (its packages
    are in :data:`EXTRAS`); a plugin lists its own packages in ``requires``.
    """

    name: str
    target: str
    is_dp: bool
    summary: str
    output: str = "rows"
    options: Mapping[str, str] | None = field(default_factory=dict)
    extra: str = ""
    requires: tuple[str, ...] = ()
    dp_when: str = ""

    def __post_init__(self) -> None:
        check_declaration(self)

    @property
    def module(self) -> str:
        """The module that defines the class."""
        return self.target.partition(":")[0]

    @property
    def qualname(self) -> str:
        """The class's name inside its module."""
        return self.target.partition(":")[2]

    @property
    def packages(self) -> tuple[str, ...]:
        """The packages it needs beyond dpsql's core (import names)."""
        return self.requires or EXTRAS.get(self.extra, ())

    def missing(self) -> list[str]:
        """The packages it needs that are not installed (found without importing them)."""
        return [p for p in self.packages if not _installed(p)]

    def install(self) -> str:
        """The command that installs what it needs."""
        if self.extra:
            return f"pip install 'dpsql[{self.extra}]'"
        return "pip install " + " ".join(self.missing() or self.packages)

    def unavailable(self) -> str | None:
        """Why it cannot be loaded here (a package is missing), or None when it can."""
        missing = self.missing()
        if not missing:
            return None
        what = f"the {self.extra} extra" if self.extra else "packages"
        return (f"synthesizer {self.name!r} needs {what} ({', '.join(missing)} not installed): "
                f"{self.install()}")


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package that cannot load, or a broken spec
        return False


def check_declaration(d: Declaration) -> None:
    """Refuse a declaration that breaks the contract (fail closed: never read as DP)."""
    if not isinstance(d.name, str) or not d.name or d.name != d.name.strip():
        raise ConfigurationError(f"a synthesizer declaration needs a name, got {d.name!r}")
    if not isinstance(d.is_dp, bool):
        raise ConfigurationError(
            f"synthesizer {d.name!r} ({d.target}) does not declare is_dp as a bool; its "
            "declaration must say is_dp=True (differentially private) or is_dp=False (a "
            "release then needs allow_non_dp: true in the policy)")
    module, _, qualname = d.target.partition(":")
    if not module or not qualname:
        raise ConfigurationError(f"synthesizer {d.name!r}: target {d.target!r} must be "
                                 "'module:Class'")
    if d.output not in OUTPUTS:
        raise ConfigurationError(f"synthesizer {d.name!r}: output must be one of "
                                 f"{', '.join(OUTPUTS)}, got {d.output!r}")
    if d.extra and d.extra not in EXTRAS:
        raise ConfigurationError(f"synthesizer {d.name!r}: no dpsql extra {d.extra!r} (extras: "
                                 f"{', '.join(EXTRAS)}); a plugin lists its packages in "
                                 "requires")
    check_option_names(d.name, d.options or ())


def check_option_names(name: str, options: Iterable[str]) -> None:
    """Refuse options named like a release parameter (or ``is_dp``)."""
    taken = sorted(set(options) & RESERVED_OPTIONS)
    if taken:
        raise ConfigurationError(
            f"synthesizer {name!r} has options named {', '.join(taken)}, which the release "
            "itself takes; rename them")


_HISTOGRAM = {"count_share": "float", "postprocess": "str"}
_PGM = {"max_cells": "int", "iters": "int"}

#: Every synthesizer dpsql ships. ``tests/synth/test_catalog.py`` loads each and checks it.
BUILTIN: tuple[Declaration, ...] = (
    Declaration(
        "independent", "dpsql.synth.histogram:Independent", True,
        "One noisy 1-way marginal per column; columns are sampled independently.",
        options=_HISTOGRAM),
    Declaration(
        "joint", "dpsql.synth.histogram:Joint", True,
        "One noisy n-way marginal over all chosen columns, sampled as whole tuples.",
        options={**_HISTOGRAM, "max_cells": "int", "expected_rows": "int | None",
                 "max_noise_ratio": "float"}),
    Declaration(
        "range", "dpsql.synth.range_tree:RangeTree", True,
        "A DP tree histogram of one or two numeric columns, answering any range query.",
        output="representation", options={"branching": "int | None"}),
    Declaration(
        "sds", "dpsql.synth.sds:SDS", True,
        "Synthetic Data Showcase: DP k-tuple counts, then aggregate-seeded synthesis.",
        options={"reporting_length": "int", "percentile": "int",
                 "percentile_epsilon_proportion": "float",
                 "number_of_records_epsilon_proportion": "float",
                 "sigma_proportions": "tuple[float, ...] | None", "threshold_type": "str",
                 "thresholds": "tuple[float, ...] | None", "prune_uncovered": "bool",
                 "paired_pass": "bool", "use_synthetic_counts": "bool",
                 "weight_selection_percentile": "int"}),
    Declaration(
        "napsu_mq", "dpsql.synth.napsu_mq.synthesizer:NapsuMQ", True,
        "Noise-aware Bayesian synthesis (NAPSU-MQ): a posterior over the data, copies from it.",
        extra="napsu",
        options={"cliques": "tuple[tuple[str, ...], ...]", "select": "str",
                 "select_share": "float", "inference": "str", "covariance": "str",
                 "pilot_warmup": "int", "pilot_samples": "int", "moves": "int", "jumps": "int",
                 "chains": "int", "warmup": "int", "samples": "int", "max_tree_depth": "int",
                 "target_accept": "float", "workers": "int", "laplace_iterations": "int",
                 "restarts": "int", "prior_sd": "float", "keep_draws": "int",
                 "sampling": "str", "max_parameters": "int", "max_memory_mb": "float",
                 "max_minutes": "float"}),
    Declaration(
        "modp", "dpsql.synth.modp.synthesizer:Modp", False,
        "Minus-one data prediction (Press 2024): not DP as published; DP with mode=dp.",
        extra="modp", dp_when="mode=dp",
        options={"mode": "str", "blades": "int", "reduced_features": "int", "device": "str",
                 "lr": "float | None", "epochs": "int", "warmup_epochs": "int",
                 "batch_size": "int", "patience": "int", "structural_zeros": "bool",
                 "passthrough": "float", "two_instance": "float", "diagnostic_rows": "int",
                 "steps": "int", "clip": "float", "sampling_rate": "float",
                 "seed_share": "float", "passes": "int"}),
    Declaration(
        "aim", "dpsql.synth.aim:AIM", True,
        "Workload-aware adaptive selection of marginals, Gaussian measurements, Private-PGM.",
        extra="synth",
        options={**_PGM, "workload": "tuple[tuple[str, ...], ...] | None",
                 "rounds": "int | None", "select_share": "float", "round_iters": "int",
                 "per_round": "int"}),
    Declaration(
        "mst", "dpsql.synth.mst:MST", True,
        "A maximum spanning tree of 2-way marginals, chosen privately, then Private-PGM.",
        extra="synth", options={**_PGM, "oneway_share": "float", "select_share": "float"}),
)
