"""Multiple-choice accuracy, for the full model and with each block removed.

Tasks are read by :mod:`depthlab.data.tasks`, as ``depthlab evaluate`` reads them: a local
``.jsonl`` in the native format of ARC, OpenBookQA, PIQA, HellaSwag, BoolQ, WinoGrande, SIQA or
``{"context", "choices", "answer"}`` or ``{"question", "choices", "answer"}``, ``builtin-mc``, or
``hf:NAME[:CONFIG[:SPLIT]]``; each with lm-evaluation-harness's zero-shot prompt. Scoring is lm-eval's:
the sum of the continuation's token log-likelihoods
(:func:`depthlab.analysis.evaluate.scoring.encode_pair` splits the tokens), ``acc`` = argmax, ``acc_norm`` =
argmax of the sum divided by the choice's length in characters (lm-eval's ``acc_norm``). Removing
block l replays the cached residual states (:meth:`ResidualCapture.run_skipping`), as the removal
sweep of :mod:`depthlab.analysis.diagnostics.removal` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.capture import ResidualCapture, UnmeasurableRemoval


@dataclass
class MCItem:
    choices: list[str]  # lm-eval's doc_to_choice strings (their lengths normalise acc_norm)
    answer: int
    contexts: tuple[str, ...]  # request i = (contexts[i], continuations[i]), as lm-eval builds them
    continuations: tuple[str, ...]

    def requests(self) -> list[tuple[str, str]]:
        return list(zip(self.contexts, self.continuations))


def load_mc(spec: str | Path, limit: int | None = None) -> list[MCItem]:
    """Items of a task spec as ``depthlab evaluate`` takes it (a .jsonl in one of
    :data:`depthlab.data.tasks.FORMATS`, ``builtin-mc``, ``hf:NAME``)."""
    from depthlab.analysis.evaluate import load_tasks

    task = load_tasks([str(spec)], limit)[0]
    return [MCItem(list(it.choices), it.gold, it.contexts, it.continuations) for it in task.items]


def _encode_pairs(items: Sequence[MCItem], encode: Callable[[str], list[int]], max_len: int | None,
                  prefix_id: int = 0) -> list[tuple[int, int, list[int], int, int]]:
    """(item, choice, ids, first continuation position, choice length in characters) per choice;
    lm-eval's split (:func:`~depthlab.analysis.evaluate.scoring.encode_pair`)."""
    from depthlab.analysis.evaluate.scoring import encode_pair

    out = []
    for i, it in enumerate(items):
        for j, (ctx, cont) in enumerate(it.requests()):
            ctx_ids, cont_ids = encode_pair(encode, ctx, cont, prefix_id)
            whole, start = list(ctx_ids) + list(cont_ids), max(1, len(ctx_ids))
            if max_len is not None and len(whole) > max_len:  # keep the continuation, cut the left
                cut = len(whole) - max_len
                whole, start = whole[cut:], max(1, start - cut)
            out.append((i, j, whole, start, max(len(it.choices[j]), 1)))
    return out


class MCAccumulator:
    """Per-choice log-likelihoods of the full model and of each block-removed model."""

    def __init__(self, items: Sequence[MCItem], n_layers: int) -> None:
        self.items = items
        self.n_layers = n_layers
        self.scores = torch.full((n_layers + 1, len(items), max(len(it.choices) for it in items)), -math.inf,
                                 dtype=torch.float64)  # [0] full model, [l] block l removed
        self.nchars = torch.ones(len(items), self.scores.shape[-1], dtype=torch.float64)
        self.unmeasurable: set[int] = set()  # blocks whose removal has no defined output (KV sharing): None below

    @torch.no_grad()
    def run(self, capture: ResidualCapture, encode: Callable[[str], list[int]], batch_size: int, device: torch.device,
            pad_id: int = 0, max_len: int | None = None, removal: bool = True, progress=None, prefix_id: int = 0
            ) -> None:
        for chunk, ids in self.batches(encode, batch_size, pad_id, max_len, prefix_id):
            ids = ids.to(device)
            logits, states = capture.run(ids)
            self.score(0, chunk, ids, logits)
            if removal:
                for l in sorted(set(range(1, self.n_layers + 1)) - self.unmeasurable):
                    try:
                        self.score(l, chunk, ids, capture.run_skipping(ids, states, {l}))
                    except UnmeasurableRemoval:
                        self.unmeasurable.add(l)
            if progress is not None:
                progress(len(chunk))

    def batches(self, encode: Callable[[str], list[int]], batch_size: int, pad_id: int = 0, max_len: int | None = None,
                prefix_id: int = 0) -> list[tuple[list, torch.Tensor]]:
        """(chunk of choices, right-padded token ids (B, T)) per forward, similar lengths together."""
        pairs = _encode_pairs(self.items, encode, max_len, prefix_id)
        pairs.sort(key=lambda p: len(p[2]))  # similar lengths together: little padding
        out = []
        for a in range(0, len(pairs), batch_size):
            chunk = pairs[a:a + batch_size]
            ids = torch.full((len(chunk), max(len(p[2]) for p in chunk)), pad_id, dtype=torch.long)
            for r, p in enumerate(chunk):  # right padding: causal models never look at it
                ids[r, : len(p[2])] = torch.tensor(p[2])
            out.append((chunk, ids))
        return out

    def score(self, row: int, chunk, ids: torch.Tensor, logits: torch.Tensor) -> None:
        """Log-likelihood of each choice of ``chunk`` under ``logits`` (B, T, V), into row ``row`` (0: the full
        model, l: block l removed)."""
        logp = torch.log_softmax(logits.float(), dim=-1)
        for r, (i, j, whole, start, nchars) in enumerate(chunk):
            tgt = ids[r, start: len(whole)]
            lp = logp[r, start - 1: len(whole) - 1].gather(-1, tgt[:, None]).sum()
            self.scores[row, i, j] = float(lp)
            self.nchars[i, j] = nchars

    def result(self) -> dict[str, Any]:
        gold = torch.tensor([it.answer for it in self.items])
        acc = (self.scores.argmax(-1) == gold).double().mean(-1)
        acc_norm = ((self.scores / self.nchars).argmax(-1) == gold).double().mean(-1)
        def rows(x: torch.Tensor) -> list[float | None]:  # block l removed; None where not measurable
            return [None if l in self.unmeasurable else float(v) for l, v in enumerate(x.tolist(), start=1)]

        return {
            "items": len(self.items),
            "acc": float(acc[0]),
            "acc_norm": float(acc_norm[0]),
            "removed_acc": rows(acc[1:]),
            "removed_acc_norm": rows(acc_norm[1:]),
            "delta_acc": rows(acc[1:] - acc[0]),
        }
