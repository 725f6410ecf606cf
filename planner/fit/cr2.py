"""The one covariance the planner computes by hand: CR2, with its Bell–McCaffrey degrees
of freedom (Bell & McCaffrey 2002, Survey Methodology 28(2); Imbens & Kolesár 2016;
Pustejovsky & Tipton 2018). statsmodels (0.15) has HC0–HC3, CR1 and CR3, not this
bias-reduced linearization, which is what few clusters need.

Each cluster costs O(n_g p²) (no n_g × n_g matrix) and a contrast's ν O(G² p).

Method: planner/fit/METHODS.md#cr2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    Array = npt.NDArray[np.float64]

# eigenvalues of H_gg are in [0, 1]; one equal to 1 (a cluster alone identifies a
# column) makes A_g undefined: clipped below 1 as clubSandwich's pseudo-inverse does
_LEVERAGE_CAP = 1.0 - 1e-9


@dataclass(frozen=True, slots=True)
class CR2:
    """CR2 covariance ``cov`` of an OLS fit and what the Bell–McCaffrey ν needs."""

    cov: Array
    xtx_inv: Array  # M
    lmat: Array  # L_g, (G, p, p)
    kmat: Array  # K_g, (G, p, p)

    def df(self, contrasts: Array) -> Array:
        """Bell–McCaffrey ν for each row c of ``contrasts`` (METHODS.md#cr2)."""
        c = np.atleast_2d(contrasts)
        diag = np.einsum("rj,gjk,rk->rg", c, self.lmat, c)  # p_g'p_g per contrast, cluster
        u = np.einsum("gjk,rk->rgj", self.kmat, c)  # X_g'p_g
        gtg = -np.einsum("rgj,jk,rhk->rgh", u, self.xtx_inv, u)
        idx = np.arange(diag.shape[1])
        gtg[:, idx, idx] += diag
        tr = np.einsum("rgg->r", gtg)
        frob = np.einsum("rgh,rgh->r", gtg, gtg)
        with np.errstate(divide="ignore", invalid="ignore"):
            out: Array = np.where(frob > 0, tr * tr / frob, np.nan)
        return out


def cr2(x: Array, resid: Array, groups: npt.NDArray[np.int64], xtx_inv: Array) -> CR2:
    """CR2 of the OLS fit with design ``x``, residuals ``resid``, ``xtx_inv`` = (X'X)^(−1),
    clusters ``groups`` (METHODS.md#cr2)."""
    lam, vec = np.linalg.eigh(xtx_inv)
    root = (vec * np.sqrt(np.maximum(lam, 0.0))) @ vec.T  # M^(1/2)
    codes, inv = np.unique(groups, return_inverse=True)
    p = x.shape[1]
    meat = np.zeros((p, p))
    lmat = np.zeros((codes.size, p, p))
    kmat = np.zeros((codes.size, p, p))
    order = np.argsort(inv, kind="stable")
    cuts = np.searchsorted(inv[order], np.arange(codes.size + 1))
    for c in range(codes.size):
        rows = order[cuts[c] : cuts[c + 1]]
        xg, e = x[rows], resid[rows]
        z = xg @ root
        lz, vz = np.linalg.eigh(z.T @ z)
        lz = np.clip(lz, 0.0, _LEVERAGE_CAP)
        small = lz <= 1e-12
        safe = np.where(small, 1.0, lz)
        half = np.where(small, 0.5, ((1.0 - lz) ** -0.5 - 1.0) / safe)  # f = (1 − λ)^(−1/2)
        full = np.where(small, 1.0, 1.0 / (1.0 - lz) - 1.0) / np.where(small, 1.0, safe)
        zx = z.T @ xg  # Z'X_g, p × p
        vzx = vz.T @ zx
        gram = xg.T @ xg
        # X_g' f(H_gg) X_g = X_g'X_g + (V'Z'X_g)' diag(w) (V'Z'X_g)
        kmat[c] = (gram + vzx.T @ (half[:, None] * vzx)) @ xtx_inv  # X_g' A_g X_g M
        lmat[c] = xtx_inv @ (gram + vzx.T @ (full[:, None] * vzx)) @ xtx_inv  # M X_g'A_g²X_g M
        score = xg.T @ e + zx.T @ (vz @ (half * (vz.T @ (z.T @ e))))
        meat += np.outer(score, score)
    cov: Array = xtx_inv @ meat @ xtx_inv
    return CR2(cov=cov, xtx_inv=xtx_inv, lmat=lmat, kmat=kmat)
