"""Scoring an image-text multiple-choice task (:mod:`depthlab.data.image_tasks`) the lm-evaluation-harness way.

The same rule as :func:`~depthlab.analysis.evaluate.scoring.score_loglik` for text: for each choice, the context and
the context + continuation are encoded (here by the model's processor, which puts its image tokens where the prompt
has :data:`~depthlab.data.image_tasks.IMAGE` and makes the pixel inputs), the whole sequence is split after the
context's tokens, and the continuation's token log-probabilities are summed; ``acc`` is the argmax over the choices.
When every continuation is one token (the letters, in every tokenizer we know), one forward of the context gives all
the choices: the same numbers, a quarter of the work.

The prompt reaches the model in one of two ways:

- plain (default): the item's prompt (``...\\nAnswer:``) with the processor's image marker
  (``processor.image_token``: ``<image>`` for LLaVA / Idefics3 / PaliGemma, ``<start_of_image>`` for Gemma 3,
  ``<|image_pad|>`` for Qwen-VL) in place of each image; continuations `` A``, `` B``, ...;
- ``chat_template=True``: the item's prompt without ``Answer:`` as one user turn (images and text in order) through
  the processor's chat template with the generation prompt, continuations ``A``, ``B``, ... (an instruct model's
  answer starts the assistant turn).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from depthlab.analysis.evaluate.scoring import MCScores, encode_pair
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import progress as progress_bar
from depthlab.data.image_tasks import IMAGE, ImageItem, ImageTask


def image_marker(processor: Any, model_type: str | None = None) -> str:
    """The text a processor expands into an image's tokens: the wrapper entry's (``Wrapper.marker``: Qwen-VL's pad
    between its vision start and end tokens, whose positions its M-RoPE reads), else the processor's image token."""
    from depthlab.hf.wrappers import WRAPPERS

    wrapper = WRAPPERS.get(model_type or "")
    if wrapper is not None and wrapper.marker:
        return wrapper.marker
    marker = getattr(processor, "image_token", None) or getattr(getattr(processor, "tokenizer", None), "image_token", None)
    if not marker:
        raise DepthlabError(f"{type(processor).__name__} names no image token (processor.image_token); it cannot "
                            "show an image-text task's images to its model")
    return str(marker)


def prompt(item: ImageItem, processor: Any, chat_template: bool = False, model_type: str | None = None
           ) -> tuple[str, tuple[str, ...]]:
    """(the context as the processor reads it, the continuations) of ``item``; ``model_type``: the wrapper's (its
    image marker, :func:`image_marker`)."""
    context = item.context()
    if not chat_template:
        return context.replace(IMAGE, image_marker(processor, model_type)), item.continuations()
    if not getattr(processor, "chat_template", None):
        raise DepthlabError(f"{type(processor).__name__} has no chat template; score without --chat-template")
    body = context.removesuffix("\nAnswer:")
    content: list[dict[str, str]] = []
    for k, piece in enumerate(body.split(IMAGE)):
        if k:
            content.append({"type": "image"})
        if piece.strip():
            content.append({"type": "text", "text": piece.strip("\n")})
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    return text, item.letters


def _inputs(processor: Any, text: str, images: Sequence[Any], device: torch.device) -> dict[str, torch.Tensor]:
    out = processor(text=[text], images=[list(images)] if images else None, return_tensors="pt")
    return {k: v.to(device) for k, v in out.items() if isinstance(v, torch.Tensor) and k not in NOT_INPUTS}


#: What some processors return that is not a model input (PaliGemma's processor makes training labels).
NOT_INPUTS = ("labels",)


def _loglik(model: Any, inputs: dict[str, torch.Tensor], n_cont: int) -> torch.Tensor:
    """Log-probabilities (n_cont,) of the last ``n_cont`` tokens of ``inputs`` given what precedes them."""
    logits = model(**inputs, use_cache=False).logits[0]
    ids = inputs["input_ids"][0]
    t = ids.shape[0]
    logp = torch.log_softmax(logits[t - n_cont - 1: t - 1].float(), dim=-1)
    return logp.gather(-1, ids[t - n_cont:, None])[:, 0]


@torch.no_grad()
def item_logliks(model: Any, processor: Any, item: ImageItem, chat_template: bool = False) -> list[float]:
    """The summed log-likelihood of each choice's continuation."""
    device = next(model.parameters()).device
    images = [ref.open() for ref in item.images]
    context, conts = prompt(item, processor, chat_template, getattr(getattr(model, "config", None), "model_type", None))

    def encode(text: str) -> list[int]:
        return _inputs(processor, text, images, torch.device("cpu"))["input_ids"][0].tolist()

    pairs = [encode_pair(encode, context, cont, prefix_id=-1) for cont in conts]
    if any(not cont for _, cont in pairs):
        raise DepthlabError(f"{item.source}: a choice encodes to no token after its context")
    ctx_len = {len(ctx) for ctx, _ in pairs}
    if len(ctx_len) == 1 and all(len(cont) == 1 for _, cont in pairs):  # one forward gives every choice
        ctx_text = context[: len(context) - (len(context) - len(context.rstrip()))]
        inputs = _inputs(processor, ctx_text, images, device)
        logits = model(**inputs, use_cache=False).logits[0, -1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return [float(logp[cont[0]]) for _, cont in pairs]
    out = []
    for ctx, cont in pairs:  # the whole sequence's tokens, as encode_pair split them
        inputs = _inputs(processor, context + conts[len(out)], images, device)
        if inputs["input_ids"][0].tolist() != ctx + cont:
            inputs["input_ids"] = torch.tensor([ctx + cont], device=device)
        out.append(float(_loglik(model, inputs, len(cont)).sum()))
    return out


def score_image_loglik(model: Any, processor: Any, task: ImageTask, *, chat_template: bool = False,
                       progress: bool = True) -> MCScores:
    """lm-eval multiple-choice scoring of every item of an image-text ``task`` on an image-text-to-text ``model``."""
    model.eval()
    bar = progress_bar(len(task.items), task.name, "item", progress)
    lls = []
    for item in task.items:
        lls.append(item_logliks(model, processor, item, chat_template))
        bar.update(1)
    bar.close()
    return MCScores(lls, task)  # type: ignore[arg-type] - an ImageItem has .choices and .gold, all MCScores reads


def answer_inputs(processor: Any, item: ImageItem, model_type: str | None = None
                  ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the wrapper's inputs for ``item``'s prompt followed by its answer, the next-token labels (1, T) of the
    answer's tokens, -100 elsewhere): the context is split from the answer as :func:`encode_pair` splits a choice
    (the context's own tokens, then the rest), so the answer's loss is the one the scoring sums."""
    from depthlab.data.batches import IGNORE_INDEX

    images = [ref.open() for ref in item.images]
    context, conts = prompt(item, processor, False, model_type)
    inputs = _inputs(processor, context + conts[item.gold], images, torch.device("cpu"))
    ids = inputs["input_ids"][0]
    n_ctx = _inputs(processor, context, images, torch.device("cpu"))["input_ids"].shape[1]
    if not 0 < n_ctx < ids.shape[0]:
        raise DepthlabError(f"{item.source}: the answer {conts[item.gold]!r} encodes to no token after its context")
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[n_ctx - 1: -1] = ids[n_ctx:]
    return inputs, labels[None]
