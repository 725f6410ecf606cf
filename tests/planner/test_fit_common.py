"""planner.fit.common: the least-squares sandwich against a brute-force loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from planner.fit.common import sandwich


def _problem(seed: int) -> tuple[Any, Any, Any, npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(7), rng.integers(2, 30, 7))  # unequal clusters
    n = g.size
    jac = np.column_stack([np.ones(n), rng.normal(size=n), rng.uniform(size=n)])
    resid = rng.normal(size=7)[g] + rng.normal(size=n)
    return jac, resid, rng.uniform(0.2, 3.0, n), g


def _brute(jac: Any, resid: Any, w: Any, g: npt.NDArray[np.int64] | None) -> Any:
    """(J'WJ)^-1 (Σ_units s s') (J'WJ)^-1 · factor, one unit (window or cluster) at a time."""
    n, p = jac.shape
    bread = np.linalg.inv(sum(w[i] * np.outer(jac[i], jac[i]) for i in range(n)))
    units = [[i] for i in range(n)] if g is None else [list(np.flatnonzero(g == c))
                                                       for c in np.unique(g)]  # fmt: skip
    meat = np.zeros((p, p))
    for rows in units:
        s = sum(w[i] * resid[i] * jac[i] for i in rows)
        meat += np.outer(s, s)
    k = len(units)
    factor = n / (n - p) if g is None else k / (k - 1) * (n - 1) / (n - p)
    return bread @ meat @ bread * factor


@pytest.mark.parametrize("clustered", [False, True])
@pytest.mark.parametrize("seed", [1, 2])
def test_sandwich_equals_the_brute_force_loop(seed: int, clustered: bool) -> None:
    jac, resid, w, g = _problem(seed)
    groups = g if clustered else None
    np.testing.assert_allclose(
        sandwich(jac, resid, w, groups), _brute(jac, resid, w, groups), rtol=1e-10, atol=0
    )


def test_sandwich_cluster_of_singletons_is_hc1_scaled() -> None:
    # every window its own cluster: CR1's factor G/(G − 1)·(n − 1)/(n − p) is HC1's
    # n/(n − p) when G = n, and the meats are the same sum
    jac, resid, w, _ = _problem(3)
    n = jac.shape[0]
    single = np.arange(n, dtype=np.int64)
    np.testing.assert_allclose(
        sandwich(jac, resid, w, single), sandwich(jac, resid, w, None), rtol=1e-12
    )
