"""Block Jacobians (docs/paper.md §5.4, Fig 5): the token-averaged d block(x)_t / d x_t of each residual block.

For a sampled token t of an evaluation sequence, block l maps the residual stream to
``y = block(x)``; we take the Jacobian of ``y_t`` with respect to the token's own input ``x_t`` (a
D x D matrix; the other tokens' inputs are held at their values, i.e. the partial derivative). The
sequence is cut right after t (a causal block's y_t does not depend on later tokens), the layer is
re-run exactly as the model called it (masks, rotary tables: recorded by the capture hooks), and
``torch.func.jacrev`` computes all D rows at once (vmap over the D cotangents).

Summaries per block: ``||J - I||_F / ||I||_F`` of the token-averaged J (0 = the identity map), the
same averaged per token, and the diagonal share ``sum_i J_ii^2 / ||J||_F^2`` (1 = diagonal).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
from torch.func import jacrev
from torch.nn.attention import SDPBackend, sdpa_kernel

from depthlab.analysis.diagnostics.capture import LayerCall, ResidualCapture


def block_jacobian(layer: torch.nn.Module, call: LayerCall, h: torch.Tensor, t: int,
                   chunk_size: int | None = None) -> torch.Tensor:
    """D x D Jacobian of ``layer``'s output at position ``t`` w.r.t. its input at ``t``.
    ``h``: the layer's input (1, T, D) as recorded by ``call``; returns float32 [i, j] = dy_i/dx_j."""
    onehot = torch.zeros(h.shape[1], 1, dtype=h.dtype, device=h.device)
    onehot[t] = 1
    base = h.detach()

    def f(x: torch.Tensor) -> torch.Tensor:  # (D,) -> (D,)
        seq = base * (1 - onehot) + onehot * x  # x placed at position t (vmap/jacrev friendly)
        return call(layer, seq)[0, t]

    if chunk_size is None:  # bound the vmapped batch of a wide state (mHC's streams, AttnRes' sources) to ~256 MB
        chunk_size = max(1, (256 << 20) // (4 * (t + 1) * h.shape[-1] * 8))
        chunk_size = None if chunk_size >= h.shape[-1] else chunk_size
    # the math SDPA kernel: the fused CPU/flash backward kernels have no vmap batching rule
    with torch.enable_grad(), sdpa_kernel([SDPBackend.MATH]):
        jac = jacrev(f, chunk_size=chunk_size)(base[0, t])
    return jac.float()


def summarize(mean_j: torch.Tensor) -> dict[str, float]:
    D = mean_j.shape[0]
    eye = torch.eye(D, dtype=mean_j.dtype)
    fro = mean_j.square().sum()
    return {
        "rel_dist_identity": float((mean_j - eye).norm() / math.sqrt(D)),
        "diag_share": float(mean_j.diagonal().square().sum() / fro) if fro > 0 else float("nan"),
        "mean_diag": float(mean_j.diagonal().mean()),
        "fro_norm": float(fro.sqrt() / math.sqrt(D)),
    }


@torch.no_grad()
def block_jacobians(capture: ResidualCapture, sequences: Sequence[torch.Tensor], positions: Sequence[int],
                    layers: Sequence[int] | None = None, keep: Sequence[int] = (), chunk_size: int | None = None,
                    on_step: Callable[[], None] | None = None) -> dict:
    """Token-averaged Jacobians of the blocks ``layers`` (1-based; default all) over the sampled
    tokens ``(sequences[k], positions[k])`` (each sequence 1-D token ids). Returns per-block summaries
    and, for the blocks in ``keep``, the mean matrices themselves (``matrices``: {l: D x D tensor})."""
    L = capture.n_layers
    layers = list(range(1, L + 1)) if layers is None else list(layers)
    sums: dict[int, torch.Tensor] = {}
    per_token: dict[int, list[float]] = {l: [] for l in layers}
    for seq, t in zip(sequences, positions):
        ids = seq[: t + 1].unsqueeze(0)
        _, states, calls = capture.run(ids, keep_calls=True)
        for l in layers:
            J = block_jacobian(capture.layers[l - 1], calls[l - 1], states[l - 1], t, chunk_size).double().cpu()
            sums[l] = sums[l] + J if l in sums else J
            D = J.shape[0]
            per_token[l].append(float((J - torch.eye(D, dtype=J.dtype)).norm() / math.sqrt(D)))
            if on_step is not None:
                on_step()
        del states, calls
    n = len(positions)
    out: dict = {"layers": layers, "tokens": n, "per_layer": [], "matrices": {}}
    for l in layers:
        mean_j = sums[l] / n
        s = summarize(mean_j)
        s["rel_dist_identity_per_token"] = sum(per_token[l]) / n
        out["per_layer"].append(s)
        if l in keep:
            out["matrices"][l] = mean_j.float()
    return out
