"""The depth-attention map of Attention Residuals: which earlier sources each layer reads.

    acc = DepthMap.of(model)               # None when the model has no depth readers (every scheme but attnres)
    with acc.recording():
        model(input_ids)                   # any forward: each reader's softmax weights are summed over its tokens
    acc.result()                           # {"readers": [...], "sources": [...], "weights": [[...]], "tokens": n}

A depth reader (:class:`~depthlab.models.nn.attnres.DepthAttention`) computes, for every token, softmax weights
over the sources it may read: the embedding and the earlier sub-layer outputs (Full AttnRes) or block sums
(Block AttnRes). ``weights[r][s]`` is reader r's weight on source s averaged over the tokens seen (rows: ``attn
1``, ``ffn 1``, ..., ``final``; None where r cannot read s, i.e. s lies after it). The weights are read with a
forward hook on each reader's softmax module, so ``diagnose`` and the trainer's depth probes get them from the
forward they already run, and nothing changes for models without readers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from depthlab.models.nn.attnres import DepthAttention


class DepthMap:
    """Token-averaged softmax weights of every depth reader of a model (see the module docstring)."""

    def __init__(self, readers: list[DepthAttention]) -> None:
        self.readers = readers
        self.sums = [torch.zeros(len(r.sources), dtype=torch.float64) for r in readers]
        self.counts = [0] * len(readers)  # tokens each reader has seen

    @classmethod
    def of(cls, model: nn.Module) -> "DepthMap | None":
        readers = [m for m in model.modules() if isinstance(m, DepthAttention)]
        return cls(readers) if readers else None

    @contextlib.contextmanager
    def recording(self) -> Iterator["DepthMap"]:
        """Sum the weights of every forward run inside this block."""

        def hook(i: int):
            def add(_m, _args, alpha: torch.Tensor) -> None:
                a = alpha.detach().double().flatten(0, -2)  # (tokens, K)
                self.sums[i] += a.sum(0).cpu()
                self.counts[i] += a.shape[0]
            return add

        handles = [r.softmax.register_forward_hook(hook(i)) for i, r in enumerate(self.readers)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def result(self) -> dict[str, Any]:
        """``{"readers", "sources", "weights", "tokens"}``: the map as plain numbers (JSON-ready)."""
        sources = list(max((r.sources for r in self.readers), key=len))
        weights = [[float(s / max(n, 1)) for s in total] + [None] * (len(sources) - len(total))
                   for total, n in zip(self.sums, self.counts)]
        return {"readers": [r.reader for r in self.readers], "sources": sources, "weights": weights,
                "tokens": max(self.counts)}
