"""Measurements of a model in training on fixed held-out data: the same tokens every time.

    evaluator = Evaluator(forward, data.eval_batches, data.probe_batch, env)
    evaluator.evaluate()   # EvalResult(loss, ppl, tokens): held-out loss over every eval batch
    evaluator.probe()      # {"layer_variance": [...]}: depth-tracking probes on the probe batch

``evaluate`` splits the eval batches across ranks and sums; ``probe`` runs one forward of the fixed
probe batch with every hidden state and turns each into per-depth numbers. New depth-tracking probes
go into :meth:`Evaluator.probe`: every key it returns lands in metrics.jsonl at each probe step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from depthlab.analysis.diagnostics.probes import depth_probe
from depthlab.base.metrics import element_variance, perplexity
from depthlab.data import IGNORE_INDEX
from depthlab.train import distributed as D
from depthlab.train.step import Forward


@dataclass(frozen=True)
class EvalResult:
    loss: float  # mean next-token loss over the held-out target tokens
    ppl: float  # perplexity(loss)
    tokens: int  # held-out target tokens

    def record(self, step: int) -> dict[str, Any]:
        """The metrics.jsonl line of this evaluation."""
        return {"step": step, "eval_loss": self.loss, "eval_ppl": self.ppl, "eval_tokens": self.tokens}

    def summary(self) -> dict[str, Any]:
        """Its keys in summary.json."""
        return {"eval_loss": self.loss, "eval_ppl": self.ppl}

    def describe(self) -> str:
        """Its log line."""
        return f"eval loss {self.loss:.4f}, ppl {self.ppl:.2f}"


class Evaluator:
    """Held-out evaluation and depth probes of the model behind ``forward``."""

    def __init__(self, forward: Forward, eval_batches: list[torch.Tensor], probe_batch: torch.Tensor,
                 env: D.DistEnv, *, model: torch.nn.Module | None = None, probe_labels: torch.Tensor | None = None,
                 track_depth: bool = False, track_removal: bool = False) -> None:
        self.forward, self.eval_batches, self.probe_batch, self.env = forward, eval_batches, probe_batch, env
        self.model, self.probe_labels = model, probe_labels  # model: the unwrapped one, whose blocks get hooks
        self.track_depth = track_depth and model is not None
        self.track_removal = track_removal and self.track_depth and probe_labels is not None

    @property
    def tokens(self) -> int:
        return sum(int((_xy(b)[1] != IGNORE_INDEX).sum()) for b in self.eval_batches)

    @torch.no_grad()
    def sharded_sum(self, stats: Callable[[Any], list[float]], width: int) -> torch.Tensor:
        """The sum of ``stats(batch)`` (``width`` numbers) over every held-out batch, all ranks together:
        rank r takes batches r, r + world, ... and every rank runs the same number of forwards (FSDP)."""
        batches, world = self.eval_batches, self.env.world_size
        mine = batches[self.env.rank::world]
        total = torch.zeros(width, dtype=torch.float64)
        with self.forward.eval_mode():
            for i in range(-(-len(batches) // world)):
                values = stats(mine[i] if i < len(mine) else batches[0])
                if i < len(mine):
                    total += torch.tensor(values, dtype=torch.float64)
        D.all_reduce_sum(total, self.env)
        return total

    @torch.no_grad()
    def evaluate(self) -> EvalResult:
        """Mean loss over every held-out target token that is not IGNORE_INDEX."""

        def stats(batch: Any) -> list[float]:
            x, y = _xy(batch)
            n = int((y != IGNORE_INDEX).sum())  # masked targets (padding, SFT prompts) count in no loss
            return [self.forward(x, y).loss.double().item() * n, n]

        loss_sum, count = self.sharded_sum(stats, 2).tolist()
        mean = loss_sum / count
        return EvalResult(mean, perplexity(mean), self.tokens)

    @torch.no_grad()
    def probe(self, removal: bool = True) -> dict[str, list[float]]:
        """Per-depth numbers of the fixed probe batch, blocks 1..L: ``layer_variance`` = each block's
        output variance (:func:`~depthlab.base.metrics.element_variance`); with depth tracking also
        ``layer_angular``, ``layer_contribution``, ``layer_norm_gain`` and, when ``removal`` (and the
        run tracks it), ``layer_removal`` (:func:`~depthlab.analysis.diagnostics.probes.depth_probe`, from the
        same forward)."""
        with self.forward.eval_mode():
            if self.track_depth:
                return depth_probe(self.model, self.probe_batch, self.probe_labels, removal=removal and self.track_removal,
                                   forward=lambda ids: self.forward(ids, logits=True).logits)
            hidden = self.forward(self.probe_batch, None, True).hidden_states  # embedding, then blocks 1..L
        return {"layer_variance": [element_variance(h) for h in hidden[1:]]}


def _xy(batch: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """An eval batch as (inputs, labels): a window (B, T + 1) is shifted; an (x, y) pair (SFT,
    prompt labels IGNORE_INDEX) is taken as it is."""
    if isinstance(batch, tuple | list):
        return batch[0], batch[1]
    return batch[:, :-1], batch[:, 1:]
