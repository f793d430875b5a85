"""``prune --unit expert`` of an image-text-to-text wrapper: routed experts of its MoE language tower go.

    report = prune_target(load_target("my-qwen3.5-moe-vl"), PruneOptions(unit="expert", fraction=0.25), "pruned/x")

The experts are chosen as for a text MoE (:func:`depthlab.prune.experts.choose_experts`: REAP, frequency, random,
``--remove`` / ``--fraction`` / ``--budget`` / ``--experts``) on held-out text run through the wrapper's language
tower, removed in place, and the whole wrapper written (both towers, the projector, the processor / tokenizer files)
with the text config's expert count cut. The export is checked as a block prune of a wrapper is
(:func:`depthlab.prune.wrapper_checks.transformers_check`): plain ``AutoModelForImageTextToText`` loads it and gives,
on a text prompt and an image-text prompt, the logits of the original with those experts never routed to, and
generates from both (cached = uncached).

Streamed (:func:`prune_wrapper_experts_streamed`), the text MoE's streamed engine runs on the wrapper's language
tower: the same choice by sweeps (:class:`depthlab.prune.streamed_experts.StreamedExperts`), the checkpoint written
shard by shard (:func:`depthlab.prune.streamed_experts.write_experts`: both towers, the processor files), read back
layer by layer against the original with the experts removed on both probes, and loaded in plain transformers when
it fits. Healing and ``--generate`` are refused for wrappers before any work
(:func:`depthlab.prune.wrappers.refuse`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.hf.experts import MoeLayer, cut_count, experts_removed, experts_spec, remove_experts
from depthlab.prune.options import PruneOptions


def text_config(target: Any) -> Any:
    """The wrapper's language-tower config (where the expert count lives), loaded or streamed."""
    from depthlab.prune.wrapper_checks import wrapper_config

    return wrapper_config(target).get_text_config()


def check(target: Any, opts: PruneOptions) -> dict[int, MoeLayer]:
    """The wrapper's MoE blocks, refusing in one line a tower other than language, a dense tower and the counts the
    tower cannot lose."""
    from depthlab.prune.experts import check_experts
    from depthlab.targets.engine import engine_of
    from depthlab.targets.layers import find_layers

    if opts.tower != "language":
        raise DepthlabError(f"--unit expert removes routed experts of the language tower; --tower {opts.tower} has none "
                            "(use --tower language)")
    layers = target.source.layers if engine_of(target) == "streamed" else find_layers(target.model, "language")
    return check_experts(layers, text_config(target), opts)


def prune_wrapper_experts(target: Any, opts: PruneOptions, out: Path, command: str | None, settings: Any = None
                          ) -> dict[str, Any]:
    """Remove routed experts of the wrapper's language tower, write the whole wrapper, check it in plain
    transformers, and write ``prune.json`` + ``report.html`` into ``out`` (whole or not at all); streamed:
    :func:`prune_wrapper_experts_streamed` (``settings``: its sweeps')."""
    from depthlab.targets.engine import engine_of

    if engine_of(target) == "streamed":
        return prune_wrapper_experts_streamed(target, opts, out, command, settings)
    return _prune_in_memory(target, opts, out, command)


