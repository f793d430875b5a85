"""Scoring a multiple-choice task the lm-evaluation-harness way, or the LLM-Adapters way.

``loglik`` (lm-eval, ``output_type: multiple_choice``): for each (context, continuation) request,
trailing spaces of the context move to the continuation, ``encode(context + continuation)`` is split
after ``len(encode(context))`` tokens, and the continuation's token log-likelihoods are summed
(inputs left-truncated to ``max_length + 1`` tokens). ``acc`` takes the argmax of the sums;
``acc_norm`` the argmax of the sums divided by the *character* length of each ``doc_to_choice``
string (lm-eval's ``completion_len``; equal to the UTF-8 byte length for ASCII text — lm-eval's
byte-normalised variant is ``acc_bytes``, reported too). Standard errors are lm-eval's
``mean_stderr``: sample standard deviation (n - 1) over sqrt(n).

``generate`` (LLM-Adapters' ``commonsense_evaluate.py``): the item's instruction goes through the SFT
prompt template, the model continues greedily (``max_new_tokens``), and the first answer word found
in the text (``answer2``, ``solution1``, ``true``, ``ending3``, ``option2``) is compared with the gold
one. LLM-Adapters decodes with 4 beams; greedy is what fits a CPU and is documented as such.

``logits_fn(ids) -> (B, T, V)`` is any causal LM: see :func:`logits_fn` for a depthlab ``DecoderLM``
(forward returns ``.logits``) or a transformers model. Batches are right-padded and run without an
attention mask, as lm-eval's HFLM does: a causal model never looks at the padding to its right.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from depthlab.base.progress import progress as progress_bar
from depthlab.data.tasks import Task

Encode = Callable[[str], list[int]]
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def logits_fn(model: torch.nn.Module) -> LogitsFn:
    """``ids -> logits`` for a depthlab ``DecoderLM`` or a transformers causal LM (no KV cache)."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return lambda ids: model(input_ids=ids, use_cache=False).logits
    return lambda ids: model(ids).logits


