"""Rubin's rules for multiple synthetic datasets (Raghunathan, Reiter & Rubin 2003).

An analyst runs the same analysis on each of the m copies of a release (the
``_copy`` column) and combines the m point estimates q_i and variance estimates
u_i into one estimate whose interval accounts for the DP noise and the
synthesis, which a single copy analysed as if it were real data does not:

    q_bar = mean(q_i),  b = var(q_i) (divisor m - 1),  u_bar = mean(u_i)
    T = (1 + 1/m) b - u_bar  (the fully synthetic rule: T may be negative)
    nu_m = (m - 1) (1 - u_bar / ((1 + 1/m) b))^2
    nu = 1 / (1/nu_m + 1/nu_obs),  nu_obs = (nu_com + 1) / (nu_com + 3) nu_com

The last line is Barnard & Rubin's (1999) small-sample correction: the reference
t distribution never has more degrees of freedom than the complete-data analysis
(nu_com, e.g. n - k for a regression; infinite when unknown, which leaves nu_m).
When T <= 0, Reiter's (2002) T* = (n_syn / n) u_bar is used: a complete-data
variance, so its t distribution has nu_obs degrees of freedom.

A result is flagged ``unreliable`` (and a :class:`RubinWarning` is issued) when
T <= 0, when nu < 3 (as (1 + 1/m) b nears u_bar, nu goes to 0 and the interval
to +-infinity) or when the between-copy variance dominates ((1 + 1/m) b >
10 u_bar: the interval then rests on the synthesizer's model of the DP noise,
estimated from m copies). The interval is still the rule's: the flag says how
far to trust it; more copies (``dpsql release-more``, free) raise nu.

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

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from scipy import stats

from dpsql.errors import ConfigurationError

COPY_COLUMN = "_copy"
#: Below this many degrees of freedom the t quantile explodes (12.7 at 1, 4.3 at 2).
MIN_DOF = 3.0
#: (1 + 1/m) b above this multiple of u_bar: the between-copy variance dominates.
DOMINANT_RATIO = 10.0


class RubinWarning(UserWarning):
    """A combined interval to read with care (its ``reason`` says why)."""


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
    unreliable: bool = False
    reason: str = ""  # why unreliable: T <= 0, df < 3, or the between-copy variance dominates

    def as_dict(self) -> dict[str, Any]:
        """JSON-able fields."""
        return asdict(self)


def observed_dof(complete_dof: float | None) -> float:
    """Barnard & Rubin's (1999) nu_obs for complete original data (no missing information).

    (nu_com + 1) / (nu_com + 3) nu_com; infinite when nu_com is unknown (None).
    """
    if complete_dof is None or math.isinf(complete_dof):
        return math.inf
    if not complete_dof > 0:
        raise ConfigurationError("complete_dof (the complete-data degrees of freedom) must be "
                                 "positive")
    return (complete_dof + 1) / (complete_dof + 3) * complete_dof


def combine(estimates: Sequence[float] | np.ndarray, variances: Sequence[float] | np.ndarray,
            *, rows_ratio: float = 1.0, confidence: float = 0.95,
            complete_dof: float | None = None, label: str = "estimate") -> Combined:
    """Combine per-copy estimates and variance estimates (Rubin's rules for synthetic data).

    ``rows_ratio`` is n_syn / n, the synthetic copies' size over the original's
    (1 when the copies have the original's row count, as dpsql releases do).
    ``complete_dof`` is the complete-data analysis's degrees of freedom (n - k
    for a regression with k coefficients; None when unknown: large-sample).
    An unreliable result also issues a :class:`RubinWarning` naming ``label``.
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
    q_bar, b, u_bar = float(q.mean()), float(q.var(ddof=1)), float(u.mean())
    nu_obs = observed_dof(complete_dof)
    between = (1 + 1 / m) * b
    adjusted = between - u_bar <= 0
    if adjusted:
        total, dof = rows_ratio * u_bar, nu_obs
    else:
        nu_m = (m - 1) * (1 - u_bar / between) ** 2
        total, dof = between - u_bar, 1 / (1 / nu_m + 1 / nu_obs)
    se = math.sqrt(total)
    quantile = stats.norm.ppf if math.isinf(dof) else (lambda p: stats.t.ppf(p, dof))
    half = float(quantile(0.5 + confidence / 2)) * se
    reason = _unreliable_reason(m, between, u_bar, dof, adjusted)
    if reason:
        warnings.warn(f"{label}: {reason}", RubinWarning, stacklevel=2)
    return Combined(q_bar, se, q_bar - half, q_bar + half, float(dof), b, u_bar, adjusted, m,
                    bool(reason), reason)


def _unreliable_reason(m: int, between: float, u_bar: float, dof: float, adjusted: bool) -> str:
    """Why a combined interval should not be taken at face value ('' when it can)."""
    more = f"more copies (dpsql release-more, free; m = {m} now) make it firmer"
    if adjusted:
        return ("T <= 0: the copies vary less than their own variance estimates predict "
                "((1 + 1/m) b <= u_bar); Reiter's T* = (n_syn/n) u_bar was used instead; "
                f"{more}")
    if dof < MIN_DOF:
        return (f"df < {MIN_DOF:g}: nu = {dof:.3g} (few copies, or (1 + 1/m) b close to "
                f"u_bar), so the interval's width is itself very uncertain; {more}")
    if between > DOMINANT_RATIO * u_bar:
        return (f"the between-copy variance dominates: (1 + 1/m) b = {between / u_bar:.3g} "
                "x u_bar; the interval rests on the synthesizer's model of the DP noise, "
                "not on the data")
    return ""


def copies(data: duckdb.DuckDBPyRelation | pd.DataFrame | pa.Table,
           copy_column: str = COPY_COLUMN) -> list[pd.DataFrame]:
    """Split a release (a table with a ``_copy`` column) into its copies, in copy order.

    Takes a DuckDB relation, a pandas DataFrame or a pyarrow Table; anything
    else (an Arrow stream, a list, ...) is refused, not guessed at.
    """
    frame = _frame(data)
    if copy_column not in frame.columns:
        raise ConfigurationError(f"no {copy_column!r} column: pass a release with several "
                                 "copies (SELECT * FROM released.<name>)")
    return [part.drop(columns=copy_column).reset_index(drop=True)
            for _, part in frame.groupby(copy_column, sort=True)]


def _frame(data: Any) -> pd.DataFrame:
    """A pandas DataFrame of a DuckDB relation, DataFrame or Arrow table; TypeError otherwise."""
    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, pa.Table):
        return data.to_pandas()
    if isinstance(data, duckdb.DuckDBPyRelation):
        return data.df()
    hint = (" (call .read_all() on an Arrow stream first)"
            if isinstance(data, pa.RecordBatchReader) else "")
    raise TypeError(f"a release must be a DuckDB relation, a pandas DataFrame or a pyarrow "
                    f"Table with a {COPY_COLUMN!r} column, not {type(data).__name__}{hint}")


