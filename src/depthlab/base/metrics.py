"""The two numbers every part of depthlab reports the same way: perplexity and output variance.

    perplexity(loss)        exp(mean next-token loss in nats); inf when that overflows a float
    element_variance(x)     variance of every element of a tensor (population, float64)

The trainer's layer-variance probe, the diagnostics' streamed :class:`VarianceAccumulator` and the
theory check all measure "output variance" with :func:`element_variance`'s definition (the
accumulator streams the same sums, see :func:`variance_from_sums`).
"""

from __future__ import annotations

import math

import torch


def perplexity(loss: float) -> float:
    """``exp(loss)``; ``inf`` when the result overflows a float (loss above ~709.78 nats), ``nan`` for nan.

    One behaviour everywhere: a perplexity is never clipped to a finite stand-in.
    """
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def variance_from_sums(total: torch.Tensor, total_sq: torch.Tensor, n: int) -> torch.Tensor:
    """Population variance from the sum and the sum of squares of ``n`` elements:
    ``E[x²] - E[x]²`` (pass float64 sums)."""
    mean = total / n
    return total_sq / n - mean.square()


def element_variance(x: torch.Tensor) -> float:
    """Variance of all elements of ``x`` (every batch, position and channel entry together),
    population form, computed in float64: the paper's Fig 4 "output variance" of one residual state."""
    x = x.detach().double()
    return float(variance_from_sums(x.sum(), x.square().sum(), x.numel()))
