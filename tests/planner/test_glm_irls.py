"""planner.fit.glm_irls: statsmodels' GLM IRLS without its model, bit for bit."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from statsmodels.genmod import families
from statsmodels.genmod.generalized_linear_model import GLM
from statsmodels.tools.sm_exceptions import PerfectSeparationWarning, SingularMatrixWarning

from planner.fit.glm_irls import binomial_cr1, irls, score_and_hessian


def _counts(seed: int, n: int, alpha: float, knee: float) -> dict[str, np.ndarray]:
    """Cell means of hinge-model counts: endog y/c, design [1, max(0, u − knee)], offset
    log t, var_weights c (the preemption knee's cells)."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.2, 1.0, n)
    t = rng.choice([15.0, 30.0, 60.0], n)
    c = rng.integers(1, 40, n).astype(float)
    mu = t * c * 0.002 * np.exp(6.0 * np.maximum(0.0, u - 0.7))
    lam = mu * (rng.gamma(1 / alpha, alpha, n) if alpha > 0 else 1.0)
    y = rng.poisson(lam).astype(float)
    x = np.column_stack([np.ones(n), np.maximum(0.0, u - knee)])
    return {"endog": y / c, "exog": x, "offset": np.log(t), "var_weights": c}


def _family(alpha: float) -> families.Family:
    return families.Poisson() if alpha == 0 else families.NegativeBinomial(alpha=alpha)


CASES = [
    # ((seed, cells, NB2 α, knee), start, maxiter)
    pytest.param((1, 400, 0.0, 0.7), (-6.0, 0.0), 50, id="poisson-converges"),
    pytest.param((2, 400, 0.5, 0.6), (-6.0, 0.0), 50, id="nb2-converges"),
    pytest.param((3, 300, 0.0, 0.8), (-6.2, 5.5), 50, id="poisson-warm-start"),
    pytest.param((4, 300, 0.0, 0.7), (-6.0, 0.0), 1, id="stops-at-maxiter-1"),
    pytest.param((5, 300, 0.3, 0.7), (-5.0, 1.0), 2, id="nb2-stops-at-maxiter-2"),
    pytest.param((6, 50, 0.0, 0.3), (-6.0, 0.0), 50, id="few-cells"),
]


def _model(cells: tuple[int, int, float, float]) -> dict[str, object]:
    """The GLM's arguments (endog, exog, family, offset, var_weights) of a CASES row."""
    seed, n, alpha, knee = cells
    return {**_counts(seed, n, alpha, knee), "family": _family(alpha)}


@pytest.mark.parametrize(("cells", "start", "maxiter"), CASES)
def test_irls_equals_statsmodels_glm_fit_bit_for_bit(
    cells: tuple[int, int, float, float], start: tuple[float, float], maxiter: int
) -> None:
    model = _model(cells)
    res = GLM(**model).fit(start_params=np.array(start), maxiter=maxiter, tol=1e-12,
                           rtol=1e-10, tol_criterion="params")  # fmt: skip
    beta, llf = irls(**model, start=np.array(start), maxiter=maxiter, atol=1e-12, rtol=1e-10)  # type: ignore[arg-type]
    np.testing.assert_array_equal(beta, np.asarray(res.params))
    assert llf == float(res.llf)
    assert res.fit_history["iteration"] <= maxiter


@pytest.mark.parametrize(("cells", "start"), [p.values[:2] for p in CASES])
def test_score_and_hessian_equal_statsmodels_glm_bit_for_bit(
    cells: tuple[int, int, float, float], start: tuple[float, float]
) -> None:
    model = _model(cells)
    params = np.array(start) + np.array([0.3, -0.7])  # off the fit: a non-zero score
    score_obs, hessian = score_and_hessian(**model, params=params)  # type: ignore[arg-type]
    np.testing.assert_array_equal(score_obs, GLM(**model).score_obs(params))
    np.testing.assert_array_equal(hessian, GLM(**model).hessian(params, observed=True))
    assert np.abs(score_obs.sum(axis=0)).max() > 0


def test_irls_rank_deficient_design_warns_as_statsmodels_does() -> None:
    data = _counts(7, 200, 0.0, 1.5)  # the knee above every u: the hinge column is all 0
    kw = {"family": _family(0.0), "offset": data["offset"], "var_weights": data["var_weights"]}
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        beta, llf = irls(data["endog"], data["exog"], start=np.array([-6.0, 0.0]), maxiter=50,
                         atol=1e-12, rtol=1e-10, **kw)  # fmt: skip
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        res = GLM(data["endog"], data["exog"], **kw).fit(
            start_params=np.array([-6.0, 0.0]), maxiter=50, tol=1e-12, rtol=1e-10,
            tol_criterion="params",
        )  # fmt: skip
    np.testing.assert_array_equal(beta, np.asarray(res.params))
    assert llf == float(res.llf)
    assert {w.category for w in ours} == {w.category for w in theirs} == {SingularMatrixWarning}


def test_irls_perfect_prediction_warns_as_statsmodels_does() -> None:
    x = np.column_stack([np.ones(6), np.zeros(6)])
    endog = np.zeros(6)  # no counts at all: μ → 0 = y
    kw = {"family": _family(0.0), "offset": np.zeros(6), "var_weights": np.ones(6)}
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        beta, _ = irls(endog, x, start=np.array([-40.0, 0.0]), maxiter=3, atol=1e-12,
                       rtol=1e-10, **kw)  # fmt: skip
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        res = GLM(endog, x, **kw).fit(start_params=np.array([-40.0, 0.0]), maxiter=3,
                                      tol=1e-12, rtol=1e-10, tol_criterion="params")  # fmt: skip
    np.testing.assert_array_equal(beta, np.asarray(res.params))
    assert PerfectSeparationWarning in {w.category for w in ours}
    assert {w.category for w in ours} == {w.category for w in theirs}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"maxiter": 0}, "maxiter must be at least 1", id="no-iteration"),
        pytest.param({"start": np.array([np.nan, 0.0])}, "returned a nan", id="nan-start"),
        pytest.param(
            {"var_weights": np.full(50, np.inf)},
            "invalid value detected in weights",
            id="infinite-weights",
        ),
    ],
)
def test_irls_refuses_bad_input_naming_it(change: dict[str, object], message: str) -> None:
    data = _counts(8, 50, 0.0, 0.7)
    kw: dict[str, object] = {"family": _family(0.0), "offset": data["offset"],
                             "var_weights": data["var_weights"], "start": np.array([-6.0, 0.0]),
                             "maxiter": 50, "atol": 1e-12, "rtol": 1e-10}  # fmt: skip
    kw.update(change)
    with pytest.raises(ValueError, match=message):
        irls(data["endog"], data["exog"], **kw)  # type: ignore[arg-type]


