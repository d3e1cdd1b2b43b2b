"""The fitted posterior over ``phi = [theta, n]``: draws from NUTS or the Laplace Gaussian.

Both are DP (post-processing of the noisy marginals) and serialize to JSON, so a
release can store them and draw more synthetic copies later at no privacy cost.
Arrays are stored as base64 of little-endian float64 to keep the state compact.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsql.errors import ConfigurationError


def encode(array: np.ndarray) -> dict[str, Any]:
    """A JSON-able form of a float array (shape + base64 of little-endian float64)."""
    data = np.ascontiguousarray(array, dtype="<f8")
    return {"shape": list(data.shape), "float64_base64": base64.b64encode(data.tobytes()).decode()}


def decode(obj: dict[str, Any]) -> np.ndarray:
    """Inverse of :func:`encode`."""
    try:
        raw = base64.b64decode(obj["float64_base64"])
        return np.frombuffer(raw, dtype="<f8").reshape(obj["shape"]).astype(np.float64)
    except (KeyError, ValueError, TypeError) as err:
        raise ConfigurationError("the stored napsu_mq posterior is damaged") from err


@dataclass(frozen=True)
class Gaussian:
    """N(mean, cov): the Laplace approximation."""

    mean: np.ndarray
    cov: np.ndarray

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One parameter vector from the Gaussian."""
        return rng.multivariate_normal(self.mean, self.cov, method="cholesky")

    def summary(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation per parameter."""
        return self.mean, np.sqrt(np.diag(self.cov))

    def state(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"kind": "laplace", "mean": encode(self.mean), "cov": encode(self.cov)}


@dataclass(frozen=True)
class Samples:
    """Posterior draws (rows): one is picked at random per synthetic copy."""

    draws: np.ndarray

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """One stored draw, uniformly at random."""
        return self.draws[int(rng.integers(self.draws.shape[0]))]

    def summary(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation per parameter."""
        return self.draws.mean(axis=0), self.draws.std(axis=0, ddof=1)

    def state(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"kind": "draws", "draws": encode(self.draws)}


Posterior = Gaussian | Samples


def from_state(obj: dict[str, Any]) -> Posterior:
    """Rebuild a posterior from :meth:`state` output."""
    kind = obj.get("kind")
    if kind == "laplace":
        return Gaussian(decode(obj["mean"]), decode(obj["cov"]))
    if kind == "draws":
        return Samples(decode(obj["draws"]))
    raise ConfigurationError(f"unknown napsu_mq posterior kind {kind!r}")


def thin(chains: np.ndarray, keep: int) -> np.ndarray:
    """At most ``keep`` draws, evenly spaced within each chain, chains pooled."""
    count, length, _ = chains.shape
    per_chain = max(1, min(length, -(-keep // count)))
    index = np.linspace(0, length - 1, per_chain).round().astype(int)
    return chains[:, index].reshape(count * per_chain, -1)[:max(keep, count)]
