"""The paper's variance theory (SPEC.md §6), iterated numerically, and an empirical check of it.

Two parts:

1. **Recursions** (no model). Lemma 3.2 (Pre-LN) and Lemma 4.1 (LNS) state the growth of the
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

2. **Empirical check** (``measure_empirical``). Randomly initialised depthlab models of one width,
   ``pre`` and ``lns``, one deep model per scheme and seed: since neither scheme's block ``l``
   depends on the total depth ``L`` (LNS scales by ``1/√l``, init is depth-independent), the first
   ``l`` blocks of a deep model *are* an ``l``-layer model, so one forward gives every depth.
   - variance of ``hidden_states[l]`` (output of block ``l``; ``[0]`` is the embedding) over all
     batch, position and channel entries, averaged over seeds;
   - ``‖∂y_l/∂x_1‖`` estimated as the RMS gain ``‖J_lᵀ w‖ / ‖w‖`` with ``w ~ N(0, I)`` over the
     whole (B, T, D) output: ``E‖Jᵀw‖² = ‖J‖_F²``, so its square averages to the mean squared
     singular value of ``J_l`` (a lower bound on the spectral norm the theorems bound). One
     backward pass per probed depth (vector-Jacobian product), sharing one forward graph;
     weights are frozen so only the input gradient is computed.
   Growth is fitted as a power law ``a · l^p`` (log-log least squares) and an exponential
   ``a · e^{r l}`` (log-linear), each with R².
"""

from __future__ import annotations

import json
import logging
import math
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from depthlab.config import ModelConfig
from depthlab.configure import from_preset
from depthlab.errors import DepthlabError
from depthlab.model import DecoderLM, build_model

log = logging.getLogger(__name__)

MAX_EMPIRICAL_DEPTH = 4096  # beyond this a CPU run takes far too long to be useful


# ====================================================================================== checks
def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= lo
    if ok and hi is not None:
        ok = value <= hi
    if not ok:
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise DepthlabError(f"{name} must be an integer {rng}, got {value!r}")
    return int(value)


def _check_pos(name: str, value: float, allow_zero: bool = False) -> float:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        rng = ">= 0" if allow_zero else "> 0"
        raise DepthlabError(f"{name} must be a finite number {rng}, got {value!r}")
    return float(value)


# ====================================================================================== recursions
def pre_ln_variance(depth: int, c: float = 1.0, sigma1_sq: float = 1.0) -> np.ndarray:
    """Lemma 3.2 form: σ²_1..σ²_depth with σ²_{l+1} = σ²_l (1 + c/σ_l)."""
    depth, c, s2 = _check_int("depth", depth, 2), _check_pos("c", c), _check_pos("sigma1_sq", sigma1_sq)
    out = np.empty(depth)
    out[0] = s2
    for l in range(1, depth):  # out[l-1] is σ²_l
        out[l] = out[l - 1] * (1.0 + c / math.sqrt(out[l - 1]))
    return out


def lns_variance(depth: int, c: float = 1.0, sigma1_sq: float = 1.0) -> np.ndarray:
    """Lemma 4.1 form: σ²_1..σ²_depth with σ²_{l+1} = σ²_l (1 + c/(√l σ_l))."""
    depth, c, s2 = _check_int("depth", depth, 2), _check_pos("c", c), _check_pos("sigma1_sq", sigma1_sq)
    out = np.empty(depth)
    out[0] = s2
    for l in range(1, depth):
        out[l] = out[l - 1] * (1.0 + c / (math.sqrt(l) * math.sqrt(out[l - 1])))
    return out


def upper_bound_log10(depth: int, c: float = 1.0, sigma1_sq: float = 1.0, lns: bool = False) -> np.ndarray:
    """log10 of the paper's frozen-σ upper bound (eq. 33): σ²_1 Π_{k<l} (1 + c/(k^{e} σ_1)), e = ½ for LNS else 0."""
    depth = _check_int("depth", depth, 2)
    s1 = math.sqrt(_check_pos("sigma1_sq", sigma1_sq))
    k = np.arange(1, depth, dtype=float)
    factors = 1.0 + _check_pos("c", c) / ((np.sqrt(k) if lns else np.ones_like(k)) * s1)
    return np.concatenate([[0.0], np.cumsum(np.log10(factors))]) + math.log10(sigma1_sq)


def gradient_bound(variance: Sequence[float], A: float = 1.0, B: float = 1.0, lns: bool = False) -> np.ndarray:
    """Theorem 3.3 (``lns=False``) / 4.2 product for L = 1..len(variance); L = 1 is the empty product 1.

    Pre-LN factor ``1 + A/σ_l + B/σ_l²``; LNS factor ``1 + A/(l σ_l) + B/(l² σ_l²)``.
    """
    A, B = _check_pos("A", A, allow_zero=True), _check_pos("B", B, allow_zero=True)
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


# ====================================================================================== part 1
@dataclass
class RecursionParams:
    c: float = 1.0  # branch constant of the Θ(1 + c/σ) factor (paper: numerator set to 1)
    sigma1_sq: float = 1.0  # σ²_1, variance of block 1's input (only c/σ_1 matters)
    A: float = 1.0  # Theorem 3.3/4.2 first-order constant
    B: float = 1.0  # Theorem 3.3/4.2 second-order constant


