"""The logit lens: what each layer's residual stream would predict if the model stopped there.

    acc = LensAccumulator(L)
    logits, states = capture.run(x)
    acc.update(capture, x, y, logits, states)
    acc.result()   # {"loss": [L+1], "agreement": [L+1], "kl": [L+1], ...}; index i = after block i (0: embeddings)

State i (x^{i+1}: the embeddings for i = 0, the output of block i otherwise) is decoded by the model's *own*
final norm and head: :meth:`~depthlab.analysis.diagnostics.capture.ResidualCapture.decode` replays the model's
forward with every block passed over and the cached state fed in, so soft-capping, tied heads or a scaled
final norm are the model's code, not a copy. At i = L the lens is the model's logits. Per state:

- ``loss``: the held-out next-token loss of the decoded logits;
- ``agreement``: the fraction of tokens whose top-1 prediction equals the final layer's;
- ``kl``: KL(final ‖ lens), nats per token, how far the decoded distribution is from the model's.

A late-rising ``agreement`` means the deep layers still change the prediction; an early plateau that they only
refine it (Csordás et al. 2025 read the second half of Llama 3.1's layers this way). Cost per batch: L + 1 runs
of the final norm and head, no block.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from depthlab.analysis.diagnostics.capture import ResidualCapture
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.base.metrics import perplexity
from depthlab.data.batches import IGNORE_INDEX


class LensAccumulator:
    """Logit-lens loss, top-1 agreement with the final layer and KL to it, for states 0..L, summed over batches."""

    def __init__(self, n_layers: int) -> None:
        self.n_layers = n_layers
        n = n_layers + 1
        self.loss, self.agree, self.kl = [0.0] * n, [0] * n, [0.0] * n
        self.count = 0  # counted labels
        self.tokens = 0  # positions compared with the final layer

    @torch.no_grad()
    def update(self, capture: ResidualCapture, input_ids: torch.Tensor, labels: torch.Tensor | None,
               logits: torch.Tensor, states: Sequence[torch.Tensor], on_state: Callable[[], None] | None = None) -> None:
        self.add(logits, lambda i: capture.decode(input_ids, states, i), labels, on_state)

    @torch.no_grad()
    def add(self, logits: torch.Tensor, decode: Callable[[int], torch.Tensor], labels: torch.Tensor | None,
            on_state: Callable[[], None] | None = None) -> None:
        """One batch (or a chunk of its rows): the model's ``logits`` and ``decode(i)``, state i decoded, i < L (one
        state's logits alive at a time). Sums over chunks are the sums over the batch."""
        final = logits.float()
        final_logp = F.log_softmax(final, dim=-1)
        top = final.argmax(-1)
        for i in range(self.n_layers + 1):
            lens = final if i == self.n_layers else decode(i).float()
            if labels is not None:
                self.loss[i] += nll_sum(lens, labels)[0]
            self.agree[i] += int((lens.argmax(-1) == top).sum())
            logp = F.log_softmax(lens, dim=-1)
            self.kl[i] += float((final_logp.exp() * (final_logp - logp)).sum(dtype=torch.float64))
            del lens, logp
            if on_state is not None:
                on_state()
        if labels is not None:
            self.count += int((labels != IGNORE_INDEX).sum())
        self.tokens += int(top.numel())

    def decode_states(self, states: Sequence[torch.Tensor], head: Callable[[torch.Tensor], torch.Tensor],
                      labels: torch.Tensor | None, rows: int) -> None:
        """The streamed engine's lens: the L+1 states of one batch (B, T, D) decoded by ``head`` (final norm + LM
        head, loaded once), ``rows`` sequences at a time, so one state's logits of ``rows`` sequences are alive
        at once (beside the final layer's), never all layers'."""
        for a in range(0, states[0].shape[0], rows):
            r = slice(a, a + rows)
            self.add(head(states[-1][r]), lambda i, r=r: head(states[i][r]), None if labels is None else labels[r])

    def state_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "agree": self.agree, "kl": self.kl, "count": self.count, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss, self.agree, self.kl = list(state["loss"]), list(state["agree"]), list(state["kl"])
        self.count, self.tokens = int(state["count"]), int(state["tokens"])

    def result(self) -> dict[str, Any]:
        if self.tokens == 0:
            raise ValueError("no tokens were added")
        out: dict[str, Any] = {
            "layout": "index i = the residual stream after block i (0: the embeddings, L: the last block's output), "
                      "decoded by the model's final norm and head",
            "agreement": [a / self.tokens for a in self.agree],
            "kl": [k / self.tokens for k in self.kl],
            "tokens": self.tokens,
        }
        if self.count:
            out["loss"] = [s / self.count for s in self.loss]
            out["ppl"] = [perplexity(x) for x in out["loss"]]
        return out


