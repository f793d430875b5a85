"""The paper's variance theory (docs/paper.md §6) iterated numerically: recursions, bounds, growth fits.

**Recursions** (no model). Lemma 3.2 (Pre-LN) and Lemma 4.1 (LNS) state the growth of the
residual-stream variance ``σ²_l`` only up to Θ(·). We iterate the representative forms

    Pre-LN:  σ²_{l+1} = σ²_l · (1 + c / σ_l)
    LNS:     σ²_{l+1} = σ²_l · (1 + c / (√l · σ_l))

with ``c = 1`` and ``σ²_1 = 1`` by default. Why these constants: the proof of Lemma 3.2 (eq. 30)
"sets the numerator to 1", and the recursions are invariant under ``(σ, c) -> (kσ, kc)``, so
``c / σ_1`` is the only dimensionless knob; ``c / σ_1 = 1`` says "a branch adds about as much
as the normalised input carries". Iterated literally, the forms grow like
``σ_l ≈ σ_1 + c(l-1)/2`` (Pre-LN, so σ² ~ l²) and ``σ_l ≈ σ_1 + c(√l - 1)`` (LNS, σ² ~ l).
The paper's *exponential* Pre-LN upper bound (eq. 33) freezes ``σ_k`` at ``σ_1`` inside the
product: ``σ²_1 (1 + c/σ_1)^{l-1}``; the same construction for LNS gives
``σ²_1 Π_k (1 + c/(√k σ_1)) ~ exp(2c√l/σ_1)``. Both bound forms are reported too (as log10,
since the Pre-LN one overflows a float beyond ~1000 layers).

The gradient bounds are the products of Theorems 3.3 and 4.2, evaluated on the recursion's own
``σ_l`` with constants ``A = B = 1``:

    Pre-LN:  ‖∂y_L/∂x_1‖ ≤ Π_{l<L} (1 + A/σ_l + B/σ_l²)
    LNS:     ‖∂y_L/∂x_1‖ ≤ Π_{l<L} (1 + A/(l σ_l) + B/(l² σ_l²))

(Appendix eqs. 47/48 give A and B from widths, heads, sequence length and init std; for real
shapes they are ~1e5-1e6, which makes both products overflow -- see ``paper_constants``.)
Note what the numbers show: on the recursions' own σ_l the Pre-LN product grows like L^{2A}
and the LNS one converges (its factors are 1 + O(l^-1.5)). The paper's reading (Pre-LN bound
-> constant, LNS bound keeps growing) needs Pre-LN variance at its *exponential* upper bound,
which the literal recursion does not reach.

The empirical check on random-init models is :mod:`depthlab.analysis.theory.empirical`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from depthlab.analysis.theory.options import RecursionParams, check_int, check_pos
from depthlab.base.errors import DepthlabError


# ====================================================================================== recursions
def pre_ln_variance(depth: int, c: float = 1.0, sigma1_sq: float = 1.0) -> np.ndarray:
    """Lemma 3.2 form: σ²_1..σ²_depth with σ²_{l+1} = σ²_l (1 + c/σ_l)."""
    depth, c, s2 = check_int("depth", depth, 2), check_pos("c", c), check_pos("sigma1_sq", sigma1_sq)
    out = np.empty(depth)
    out[0] = s2
    for l in range(1, depth):  # out[l-1] is σ²_l
        out[l] = out[l - 1] * (1.0 + c / math.sqrt(out[l - 1]))
    return out


def lns_variance(depth: int, c: float = 1.0, sigma1_sq: float = 1.0) -> np.ndarray:
    """Lemma 4.1 form: σ²_1..σ²_depth with σ²_{l+1} = σ²_l (1 + c/(√l σ_l))."""
    depth, c, s2 = check_int("depth", depth, 2), check_pos("c", c), check_pos("sigma1_sq", sigma1_sq)
    out = np.empty(depth)
    out[0] = s2
    for l in range(1, depth):
        out[l] = out[l - 1] * (1.0 + c / (math.sqrt(l) * math.sqrt(out[l - 1])))
    return out


def upper_bound_log10(depth: int, c: float = 1.0, sigma1_sq: float = 1.0, lns: bool = False) -> np.ndarray:
    """log10 of the paper's frozen-σ upper bound (eq. 33): σ²_1 Π_{k<l} (1 + c/(k^{e} σ_1)), e = ½ for LNS else 0."""
    depth = check_int("depth", depth, 2)
    s1 = math.sqrt(check_pos("sigma1_sq", sigma1_sq))
    k = np.arange(1, depth, dtype=float)
    factors = 1.0 + check_pos("c", c) / ((np.sqrt(k) if lns else np.ones_like(k)) * s1)
    return np.concatenate([[0.0], np.cumsum(np.log10(factors))]) + math.log10(sigma1_sq)


