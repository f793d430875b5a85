"""Layerwise output variance and residual-norm growth (docs/paper.md §5.3), streamed.

For each residual state x^l (l = 1..L+1; x^{l+1} is the output of block l): the variance of all its
elements over the evaluated tokens (Fig 4's "output variance"), its RMS, and the mean per-token L2
norm; from which the norm growth per block ||x^{l+1}|| / ||x^l||. Sums are float64; the variance is
:func:`depthlab.base.metrics.element_variance`'s (the trainer's probe), streamed over batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from depthlab.base.metrics import variance_from_sums


class VarianceAccumulator:
    def __init__(self, n_states: int) -> None:
        self.n_states = n_states
        self.sum = torch.zeros(n_states, dtype=torch.float64)
        self.sumsq = torch.zeros(n_states, dtype=torch.float64)
        self.norm_sum = torch.zeros(n_states, dtype=torch.float64)
        self.tok_var_sum = torch.zeros(n_states, dtype=torch.float64)
        self.tokens = 0
        self.width = 0

    @torch.no_grad()
    def update(self, states: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> None:
        for i, s in enumerate(states):
            x = s.reshape(-1, s.shape[-1])
            if mask is not None:
                x = x[mask.reshape(-1).to(x.device)]
            x = x.double()
            self.sum[i] += x.sum().cpu()
            self.sumsq[i] += x.square().sum().cpu()
            self.norm_sum[i] += x.norm(dim=-1).sum().cpu()
            self.tok_var_sum[i] += x.var(dim=-1, unbiased=False).sum().cpu()
        self.tokens += x.shape[0]
        self.width = x.shape[-1]

    def result(self) -> dict[str, list[float]]:
        n = self.tokens * self.width
        if n == 0:
            raise ValueError("no tokens were added")
        var = variance_from_sums(self.sum, self.sumsq, n)
        norm = self.norm_sum / self.tokens
        return {
            "variance": var.tolist(),  # element variance of x^l, l = 1..L+1
            "rms": (self.sumsq / n).sqrt().tolist(),
            "mean_norm": norm.tolist(),  # mean per-token ||x^l||_2
            "token_variance": (self.tok_var_sum / self.tokens).tolist(),  # mean per-token variance over channels
            "norm_growth": (norm[1:] / norm[:-1]).tolist(),  # block l: ||x^{l+1}|| / ||x^l||, l = 1..L
        }
