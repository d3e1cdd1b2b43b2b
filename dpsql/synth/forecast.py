"""A release's forecast: the noise its measurements will carry, known before the charge.

Each synthesizer's ``forecast(domain, budget)`` lists what it will measure
(:class:`Planned`: how many marginals of how many cells, with which mechanism
and noise) from public facts only: the policy's domains and bounds, its public
row count when it declares one, the budget and the options. Nothing private is
read, so a forecast costs nothing and may be shown before anything is charged
(``dpsql release --dry-run``) and at the start of every release.

What it means is said in rows: the expected L1 error of a noisy marginal
(``cells * E|noise|``), and, when the row count is public, as a share of it.
``independent`` at the same budget is the yardstick: a forecast that says a
release cannot beat it (:attr:`Forecast.worse`) is refused unless the
administrator insists (``--force``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from dpsql.domain import Domain
from dpsql.mechanisms.additive import additive
from dpsql.mechanisms.laplace import LaplaceMechanism
from dpsql.privacy import Number, PrivacyCost, to_fraction


def noise_sd(cost: PrivacyCost, sensitivity: int) -> tuple[float, str]:
    """Per-cell noise sd and mechanism a marginal of ``sensitivity`` gets from ``cost``.

    The calibration :func:`dpsql.synth.measure.measure_counts` samples with
    (public arithmetic: nothing is drawn). An infinite share gives no noise.
    """
    if cost.infinite:
        return 0.0, "none"
    mechanism = additive(cost.kind, sensitivity, cost)
    if mechanism.name == LaplaceMechanism.name:
        return math.sqrt(2) * mechanism.noise_scale, mechanism.name
    return mechanism.noise_scale, mechanism.name


def expected_l1(sd: float, mechanism: str, cells: int) -> float:
    """Expected L1 error, in rows, of a marginal of ``cells`` cells with noise ``sd`` per cell.

    E|X| is sd * sqrt(2 / pi) for a Gaussian and sd / sqrt(2) (the scale) for a
    Laplace; the discrete samplers are within a fraction of a row of both.
    """
    per_cell = sd / math.sqrt(2) if mechanism == LaplaceMechanism.name \
        else sd * math.sqrt(2 / math.pi)
    return cells * per_cell


@dataclass(frozen=True)
class Planned:
    """``count`` measurements alike: ``what``, each over ``cells`` cells, noise ``sd`` per cell.

    For DP-SGD, ``sd`` is the noise multiplier (the noise per coordinate of a
    step's summed gradient, in units of one row's clipped gradient) and
    ``cells`` the number of noised coordinates.
    """

    what: str
    count: int
    cells: int
    mechanism: str
    sd: float
    at_most: bool = False  # the fit may measure fewer, or with less noise

    @property
    def error(self) -> float | None:
        """Expected L1 error of one of them, in rows (None for DP-SGD)."""
        if self.mechanism == "DP-SGD":
            return None
        return expected_l1(self.sd, self.mechanism, self.cells)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able."""
        return {"what": self.what, "count": self.count, "cells": self.cells,
                "mechanism": self.mechanism, "sd": _round(self.sd), "at_most": self.at_most,
                "expected_l1_rows": _round(self.error)}


