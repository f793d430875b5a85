"""The empirical check of the theory on randomly initialised deep models (docs/paper.md §6).

``measure_empirical`` builds randomly initialised depthlab models of one width,
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

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from depthlab.analysis.theory.options import EmpiricalSetup
from depthlab.analysis.theory.recursions import growth_fits
from depthlab.base.metrics import element_variance
from depthlab.base.progress import progress
from depthlab.models.decoder import DecoderLM, build_model

log = logging.getLogger(__name__)

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
    variance = [element_variance(h) for h in hidden]  # (L+1,) over B·T·D entries

    gains = jacobian_rms_gains(model, hidden[0], setup.probe_depths(), gen)
    return {"variance": variance, "jacobian_gain": gains}


def measure_empirical(setup: EmpiricalSetup | None = None, schemes: Sequence[str] = ("pre", "lns")) -> dict[str, Any]:
    """Both measurements for each scheme over all seeds, seed-averaged, with growth fits."""
    setup = setup or EmpiricalSetup()
    setup.validate()
    probes = setup.probe_depths()
    layers = np.arange(1, setup.depth + 1)
    report: dict[str, Any] = {"setup": asdict(setup), "d_ff": setup.ffn, "jacobian_depths": probes, "schemes": {}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # width-64 ops: one thread is 4-5x faster than two on this project's CPU
    try:
        with progress(len(schemes) * len(setup.seeds), f"theory: random-init models of {setup.depth} blocks, width "
                      f"{setup.d_model}", "model") as bar:
            for scheme in schemes:
                runs = []
                for seed in setup.seeds:
                    runs.append(measure_scheme(scheme, setup, seed))
                    bar.update(1)
                report["schemes"][scheme] = _scheme_record(runs, layers, probes)
    finally:
        torch.set_num_threads(threads)
    return report


def _scheme_record(runs: list[dict[str, list[float]]], layers: np.ndarray, probes: list[int]) -> dict[str, Any]:
    """One scheme's seed-averaged variance and Jacobian gain, with their growth fits."""
    var = np.mean([r["variance"] for r in runs], axis=0)
    # RMS over seeds of the RMS gain: keeps it an estimate of sqrt(‖J‖_F² / n)
    gain = np.sqrt(np.mean([np.square(r["jacobian_gain"]) for r in runs], axis=0))
    excess = var[1:] - var[0]  # variance added by the blocks on top of the embedding's
    return {
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
