"""Per-session and per-query options: ``SET dpsql.<name> = value`` and GoogleSQL's OPTIONS.

A query's privacy cost comes from, in order: the query's own
``WITH DIFFERENTIAL_PRIVACY OPTIONS (...)``, the session's ``SET dpsql.epsilon``
(or ``dpsql.rho``), and the policy's ``default_query``. The policy's per-query
cap and the budgets are enforced by the ledger when the query is charged.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpsql.errors import ConfigurationError, QueryRejected
from dpsql.policy import Dataset, Policy
from dpsql.privacy import PrivacyCost, budget_cost, check_delta, check_epsilon, to_fraction


@dataclass(frozen=True)
class Option:
    """One ``dpsql.*`` option: what it means and how its value is read."""

    name: str
    help: str


OPTIONS: dict[str, Option] = {
    "epsilon": Option("epsilon", "privacy cost of each query, as epsilon (under zcdp converted "
                      "with dpsql.delta); clears dpsql.rho"),
    "delta": Option("delta", "delta used to convert dpsql.epsilon under zcdp accounting "
                    "(default: the policy's delta)"),
    "rho": Option("rho", "privacy cost of each query as zCDP rho (zcdp policies only); "
                  "clears dpsql.epsilon"),
    "ci": Option("ci", "confidence level of the intervals added as <column>_ci_low/_ci_high "
                 "(e.g. 0.95), or off"),
    "nonnegative_counts": Option("nonnegative_counts", "on: report negative noisy counts (and "
                                 "their interval bounds) as 0; off (default): unbiased counts"),
    "target_error": Option("target_error", "EXPLAIN PRIVACY suggests the cost at which each "
                           "measurement's interval half-width is at most this (its own units)"),
}
_ON = {"on", "true", "1", "yes"}
_OFF = {"off", "none", "false", "0", "default", ""}


def option_name(name: str) -> str:
    """``dpsql.epsilon`` -> ``epsilon``; anything outside ``dpsql.*`` is rejected."""
    lowered = name.strip().lower()
    if not lowered.startswith("dpsql."):
        raise QueryRejected(f"SET {name} is not allowed", construct="SET",
                            advice="only dpsql.* options can be set: "
                            + ", ".join(f"dpsql.{n}" for n in OPTIONS))
    short = lowered[len("dpsql."):]
    if short not in OPTIONS:
        import difflib

        close = difflib.get_close_matches(short, list(OPTIONS), n=1)
        hint = f"did you mean dpsql.{close[0]}? " if close else ""
        raise QueryRejected(f"unknown option {name}", construct="SET",
                            advice=hint + "options: " + ", ".join(f"dpsql.{n}" for n in OPTIONS))
    return short


def read_value(name: str, raw: str) -> str | None:
    """Validate a value typed for option ``name``; returns its canonical text (None: unset)."""
    value = raw.strip()
    if value.lower() in _OFF and name == "ci":
        return None
    if value.lower() == "default":
        return None
    if name == "nonnegative_counts":
        if value.lower() not in _ON | _OFF:
            raise ConfigurationError(f"dpsql.nonnegative_counts is on or off, got {value}")
        return "on" if value.lower() in _ON else None
    if name == "target_error":
        error = _number(value, "dpsql.target_error")
        if not (0 < error < float("inf")):
            raise ConfigurationError(f"dpsql.target_error must be a positive number such as 10, "
                                     f"got {value}")
        return value
    if name == "ci":
        level = _number(value, "dpsql.ci")
        if not 0 < level < 1:
            raise ConfigurationError(f"dpsql.ci must be a confidence level in (0, 1) such as "
                                     f"0.95, got {value}")
        return value
    if name == "epsilon":
        check_epsilon(_exact(value, "dpsql.epsilon"))
    elif name == "delta":
        check_delta(_exact(value, "dpsql.delta"))
    elif name == "rho":
        rho = _exact(value, "dpsql.rho")
        if rho <= 0:
            raise ConfigurationError(f"dpsql.rho must be > 0, got {value}")
    return value


def set_option(options: MutableMapping[str, Any], name: str, raw: str) -> None:
    """Apply ``SET dpsql.<name> = raw`` to a session's options."""
    short = option_name(name)
    value = read_value(short, raw)
    if value is None:
        options.pop(short, None)
        return
    options[short] = value
    if short == "epsilon":
        options.pop("rho", None)
    elif short == "rho":
        options.pop("epsilon", None)


def reset_option(options: MutableMapping[str, Any], name: str) -> None:
    """``RESET dpsql.<name>`` (or ``RESET ALL``: every dpsql option)."""
    if name.strip().lower() == "all":
        for key in list(OPTIONS):
            options.pop(key, None)
        return
    options.pop(option_name(name), None)


def confidence(options: Mapping[str, Any]) -> float | None:
    """The confidence level of ``dpsql.ci``, or None when intervals are off."""
    value = options.get("ci")
    return None if value is None else float(value)


def nonnegative_counts(options: Mapping[str, Any]) -> bool:
    """Whether ``dpsql.nonnegative_counts`` is on."""
    return options.get("nonnegative_counts") == "on"


def target_error(options: Mapping[str, Any]) -> float | None:
    """The ``dpsql.target_error`` EXPLAIN PRIVACY suggests a cost for, if set."""
    value = options.get("target_error")
    return None if value is None else float(value)


def query_cost(policy: Policy, dataset: Dataset, session_options: Mapping[str, Any],
               query_options: Mapping[str, str]) -> PrivacyCost:
    """The cost a query is charged, in the policy's accounting (see module docstring)."""
    chosen = dict(query_options) if ("epsilon" in query_options or "rho" in query_options) \
        else {k: v for k, v in session_options.items() if k in ("epsilon", "rho", "delta")}
    if "delta" in query_options:
        chosen["delta"] = query_options["delta"]
    if "epsilon" not in chosen and "rho" not in chosen:
        if dataset.default_query is None:
            raise QueryRejected(
                f"the policy sets no default query cost for {dataset.name}",
                construct="privacy cost",
                advice="give one: SET dpsql.epsilon = 0.1, or SELECT WITH DIFFERENTIAL_PRIVACY "
                       "OPTIONS (epsilon = 0.1) ...")
        return dataset.default_query
    delta: Any = chosen.get("delta")
    if "epsilon" in chosen:
        if delta is None and policy.accounting == "zcdp":
            delta = policy.delta
        return budget_cost(policy.accounting, epsilon=_exact(chosen["epsilon"], "epsilon"),
                           delta=None if delta is None else _exact(str(delta), "delta"))
    if policy.accounting != "zcdp":
        raise ConfigurationError("a pure-DP policy counts epsilon; rho needs accounting: zcdp")
    return budget_cost(policy.accounting, rho=_exact(chosen["rho"], "rho"))


def _exact(value: str, what: str) -> Fraction:
    text = str(value).strip()
    if text.lower() in {"inf", "+inf", "infinity", ".inf", "nan"}:
        raise ConfigurationError(f"{what} must be a finite positive number, got {text}; an "
                                 "infinite epsilon or rho is not a privacy guarantee")
    return to_fraction(text, what)


def _number(value: str, what: str) -> float:
    try:
        return float(value)
    except ValueError as err:
        raise ConfigurationError(f"{what} must be a number, got {value!r}") from err
