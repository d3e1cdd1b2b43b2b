"""DP partition selection: which keys of a GROUP BY column with no value list are released.

A categorical column the policy lists no values for has no public key set, so
the keys an answer shows come from the data and must themselves be DP. Every
key present in the bounded source gets a noisy row count (the query's COUNT(*)
measure, with the noise every count gets); a key is released only if its noisy
count is at least ``tau``. The released counts are that same draw, so a
``COUNT(*)`` in the query reuses them (post-processing); other aggregates spend
their own share on the released keys only.

Privacy: the noisy counts and their threshold are the mechanism
:class:`dpsql.mechanisms.threshold.KeyThreshold`, its proof beside it: with the
COUNT(*) measure's discrete Gaussian noise of ``rho_share`` and ``tau = m +
ceil(sigma * sqrt(2 ln(m / delta)))`` for ``m = max_rows``, the selection is
``delta``-approximate ``rho_share``-zCDP. Approximate zCDP composes by adding
rhos and adding deltas, so each query's selection gets the policy's delta
times the query's share of the dataset's total budget (:func:`selection_delta`):
however many queries select keys, their deltas add up to at most the policy's
delta (the ledger keeps each with its charge and refuses one that would pass
it), and the dataset's guarantee stays (epsilon(rho, delta_policy), 2 delta_policy)-DP at the most,
where epsilon is what the ledger shows. Pure accounting has no delta, so it
refuses such a query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dpsql.errors import InternalError
from dpsql.mechanisms.additive import Noise
from dpsql.mechanisms.gaussian import GaussianMechanism
from dpsql.mechanisms.threshold import KeyThreshold
from dpsql.mechanisms.threshold import leak_bound as tail_bound
from dpsql.privacy import PrivacyCost
from dpsql.query.model import GroupKey, Measure, QueryPlan

#: The measure whose noisy counts decide which keys are released.
COUNT_ROWS = Measure("count", None)


def selects_keys(plan: QueryPlan) -> bool:
    """Whether the plan's keys are chosen by partition selection (not public)."""
    return any(k.mode == "selected" for k in plan.keys)


def selection_delta(policy_delta: float | None, cost: PrivacyCost,
                    total: PrivacyCost) -> float | None:
    """The delta one query's selection spends: the policy's, times the query's share of ``total``.

    ``cost``: the query's; ``total``: its dataset's budget, which the ledger keeps
    the sum of every charge under, so the selections' deltas sum to at most the
    policy's: the share is rounded down to a float, so that the floats the ledger
    sums exactly do too. The ledger also refuses a selection that would bring the
    dataset's lifetime sum past the policy's delta (a policy apply that raises the
    budget leaves the earlier, larger shares spent). A dataset without a finite
    budget promises nothing finite: each selection then spends the policy's delta.
    """
    if policy_delta is None:
        return None
    if total.infinite or cost.infinite or total.is_zero:
        return policy_delta
    exact = Fraction(policy_delta) * min(Fraction(1), cost.value / total.value)
    share = float(exact)
    return share if Fraction(share) <= exact else math.nextafter(share, 0.0)


def _counts(noise: Noise) -> GaussianMechanism:
    """The discrete Gaussian of a COUNT(*) measure (anything else is a bug)."""
    base = noise.base
    if not isinstance(base, GaussianMechanism) or noise.exponent != 0:
        raise InternalError("partition selection needs a discrete Gaussian count and a delta; "
                            "this is a bug in dpsql")
    return base


def threshold(noise: Noise, max_rows: int, delta: float) -> int:
    """The least noisy count a key needs to be released (:class:`KeyThreshold`).

    Without noise (an unbounded budget) every key present is released.
    """
    if not noise.noisy:
        return 1
    return KeyThreshold.over(_counts(noise), max_rows, delta).tau


def leak_bound(noise: Noise, max_rows: int, tau: int) -> float:
    """The most probability with which any key held by one unit alone is released."""
    if not noise.noisy:
        return 1.0
    return tail_bound(_counts(noise).sigma2, max_rows, tau)


@dataclass(frozen=True)
class Selection:
    """How a plan's keys are selected: the deciding measure, its threshold and delta."""

    measure: int
    tau: int
    delta: float

    @classmethod
    def of(cls, plan: QueryPlan, noises: tuple[Any, ...], delta: float | None) -> Selection | None:
        """The selection of ``plan`` (None when its keys are public)."""
        if not selects_keys(plan):
            return None
        measure = plan.measures.index(COUNT_ROWS)
        noise = noises[measure]
        if not noise.noisy:
            return cls(measure, 1, 0.0)
        if not delta:
            raise InternalError("partition selection without a delta; this is a bug in dpsql")
        return cls(measure, threshold(noise, plan.dataset.max_rows, delta), delta)

    def describe(self) -> dict[str, Any]:
        """JSON-able: the rule, its threshold and the delta it costs."""
        return {"mechanism": "partition selection (noisy COUNT(*) >= tau)", "tau": self.tau,
                "delta": self.delta}


def released(plan: QueryPlan, values: tuple[Any, ...]) -> QueryPlan:
    """``plan`` with its selected key set to the released ``values`` (public from now on)."""
    key = plan.keys[0]
    return replace(plan, keys=(GroupKey(key.column, "selected", values),))


def select_keys(plan: QueryPlan, sparse: pa.Table, noises: tuple[Noise, ...],
                selection: Selection) -> tuple[QueryPlan, list[np.ndarray]]:
    """Threshold the noisy counts of the keys found, then noise the other measures on the rest.

    ``sparse``: one row per key present (``_k0``) with each measure's exact value
    (``_m{j}``). Returns the plan over the released keys (sorted, NULL last) and
    each measure's noisy vector over them.
    """
    column = sparse.column("_k0")
    if pa.types.is_dictionary(column.type):  # an ENUM column arrives dictionary-encoded
        column = column.cast(column.type.value_type)
    exact = [sparse.column(f"_m{j}").fill_null(0).to_numpy(zero_copy_only=False)
             .astype(np.int64) for j in range(len(plan.measures))]
    counts = noises[selection.measure].release(exact[selection.measure])
    kept = np.flatnonzero(counts >= selection.tau)
    kept_keys = column.take(pa.array(kept, pa.int64())).combine_chunks()
    order = kept[pc.array_sort_indices(kept_keys, null_placement="at_end").to_numpy()]
    noisy = [counts[order] if j == selection.measure else noise.release(values[order])
             for j, (values, noise) in enumerate(zip(exact, noises, strict=True))]
    keys = tuple(column.take(pa.array(order, pa.int64())).to_pylist())
    return released(plan, keys), noisy
