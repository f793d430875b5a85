"""How much each routed expert of an MoE model does: REAP saliency and routing frequency, per block and expert.

    acc = ExpertAccumulator(moe)                  # moe: depthlab.hf.experts.moe_layers(layers, spec, config)
    with acc.recording():                         # in memory: hooks on the routers / experts during a forward
        model(input_ids=x)
    acc.add_block(j, layer, call, x_j)            # streamed: block j re-run on its input while it is loaded
    scores = acc.result()                         # {"blocks": {j: {"reap": [...], "frequency": [...], ...}}}

For expert e of block j, over the held-out tokens routed to it (X_e, the tokens whose top-k holds e):

- ``reap``: REAP's saliency (Lasby et al., arXiv 2510.13999), the mean over X_e of g_e(x)·‖f_e(x)‖₂, the router's
  gate times the norm of the expert's output: the norm of what the expert adds to the layer's output. It is measured
  as that norm, ‖e's term of the MoE output‖ (the experts module called on each top-k slot alone), which is
  g·‖f(x)‖ where the gate scales the output and ‖f(g·x)‖ in Llama 4, whose gate scales the input;
- ``frequency``: |X_e| / tokens, the share of tokens routed to e;
- ``gate``: the mean gate weight over X_e.

An expert no token reached has saliency 0 (it is removed first). Sums are float64, kept per block and expert, and
saved with a streamed sweep's resume state (:meth:`state_dict`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from depthlab.hf.experts import MoeLayer


def _topk_args(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden states, top-k expert indices, top-k weights) of a call of an experts module."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args[:3]) + [None] * (3 - len(args[:3]))
    for i, name in enumerate(names):
        if values[i] is None:
            values[i] = next((v for k, v in kwargs.items() if k == name or (i == 1 and "ind" in k)
                              or (i == 2 and "weight" in k)), None)
    return values[0], values[1], values[2]


class ExpertAccumulator:
    """Per MoE block and expert: summed contribution norms, gate weights and routed-token counts (float64)."""

    def __init__(self, moe: Mapping[int, MoeLayer]) -> None:
        self.moe = dict(moe)
        self.saliency = {b: torch.zeros(layer.n, dtype=torch.float64) for b, layer in self.moe.items()}
        self.gate = {b: torch.zeros(layer.n, dtype=torch.float64) for b, layer in self.moe.items()}
        self.routed = {b: torch.zeros(layer.n, dtype=torch.float64) for b, layer in self.moe.items()}
        self.tokens = {b: 0 for b in self.moe}
        self._busy = False

    # ------------------------------------------------------------------ recording
    @contextlib.contextmanager
    def recording(self, blocks: list[int] | None = None) -> Iterator[None]:
        """While inside, every call of the MoE blocks ``blocks`` (default: all) adds to the sums."""
        handles = []
        for b in blocks if blocks is not None else list(self.moe):
            layer = self.moe[b]
            if layer.dense:
                store: dict[str, torch.Tensor] = {}
                handles.append(layer.router.register_forward_hook(self._router_hook(store)))
                handles.append(layer.experts.register_forward_hook(self._dense_hook(b, store)))
            else:
                handles.append(layer.experts.register_forward_hook(self._topk_hook(b), with_kwargs=True))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _topk_hook(self, b: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            if self._busy:
                return
            h, index, weights = _topk_args(args, kwargs)
            self._busy = True
            try:
                self._add_topk(b, module, h, index, weights)
            finally:
                self._busy = False
        return hook

    @torch.no_grad()
    def _add_topk(self, b: int, module: nn.Module, h: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> None:
        n = self.moe[b].n
        for s in range(index.shape[1]):
            idx, w = index[:, s:s + 1], weights[:, s:s + 1]
            norms = module(h, idx, w).double().norm(dim=-1).cpu()  # this slot's expert's term, per token
            e = idx[:, 0].cpu()
            valid = e < n  # an index of n pads a slot (no expert)
            self.saliency[b].index_add_(0, e[valid], norms[valid])
            self.gate[b].index_add_(0, e[valid], w[:, 0].double().cpu()[valid])
            self.routed[b].index_add_(0, e[valid], torch.ones_like(norms[valid]))
        self.tokens[b] += int(h.shape[0])

    @staticmethod
    def _router_hook(store: dict[str, torch.Tensor]) -> Callable:
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            store["scores"] = (out[0] if isinstance(out, tuple) else out).detach()
        return hook

    def _dense_hook(self, b: int, store: dict[str, torch.Tensor]) -> Callable:
        @torch.no_grad()
        def hook(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            scores = store.pop("scores").double().cpu()  # (N, E): the gate, 0 for experts not routed to
            n_tok, n = scores.shape
            norms = out.detach().reshape(n, n_tok, -1).double().norm(dim=-1).cpu()  # (E, N)
            routed = (scores.T > 0).double()
            self.saliency[b] += (norms * routed).sum(dim=1)
            self.gate[b] += scores.T.sum(dim=1)
            self.routed[b] += routed.sum(dim=1)
            self.tokens[b] += n_tok
        return hook

    def add_block(self, j: int, layer: nn.Module, call: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                  x: torch.Tensor) -> None:
        """Block j (while loaded, streamed) run again on its input x^j with the recording on."""
        if j in self.moe:
            with self.recording([j]), torch.no_grad():
                call(layer, x)

    # ------------------------------------------------------------------ resume, result
    def state_dict(self) -> dict[str, Any]:
        return {"saliency": self.saliency, "gate": self.gate, "routed": self.routed, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("saliency", "gate", "routed"):
            setattr(self, name, {int(b): t.clone() for b, t in state[name].items()})
        self.tokens = {int(b): int(v) for b, v in state["tokens"].items()}

    def result(self) -> dict[str, Any]:
        """Per MoE block (1-based, as a string key): each expert's ``reap``, ``frequency``, ``gate`` and ``tokens``."""
        blocks = {}
        for b in sorted(self.moe):
            routed, tokens = self.routed[b], max(self.tokens[b], 1)
            per = routed.clamp_min(1)  # 0 for an expert never routed to
            blocks[str(b)] = {"reap": (self.saliency[b] / per).tolist(), "gate": (self.gate[b] / per).tolist(),
                              "frequency": (routed / tokens).tolist(), "tokens": routed.long().tolist()}
        return {"blocks": blocks, "experts": {str(b): layer.n for b, layer in sorted(self.moe.items())},
                "top_k": {str(b): layer.top_k for b, layer in sorted(self.moe.items())}}