def _binomial(seed: int, n: int, pools: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[successes, failures] of a logistic curve in ln size with a pool effect, its design
    [1, x, x²] and each row's pool (the hit-rate curve's shape)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, n)
    pool = rng.integers(0, pools, n)
    trials = rng.integers(1, 500, n).astype(float)
    p = 1 / (1 + np.exp(-(0.3 + 1.5 * x - 0.8 * x**2 + rng.normal(0, 0.3, pools)[pool])))
    hits = rng.binomial(trials.astype(int), p).astype(float)
    h = hits / trials
    endog = np.column_stack([h * trials, (1.0 - h) * trials])
    return endog, np.column_stack([np.ones(n), x, x**2]), pool.astype(np.int64)


@pytest.mark.parametrize(("seed", "n", "pools"), [(11, 3000, 12), (12, 400, 5), (13, 60, 4)])
def test_binomial_cr1_equals_statsmodels_cluster_fit_bit_for_bit(
    seed: int, n: int, pools: int
) -> None:
    endog, exog, groups = _binomial(seed, n, pools)
    res = GLM(endog, exog, family=families.Binomial()).fit(
        cov_type="cluster", cov_kwds={"groups": groups}
    )
    beta, cov = binomial_cr1(endog, exog, groups)
    np.testing.assert_array_equal(beta, np.asarray(res.params))
    np.testing.assert_array_equal(cov, np.asarray(res.cov_params()))
    assert res.fit_history["iteration"] > 2  # iterated: the deviance criterion ran


@pytest.mark.parametrize("maxiter", [1, 3, 100])
def test_irls_from_the_familys_start_on_deviance_equals_statsmodels(maxiter: int) -> None:
    model = _model((14, 300, 0.0, 0.7))
    res = GLM(**model).fit(maxiter=maxiter, tol=1e-8, tol_criterion="deviance")
    beta, llf = irls(**model, start=None, maxiter=maxiter, atol=1e-8, rtol=0.0,  # type: ignore[arg-type]
                     criterion="deviance")  # fmt: skip
    np.testing.assert_array_equal(beta, np.asarray(res.params))
    assert llf == float(res.llf)


def test_irls_refuses_an_unknown_criterion() -> None:
    data = _counts(8, 50, 0.0, 0.7)
    with pytest.raises(ValueError, match="criterion is 'params' or 'deviance'"):
        irls(data["endog"], data["exog"], family=_family(0.0), offset=data["offset"],
             var_weights=data["var_weights"], start=None, maxiter=5, atol=1e-8, rtol=0.0,
             criterion="llf")  # fmt: skip