def recursion_report(depth: int, params: RecursionParams | None = None) -> dict[str, Any]:
    """Iterate both recursions and both gradient bounds to ``depth``; fit their growth."""
    p = params or RecursionParams()
    depth = _check_int("depth", depth, 2)
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


# ====================================================================================== part 2
@dataclass
class EmpiricalSetup:
    depth: int = 256  # blocks of the deep model (every depth 1..depth is measured)
    d_model: int = 64  # width; narrow so hundreds of layers run in seconds on a CPU
    n_heads: int = 4
    d_ff: int | None = None  # None = the tiny preset's ratio 2.75·d_model, rounded to a multiple of 8
    seq_len: int = 64
    batch_size: int = 2
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    init_std: float = 0.02  # the paper's init; larger values exaggerate the branches (see module doc)
    n_jacobian_depths: int = 12  # geometric grid of probed depths for ‖∂y_l/∂x_1‖

    def validate(self) -> None:
        _check_int("empirical depth", self.depth, 2, MAX_EMPIRICAL_DEPTH)
        for name in ("d_model", "n_heads", "seq_len", "batch_size", "n_jacobian_depths"):
            _check_int(name, getattr(self, name), 1)
        if self.d_ff is not None:
            _check_int("d_ff", self.d_ff, 1)
        if not self.seeds:
            raise DepthlabError("seeds must list at least one seed, got none")
        _check_pos("init_std", self.init_std)
        self.config("pre")  # shape errors (width vs heads, ...) surface now, as ConfigError

    def config(self, scheme: str) -> ModelConfig:
        """The tiny preset narrowed/deepened to this setup."""
        return from_preset(
            "tiny", scheme=scheme, n_layers=self.depth, d_model=self.d_model, n_heads=self.n_heads,
            d_ff=self.ffn, max_seq_len=self.seq_len, init_std=self.init_std,
        )

    @property
    def ffn(self) -> int:
        return self.d_ff if self.d_ff is not None else max(8, 8 * round(2.75 * self.d_model / 8))

    def probe_depths(self) -> list[int]:
        grid = np.geomspace(1, self.depth, self.n_jacobian_depths)
        return sorted({int(round(v)) for v in grid} | {self.depth})


def _model(scheme: str, setup: EmpiricalSetup, seed: int) -> DecoderLM:
    torch.manual_seed(seed)
    model = build_model(setup.config(scheme)).eval()
    model.requires_grad_(False)  # only the input gradient is needed
    return model


def jacobian_rms_gains(
    model: DecoderLM, x1: torch.Tensor, depths: Sequence[int], gen: torch.Generator, n_probes: int = 1
) -> list[float]:
    """RMS gain of ∂y_l/∂x_1 for each l in ``depths``: sqrt(mean over probes of ‖J_lᵀw‖²/‖w‖²), w ~ N(0, I).

    ``x1`` (B, T, D) is the input of block 1. E‖J_lᵀw‖² = ‖J_l‖_F², so the square of the estimate
    averages to ‖J_l‖_F² / n (the mean squared singular value). One forward builds one graph; each
    depth and probe costs one backward through the first l blocks.
    """
    depths = sorted(set(depths))
    x1 = x1.detach().clone().requires_grad_(True)
    rope = model.rope(x1.shape[1], x1.device)
    outputs, h = {}, x1
    with torch.enable_grad():
        for l, block in enumerate(model.blocks[: depths[-1]], start=1):
            h = block(h, rope)  # (B, T, D)
            if l in depths:
                outputs[l] = h
        gains = []
        for i, l in enumerate(depths):
            sq = 0.0
            for k in range(n_probes):
                w = torch.randn(outputs[l].shape, generator=gen, dtype=outputs[l].dtype)
                last = i == len(depths) - 1 and k == n_probes - 1
                (g,) = torch.autograd.grad(outputs[l], x1, grad_outputs=w, retain_graph=not last)
                sq += float(g.double().norm() ** 2 / w.double().norm() ** 2)
            gains.append(math.sqrt(sq / n_probes))
    return gains


def measure_scheme(scheme: str, setup: EmpiricalSetup, seed: int) -> dict[str, list[float]]:
    """Variance per depth 0..L and the RMS Jacobian gain ‖∂y_l/∂x_1‖ at the probe depths, one seed."""
    model = _model(scheme, setup, seed)
    gen = torch.Generator().manual_seed(10_000 + seed)
    ids = torch.randint(model.cfg.vocab_size, (setup.batch_size, setup.seq_len), generator=gen)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states
    variance = [float(h.double().var()) for h in hidden]  # (L+1,) over B·T·D entries

    gains = jacobian_rms_gains(model, hidden[0], setup.probe_depths(), gen)
    return {"variance": variance, "jacobian_gain": gains}


