"""What a pruned image-text wrapper's export is checked against and what it costs (:mod:`depthlab.prune.wrappers`):
the original's logits with the removed blocks skipped, in memory (its tower's capture) or streamed (a sweep's lane),
on a text prompt and an image-text prompt; the export loaded in plain ``AutoModelForImageTextToText`` and generating
from both; each tower's parameters and FLOPs before and after."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.capture import ResidualCapture
from depthlab.hf.wrappers import text_forward, tower_family, wrapper_of
from depthlab.prune.options import PruneOptions
from depthlab.targets.layers import find_layers

log = logging.getLogger(__name__)

#: The text prompt every wrapper export is checked on (besides an image-text item).
TEXT_PROBE = "A picture of a small red square next to a blue circle. The capital of France is"


def wrapper_config(target: Any) -> Any:
    """The config of a wrapper target, loaded or streamed (its skeleton's)."""
    source = getattr(target, "source", None)
    model = source.skeleton if source is not None else getattr(target, "model", None)
    return getattr(model, "config", None)


def probes(target: Any, opts: PruneOptions) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """(a text prompt's ids (1, T), an image-text item's inputs or None where the wrapper's vision tower is refused):
    what the export is checked on."""
    from depthlab.analysis.diagnostics.heldout import vision_items
    from depthlab.analysis.evaluate.image_scoring import answer_inputs
    from depthlab.targets.wrappers import processor_of

    tok = target.tokenizer
    ids = torch.tensor([tok.tok.encode(TEXT_PROBE) if getattr(tok, "kind", "") == "hf" else tok.encode(TEXT_PROBE)])
    config = wrapper_config(target)
    if wrapper_of(config).refused.get("vision"):
        return ids[:, :48], None
    item = vision_items(opts.data if opts.tower == "vision" else "builtin-shapes", 1)[0]
    inputs, _ = answer_inputs(processor_of(target), item, config.model_type)
    return ids[:, :48], inputs


def _on(inputs: dict[str, torch.Tensor], model: Any) -> dict[str, torch.Tensor]:
    p = next(model.parameters())
    return {k: v.to(p.device, p.dtype if v.is_floating_point() else v.dtype) for k, v in inputs.items()}


@torch.no_grad()
def in_memory_logits(target: Any, tower: str, removed: list[int], ids: torch.Tensor,
                     inputs: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
    """The logits of the loaded wrapper on the text probe and the image-text probe, with the blocks ``removed`` of
    ``tower`` skipped (the tower's capture replaying its blocks; a probe that does not run the tower: as it is)."""
    model = target.model
    text, image = text_forward(model), (lambda x: model(**x, use_cache=False).logits)
    out = []
    for x, forward, runs in ((ids.to(next(model.parameters()).device), text, tower == "language"),
                             (inputs, image, True)):
        if x is None:
            continue
        x = _on(x, model) if isinstance(x, dict) else x
        if not removed or not runs:
            out.append(forward(x).float().cpu())
            continue
        cap = ResidualCapture(model, find_layers(model, tower), forward)
        cap.run(x)
        out.append(cap.run_without(x, removed).float().cpu())
    return out


def streamed_logits(target: Any, sweeper: Any, tower: str, removed: list[int], ids: torch.Tensor,
                    inputs: dict[str, torch.Tensor] | None, name: str,
                    experts: frozenset[tuple[int, int]] = frozenset()) -> list[torch.Tensor]:
    """:func:`in_memory_logits` by sweeps of a streamed wrapper; ``experts``: (1-based block, expert) of the language
    tower removed too (``Lane.experts``)."""
    from depthlab.prune.streamed import LogitsConsumer
    from depthlab.targets.stream.lanes import Lane
    from depthlab.targets.stream.sweep import SweepBatch
    from depthlab.targets.stream.wrapper import SKIP

    language = frozenset(removed) if tower == "language" else frozenset()
    vision = tuple(sorted(removed)) if tower == "vision" else ()
    batches = [SweepBatch(ids, states=False)]
    if inputs is not None:
        rest = {k: v for k, v in inputs.items() if k != "input_ids"}
        batches.append(SweepBatch(inputs["input_ids"], states=False, inputs={**rest, SKIP: vision}))
    out = []
    for i, batch in enumerate(batches):
        consumer = LogitsConsumer()
        sweeper.sweep(f"{name}-{i}", [batch], [Lane("probe", language, experts=experts)], False, consumer, show=False)
        out.append(consumer.out[0])
    return out


def transformers_check_if_fits(check: dict[str, Any], out: Path, ids: torch.Tensor,
                               inputs: dict[str, torch.Tensor] | None, refs: list[torch.Tensor], target: Any,
                               tower: str) -> dict[str, Any]:
    """``check`` (a streamed export read back layer by layer) updated by :func:`transformers_check` when the
    written wrapper in ``out`` fits in memory; else it stands, and the log says why."""
    from depthlab.targets.engine import MEMORY_FRACTION, available_memory
    from depthlab.targets.stream.open import locate, stored_bytes

    free = available_memory(target.device)
    if free is not None and stored_bytes(locate(str(out), tower), target.source.compute_dtype) <= MEMORY_FRACTION * free:
        check.update(transformers_check(out, ids, inputs, refs, target.source.compute_dtype, target.device, tower))
    else:
        log.info("the pruned wrapper would not fit in memory: its export is checked layer by layer, without "
                 "transformers' generate")
    return check


@torch.no_grad()
def transformers_check(out: Path, ids: torch.Tensor, inputs: dict[str, torch.Tensor] | None,
                       refs: list[torch.Tensor], dtype: torch.dtype, device: torch.device, tower: str
                       ) -> dict[str, Any]:
    """The written wrapper loaded with plain ``AutoModelForImageTextToText``: its logits on both probes against
    ``refs``, greedy ``generate`` from text and from image + text (with the KV cache = without), its processor."""
    from transformers import AutoModelForImageTextToText

    from depthlab.hf.processors import wrapper_processor

    loaded = AutoModelForImageTextToText.from_pretrained(str(out), dtype=dtype).to(device).eval()
    wrapper = wrapper_of(loaded.config)
    got = [text_forward(loaded)(ids.to(device)).float().cpu()]
    if inputs is not None:
        got.append(loaded(**_on(inputs, loaded), use_cache=False).logits.float().cpu())
    diffs = [float((a - b).abs().max()) for a, b in zip(got, refs)]
    check = {"max_abs_logit_diff": max(diffs), "max_abs_logit_diff_text": diffs[0],
             "max_abs_logit_diff_image_text": diffs[1] if len(diffs) > 1 else None,
             "loaded_with": "transformers (AutoModelForImageTextToText)",
             "n_layers_loaded": len(find_layers(loaded, tower)), "architecture": type(loaded).__name__,
             "processor": None if wrapper.refused.get("vision") else type(wrapper_processor(out, wrapper.expand)).__name__}
    why = wrapper.refused.get("generate")
    if why is not None:
        return {**check, "generated_tokens": None, "generate_cache_matches_no_cache": None, "generate_refused": why}
    kw = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    prompts = {"text": {"input_ids": ids[:, :12].to(device)}}
    if inputs is not None:
        prompts["image_text"] = _on(inputs, loaded)
    tokens, same = {}, True
    for what, prompt in prompts.items():
        cached = loaded.generate(**prompt, use_cache=True, **kw)
        same = same and bool(torch.equal(cached, loaded.generate(**prompt, use_cache=False, **kw)))
        tokens[what] = cached[0, prompt["input_ids"].shape[1]:].tolist()
    return {**check, "generated_tokens": tokens, "generate_cache_matches_no_cache": same}


# ---------------------------------------------------------------------------------------------- cost
def tower_cost(tensors: dict[str, tuple[int, ...]], blocks: str, n_layers: int) -> dict[str, Any]:
    """Parameters of the wrapper and of the tower's blocks, and ``flops_per_token``: 2 per weight of the tower's
    blocks' matrices (the work per token of that tower), from (name -> shape) of every stored tensor, the tower's
    block-key prefix (module names) and its block count."""
    size = {k: int(torch.Size(s).numel()) for k, s in tensors.items()}
    mine = {k: n for k, n in size.items() if k.startswith(blocks + ".")}
    return {"params": sum(size.values()), "tower_params": sum(mine.values()),
            "flops_per_token": 2 * sum(n for k, n in mine.items() if len(tensors[k]) == 2), "n_layers": n_layers,
            "flops": "2 per weight of the tower's blocks' matrices, per token of that tower"}


def model_cost(model: Any, tower: str) -> dict[str, Any]:
    """:func:`tower_cost` of a loaded wrapper."""
    stored = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return tower_cost(stored, tower_family(model.config, tower).layers, len(find_layers(model, tower)))


def stored_cost(target: Any, tower: str) -> dict[str, Any]:
    """:func:`tower_cost` of a streamed wrapper, from its checkpoint's index (keys as transformers loads them)."""
    from depthlab.prune.shards import module_keys

    config = wrapper_config(target)
    index = target.source.store.index
    names = module_keys(config, list(index))
    n = len(target.source.vision_blocks()) if tower == "vision" else target.source.n_layers
    return tower_cost({names[k]: tuple(i.shape) for k, i in index.items()}, tower_family(config, tower).layers, n)


# ---------------------------------------------------------------------------------------------- the prune
