"""Angular distance between residual states (docs/paper.md §5.1, eq. 1), all pairs, streamed.

    d(x^l, x^{l+n}) = arccos(cos(x_T^l, x_T^{l+n})) / pi, averaged over every evaluated token T.

:class:`AngularAccumulator` keeps only an (L+1) x (L+1) matrix of sums and a token count, whatever
the number of tokens: per batch, the L+1 states of each token are normalised and their cosine Gram
matrix is formed by one batched matmul (tokens in chunks), then ``arccos/pi`` is summed over tokens.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

#: Upper bound on the elements of one chunk's (tokens, L+1, L+1) Gram tensor.
GRAM_CHUNK_ELEMS = 1 << 23


class AngularAccumulator:
    """Running sums of arccos(cos)/pi for every pair of the ``n_states`` residual states."""

    def __init__(self, n_states: int, dtype: torch.dtype | None = None) -> None:
        self.n_states = n_states
        # Gram precision. float32 (default): angles within ~5e-4 of exact near the identity, where
        # arccos amplifies rounding; float64 is exact to ~1e-7 but ~15x slower on CPU (tiny bmm's).
        self.dtype = dtype or torch.float32
        self.sum = torch.zeros(n_states, n_states, dtype=torch.float64)
        self.count = 0

    def state_nbytes(self) -> int:
        """Bytes held between batches (constant: independent of the number of tokens)."""
        return self.sum.numel() * self.sum.element_size()

    @torch.no_grad()
    def update(self, states: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> None:
        """Add the tokens of one batch. ``states``: n_states tensors (B, T, D); ``mask`` (B, T) bool
        selects the tokens to count (None: all)."""
        if len(states) != self.n_states:
            raise ValueError(f"expected {self.n_states} states, got {len(states)}")
        device = states[0].device
        dtype = self.dtype
        flat = [s.reshape(-1, s.shape[-1]) for s in states]  # views (N, D)
        if mask is not None:
            keep = mask.reshape(-1).to(device)
            flat = [f[keep] for f in flat]
        n_tok = flat[0].shape[0]
        S = self.n_states
        chunk = max(1, GRAM_CHUNK_ELEMS // (S * S))
        total = torch.zeros(S, S, dtype=torch.float64, device=device)
        for a in range(0, n_tok, chunk):
            x = torch.stack([f[a:a + chunk] for f in flat], dim=1).to(dtype)  # (n, S, D)
            x = torch.nn.functional.normalize(x, dim=-1)
            cos = torch.bmm(x, x.transpose(1, 2)).clamp_(-1.0, 1.0)  # (n, S, S)
            total += cos.acos_().sum(0, dtype=torch.float64)
        self.sum += (total / math.pi).cpu()
        self.count += n_tok

    def mean(self) -> torch.Tensor:
        """(L+1, L+1) float64: entry [i, j] = mean d(x^{i+1}, x^{j+1}) (states 0-based)."""
        if self.count == 0:
            raise ValueError("no tokens were added")
        return self.sum / self.count


def pair_matrix_to_layout(mean: torch.Tensor) -> list[list[float | None]]:
    """The paper's heatmap layout: rows n = 1..L, columns l = 1..L, entry d(x^l, x^{l+n}) (None where
    l + n > L + 1). x^l is the input of block l; x^{L+1} the output of the last block."""
    S = mean.shape[0]
    L = S - 1
    return [[float(mean[l - 1, l - 1 + n]) if l + n <= L + 1 else None for l in range(1, L + 1)] for n in range(1, L + 1)]


def adjacent(mean: torch.Tensor) -> list[float]:
    """d(x^l, x^{l+1}) for l = 1..L: how much block l turns the residual stream."""
    return [float(mean[i, i + 1]) for i in range(mean.shape[0] - 1)]