def _prune_in_memory(target: Any, opts: PruneOptions, out: Path, command: str | None) -> dict[str, Any]:
    """:func:`prune_wrapper_experts` on the loaded wrapper: the experts removed in place, the wrapper saved."""
    from depthlab.analysis.diagnostics.capture import capture_of
    from depthlab.base.fileio import publish_dir
    from depthlab.hf.loading import third_party_output
    from depthlab.prune.experts import MemoryExperts, choose_experts
    from depthlab.prune.experts_report import experts_report, write_experts_report
    from depthlab.prune.pipeline import held_out_batches
    from depthlab.prune.shards import copy_side_files
    from depthlab.prune.units import _Cached
    from depthlab.prune.wrapper_checks import in_memory_logits, model_cost, probes, transformers_check

    t0 = time.time()
    model, config = target.model, text_config(target)
    moe = check(target, opts)
    batches = _Cached(held_out_batches(target, opts))
    measure = MemoryExperts(capture_of(target), batches, moe)
    base, scores, removal, details = choose_experts(measure, opts)
    ids, inputs = probes(target, opts)
    original = model_cost(model, "language")
    with torch.no_grad(), experts_removed(moe, removal):
        refs = in_memory_logits(target, "language", [], ids, inputs)
    remove_experts(moe, removal)
    kept = moe[min(moe)].n
    cut_count(config, experts_spec(config), kept)
    with torch.no_grad():
        got = in_memory_logits(target, "language", [], ids, inputs)
    losses: dict[str, float | None] = {"original": base, "pruned": measure.loss({}), "healed": None}
    report = experts_report(target, opts, removal, details, scores, losses, {}, batches, command, moe, kept)
    report.update(tower="language", heal=None, cost={"original": original, "pruned": model_cost(model, "language")})
    with publish_dir(out) as tmp:
        model.config.depthlab = {**(getattr(model.config, "depthlab", None) or {}), "pruned_from": str(target.name),
                                 "tower": "language", "removed_experts": report["removed_experts"],
                                 "method": report["method"], "healed_steps": 0}
        with third_party_output(None if opts.progress else False):
            model.save_pretrained(str(tmp))
        copy_side_files(Path(target.info["source"]), tmp)
        p = next(model.parameters())
        check_ = transformers_check(tmp, ids, inputs, refs, p.dtype, p.device, "language")
        report["export"] = {**check_, "dir": str(out), "max_abs_logit_diff_vs_removed_in_original":
                            max(float((a.float() - b.float()).abs().max()) for a, b in zip(got, refs))}
        report["seconds"] = round(time.time() - t0, 2)
        write_experts_report(report, tmp)
    return report


def prune_wrapper_experts_streamed(target: Any, opts: PruneOptions, out: Path, command: str | None, settings: Any
                                   ) -> dict[str, Any]:
    """:func:`prune_wrapper_experts` reading the wrapper one layer at a time (see the module docstring)."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.experts_report import experts_report, write_experts_report
    from depthlab.prune.streamed_experts import StreamedExperts, choose_streamed, expert_lane, experts_engine, write_experts
    from depthlab.prune.wrapper_checks import probes, stored_cost, streamed_logits, transformers_check_if_fits
    from depthlab.targets.stream.open import locate, open_streamed

    t0, src = time.time(), target.source
    batches, text, measure, (base, scores, removal, details), kept = choose_streamed(target, opts, settings)
    ids, inputs = probes(target, opts)
    with publish_dir(out) as tmp:
        written = write_experts(target, measure.moe, removal, tmp, {
            "pruned_from": str(target.name), "tower": "language", "healed_steps": 0,
            "removed_experts": {str(b): g for b, g in sorted(removal.items())}, "method": details["method"]})
        opened = open_streamed(str(tmp), target.device, src.dtype, src.compute_dtype, found=locate(str(tmp), "language"))
        opened.processor = target.processor
        pruned = StreamedExperts(opened, text, settings)
        refs = streamed_logits(target, measure.sweeper, "language", [], ids, inputs, "probe-original",
                               expert_lane("probe", removal).experts)
        got = streamed_logits(opened, pruned.sweeper, "language", [], ids, inputs, "probe-pruned")
        diff = max(float((a - b).abs().max()) for a, b in zip(got, refs))
        check = transformers_check_if_fits({
            "max_abs_logit_diff": diff, "max_abs_logit_diff_vs_removed_in_original": diff, "written": written,
            "loaded_with": "depthlab, layer by layer", "architecture": opened.info["architecture"],
            "generated_tokens": None, "generate_cache_matches_no_cache": None}, tmp, ids, inputs, refs, target,
            "language")
        losses = {"original": base, "pruned": pruned.loss({}), "healed": None}
        report = experts_report(target, opts, removal, details, scores, losses, {}, batches, command, measure.moe, kept)
        report.update(tower="language", heal=None, latency=None, export={**check, "dir": str(out)},
                      cost={"original": stored_cost(target, "language"), "pruned": stored_cost(opened, "language")},
                      engine=experts_engine(measure, pruned), seconds=round(time.time() - t0, 2))
        write_experts_report(report, tmp)
    return report
