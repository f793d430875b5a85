"""How much of its depth a model uses: the swap test beside the removal test, and one effective depth.

    acc = SwapAccumulator(L)                                   # fed by either engine
    acc.update(capture, ids, labels, logits, states, calls)    # in memory: pair (l, l+1) exchanged, from cached x^l
    report["swap"] = acc.result()                              # loss and Δloss of each adjacent pair exchanged
    report["effective_depth"] = effective_depth(report["removal"], threshold=0.01)

**The swap test** (interchange: the removal test's sibling, arXiv 2605.16234): the held-out loss when adjacent blocks
l and l+1 exchange places — block l+1 applied to x^l, then block l — minus the model's loss, for l = 1..L-1. Each
block keeps its own weights and is called as the model calls it (its own attention mask, rotary table, window): what
exchanging the two modules in the model's block list computes. A block that only adds a small, order-insensitive
update swaps at no cost even when removing it costs much; a block whose input must come from the block before it
(a circuit built across the two) costs on a swap. In memory, per batch and pair: two block calls from the cached x^l,
then blocks l+2..L and the head (:meth:`ResidualCapture.run_from`), sum_l (L - l + 1) block evaluations in all,
about the removal sweep's. Streamed: one lane per pair (:func:`depthlab.targets.stream.lanes.swap_lanes`).

A pair with a block that writes state later blocks read (Gemma 4's KV sharing) is not measured: reordering them would
hand a block keys and values its partner has not yet written (None, with the reason, as the removal test does).

**Effective depth**: the number of blocks whose removal raises the held-out loss by more than ``threshold`` times the
model's own loss (default 1 %: 0.045 nats at a loss of 4.5), and its share of L. Relative to the model's loss, so
models of different depth, family and quality are put on one scale; the threshold is in the report with the nats it
came to. The paper's claim read through it: under LNS the deep blocks should count (a larger share), under Pre-LN
many should fall below it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from depthlab.analysis.diagnostics.capture import LayerCall, ResidualCapture
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.base.metrics import perplexity

log = logging.getLogger(__name__)

EFFECTIVE_RULE = ("blocks whose removal raises the held-out loss by more than threshold x the model's loss "
                  "(threshold_nats)")


class SwapAccumulator:
    """Loss of the model and of the model with blocks l and l+1 exchanged, l = 1..L-1, summed over batches."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        self.base, self.count = 0.0, 0
        self.swapped = [0.0] * max(n_layers - 1, 0)
        self.unmeasurable: dict[int, str] = {}  # pair l -> why it was not measured (shared state between blocks)

    def add(self, pair: int | None, total: float, count: int) -> None:
        """One batch's summed loss: of the model (``pair`` None, with its label count) or of pair ``pair`` swapped."""
        if pair is None:
            self.base, self.count = self.base + total, self.count + count
        else:
            self.swapped[pair - 1] += total

    @torch.no_grad()
    def update(self, capture: ResidualCapture, input_ids: torch.Tensor, labels: torch.Tensor,
               logits: torch.Tensor, states: Sequence[torch.Tensor], calls: Sequence[LayerCall],
               on_pair: Callable[[], None] | None = None) -> None:
        """One batch: ``states`` and ``calls`` from ``capture.run(input_ids, keep_calls=True)``."""
        self.add(None, *nll_sum(logits, labels))
        L = self.n_layers
        for l in range(1, L):
            if self._measurable(capture, l):
                h = calls[l](capture.layers[l], states[l - 1])  # block l+1 on x^l, as the model calls block l+1
                h = calls[l - 1](capture.layers[l - 1], h)  # then block l
                # the rest of the model from the new x^{l+2} (x^{L+1} for the last pair: the head alone)
                self.add(l, nll_sum(capture.run_from(input_ids, [*states[:l + 1], h, *states[l + 2:]], l + 2), labels)[0], 0)
            if on_pair is not None:
                on_pair()

    def _measurable(self, capture: ResidualCapture, l: int) -> bool:
        if l in self.unmeasurable:
            return False
        writers = [b for b in (l, l + 1) if b in capture._writers]
        if writers:
            self.unmeasurable[l] = (f"block(s) {writers} write state later blocks read (KV sharing): exchanging blocks "
                                    f"{l} and {l + 1} would hand a block keys and values not yet written")
            log.warning("swap of blocks %d and %d not measured: %s", l, l + 1, self.unmeasurable[l])
            return False
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base, "count": self.count, "swapped": self.swapped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base, self.count, self.swapped = float(state["base"]), int(state["count"]), list(state["swapped"])

    def result(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("no tokens were added")
        base = self.base / self.count
        loss = [None if l in self.unmeasurable else s / self.count for l, s in enumerate(self.swapped, start=1)]
        out = {"pairs": [[l, l + 1] for l in range(1, self.n_layers)],
               "base_loss": base,
               "loss": loss,  # blocks l and l+1 exchanged, l = 1..L-1 (None: not measurable)
               "ppl": [None if x is None else perplexity(x) for x in loss],
               "delta_loss": [None if x is None else x - base for x in loss],
               "tokens": self.count}
        if self.unmeasurable:
            out["unmeasurable"] = {str(l): why for l, why in sorted(self.unmeasurable.items())}
        return out


def effective_depth(removal: dict[str, Any], threshold: float) -> dict[str, Any]:
    """The blocks whose removal costs more than ``threshold`` x the model's loss (``removal``: the report's section),
    their number ``n`` and its share of L."""
    L, base = len(removal["delta_loss"]), removal["base_loss"]
    nats = threshold * abs(base)
    blocks = [l for l, d in enumerate(removal["delta_loss"], start=1) if d is not None and d > nats]
    return {"n": len(blocks), "share": len(blocks) / L if L else 0.0, "n_layers": L, "blocks": blocks,
            "threshold": threshold, "threshold_nats": nats, "rule": EFFECTIVE_RULE}


def deep_pairs(deep: Sequence[int], n_layers: int) -> list[int]:
    """The swap pairs (l-1, l) of the blocks l in ``deep`` (1-based), by their first block: each block swapped with
    the one before it, one pair per block as the removal test has one number per block (block 1 has none)."""
    return [l - 1 for l in sorted(set(deep)) if 1 < l <= n_layers]


def depth_use_columns(report: dict[str, Any], deep: Sequence[int]) -> dict[str, float]:
    """A report's depth-use numbers as ``compare``'s table columns: the mean swap Δloss of the blocks ``deep`` (the
    deepest third; :func:`deep_pairs`), the effective depth and its share of L (absent where not measured)."""
    out: dict[str, float] = {}
    swap = (report.get("swap") or {}).get("delta_loss")
    if swap is not None:
        got = [swap[l - 1] for l in deep_pairs(deep, len(swap) + 1) if swap[l - 1] is not None]
        if got:
            out["deep_swap_drop"] = sum(got) / len(got)
    eff = report.get("effective_depth")
    if eff is not None:
        out["effective_depth"], out["effective_share"] = float(eff["n"]), float(eff["share"])
    return out