@torch.no_grad()
def logit_lens(capture: ResidualCapture, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
    """The logit lens of one batch (``input_ids`` (B, T), next-token ``labels`` (B, T) or None)."""
    logits, states = capture.run(input_ids)
    acc = LensAccumulator(capture.n_layers)
    acc.update(capture, input_ids, labels, logits, states)
    return acc.result()


class TunedLens:
    """One affine map per state i < L, x^{(i)} ↦ x^{(i)} W_i + b_i, fitted by least squares (ridge ``ridge`` times the
    mean diagonal of XᵀX) to send state i to the last block's output x^{(L)} on held-out text; decoded by the model's
    own final norm and head, as the plain lens. This is the linear shortcut of Din et al. (2023); the tuned lens of
    Belrose et al. (2023) fits the same family by minimising KL through the head with SGD: the closed form here needs
    no optimiser, is deterministic and costs one (D+1)² accumulation per state and token.

        fit = TunedLens(L); fit.update(states) for the fitting batches; fit.solve()
        fit.apply(i, states[i])   # the mapped state i (same shape and dtype); i = L: unchanged

    Memory: (L) (D+1)(2D+1) float64 sums (about 8.6 GB at D = 4096, L = 32: meant for models held in memory)."""

    def __init__(self, n_layers: int, ridge: float = 1e-4) -> None:
        self.n_layers, self.ridge = n_layers, ridge
        self.xtx: torch.Tensor | None = None  # (L, D+1, D+1)
        self.xty: torch.Tensor | None = None  # (L, D+1, D)
        self.maps: torch.Tensor | None = None  # (L, D+1, D): rows 0..D-1 = W_i, row D = b_i
        self.tokens = 0

    @staticmethod
    def _augmented(h: torch.Tensor) -> torch.Tensor:
        x = h.detach().flatten(0, -2).double()
        return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], dim=1)

    @torch.no_grad()
    def update(self, states: Sequence[torch.Tensor]) -> None:
        """Add one batch's L+1 states (B, T, D) to the least-squares sums."""
        y = states[-1].detach().flatten(0, -2).double()
        D = y.shape[1]
        if self.xtx is None:
            self.xtx = torch.zeros(self.n_layers, D + 1, D + 1, dtype=torch.float64, device=y.device)
            self.xty = torch.zeros(self.n_layers, D + 1, D, dtype=torch.float64, device=y.device)
        for i in range(self.n_layers):
            x = self._augmented(states[i])
            self.xtx[i] += x.T @ x
            self.xty[i] += x.T @ y
        self.tokens += y.shape[0]

    def solve(self) -> None:
        if self.xtx is None:
            raise ValueError("no states were added")
        eye = torch.eye(self.xtx.shape[1], dtype=torch.float64, device=self.xtx.device)
        scale = self.xtx.diagonal(dim1=1, dim2=2).mean(-1)[:, None, None]
        self.maps = torch.linalg.solve(self.xtx + self.ridge * scale * eye, self.xty)

    def apply(self, i: int, h: torch.Tensor) -> torch.Tensor:
        if i >= self.n_layers:
            return h
        assert self.maps is not None, "solve() first"
        W = self.maps[i]
        return (h.double() @ W[:-1] + W[-1]).to(h.dtype)


def _mapped(capture: ResidualCapture, x: torch.Tensor, states: Sequence[torch.Tensor], fit: TunedLens
            ) -> Callable[[int], torch.Tensor]:
    """decode(i): state i mapped by the tuned lens, then the model's final norm and head (handed over as the last
    block's output: decoding index L passes every block over, so state 0 too is the mapped one, not the embedding)."""
    L = len(states) - 1
    return lambda i: capture.decode(x, [*states[:L], fit.apply(i, states[i])], L)


@torch.no_grad()
def tuned_lens_compare(capture: ResidualCapture, fit_batches, eval_batches, n_layers: int,
                       on_batch: Callable[[], None] | None = None) -> dict[str, Any]:
    """Fit a :class:`TunedLens` on ``fit_batches`` ((ids, labels) pairs), then measure it and the plain lens on
    ``eval_batches`` (text the maps never saw): ``{"loss", "agreement", "kl", "plain": {...}, ...}``."""
    fit = TunedLens(n_layers)
    for x, _ in fit_batches:
        fit.update(capture.run(x)[1])
        if on_batch is not None:
            on_batch()
    fit.solve()
    tuned, plain = LensAccumulator(n_layers), LensAccumulator(n_layers)
    for x, y in eval_batches:
        logits, states = capture.run(x)
        plain.update(capture, x, y, logits, states)
        tuned.add(logits, _mapped(capture, x, states, fit), y)
        if on_batch is not None:
            on_batch()
    if tuned.tokens == 0:
        raise ValueError("no evaluation tokens")
    out = {k: v for k, v in tuned.result().items() if k != "layout"}
    out["plain"] = {k: v for k, v in plain.result().items() if k != "layout"}
    out["fit_tokens"] = fit.tokens
    out["method"] = ("one affine map per state fitted by least squares (ridge 1e-4) to the last block's output on the "
                     "even held-out batches, measured with the plain lens on the odd ones")
    return out