def measure_empirical(setup: EmpiricalSetup | None = None, schemes: Sequence[str] = ("pre", "lns")) -> dict[str, Any]:
    """Both measurements for each scheme over all seeds, seed-averaged, with growth fits."""
    setup = setup or EmpiricalSetup()
    setup.validate()
    probes = setup.probe_depths()
    layers = np.arange(1, setup.depth + 1)
    report: dict[str, Any] = {"setup": asdict(setup), "d_ff": setup.ffn, "jacobian_depths": probes, "schemes": {}}
    for scheme in schemes:
        runs = []
        for seed in setup.seeds:
            log.info("theory: measuring %s, %d layers, width %d, seed %d", scheme, setup.depth, setup.d_model, seed)
            runs.append(measure_scheme(scheme, setup, seed))
        var = np.mean([r["variance"] for r in runs], axis=0)
        # RMS over seeds of the RMS gain: keeps it an estimate of sqrt(‖J‖_F² / n)
        gain = np.sqrt(np.mean([np.square(r["jacobian_gain"]) for r in runs], axis=0))
        excess = var[1:] - var[0]  # variance added by the blocks on top of the embedding's
        report["schemes"][scheme] = {
            "variance": var.tolist(),
            "variance_per_seed": [r["variance"] for r in runs],
            "jacobian_gain": gain.tolist(),
            "jacobian_gain_per_seed": [r["jacobian_gain"] for r in runs],
            "fits": {
                "variance": growth_fits(layers, var[1:]),
                "excess_variance": growth_fits(layers, excess) if np.all(excess > 0) else None,
                "jacobian_gain": growth_fits(probes, gain),
            },
            "variance_ratio_last_to_embedding": float(var[-1] / var[0]),
        }
    return report


# ====================================================================================== run all
def run_theory(
    depth: int,
    out: str | Path,
    params: RecursionParams | None = None,
    setup: EmpiricalSetup | None = None,
    empirical: bool = True,
    command: str | None = None,
) -> dict[str, Any]:
    """Recursions to ``depth`` (+ empirical check), written to ``out/theory.json`` and ``out/theory.png``."""
    from depthlab.plots.theory import plot_theory  # late: matplotlib only when drawing

    depth = _check_int("depth", depth, 2)
    if setup is not None:
        setup.validate()  # fail before the (quick) recursions, not after
    rec = recursion_report(depth, params)
    emp = measure_empirical(setup) if empirical else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "recursion": rec,
        "empirical": emp,
        "provenance": {
            "command": command,
            "torch": torch.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }
    json_path = out / "theory.json"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    fig = plot_theory(
        out / "theory.png",
        variance=rec["variance"],
        gradient_bound=rec["gradient_bound"],
        emp_variance={k: v["variance"] for k, v in emp["schemes"].items()} if emp else None,
        emp_jacobian_depths=emp["jacobian_depths"] if emp else None,
        emp_jacobian_gain={k: v["jacobian_gain"] for k, v in emp["schemes"].items()} if emp else None,
        emp_label=_emp_label(emp["setup"]) if emp else "",
    )
    result["paths"] = {"json": str(json_path), "figure": str(fig)}
    log.info("theory: wrote %s and %s", json_path, fig)
    return result


def _emp_label(setup: dict[str, Any]) -> str:
    return (f"random init, width {setup['d_model']}, std {setup['init_std']}, "
            f"B×T={setup['batch_size']}×{setup['seq_len']}, {len(setup['seeds'])} seed(s)")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """A short human summary of ``run_theory``'s result (the CLI prints it)."""
    rec = result["recursion"]
    fv, fg = rec["fits"]["variance"], rec["fits"]["gradient_bound"]
    lines = [
        f"recursions to depth {rec['depth']} (c={rec['params']['c']}, σ²_1={rec['params']['sigma1_sq']}):",
        f"  variance   pre: σ²_L={rec['variance']['pre'][-1]:.4g}, power-law exponent (deeper half) "
        f"{fv['pre']['power_law_tail']['exponent']:.2f} | lns: σ²_L={rec['variance']['lns'][-1]:.4g}, "
        f"exponent {fv['lns']['power_law_tail']['exponent']:.2f}",
        f"  grad bound pre: {rec['gradient_bound']['pre'][-1]:.4g} (exponent {fg['pre']['power_law_tail']['exponent']:.2f})"
        f" | lns: {rec['gradient_bound']['lns'][-1]:.4g} (exponent {fg['lns']['power_law_tail']['exponent']:.2f})",
    ]
    emp = result.get("empirical")
    if emp:
        lines.append(f"empirical, {emp['setup']['depth']} layers ({_emp_label(emp['setup'])}):")
        for name, s in emp["schemes"].items():
            f = s["fits"]
            lines.append(
                f"  {name:<4} variance {s['variance'][0]:.3g} -> {s['variance'][-1]:.3g} "
                f"(×{s['variance_ratio_last_to_embedding']:.1f}; exponent {f['variance']['power_law']['exponent']:.2f})"
                f", ‖∂y_L/∂x_1‖ ≈ {s['jacobian_gain'][-1]:.3g} (exponent {f['jacobian_gain']['power_law']['exponent']:.2f})"
            )
    return lines