@dataclass(frozen=True)
class Forecast:
    """What a release will measure and what its noise means, from public facts only.

    ``oneway``: the expected L1 error (rows) of each column's 1-way marginal as
    this synthesizer measures it, when it measures them directly; ``baseline``:
    the same for ``independent`` at the same budget. ``worse``: why the
    release cannot beat ``independent`` (``""`` when nothing says so).
    """

    synthesizer: str
    planned: tuple[Planned, ...]
    rows: int | None  # the policy's public row count, when it declares one
    baseline: float | None
    oneway: float | None = None
    notes: tuple[str, ...] = ()
    worse: str = ""
    dp: bool = True

    def lines(self) -> list[str]:
        """The forecast as plain sentences, one per measurement and note."""
        if not self.dp:
            return [f"{self.synthesizer} is not DP here: it measures nothing with noise, and "
                    "its release is labelled privacy: empirical", *self.notes]
        out = []
        for p in self.planned:
            many, most = (f"{p.count} x ", "up to ") if p.count > 1 else ("", "")
            many = f"at most {many}" if p.at_most and many else many
            noise = "noise sd at most" if p.at_most else "noise sd"
            if p.error is None:
                out.append(f"{many}{p.what}: noise multiplier {p.sd:.3g} over "
                           f"{p.cells:,} coordinates")
            else:
                out.append(f"{many}{p.what}: {most}{p.cells:,} cells, {p.mechanism} {noise} "
                           f"{p.sd:.3g} per cell, expected L1 error {most}"
                           f"{self._rows(p.error)}")
        if self.oneway is not None and self.synthesizer == "independent":
            out.append(f"1-way marginals: expected L1 error {self._rows(self.oneway)} on "
                       "average")
        elif self.oneway is not None and self.baseline:
            ratio = self.oneway / self.baseline
            out.append(f"1-way marginals: expected L1 error {self._rows(self.oneway)} on "
                       f"average, {ratio:.2g}x that of independent at this budget "
                       f"({self._rows(self.baseline)})")
        out += self.notes
        if self.worse:
            out.append(f"forecast: cannot beat independent: {self.worse}")
        return out

    def _rows(self, value: float) -> str:
        share = f" ({value / self.rows:.1%} of {self.rows:,} rows)" if self.rows else ""
        return f"{value:,.0f} rows{share}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-able (the release's provenance keeps it as ``forecast``)."""
        return {"synthesizer": self.synthesizer, "dp": self.dp,
                "planned": [p.as_dict() for p in self.planned], "rows": self.rows,
                "oneway_l1_rows": _round(self.oneway),
                "independent_oneway_l1_rows": _round(self.baseline),
                "notes": list(self.notes), "worse_than_independent": self.worse or None,
                "lines": self.lines()}


@dataclass(frozen=True)
class Marginals:
    """A helper for the common case: marginals measured with a budget split in shares."""

    sensitivity: int
    planned: list[Planned] = field(default_factory=list)

    def add(self, what: str, count: int, cells: int, share: PrivacyCost) -> Planned:
        """Plan ``count`` marginals of ``cells`` cells, each with the budget ``share``."""
        sd, mechanism = noise_sd(share, self.sensitivity)
        planned = Planned(what, count, cells, mechanism, sd)
        self.planned.append(planned)
        return planned


def _round(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.4g}")


def histogram_shares(k: int, count_share: Fraction, with_count: bool) -> list[Number]:
    """The budget shares of ``k`` marginals (equal) and, ``with_count``, a noisy row count."""
    part = Fraction(1, k) if not with_count else (1 - count_share) / k
    shares: list[Number] = [part] * k
    return [*shares, count_share] if with_count else shares


def oneway_plan(domain: Domain, budget: PrivacyCost, count_share: float = 0.05,
                what: str = "1-way marginal of each column") -> tuple[Planned, float]:
    """``independent``'s 1-way marginals at ``budget``: the plan, and the mean expected L1.

    The split :func:`dpsql.synth.histogram.fit_histogram` makes: a share
    ``count_share`` for a noisy row count unless the policy declares it, the rest
    in equal parts, one per column.
    """
    columns = len(domain.names)
    share = to_fraction(count_share, "count_share")
    with_count = domain.public_rows is None and share > 0
    part = budget.split(histogram_shares(columns, share, with_count))[0]
    sd, mechanism = noise_sd(part, domain.max_rows)
    cells = max(domain.shape)
    errors = [expected_l1(sd, mechanism, n) for n in domain.shape]
    return Planned(what, columns, cells, mechanism, sd), sum(errors) / columns


def baseline(domain: Domain, budget: PrivacyCost) -> float:
    """The mean expected L1 error (rows) of ``independent``'s 1-way marginals at ``budget``."""
    return oneway_plan(domain, budget)[1]
