"""The NAPSU-MQ model against brute-force enumeration of small domains."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dpsql.errors import ConfigurationError
from dpsql.synth.napsu_mq import laplace, model
from dpsql.synth.napsu_mq.structure import Structure, cell_map

CASES = {
    "one_pair": ((2, 3), [(0, 1)]),
    "chain": ((3, 2, 4), [(0, 1), (1, 2)]),
    "triangle": ((2, 3, 2), [(0, 1), (1, 2), (0, 2)]),
    "three_way_plus_pair": ((2, 2, 3, 2), [(0, 1, 2), (2, 3)]),
    "forest": ((3, 2, 2, 3), [(0, 1), (2, 3)]),
    "cycle4": ((2, 3, 2, 2), [(0, 1), (1, 2), (2, 3), (0, 3)]),
}


def features(structure: Structure, x: tuple[int, ...]) -> np.ndarray:
    """Canonical features b(x) by definition: [x_D = v] for v with no zero component."""
    out = []
    for scope in structure.scopes:
        for v in itertools.product(*(range(1, structure.sizes[j]) for j in scope)):
            out.append(float(all(x[j] == w for j, w in zip(scope, v, strict=True))))
    return np.array(out)


def enumerate_model(structure: Structure, theta: np.ndarray):
    points = list(itertools.product(*(range(k) for k in structure.sizes)))
    feats = np.array([features(structure, x) for x in points])
    logits = feats @ theta
    log_z = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
    p = np.exp(logits - log_z)
    mu = p @ feats
    centered = feats - mu
    sigma = (centered * p[:, None]).T @ centered
    return points, p, log_z, mu, sigma


@pytest.mark.parametrize("case", list(CASES))
def test_log_z_mu_sigma_match_enumeration(case: str) -> None:
    sizes, cliques = CASES[case]
    structure = Structure.build(sizes, cliques)
    theta = np.random.default_rng(len(case)).normal(0, 1.0, structure.dim)
    _, _, log_z, mu, sigma = enumerate_model(structure, theta)
    with jax.enable_x64(True):
        got_log_z = float(model.log_z(structure, jnp.asarray(theta)))
        got_mu, got_sigma = model.moments(structure, jnp.asarray(theta))
    assert got_log_z == pytest.approx(log_z, rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(np.asarray(got_mu), mu, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got_sigma), sigma, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", list(CASES))
def test_clique_marginals_match_enumeration(case: str) -> None:
    sizes, cliques = CASES[case]
    structure = Structure.build(sizes, cliques)
    theta = np.random.default_rng(7).normal(0, 1.0, structure.dim)
    points, p, *_ = enumerate_model(structure, theta)
    with jax.enable_x64(True):
        tables = model.compiled_marginals(structure)(jnp.asarray(theta))
    for clique, table in zip(structure.tree, tables, strict=True):
        expected = np.zeros(tuple(sizes[j] for j in clique))
        for x, px in zip(points, p, strict=True):
            expected[tuple(x[j] for j in clique)] += px
        np.testing.assert_allclose(np.asarray(table), expected, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("case", list(CASES))
def test_cell_map_recovers_every_measured_marginal(case: str) -> None:
    sizes, cliques = CASES[case]
    structure = Structure.build(sizes, cliques)
    theta = np.random.default_rng(3).normal(0, 1.0, structure.dim)
    points, p, _, mu, _ = enumerate_model(structure, theta)
    for clique in cliques:
        for scope in [clique, clique[::-1], clique[:1]]:
            expected = np.zeros(tuple(sizes[j] for j in scope))
            for x, px in zip(points, p, strict=True):
                expected[tuple(x[j] for j in scope)] += px
            got = cell_map(structure, scope) @ np.concatenate([[1.0], mu])
            np.testing.assert_allclose(got, expected.reshape(-1), atol=1e-12)


def test_canonical_features_are_identifiable() -> None:
    """Features plus the constant are linearly independent over the domain, and span the
    cell indicators of every clique (the pruned set carries the same information)."""
    for sizes, cliques in CASES.values():
        structure = Structure.build(sizes, cliques)
        points = list(itertools.product(*(range(k) for k in sizes)))
        design = np.array([np.concatenate([[1.0], features(structure, x)]) for x in points])
        assert np.linalg.matrix_rank(design) == structure.dim + 1
        for clique in cliques:
            cells = np.array([[float(tuple(x[j] for j in clique) == w)
                               for w in itertools.product(*(range(sizes[j]) for j in clique))]
                              for x in points])
            np.testing.assert_allclose(design @ cell_map(structure, clique).T, cells, atol=1e-12)


def test_parameter_count_of_canonical_pruning() -> None:
    # Two pairs sharing column 1: singletons (1 + 2 + 3) + pairs (1*2 + 2*3).
    structure = Structure.build((2, 3, 4), [(0, 1), (1, 2)])
    assert structure.dim == 6 + 8


def test_uncovered_column_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="no clique"):
        Structure.build((2, 2, 2), [(0, 1)])


def test_gaussian_density_gradient_matches_autodiff() -> None:
    rng = np.random.default_rng(4)
    a = rng.normal(size=(6, 6))
    cov = a @ a.T + 6 * np.eye(6)
    residual = rng.normal(size=6)

    def plain(c: jax.Array, r: jax.Array) -> jax.Array:
        chol = jnp.linalg.cholesky(c)
        w = jax.scipy.linalg.solve_triangular(chol, r, lower=True)
        return -0.5 * w @ w - jnp.log(jnp.diagonal(chol)).sum()

    with jax.enable_x64(True):
        got = jax.grad(model.gaussian_log_density, argnums=(0, 1))(jnp.asarray(cov),
                                                                   jnp.asarray(residual))
        want = jax.grad(plain, argnums=(0, 1))(jnp.asarray(cov), jnp.asarray(residual))
        value = model.gaussian_log_density(jnp.asarray(cov), jnp.asarray(residual))
    # Autodiff of the factorization gives the same (symmetrized) gradient.
    np.testing.assert_allclose(np.asarray(got[0]), (np.asarray(want[0]) + np.asarray(want[0]).T)
                               / 2, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), atol=1e-12)
    expected = -0.5 * residual @ np.linalg.solve(cov, residual) - 0.5 * np.linalg.slogdet(cov)[1]
    assert float(value) == pytest.approx(expected, rel=1e-12)


def test_log_posterior_gradient_matches_finite_differences() -> None:
    structure = Structure.build((2, 3, 2), [(0, 1), (1, 2)])
    dim = structure.dim
    rng = np.random.default_rng(8)
    evidence = model.Evidence(z=jnp.asarray(np.abs(rng.normal(size=dim + 1)) * 50 + 10),
                              noise_cov=jnp.asarray(np.eye(dim + 1) * 30.0),
                              n0=jnp.asarray(500.0), n_scale=jnp.asarray(5.0),
                              prior_sd=jnp.asarray(10.0))
    phi = rng.normal(0, 0.5, dim + 1)
    with jax.enable_x64(True):
        f = jax.jit(lambda x: model.log_posterior(structure, x, evidence))
        grad = np.asarray(jax.grad(lambda x: model.log_posterior(structure, x, evidence))(
            jnp.asarray(phi)))
        step = 1e-6
        numeric = np.array([(float(f(jnp.asarray(phi + step * e))) -
                             float(f(jnp.asarray(phi - step * e)))) / (2 * step)
                            for e in np.eye(dim + 1)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6)


def _evidence(structure: Structure, rng: np.random.Generator) -> model.Evidence:
    dim = structure.dim
    return model.Evidence(z=jnp.asarray(np.abs(rng.normal(size=dim + 1)) * 50 + 10),
                          noise_cov=jnp.asarray(np.eye(dim + 1) * 30.0),
                          n0=jnp.asarray(500.0), n_scale=jnp.asarray(5.0),
                          prior_sd=jnp.asarray(10.0))


def test_plugin_likelihood_is_the_exact_one_where_its_covariance_was_taken() -> None:
    """At the phi where the covariance is fixed, the two differ by log-det only."""
    structure = Structure.build((2, 3, 2), [(0, 1), (1, 2)])
    rng = np.random.default_rng(9)
    with jax.enable_x64(True):
        evidence = _evidence(structure, rng)
        phi = jnp.asarray(rng.normal(0, 0.5, structure.dim + 1))
        cov = model.likelihood_covariance(structure, phi, evidence)
        chol = jnp.linalg.cholesky(cov)
        exact = float(model.log_likelihood(structure, phi, evidence))
        plugin = float(model.log_likelihood_plugin(structure, phi, evidence, chol))
        elsewhere = phi + 0.3
        moved = float(model.log_likelihood(structure, elsewhere, evidence))
        moved_plugin = float(model.log_likelihood_plugin(structure, elsewhere, evidence, chol))
        log_det_half = float(jnp.log(jnp.diagonal(chol)).sum())
    assert plugin - log_det_half == pytest.approx(exact, rel=1e-10)
    # Away from that phi the covariance moves in the exact likelihood only.
    assert abs((moved_plugin - log_det_half) - moved) > 1e-6


def test_plugin_posterior_gradient_matches_finite_differences() -> None:
    structure = Structure.build((3, 2, 2), [(0, 1), (0, 2)])
    rng = np.random.default_rng(10)
    phi = rng.normal(0, 0.5, structure.dim + 1)
    with jax.enable_x64(True):
        evidence = _evidence(structure, rng)
        chol = jnp.linalg.cholesky(model.likelihood_covariance(structure, jnp.zeros_like(
            jnp.asarray(phi)), evidence))

        def f(x: jax.Array) -> jax.Array:
            return model.log_posterior_plugin(structure, x, evidence, chol)

        grad = np.asarray(jax.grad(f)(jnp.asarray(phi)))
        step = 1e-6
        numeric = np.array([(float(f(jnp.asarray(phi + step * e))) -
                             float(f(jnp.asarray(phi - step * e)))) / (2 * step)
                            for e in np.eye(structure.dim + 1)])
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6)


def test_exact_hessian_matches_finite_differences_in_small_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The autodiff Hessian (batched, last batch padded) equals differences of the gradient.

    The batch is forced below the dimension so that padding and placement of
    columns are exercised; a column out of place or a wrong sign fails the
    1e-5 relative tolerance by orders of magnitude.
    """
    structure = Structure.build((2, 3, 2), [(0, 1), (1, 2)])
    rng = np.random.default_rng(11)
    evidence = _evidence(structure, rng)
    phi = rng.normal(0, 0.5, structure.dim + 1)
    monkeypatch.setattr(laplace, "hessian_batch", lambda dim: 3)
    seen = []
    with jax.enable_x64(True):
        got = laplace.exact_hessian(structure, evidence, phi,
                                    lambda stage, done, total=None: seen.append(done))
        grad = jax.jit(jax.grad(lambda x: -model.log_posterior(structure, x, evidence)))
        step = 1e-5
        numeric = np.stack([(np.asarray(grad(jnp.asarray(phi + step * e)))
                             - np.asarray(grad(jnp.asarray(phi - step * e)))) / (2 * step)
                            for e in np.eye(phi.size)], axis=1)
    np.testing.assert_allclose(got, (numeric + numeric.T) / 2, rtol=1e-5, atol=1e-5)
    assert seen == [0, *range(3, phi.size, 3), phi.size]  # at the start, after each batch


def test_gauss_newton_is_the_hessian_of_the_plugin_posterior_at_a_perfect_fit() -> None:
    """Where the mean fits z exactly, the plug-in posterior's Hessian is J' C^-1 J + prior."""
    structure = Structure.build((2, 3, 2), [(0, 1), (1, 2)])
    rng = np.random.default_rng(12)
    phi = rng.normal(0, 0.5, structure.dim + 1)
    base = _evidence(structure, rng)
    with jax.enable_x64(True):
        n = model.records(structure, jnp.asarray(phi), base)
        mu, _ = model.moments(structure, jnp.asarray(phi[: structure.dim]))
        evidence = base._replace(z=n * jnp.concatenate([jnp.ones(1), mu]))
        chol = jnp.linalg.cholesky(model.likelihood_covariance(structure, jnp.asarray(phi),
                                                               evidence))
        want = -jax.hessian(lambda x: model.log_posterior_plugin(structure, x, evidence, chol))(
            jnp.asarray(phi))
        got = laplace.gauss_newton(structure)(jnp.asarray(phi), evidence)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-8, atol=1e-8)
