"""Attention and MLP as separate units: where a block's two branches end, and what each one does.

    attn, mlp = branch_ends(layer)                # the modules whose outputs are added to the residual stream
    with zeroed(attn):                            # block l without its attention branch (its MLP still runs)
        logits = capture.run_from(x, states, l)   # the model without block l's attention, blocks < l not recomputed
    acc = SublayerAccumulator(L)                  # per block: removal Δloss, contribution, angular distance of each

A sublayer is removed by zeroing its branch's output, which is what zeroing its output projection's weights
(``o_proj`` / ``down_proj``, and their biases) does to a Hugging Face checkpoint: the residual stream then passes
through that half of the block unchanged. Where the branches end is one table, shared with the streamed sweep and
``prune --unit``: :mod:`depthlab.targets.branches`.

Per block l, from the cached input x^l (one captured forward):

- ``mid``  = block l with its MLP branch zeroed, applied to x^l: x^l plus the attention branch
  (one block evaluation per block: the cost of one more forward);
- ``contribution``: attention ‖mid − x^l‖ / ‖x^l‖, MLP ‖x^{l+1} − mid‖ / ‖mid‖, per token, averaged;
- ``angular``: attention d(x^l, mid), MLP d(mid, x^{l+1}) (arccos(cos)/π averaged over tokens, as eq. 1);
- ``delta_loss`` (with the removal sweep): the held-out loss with that branch zeroed minus the full model's,
  blocks l..L re-run from the cached x^l (2 partial forwards per block, as many as the block sweep's 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import LayerCall, ResidualCapture
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.data.batches import IGNORE_INDEX
from depthlab.targets.branches import UNITS, branch_ends, zeroed


class SublayerAccumulator:
    """Per block and unit (attention, MLP): contribution and angular distance of its branch, and with
    ``removal`` the summed held-out loss with the branch zeroed, over batches."""

    def __init__(self, n_layers: int, removal: bool = True) -> None:
        self.n_layers, self.removal = n_layers, removal
        zeros = lambda: {u: [0.0] * n_layers for u in UNITS}  # noqa: E731
        self.contribution, self.angular, self.removed = zeros(), zeros(), zeros()
        self.base = 0.0
        self.count = 0  # tokens (contribution, angular)
        self.labels_count = 0  # counted labels (loss)

    @torch.no_grad()
    def update(self, capture: ResidualCapture, input_ids: torch.Tensor, labels: torch.Tensor | None,
               logits: torch.Tensor | None, states: Sequence[torch.Tensor], calls: Sequence[LayerCall],
               on_pass: Callable[[], None] | None = None) -> None:
        """One batch: ``states`` and ``calls`` from ``capture.run(input_ids, keep_calls=True)``."""
        n_tok = states[0].shape[0] * states[0].shape[1]
        if self.removal and labels is not None:
            self.base += nll_sum(logits, labels)[0]
        for l in range(1, self.n_layers + 1):
            layer = capture.layers[l - 1]
            attn, mlp = branch_ends(layer)
            self.add_block(l, layer, calls[l - 1], states[l - 1], states[l])
            if self.removal and labels is not None:
                for unit, module in zip(UNITS, (attn, mlp)):
                    with zeroed(module):
                        self.removed[unit][l - 1] += nll_sum(capture.run_from(input_ids, states, l), labels)[0]
                    if on_pass is not None:
                        on_pass()
        self.count += n_tok
        if self.removal and labels is not None:
            self.labels_count += int((labels != IGNORE_INDEX).sum())

    @torch.no_grad()
    def add_block(self, l: int, layer: nn.Module, call: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                  x: torch.Tensor, out: torch.Tensor) -> None:
        """Contribution and angular distance of block l's two branches: ``mid`` = ``call(layer, x)`` with the MLP
        branch zeroed, between ``x`` (x^l) and ``out`` (x^{l+1}). The streamed engine calls it while block l is
        loaded; the token count is added by :meth:`update` (or the caller: ``count``)."""
        with zeroed(branch_ends(layer)[1]):
            mid = call(layer, x)
        for unit, (a, b) in zip(UNITS, ((x, mid), (mid, out))):
            ratio, angle = _contribution_and_angle(a, b)
            self.contribution[unit][l - 1] += ratio
            self.angular[unit][l - 1] += angle

    def state_dict(self) -> dict[str, Any]:
        return {"contribution": self.contribution, "angular": self.angular, "removed": self.removed, "base": self.base,
                "count": self.count, "labels_count": self.labels_count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("contribution", "angular", "removed"):
            setattr(self, name, {u: list(state[name][u]) for u in UNITS})
        self.base, self.count, self.labels_count = float(state["base"]), int(state["count"]), int(state["labels_count"])

    def result(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("no tokens were added")
        out: dict[str, Any] = {"units": list(UNITS), "tokens": self.count}
        for unit in UNITS:
            entry = {"contribution": [v / self.count for v in self.contribution[unit]],
                     "angular": [v / self.count for v in self.angular[unit]]}
            if self.removal and self.labels_count:
                base = self.base / self.labels_count
                entry["loss"] = [v / self.labels_count for v in self.removed[unit]]
                entry["delta_loss"] = [v - base for v in entry["loss"]]
                out["base_loss"] = base
            out[unit] = entry
        return out


def _contribution_and_angle(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """Summed over tokens: ‖b − a‖ / ‖a‖ and arccos(cos(a, b))/π (float64)."""
    a, b = a.double().flatten(0, -2), b.double().flatten(0, -2)
    ratio = (b - a).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-30).clamp(-1.0, 1.0)
    return float(ratio.sum()), float(cos.acos().sum() / math.pi)
