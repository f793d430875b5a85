"""Layer removal (docs/paper.md §5.2, "performance drop"): the held-out loss with each block skipped.

Per batch, the full pass caches every block's input (:class:`~depthlab.analysis.diagnostics.capture.ResidualCapture`);
removing block l then reuses the cached x^l and runs only blocks l+1..L and the head. A full sweep
costs sum_l (L - l) block evaluations + L heads instead of L * (L - 1) + L (delete and re-run).
Multiple-choice accuracy with blocks removed lives in :mod:`depthlab.analysis.diagnostics.mc`.

A block whose removal has no defined output (Gemma 4 with KV sharing: a later block reuses the keys and values it
computes, so no model without it exists and ``prune`` refuses to remove it) is *not measurable*: its ``loss``,
``ppl`` and ``delta_loss`` are None, ``unmeasurable`` says why (block -> reason), and one log line names it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from depthlab.analysis.diagnostics.capture import ResidualCapture, UnmeasurableRemoval
from depthlab.base.metrics import perplexity
from depthlab.data.batches import IGNORE_INDEX

log = logging.getLogger(__name__)


def nll_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """Summed cross-entropy (float64 total) and the number of counted labels (!= IGNORE_INDEX): next-token
    logits (B, T, V) with labels (B, T), or a classifier's logits (B, C) with labels (B,)."""
    flat = logits.float() if logits.dim() == 2 else logits.flatten(0, 1).float()
    loss = F.cross_entropy(flat, labels.flatten().to(logits.device), ignore_index=IGNORE_INDEX, reduction="sum")
    return float(loss), int((labels != IGNORE_INDEX).sum())


def top1_hits(logits: torch.Tensor, labels: torch.Tensor) -> int:
    """Correct top-1 predictions of a classifier's (B, C) logits."""
    return int((logits.argmax(-1) == labels.to(logits.device)).sum())


class RemovalAccumulator:
    """Loss of the full model and of the model without block l, l = 1..L, summed over batches."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.base = 0.0
        self.removed = [0.0] * n_layers
        self.count = 0
        self.correct: list[int] | None = None  # classifiers ((B, C) logits): top-1 hits, full model, then block l out
        self.unmeasurable: dict[int, str] = {}  # block -> why its removal has no defined output (KV sharing)

    @torch.no_grad()
    def update(self, capture: ResidualCapture, input_ids: torch.Tensor, labels: torch.Tensor,
               logits: torch.Tensor, states: Sequence[torch.Tensor], on_layer: Callable[[], None] | None = None) -> None:
        total, n = nll_sum(logits, labels)
        self.base += total
        self.count += n
        if logits.dim() == 2:
            self.correct = self.correct or [0] * (self.n_layers + 1)
            self.correct[0] += top1_hits(logits, labels)
        for l in range(1, self.n_layers + 1):
            out = self._skipping(capture, input_ids, states, l)
            if out is None:
                if on_layer is not None:
                    on_layer()
                continue
            self.removed[l - 1] += nll_sum(out, labels)[0]
            if self.correct is not None:
                self.correct[l] += top1_hits(out, labels)
            del out
            if on_layer is not None:
                on_layer()

    def _skipping(self, capture: ResidualCapture, input_ids: torch.Tensor, states: Sequence[torch.Tensor], l: int
                  ) -> torch.Tensor | None:
        """The output without block l, or None (logged once) when that removal is not measurable."""
        if l in self.unmeasurable:
            return None
        try:
            return capture.run_skipping(input_ids, states, {l})
        except UnmeasurableRemoval as err:
            self.unmeasurable[l] = str(err)
            log.warning("removal of block %d not measured: %s", l, err)
            return None

    def result(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("no tokens were added")
        base = self.base / self.count
        loss = [None if l in self.unmeasurable else s / self.count for l, s in enumerate(self.removed, start=1)]
        out = {
            "base_loss": base,
            "base_ppl": perplexity(base),
            "loss": loss,  # block l removed, l = 1..L (None: not measurable, see "unmeasurable")
            "ppl": [None if x is None else perplexity(x) for x in loss],
            "delta_loss": [None if x is None else x - base for x in loss],
            "tokens": self.count,
            **self._accuracy(),
        }
        if self.unmeasurable:
            out["unmeasurable"] = {str(l): why for l, why in sorted(self.unmeasurable.items())}
        return out

    def _accuracy(self) -> dict[str, Any]:
        """Top-1 accuracy with each block removed, for classifiers (empty for LMs)."""
        if self.correct is None:
            return {}
        acc = [c / self.count for c in self.correct]
        return {"base_accuracy": acc[0], "accuracy": acc[1:], "delta_accuracy": [a - acc[0] for a in acc[1:]]}


@torch.no_grad()
def joint_removal_loss(capture: ResidualCapture, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                       skip: Iterable[int]) -> float:
    """Held-out loss with all blocks in ``skip`` removed at once (recomputed, no cache)."""
    total, count = 0.0, 0
    for x, y in batches:
        out = capture.run_without(x, skip)
        s, n = nll_sum(out, y)
        total, count = total + s, count + n
    return total / max(count, 1)