def encode_pair(encode: Encode, context: str, continuation: str, prefix_id: int) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair`` (causal): context's trailing spaces go to the continuation; the
    whole string is encoded and split after the context's tokens. An empty context is ``[prefix_id]``."""
    if context == "":
        cont = encode(continuation)
        return ([prefix_id], cont) if not cont or cont[0] != prefix_id else (cont[:1], cont[1:])
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def loglikelihoods(fn: LogitsFn, pairs: Sequence[tuple[list[int], list[int]]], *, batch_size: int = 8,
                   max_length: int = 2048, pad_id: int = 0, device: torch.device | str = "cpu",
                   desc: str = "loglikelihood", progress: bool = True) -> list[float]:
    """Summed log-probability of each continuation given its context (token ids)."""
    rows = []
    for ctx, cont in pairs:
        if not cont:
            raise ValueError("empty continuation")
        whole = (list(ctx) + list(cont))[-(max_length + 1):]  # left-truncated, as lm-eval
        rows.append((whole[:-1], list(cont)[-(len(whole) - 1):]))  # a continuation longer than max_length: its tail
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first, as lm-eval
    out = [0.0] * len(rows)
    bar = progress_bar(len(rows), desc, "item", progress)  # a bar on a terminal, ETA lines in a log
    for a in range(0, len(order), batch_size):
        idx = order[a:a + batch_size]
        width = max(len(rows[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(rows[i][0])] = torch.as_tensor(rows[i][0])
        logits = fn(ids.to(device))
        for r, i in enumerate(idx):
            inp, cont = rows[i]
            n = len(inp)
            logp = torch.log_softmax(logits[r, n - len(cont): n].float(), dim=-1)  # only the rows scored
            tgt = torch.as_tensor(cont, device=logp.device)
            out[i] = float(logp.gather(-1, tgt[:, None]).sum())
        bar.update(len(idx))
    bar.close()
    return out


def mean_stderr(values: Sequence[float]) -> float:
    """lm-eval's ``mean_stderr``: sample std (n - 1) / sqrt(n); NaN below two values."""
    n = len(values)
    if n < 2:
        return float("nan")
    mu = sum(values) / n
    return math.sqrt(sum((v - mu) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def _argmax(xs: Sequence[float]) -> int:
    return max(range(len(xs)), key=lambda i: (xs[i], -i))  # first maximum, as numpy.argmax


@dataclass
class MCScores:
    """Per-item per-choice log-likelihoods and the metrics derived from them."""

    lls: list[list[float]]
    task: Task

    def correct(self) -> dict[str, list[float]]:
        acc, norm, byt = [], [], []
        for item, ll in zip(self.task.items, self.lls):
            acc.append(float(_argmax(ll) == item.gold))
            norm.append(float(_argmax([x / max(len(c), 1) for x, c in zip(ll, item.choices)]) == item.gold))
            byt.append(float(_argmax([x / max(len(c.encode("utf-8")), 1) for x, c in zip(ll, item.choices)]) == item.gold))
        return {"acc": acc, "acc_norm": norm, "acc_bytes": byt}

    def metrics(self) -> dict[str, Any]:
        res: dict[str, Any] = {"n": len(self.lls)}
        for k, v in self.correct().items():
            res[k] = sum(v) / len(v)
            res[f"{k}_stderr"] = mean_stderr(v)
        return res


def score_loglik(fn: LogitsFn, task: Task, encode: Encode, *, prefix_id: int, batch_size: int = 8,
                 max_length: int = 2048, pad_id: int = 0, device: torch.device | str = "cpu",
                 progress: bool = True) -> MCScores:
    """lm-eval multiple-choice scoring of every item of ``task``."""
    pairs, owner = [], []
    for k, item in enumerate(task.items):
        for ctx, cont in zip(item.contexts, item.continuations):
            pairs.append(encode_pair(encode, ctx, cont, prefix_id))
            owner.append(k)
    flat = loglikelihoods(fn, pairs, batch_size=batch_size, max_length=max_length, pad_id=pad_id, device=device,
                          desc=task.name, progress=progress)
    lls: list[list[float]] = [[] for _ in task.items]
    for k, ll in zip(owner, flat):
        lls[k].append(ll)
    return MCScores(lls, task)


# ---------------------------------------------------------------------- generation (LLM-Adapters)
@torch.no_grad()
def greedy_generate(fn: LogitsFn, prompts: Sequence[list[int]], *, max_new_tokens: int = 32, eos_id: int | None = None,
                    pad_id: int = 0, max_length: int = 2048, device: torch.device | str = "cpu") -> list[list[int]]:
    """Greedy continuation of each prompt, batched with right padding: row r's next token is read
    at its own last position, so padding never influences it (no KV cache: small models)."""
    seqs = [list(p)[-(max_length - max_new_tokens):] if max_length > max_new_tokens else list(p) for p in prompts]
    new: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))
    for _ in range(max_new_tokens):
        if not live:
            break
        width = max(len(seqs[i]) for i in live)
        ids = torch.full((len(live), width), pad_id, dtype=torch.long)
        for r, i in enumerate(live):
            ids[r, : len(seqs[i])] = torch.as_tensor(seqs[i])
        logits = fn(ids.to(device))
        nxt = [int(logits[r, len(seqs[i]) - 1].argmax()) for r, i in enumerate(live)]
        still = []
        for i, t in zip(live, nxt):
            if eos_id is not None and t == eos_id:
                continue
            seqs[i].append(t)
            new[i].append(t)
            still.append(i)
        live = still
    return new


def extract_answer(text: str, words: Sequence[str]) -> int | None:
    """Index of the first answer word in ``text`` (LLM-Adapters' ``re.findall(...)[0]``), else None."""
    if not words:
        return None
    pattern = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
    found = re.findall(pattern, text.strip())
    return list(words).index(found[0]) if found else None


def score_generate(fn: LogitsFn, task: Task, encode: Encode, decode: Callable[[list[int]], str],
                   render: Callable[[str], str], *, eos_id: int | None, batch_size: int = 8,
                   max_new_tokens: int = 32, max_length: int = 2048, pad_id: int = 0,
                   device: torch.device | str = "cpu", progress: bool = True) -> dict[str, Any]:
    """Generation-and-match accuracy; ``render(instruction)`` is the SFT prompt up to the response."""
    correct, outputs = [], []
    bar = progress_bar(len(task.items), f"{task.name} (generate)", "item", progress)
    for a in range(0, len(task.items), batch_size):
        chunk = task.items[a:a + batch_size]
        gens = greedy_generate(fn, [encode(render(it.instruction)) for it in chunk], max_new_tokens=max_new_tokens,
                               eos_id=eos_id, pad_id=pad_id, max_length=max_length, device=device)
        for it, g in zip(chunk, gens):
            text = decode(g)
            pred = extract_answer(text, it.answer_words)
            correct.append(float(pred == it.gold))
            outputs.append({"source": it.source, "output": text, "pred": pred, "gold": it.gold})
        bar.update(len(chunk))
    bar.close()
    return {"n": len(correct), "acc": sum(correct) / len(correct), "acc_stderr": mean_stderr(correct),
            "outputs": outputs}
