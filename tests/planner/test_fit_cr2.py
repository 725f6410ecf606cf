"""planner.fit.cr2: the CR2 covariance and its Bell–McCaffrey degrees of freedom, against
dense n × n computations, hand-worked cases and a seeded coverage simulation."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from planner.fit.common import ols_robust
from planner.fit.cr2 import cr2


def _inv_sqrt(a: Any) -> Any:
    w, v = np.linalg.eigh(a)
    return v @ np.diag(w**-0.5) @ v.T


def _dense_df(x: Any, g: npt.NDArray[np.int64], c: Any) -> float:
    """ν = tr(G'G)² / tr((G'G)²) with G's columns (I − H)_g' A_g X_g M c, all n × n."""
    n = x.shape[0]
    m = np.linalg.inv(x.T @ x)
    ih = np.eye(n) - x @ m @ x.T
    cols = []
    for k in np.unique(g):
        rows = np.flatnonzero(g == k)
        a = _inv_sqrt(ih[np.ix_(rows, rows)])
        cols.append(ih[rows].T @ (a @ x[rows] @ m @ c))
    gtg = np.column_stack(cols).T @ np.column_stack(cols)
    lam = np.linalg.eigvalsh(gtg)
    return float(lam.sum() ** 2 / (lam**2).sum())


def _problem(seed: int) -> tuple[Any, Any, npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 15, 6)
    g = np.repeat(np.arange(6), sizes)
    d = (g % 3 == 0).astype(float)  # a cluster-level regressor, 2 clusters of 6
    x = np.column_stack([np.ones(g.size), rng.normal(size=g.size), d, d * rng.uniform(size=g.size)])
    y = x @ np.array([1.0, 2.0, -1.0, 0.5]) + rng.normal(size=6)[g] + rng.normal(size=g.size)
    return x, y, g


def test_cr2_covariance_equals_the_dense_bias_reduced_formula() -> None:
    x, y, g = _problem(11)
    fit = ols_robust(y, x, g, "CR2")
    bread = np.linalg.inv(x.T @ x)
    resid = y - x @ fit.params
    meat = np.zeros((4, 4))
    for c in np.unique(g):
        m = g == c
        s = x[m].T @ _inv_sqrt(np.eye(int(m.sum())) - x[m] @ bread @ x[m].T) @ resid[m]
        meat += np.outer(s, s)
    assert fit.cov == pytest.approx(bread @ meat @ bread, rel=1e-9)
    np.testing.assert_allclose(fit.params, np.linalg.solve(x.T @ x, x.T @ y), rtol=1e-10)
    # with few clusters CR2 is wider than the uncorrected cluster sandwich
    cr1 = ols_robust(y, x, g, "cluster").cov
    n, p = x.shape
    assert np.all(np.diag(fit.cov) > np.diag(cr1) * (5 / 6) * (n - p) / (n - 1))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bell_mccaffrey_df_equals_the_dense_computation(seed: int) -> None:
    x, y, g = _problem(seed)
    contrasts = np.vstack([np.eye(4), np.random.default_rng(seed).normal(size=(3, 4))])
    got = ols_robust(y, x, g, "CR2").df(contrasts)
    want = [_dense_df(x, g, c) for c in contrasts]
    np.testing.assert_allclose(got, want, rtol=1e-8)
    assert np.all(got <= 5.0 + 1e-9)  # never more than G − 1


def _brute_cr2(x: Any, e: Any, g: npt.NDArray[np.int64], c: Any) -> tuple[Any, float]:
    """CR2 and the Bell–McCaffrey ν of c'β from their definitions, every matrix n × n:
    H = X M X', A_g = (I − H_gg)^(−1/2) by eigh, G = [(I − H)_g' A_g X_g M c]_g."""
    n = x.shape[0]
    m = np.linalg.inv(x.T @ x)
    ih = np.eye(n) - x @ m @ x.T
    meat = np.zeros((x.shape[1],) * 2)
    cols = []
    for k in np.unique(g):
        rows = np.flatnonzero(g == k)
        lam, vec = np.linalg.eigh(ih[np.ix_(rows, rows)])
        a = vec @ np.diag(lam**-0.5) @ vec.T
        s = x[rows].T @ a @ e[rows]
        meat += np.outer(s, s)
        cols.append(ih[rows].T @ (a @ x[rows] @ m @ c))
    gmat = np.column_stack(cols)
    gtg = gmat.T @ gmat
    return m @ meat @ m, float(np.trace(gtg) ** 2 / np.sum(gtg * gtg))


@pytest.mark.parametrize("seed", [5, 6, 7, 8])
def test_cr2_and_df_with_weights_and_unequal_clusters_equal_the_brute_force(seed: int) -> None:
    # a weighted fit is OLS on rows scaled by √w (planner.fit.cr2); clusters of 1 to 40 rows
    rng = np.random.default_rng(seed)
    sizes = np.concatenate([[1, 2, 40], rng.integers(3, 25, 4)])
    g = rng.permutation(np.repeat(np.arange(sizes.size), sizes))  # rows not sorted by cluster
    n = g.size
    d = (g % 2 == 0).astype(float)
    x = np.column_stack([np.ones(n), rng.normal(size=n), d, rng.uniform(size=n) * d])
    y = x @ np.array([1.0, -0.5, 2.0, 0.3]) + rng.normal(size=sizes.size)[g] + rng.normal(size=n)
    rw = np.sqrt(rng.uniform(0.1, 5.0, n))
    xw, yw = x * rw[:, None], y * rw
    m = np.linalg.inv(xw.T @ xw)
    e = yw - xw @ (m @ xw.T @ yw)
    got = cr2(xw, e, g, m)
    contrasts = np.vstack([np.eye(4), rng.normal(size=(2, 4))])
    nus = got.df(contrasts)
    for c, nu in zip(contrasts, nus, strict=True):
        cov, want_nu = _brute_cr2(xw, e, g, c)
        np.testing.assert_allclose(got.cov, cov, rtol=1e-8, atol=0)
        assert nu == pytest.approx(want_nu, rel=1e-8)
    fit = ols_robust(yw, xw, g, "CR2")
    np.testing.assert_allclose(fit.cov, got.cov, rtol=1e-8)
    np.testing.assert_allclose(fit.df(contrasts), nus, rtol=1e-10)


def test_bell_mccaffrey_df_hand_worked_cases() -> None:
    # intercept only, 5 equal clusters: G'G = a(I − J/G), so ν = G − 1 exactly
    g = np.repeat(np.arange(5), 4)
    x = np.ones((20, 1))
    fit = cr2(x, np.arange(20.0), g, np.linalg.inv(x.T @ x).astype(np.float64))
    assert fit.df(np.array([1.0]))[0] == pytest.approx(4.0, rel=1e-12)
    # difference of two group means, G0 = 2 and G1 = 5 equal clusters, regressor constant
    # within clusters: the Welch–Satterthwaite ν of the two means with equal variances,
    # (1/G0 + 1/G1)² / (1/(G0²(G0 − 1)) + 1/(G1²(G1 − 1)))
    g = np.repeat(np.arange(7), 3)
    x = np.column_stack([np.ones(21), (g < 2).astype(float)])
    fit = cr2(x, np.zeros(21), g, np.linalg.inv(x.T @ x).astype(np.float64))
    welch = (1 / 2 + 1 / 5) ** 2 / (1 / (4 * 1) + 1 / (25 * 4))
    assert fit.df(np.array([0.0, 1.0]))[0] == pytest.approx(welch, rel=1e-9)


def test_cr2_and_df_of_a_mean_agree_with_clubsandwichs_closed_forms() -> None:
    # the closed forms clubSandwich's own test suite checks its CR2 and Satterthwaite df
    # against (population mean, unbalanced clusters; tests/testthat/test_intercept_formulas.R,
    # https://rdrr.io/cran/clubSandwich/src/tests/testthat/test_intercept_formulas.R), on the
    # same design: 14 clusters of 1 + NegBin(size 2, mean 5) rows, ICC 0.2
    rng = np.random.default_rng(20190513)
    nj = 1 + rng.negative_binomial(2, 2 / (2 + 5), 14)
    g = np.repeat(np.arange(14), nj)
    n = float(nj.sum())
    y = rng.normal(0, np.sqrt(0.2), 14)[g] + rng.normal(0, np.sqrt(0.8), g.size)
    x = np.ones((g.size, 1))
    fit = ols_robust(y, x, g, "CR2")
    ybar = np.bincount(g, weights=y) / nj
    v = np.sum(nj**2 * (ybar - y.mean()) ** 2 / (1 - nj / n)) / n**2
    df = n**2 / (
        n**2 * np.sum(nj**2 / (n - nj) ** 2)
        - 2 * n * np.sum(nj**3 / (n - nj) ** 2)
        + np.sum(nj**2 / (n - nj)) ** 2
    )
    assert fit.cov[0, 0] == pytest.approx(v, rel=1e-10)
    assert fit.df(np.array([1.0]))[0] == pytest.approx(df, rel=1e-10)


def test_hc3_and_cr1_are_the_textbook_formulas() -> None:
    x, y, g = _problem(4)
    n, p = x.shape
    bread = np.linalg.inv(x.T @ x)
    e = y - x @ bread @ x.T @ y
    h = np.einsum("ij,jk,ik->i", x, bread, x)
    hc3 = ols_robust(y, x, g, "HC3")
    xe = x * (e / (1 - h))[:, None]
    np.testing.assert_allclose(hc3.cov, bread @ xe.T @ xe @ bread, rtol=1e-9)
    assert hc3.df(np.eye(p)).tolist() == [n - p] * p
    cr1 = ols_robust(y, x, g, "cluster")
    s = np.array([x[g == c].T @ e[g == c] for c in range(6)])
    want = bread @ s.T @ s @ bread * 6 / 5 * (n - 1) / (n - p)
    np.testing.assert_allclose(cr1.cov, want, rtol=1e-9)
    assert cr1.df(np.eye(p)).tolist() == [5.0] * p


def _coverage(clusters: int, treated: int, reps: int, seed: int) -> tuple[float, float]:
    """Share of nominal 95 % intervals for a cluster-level effect (true value 0) covering
    it: t(G − 1) and t(Bell–McCaffrey ν), both with CR2; engine random effects, unequal
    cluster sizes."""
    rng = np.random.default_rng(seed)
    old = new = 0
    for _ in range(reps):
        g = np.repeat(np.arange(clusters), rng.integers(20, 80, clusters))
        d = (g < treated).astype(float)
        x1 = rng.normal(size=g.size)
        y = 1.0 + 0.5 * x1 + rng.normal(size=clusters)[g] + rng.normal(size=g.size)
        fit = ols_robust(y, np.column_stack([np.ones(g.size), x1, d]), g, "CR2")
        se = float(np.sqrt(fit.cov[2, 2]))
        nu = float(fit.df(np.array([0.0, 0.0, 1.0]))[0])
        old += abs(fit.params[2]) <= stats.t.ppf(0.975, clusters - 1) * se
        new += abs(fit.params[2]) <= stats.t.ppf(0.975, nu) * se
    return old / reps, new / reps


@pytest.mark.parametrize(("clusters", "treated"), [(4, 2), (8, 2)])
def test_bell_mccaffrey_intervals_cover_with_few_clusters(clusters: int, treated: int) -> None:
    # seeded Monte Carlo, 300 replicates: t(G − 1) covers 0.937 (2 + 2 clusters) and 0.917
    # (2 + 6), t(ν) 0.973 and 0.987 (other seeds of 400: t(G − 1) 0.87–0.89)
    old, new = _coverage(clusters, treated, 300, seed=clusters)
    assert new >= 0.92
    assert new > old
