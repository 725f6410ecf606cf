"""planner.fit.lsq against statsmodels' OLS (the brute force it replaces): the pinv solution,
its rank, the HC3 and CR1 covariances, on designs well and badly conditioned, rank-deficient,
shorter than wide, and folded over blocks of every size."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from statsmodels.regression.linear_model import OLS
from statsmodels.tools.sm_exceptions import SingularMatrixWarning

from planner.fit.common import ols_robust
from planner.fit.lsq import cov_cr1, cov_hc3, solve

Array = npt.NDArray[np.float64]
Groups = npt.NDArray[np.int64]


def _design(kind: str, n: int, rng: np.random.Generator) -> tuple[Array, Array, Groups]:
    """(y, x, groups) of a named shape."""
    g = rng.integers(0, 12, n).astype(np.int64)
    if kind == "spline":  # the gain fit's shape: a hinge basis × mode, rows scaled by √w
        u = rng.uniform(0.05, 0.95, n)
        d = (rng.random(n) < 0.5).astype(float)
        b = np.column_stack([np.ones(n), u - 0.5, *(np.maximum(u - k, 0) for k in (0.3, 0.5, 0.7))])
        sw = np.sqrt(rng.integers(1, 400, n).astype(float))
        x = np.column_stack([b, b * d[:, None]]) * sw[:, None]
        y = (1.0 + 0.2 * u + 0.1 * d * u + rng.normal(0, 0.05, n) + 0.1 * g / 12) * sw
        return y, x, g
    x = rng.normal(size=(n, 5))
    if kind == "ill":  # two columns nearly equal: condition number ~1e7
        x[:, 4] = x[:, 3] + 1e-7 * rng.normal(size=n)
    if kind == "deficient":  # one column the sum of two others
        x[:, 4] = x[:, 1] + x[:, 2]
    y = x @ np.arange(1.0, 6.0) + rng.standard_t(3, n) * (1 + np.abs(x[:, 0]))
    return y, x, g


CASES = [("plain", 400), ("spline", 3000), ("ill", 500), ("deficient", 300), ("plain", 4)]


@pytest.mark.parametrize(("kind", "n"), CASES)
@pytest.mark.parametrize("rows_per_pass", [1, 7, 64, 1 << 15])
def test_solve_and_sandwiches_equal_statsmodels(kind: str, n: int, rows_per_pass: int) -> None:
    y, x, g = _design(kind, n, np.random.default_rng(n))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularMatrixWarning)
        res = OLS(y, x).fit()
        fit = solve(y, x, rows_per_pass=rows_per_pass)
        hc3 = OLS(y, x).fit(cov_type="HC3").cov_params()
        cr1 = OLS(y, x).fit(cov_type="cluster", cov_kwds={"groups": g}).cov_params()
    # the minimum-norm solution is unique even when the design is rank-deficient
    tol = 1e-6 if kind == "ill" else 1e-9
    scale = np.abs(res.params).max()
    np.testing.assert_allclose(fit.params, res.params, rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(fit.resid, res.resid, rtol=tol, atol=tol * np.abs(y).max())
    assert fit.rank == res.model.rank and x.shape[0] - fit.rank == res.df_resid
    bread = np.asarray(res.normalized_cov_params)
    np.testing.assert_allclose(fit.bread, bread, rtol=tol, atol=tol * np.abs(bread).max())
    if n > x.shape[1] and kind != "ill":  # "ill": test_ill_conditioned_equal_exact_arithmetic
        for got, want in (
            (cov_hc3(x, fit, rows_per_pass), hc3),
            (cov_cr1(x, fit, g, rows_per_pass), cr1),
        ):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def _inverse(m: list[list[Fraction]]) -> list[list[Fraction]]:
    k = len(m)
    a = [row[:] + [Fraction(int(i == j)) for j in range(k)] for i, row in enumerate(m)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(a[r][c]))
        a[c], a[p] = a[p], a[c]
        a[c] = [v / a[c][c] for v in a[c]]
        for r in range(k):
            if r != c and a[r][c]:
                f = a[r][c]
                a[r] = [v - f * w for v, w in zip(a[r], a[c], strict=True)]
    return [row[k:] for row in a]


def _exact(y: Array, x: Array, g: npt.NDArray[np.int64], kind: str) -> tuple[Array, Array]:
    """(params, covariance) of HC3 or CR1 in exact rational arithmetic: the textbook
    formulas (X'X)⁻¹X'y and (X'X)⁻¹ M (X'X)⁻¹ with no rounding anywhere."""
    n, k = x.shape
    xs = [[Fraction(float(v)) for v in row] for row in x]
    ys = [Fraction(float(v)) for v in y]
    r = range(k)
    b = _inverse(
        [[sum((xs[i][a] * xs[i][c] for i in range(n)), Fraction(0)) for c in r] for a in r]
    )
    xty = [sum(xs[i][a] * ys[i] for i in range(n)) for a in r]
    beta = [sum(b[a][c] * xty[c] for c in r) for a in r]
    e = [ys[i] - sum(xs[i][a] * beta[a] for a in r) for i in range(n)]
    if kind == "HC3":
        meat = [[Fraction(0)] * k for _ in r]
        for i in range(n):
            h = sum(xs[i][a] * b[a][c] * xs[i][c] for a in r for c in r)
            s = (e[i] / (1 - h)) ** 2
            for a in r:
                for c in r:
                    meat[a][c] += xs[i][a] * xs[i][c] * s
        factor = 1.0
    else:
        sums: dict[int, list[Fraction]] = {}
        for i in range(n):
            v = sums.setdefault(int(g[i]), [Fraction(0)] * k)
            for a in r:
                v[a] += xs[i][a] * e[i]
        meat = [[sum((v[a] * v[c] for v in sums.values()), Fraction(0)) for c in r] for a in r]
        factor = len(sums) / (len(sums) - 1) * (n - 1) / (n - k)
    bm = [[sum(b[a][j] * meat[j][c] for j in r) for c in r] for a in r]
    cov = [[float(sum(bm[a][j] * b[j][c] for j in r)) for c in r] for a in r]
    return np.array([float(v) for v in beta]), np.array(cov) * factor


@pytest.mark.parametrize("kind", ["HC3", "cluster"])
def test_ill_conditioned_equal_exact_arithmetic(kind: str) -> None:
    """At κ ≈ 1e7 the covariance is wrong in the 2nd–3rd digit from any method that forms
    (X'X)⁻¹ or pinv(X) (statsmodels: ~1e-3–1e-2 off); the blocks stay within 1e-7."""
    y, x, g = _design("ill", 40, np.random.default_rng(5))
    beta, want = _exact(y, x, g, kind)
    fit = solve(y, x, rows_per_pass=16)
    got = cov_hc3(x, fit, 16) if kind == "HC3" else cov_cr1(x, fit, g, 16)
    np.testing.assert_allclose(fit.params, beta, rtol=1e-7, atol=1e-7 * np.abs(beta).max())
    np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-7 * np.abs(want).max())


def test_solve_rank_deficient_warns_as_statsmodels() -> None:
    y, x, _ = _design("deficient", 200, np.random.default_rng(1))
    with pytest.warns(SingularMatrixWarning, match="rank-deficient"):
        fit = solve(y, x)
    assert fit.rank == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert solve(*_design("plain", 200, np.random.default_rng(1))[:2]).rank == 5


def test_solve_a_wrong_solution_is_caught() -> None:
    """The comparison above can fail: a perturbed solution is far outside its tolerance."""
    y, x, _ = _design("spline", 2000, np.random.default_rng(3))
    res = OLS(y, x).fit()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(solve(y, x).params * (1 + 1e-6), res.params, rtol=1e-9)


@pytest.mark.parametrize("kind", ["HC3", "cluster"])
def test_ols_robust_is_statsmodels_fit(kind: str) -> None:
    y, x, g = _design("spline", 5000, np.random.default_rng(7))
    got = ols_robust(y, x, g, kind)
    kw = {"cov_kwds": {"groups": g}} if kind == "cluster" else {}
    want = OLS(y, x).fit(cov_type=kind, **kw)
    np.testing.assert_allclose(got.params, want.params, rtol=1e-9)
    np.testing.assert_allclose(got.cov, want.cov_params(), rtol=1e-8, atol=1e-12)
    assert got.df_resid == want.df_resid and got.clusters == 12
