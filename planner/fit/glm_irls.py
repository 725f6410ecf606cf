"""statsmodels' GLM IRLS, score and Hessian for one family, many times without a model.

The preemption knee's profile fits one count GLM at ~320 knees, the hit-rate curve one
binomial GLM on ~300k windows; ``GLM(...)`` spends much of either building the model and
its results. :func:`irls` runs statsmodels 0.15's ``GLM._fit_irls`` (``wls_method="lstsq"``,
no freq_weights or exposure; binomial trials) with the family's own functions and its closing
pseudo-inverse step; :func:`score_and_hessian` is ``GLM.score_obs`` and ``GLM.hessian(observed
=True)`` at scale 1 (Poisson, NB2, binomial): tests/planner/test_glm_irls.py holds them equal
to statsmodels', bit for bit.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

_NOT_FINITE = "NaN, inf or invalid value detected in {0}, estimation infeasible."


def irls(  # noqa: PLR0913 - the GLM's parts and statsmodels' fit options, keyword-only
    endog: Array,
    exog: Array,
    *,
    family: Any,
    offset: Array,
    var_weights: Array,
    start: Array | None,
    maxiter: int,
    atol: float,
    rtol: float,
    n_trials: Array | None = None,
    criterion: str = "params",
) -> tuple[Array, float]:
    """(β, log-likelihood) that ``GLM(endog, exog, family=family, offset=offset,
    var_weights=var_weights).fit(start_params=start, maxiter=maxiter, tol=atol, rtol=rtol,
    tol_criterion=criterion)`` gives (its ``params`` and ``llf``), for ``maxiter`` ≥ 1.
    Binomial: ``endog`` and ``n_trials`` as ``family.initialize`` returns them (which also
    gives the family its trials)."""
    from statsmodels.tools.sm_exceptions import PerfectSeparationWarning  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    if maxiter < 1:
        raise ValueError(f"irls: maxiter must be at least 1, got {maxiter}")
    if criterion not in ("params", "deviance"):
        raise ValueError(f"irls: criterion is 'params' or 'deviance', got {criterion!r}")
    ones = np.ones(endog.shape[0])  # statsmodels' freq_weights (and n_trials but binomial)
    trials = ones if n_trials is None else n_trials
    iweights = ones * var_weights
    if start is None:  # statsmodels' start: the family's starting mu, β = 0 in the history
        start = np.zeros(exog.shape[1])
        mu = family.starting_mu(endog)
        lin_pred = family.predict(mu)
    else:
        lin_pred = np.dot(exog, start) + offset
        mu = family.fitted(lin_pred)
    deviance = family.deviance(endog, mu, var_weights, ones, 1.0)
    if np.isnan(deviance):
        raise ValueError("The first guess on the deviance function returned a nan.")
    previous = start if criterion == "params" else deviance
    for _ in range(maxiter):
        weights = iweights * trials * family.weights(mu)
        z = lin_pred + family.link.deriv(mu) * (endog - mu) - offset
        w_half = np.sqrt(weights)
        if not np.all(np.isfinite(w_half)):
            raise ValueError(_NOT_FINITE.format("weights"))
        if not np.all(np.isfinite(z)):
            raise ValueError(_NOT_FINITE.format("endog"))
        wexog = w_half[:, None] * exog
        wendog = w_half * z
        params = np.linalg.lstsq(wexog, wendog, rcond=-1)[0]
        lin_pred = np.dot(exog, params)
        lin_pred += offset
        mu = family.fitted(lin_pred)
        now = params if criterion == "params" else family.deviance(endog, mu, var_weights,
                                                                    ones, 1.0)  # fmt: skip
        if np.allclose(mu - endog, 0):
            warnings.warn(
                "Perfect separation or prediction detected, parameter may not be identified",
                category=PerfectSeparationWarning, stacklevel=2,
            )  # fmt: skip
        converged = np.allclose(previous, now, atol=atol, rtol=rtol)
        previous = now
        if converged:
            break
    # statsmodels whitens the last iteration's (z, weights) again for it: the same products
    beta = _pinv_step(wendog, wexog)
    fitted = family.fitted(np.dot(exog, beta) + offset + 0.0)
    llf = family.loglike(endog, fitted, var_weights=var_weights, freq_weights=ones, scale=1.0)
    return beta, float(llf)


def _pinv_step(wendog: Array, wexog: Array) -> Array:
    """The WLS that closes statsmodels' IRLS (``WLS.fit(method="pinv")``): its pseudo-inverse,
    with its warning when the design is rank-deficient."""
    from statsmodels.tools.sm_exceptions import SingularMatrixWarning  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`
    from statsmodels.tools.tools import pinv_extended  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    pinv_wexog, s = pinv_extended(wexog)
    # statsmodels' rank, np.linalg.matrix_rank(np.diag(s)): the singular values of a
    # diagonal matrix are its diagonal, so its tolerance applies to s itself
    if np.count_nonzero(s > s.max() * s.size * np.finfo(s.dtype).eps) < wexog.shape[1]:
        warnings.warn(
            "The design matrix is rank-deficient. The model parameters are not uniquely "
            "determined.", SingularMatrixWarning, stacklevel=3,
        )  # fmt: skip
    beta: Array = np.dot(pinv_wexog, wendog)
    return beta


def score_and_hessian(
    endog: Array,
    exog: Array,
    *,
    family: Any,
    offset: Array,
    var_weights: Array,
    params: Array,
    n_trials: Array | None = None,
) -> tuple[Array, Array]:
    """``GLM(endog, exog, family=family, offset=offset, var_weights=var_weights)``'s
    ``score_obs(params)`` and ``hessian(params, observed=True)``, for a family whose scale
    is 1 (Poisson, NegativeBinomial, Binomial: with ``n_trials`` as for :func:`irls`)."""
    ones = np.ones(endog.shape[0])  # statsmodels' freq_weights (and n_trials but binomial)
    weights = ones * var_weights * (ones if n_trials is None else n_trials)  # iweights * n_trials
    link, variance = family.link, family.variance
    mu = family.fitted(np.dot(exog, params) + offset + 0.0)
    factor = (endog - mu) / link.deriv(mu)
    factor /= variance(mu)
    factor *= weights
    eim = 1 / (link.deriv(mu) ** 2 * variance(mu))
    eim *= weights
    tmp = variance(mu) * link.deriv2(mu)
    tmp += variance.deriv(mu) * link.deriv(mu)
    tmp = factor * tmp
    tmp /= weights
    oim = eim * (1 + tmp)
    scaled = np.empty_like(exog)
    np.multiply(exog.T, oim, out=scaled.T)
    hessian: Array = -scaled.T.dot(exog)
    score_obs: Array = factor[:, None] * exog
    return score_obs, hessian


def binomial_cr1(endog: Array, exog: Array, groups: npt.NDArray[np.int64]) -> tuple[Array, Array]:
    """``GLM(endog, exog, family=Binomial()).fit(cov_type="cluster", cov_kwds={"groups":
    groups})``'s ``params`` and ``cov_params()`` (``endog``: [successes, failures]): its
    IRLS (:func:`irls`, statsmodels' defaults) and statsmodels' ``cov_cluster`` (CR1 with
    its small-sample factor) on the scores and the inverse observed Hessian."""
    from statsmodels.genmod import families  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`
    from statsmodels.stats.sandwich_covariance import cov_cluster  # noqa: PLC0415 - start-up: statsmodels (~0.7 s) loads when this fit runs, not on `import planner.plan`

    family = families.Binomial()
    ones = np.ones(endog.shape[0])
    y, n = family.initialize(np.asarray(endog, dtype=np.float64), ones)  # sets its trials
    parts: dict[str, Any] = {"family": family, "offset": np.zeros(y.shape[0]),
                             "var_weights": ones, "n_trials": n}  # fmt: skip
    beta, _ = irls(y, exog, **parts, start=None, maxiter=100, atol=1e-8, rtol=0.0,
                   criterion="deviance")  # fmt: skip
    score_obs, hessian = score_and_hessian(y, exog, **parts, params=beta)
    cov: Array = cov_cluster((score_obs, np.linalg.inv(hessian)), groups, use_correction=True)
    return beta, cov