def fit_formula(data: duckdb.DuckDBPyRelation | pd.DataFrame | pa.Table, formula: str,
                model: str | Callable[..., Any] = "logit", *, confidence: float = 0.95,
                rows_ratio: float = 1.0, max_std_error: float | None = None,
                copy_column: str = COPY_COLUMN, **fit_options: Any) -> pd.DataFrame:
    """Fit a statsmodels formula model on every copy and combine each coefficient.

    ``data`` is a release with a ``_copy`` column: a DuckDB relation, a pandas
    DataFrame or a pyarrow Table (anything else raises TypeError). ``model``
    names a ``statsmodels.formula.api`` function (``logit``, ``ols``,
    ``probit``, ``poisson``, ...) or is such a callable. ``max_std_error`` drops a
    copy's coefficient whose standard error exceeds it before combining (the
    paper does this for coefficients of categories a copy happens to lack).
    The complete-data degrees of freedom are the fits' residual ones (n - k).
    Returns one row per coefficient: estimate, std_error, ci_low, ci_high, dof,
    between, within, adjusted, copies, unreliable, reason, and unconverged_copies
    (fits whose optimizer reported non-convergence: kept, counted, not raised).
    """
    import statsmodels.formula.api as smf

    frames = copies(data, copy_column)
    fitter = getattr(smf, model) if isinstance(model, str) else model
    if fitter in (smf.logit, smf.probit, smf.poisson):
        fit_options.setdefault("disp", 0)
    from statsmodels.tools.sm_exceptions import ConvergenceWarning

    params, variances, residual_dof, unconverged = [], [], [], 0
    for frame in frames:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            result = fitter(formula, data=frame).fit(**fit_options)
        unconverged += any(issubclass(w.category, ConvergenceWarning) for w in caught)
        for w in caught:
            if not issubclass(w.category, ConvergenceWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        params.append(result.params)
        variances.append(result.bse**2)
        residual_dof.append(float(getattr(result, "df_resid", math.inf)))
    estimates = pd.DataFrame(params)
    var = pd.DataFrame(variances)
    complete_dof = float(np.mean(residual_dof))
    rows = {}
    for name in estimates.columns:
        q, u = estimates[name].to_numpy(), var[name].to_numpy()
        keep = np.isfinite(q) & np.isfinite(u)
        if max_std_error is not None:
            keep &= np.sqrt(u) <= max_std_error
        if keep.sum() < 2:
            continue
        combined = combine(q[keep], u[keep], rows_ratio=rows_ratio, confidence=confidence,
                           complete_dof=complete_dof if complete_dof > 0 else None,
                           label=f"coefficient {name}")
        rows[name] = {**combined.as_dict(), "unconverged_copies": unconverged}
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