def gradient_bound(variance: Sequence[float], A: float = 1.0, B: float = 1.0, lns: bool = False) -> np.ndarray:
    """Theorem 3.3 (``lns=False``) / 4.2 product for L = 1..len(variance); L = 1 is the empty product 1.

    Pre-LN factor ``1 + A/σ_l + B/σ_l²``; LNS factor ``1 + A/(l σ_l) + B/(l² σ_l²)``.
    """
    A, B = check_pos("A", A, allow_zero=True), check_pos("B", B, allow_zero=True)
    sigma = np.sqrt(np.asarray(variance, dtype=float))
    l = np.arange(1, len(sigma) + 1, dtype=float)
    damp = l if lns else np.ones_like(l)
    factors = 1.0 + A / (damp * sigma) + B / (damp * sigma) ** 2
    return np.concatenate([[1.0], np.exp(np.cumsum(np.log(factors[:-1])))])


def paper_constants(d: int, d_ffn: int, n_heads: int, seq_len: int, std: float) -> dict[str, float]:
    """A and B of Appendix eqs. 47/48 for a given shape (informational: they are huge)."""
    dh = d / n_heads
    s_term = math.sqrt(seq_len) + 2 + 1 / math.sqrt(seq_len)
    a = std**2 / (math.sqrt(d) + math.sqrt(d_ffn)) ** 2 + 2 * d * n_heads * s_term * std**2 * (
        d * math.sqrt(dh) + 1 + math.sqrt(dh / d)
    )
    b = 2 * d * n_heads * s_term * std**4 * d * math.sqrt(dh)
    return {"A": a, "B": b}


# ====================================================================================== fits
def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, R²)."""
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else 1.0
    return float(a), float(b), r2


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """y ≈ prefactor · x^exponent, fitted in log-log space (positive values only)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (xa > 0) & (ya > 0) & np.isfinite(ya)
    if keep.sum() < 2:
        raise DepthlabError(f"a power-law fit needs at least 2 positive points, got {int(keep.sum())}")
    a, b, r2 = _fit_line(np.log(xa[keep]), np.log(ya[keep]))
    return {"exponent": b, "prefactor": math.exp(a), "r2": r2}


def fit_exponential(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """y ≈ prefactor · exp(rate · x), fitted in log-linear space (positive values only)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (ya > 0) & np.isfinite(ya)
    if keep.sum() < 2:
        raise DepthlabError(f"an exponential fit needs at least 2 positive points, got {int(keep.sum())}")
    a, b, r2 = _fit_line(xa[keep], np.log(ya[keep]))
    return {"rate": b, "prefactor": math.exp(a), "r2": r2}


def growth_fits(x: Sequence[float], y: Sequence[float]) -> dict[str, dict[str, float]]:
    """Both fits over all points, plus the power law over the deeper half (the asymptotic slope)."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    tail = xa >= xa.max() / 2
    return {
        "power_law": fit_power_law(xa, ya),
        "power_law_tail": fit_power_law(xa[tail], ya[tail]) if tail.sum() >= 2 else fit_power_law(xa, ya),
        "exponential": fit_exponential(xa, ya),
    }


# ====================================================================================== report
def recursion_report(depth: int, params: RecursionParams | None = None) -> dict[str, Any]:
    """Iterate both recursions and both gradient bounds to ``depth``; fit their growth."""
    p = params or RecursionParams()
    depth = check_int("depth", depth, 2)
    layers = np.arange(1, depth + 1)
    pre, lns = pre_ln_variance(depth, p.c, p.sigma1_sq), lns_variance(depth, p.c, p.sigma1_sq)
    gpre, glns = gradient_bound(pre, p.A, p.B), gradient_bound(lns, p.A, p.B, lns=True)
    lns_fit = fit_power_law(layers, lns)
    # how far Pre-LN ends above the power law fitted to LNS, extrapolated over the same depths
    ratio_to_lns_fit = pre / (lns_fit["prefactor"] * layers.astype(float) ** lns_fit["exponent"])
    return {
        "params": asdict(p),
        "depth": depth,
        "variance": {"pre": pre.tolist(), "lns": lns.tolist()},
        "variance_upper_bound_log10": {
            "pre": upper_bound_log10(depth, p.c, p.sigma1_sq).tolist(),
            "lns": upper_bound_log10(depth, p.c, p.sigma1_sq, lns=True).tolist(),
        },
        "gradient_bound": {"pre": gpre.tolist(), "lns": glns.tolist()},
        "fits": {
            "variance": {"pre": growth_fits(layers, pre), "lns": growth_fits(layers, lns)},
            "gradient_bound": {"pre": growth_fits(layers, gpre), "lns": growth_fits(layers, glns)},
        },
        "pre_over_lns_power_fit_at_depth": float(ratio_to_lns_fit[-1]),
    }
