"""Rubin's rules for multiple synthetic datasets (Raghunathan, Reiter & Rubin 2003).

An analyst runs the same analysis on each of the m copies of a release (the
``_copy`` column) and combines the m point estimates q_i and variance estimates
u_i into one estimate whose interval accounts for the DP noise and the
synthesis, which a single copy analysed as if it were real data does not:

    q_bar = mean(q_i),  b = var(q_i) (divisor m - 1),  u_bar = mean(u_i)
    T = (1 + 1/m) b - u_bar
    T* = max(0, T) + (n_syn / n) u_bar  when T <= 0 (Reiter 2002)
    nu = (m - 1) (1 - m u_bar / ((m + 1) b))^2, a t distribution with nu dof.

:func:`fit_formula` runs a statsmodels formula (e.g. a logistic regression)
on every copy and combines each coefficient; :func:`mix_posteriors` pools
Bayesian analyses instead (Gelman et al. 2014, the mixed posterior).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import stats

from dpsql.errors import ConfigurationError

COPY_COLUMN = "_copy"


@dataclass(frozen=True)
class Combined:
    """One combined estimate: point, standard error, t interval and its parts."""

    estimate: float
    std_error: float
    ci_low: float
    ci_high: float
    dof: float
    between: float  # b: variance of the estimates across copies
    within: float  # u_bar: mean of the per-copy variance estimates
    adjusted: bool  # True when T <= 0 and Reiter's T* was used
    copies: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return asdict(self)


def combine(estimates: Sequence[float] | np.ndarray, variances: Sequence[float] | np.ndarray,
            *, rows_ratio: float = 1.0, confidence: float = 0.95) -> Combined:
    """Combine per-copy estimates and variance estimates (Rubin's rules for synthetic data).

    ``rows_ratio`` is n_syn / n, the synthetic copies' size over the original's
    (1 when the copies have the original's row count, as dpsql releases do).
    """
    q = np.asarray(estimates, dtype=np.float64)
    u = np.asarray(variances, dtype=np.float64)
    m = q.size
    if m < 2 or u.size != m:
        raise ConfigurationError("Rubin's rules need estimates and variances from at least 2 "
                                 "copies (release with --copies 2 or more)")
    if not 0 < confidence < 1:
        raise ConfigurationError("confidence must be between 0 and 1")
    if np.any(u < 0) or not (np.all(np.isfinite(q)) and np.all(np.isfinite(u))):
        raise ConfigurationError("estimates must be finite and variances non-negative")
    q_bar = float(q.mean())
    b = float(q.var(ddof=1))
    u_bar = float(u.mean())
    total = (1 + 1 / m) * b - u_bar
    adjusted = total <= 0
    if adjusted:
        total = max(0.0, total) + rows_ratio * u_bar
    dof = (m - 1) * (1 - m * u_bar / ((m + 1) * b)) ** 2 if b > 0 else math.inf
    se = math.sqrt(total)
    quantile = stats.norm.ppf if math.isinf(dof) else (lambda p: stats.t.ppf(p, dof))
    half = float(quantile(0.5 + confidence / 2)) * se
    return Combined(q_bar, se, q_bar - half, q_bar + half, float(dof), b, u_bar, adjusted, m)


def copies(data: pd.DataFrame | pa.Table | Sequence[pd.DataFrame],
           copy_column: str = COPY_COLUMN) -> list[pd.DataFrame]:
    """Split a release (one table with a ``_copy`` column, or a list of tables) into copies."""
    if isinstance(data, pa.Table):
        data = data.to_pandas()
    if isinstance(data, pd.DataFrame):
        if copy_column not in data.columns:
            raise ConfigurationError(f"no {copy_column!r} column: pass a release with several "
                                     "copies, or a list of data frames")
        return [part.drop(columns=copy_column).reset_index(drop=True)
                for _, part in data.groupby(copy_column, sort=True)]
    return [d.to_pandas() if isinstance(d, pa.Table) else d for d in data]


def fit_formula(data: pd.DataFrame | pa.Table | Sequence[pd.DataFrame], formula: str,
                model: str | Callable[..., Any] = "logit", *, confidence: float = 0.95,
                rows_ratio: float = 1.0, max_std_error: float | None = None,
                copy_column: str = COPY_COLUMN, **fit_options: Any) -> pd.DataFrame:
    """Fit a statsmodels formula model on every copy and combine each coefficient.

    ``model`` names a ``statsmodels.formula.api`` function (``logit``, ``ols``,
    ``probit``, ``poisson``, ...) or is such a callable. ``max_std_error`` drops a
    copy's coefficient whose standard error exceeds it before combining (the
    paper does this for coefficients of categories a copy happens to lack).
    Returns one row per coefficient: estimate, std_error, ci_low, ci_high, dof,
    between, within, adjusted, copies, and unconverged_copies (fits whose optimizer
    reported non-convergence: kept, counted, not raised).
    """
    import statsmodels.formula.api as smf

    fitter = getattr(smf, model) if isinstance(model, str) else model
    if fitter in (smf.logit, smf.probit, smf.poisson):
        fit_options.setdefault("disp", 0)
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    params, variances, unconverged = [], [], 0
    for frame in copies(data, copy_column):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            result = fitter(formula, data=frame).fit(**fit_options)
        unconverged += any(issubclass(w.category, ConvergenceWarning) for w in caught)
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        params.append(result.params)
        variances.append(result.bse**2)
    estimates = pd.DataFrame(params)
    var = pd.DataFrame(variances)
    rows = {}
    for name in estimates.columns:
        q, u = estimates[name].to_numpy(), var[name].to_numpy()
        keep = np.isfinite(q) & np.isfinite(u)
        if max_std_error is not None:
            keep &= np.sqrt(u) <= max_std_error
        if keep.sum() < 2:
            continue
        rows[name] = {**combine(q[keep], u[keep], rows_ratio=rows_ratio,
                                confidence=confidence).as_dict(),
                      "unconverged_copies": unconverged}
    return pd.DataFrame.from_dict(rows, orient="index")


def mix_posteriors(draws: Sequence[np.ndarray], rng: np.random.Generator | None = None,
                   per_copy: int | None = None) -> np.ndarray:
    """Pool posterior draws of a Bayesian analysis run on each copy (the mixed posterior).

    Takes the same number of draws from every copy (``per_copy``, default the
    smallest count; drawn without replacement when ``rng`` is given, else the
    first ones) so each copy weighs equally.
    """
    arrays = [np.asarray(d) for d in draws]
    if len(arrays) < 2:
        raise ConfigurationError("mixing needs the posteriors of at least 2 copies")
    take = min(a.shape[0] for a in arrays) if per_copy is None else per_copy
    if take < 1 or take > min(a.shape[0] for a in arrays):
        raise ConfigurationError("per_copy must be between 1 and the smallest number of draws")
    picked = [a[rng.choice(a.shape[0], take, replace=False)] if rng is not None else a[:take]
              for a in arrays]
    return np.concatenate(picked, axis=0)


def credible_interval(mixed: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Equal-tailed interval of mixed posterior draws (per column)."""
    alpha = (1 - confidence) / 2
    return np.quantile(mixed, alpha, axis=0), np.quantile(mixed, 1 - alpha, axis=0)
