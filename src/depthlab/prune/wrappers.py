"""``prune`` of an image-text-to-text wrapper: blocks of one tower go, the whole wrapper is written.

    report = prune_target("qwen2.5-vl", PruneOptions(tower="vision", blocks=[7]), "pruned/x")   # depthlab.prune

The blocks are chosen as for a text model (every method; ``--remove`` / ``--budget`` / ``--blocks``), measured on
the tower's data: the language tower on held-out text, the vision tower on image-text items (the loss of their
answers given the image: :class:`~depthlab.analysis.diagnostics.heldout.ImageTextBatches`); in memory by the tower's
capture, streamed by sweeps of the language tower carrying one batch per (item, vision lane). The export is the whole
wrapper (both towers, the projector, the processor / tokenizer / chat-template files) with the tower's per-layer
config facts cut, and the wrapper's (the projector's feature layer); written by the surgery in memory
(:func:`~depthlab.prune.export.drop_layers` with ``tower``) or shard by shard
(:func:`~depthlab.prune.shards.write_pruned_shards`). It is checked against the original with those blocks skipped,
on a text prompt and on an image-text prompt: read back by depthlab, and loaded with plain
``AutoModelForImageTextToText`` (streamed: when it fits), which generates from both (cached = uncached; Llama 4's
generate raises in transformers 5.24: not tried, the reason recorded). Healing, ``--generate``, ``--unit attn|mlp``
and the latency measurement are not done for wrappers: refused in one line from config.json, before any work.
``--unit expert`` removes routed experts of an MoE language tower, on either engine
(:mod:`depthlab.prune.wrapper_experts`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.angular import AngularAccumulator
from depthlab.analysis.diagnostics.capture import ResidualCapture, capture_of
from depthlab.analysis.diagnostics.removal import joint_removal_loss, nll_sum
from depthlab.base.errors import DepthlabError
from depthlab.base.metrics import perplexity
from depthlab.hf.wrappers import check_tower, tower_family, tower_layers, wrapper_of
from depthlab.prune.options import PruneOptions
from depthlab.prune.select import InfluenceAccumulator, Survey, block_limits, check_removable, select_blocks
from depthlab.prune.wrapper_checks import (
    in_memory_logits,
    model_cost,
    probes,
    stored_cost,
    streamed_logits,
    transformers_check,
    transformers_check_if_fits,
    wrapper_config,
)
from depthlab.targets.engine import engine_of, engine_record
from depthlab.targets.frame import Request
from depthlab.targets.layers import find_layers

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------- refusals
def refuse(opts: PruneOptions, config: Any, n_layers: int | None = None) -> None:
    """What ``prune`` does not do for the wrapper ``config`` describes, and the blocks its ``opts.tower`` cannot
    lose (with ``n_layers``: the ranges too): one line each, from the config alone."""
    tower = opts.tower
    for asked, what in ((opts.heal.steps > 0, "--heal-steps (healing trains a text model)"),
                        (opts.generate is not None, "--generate (a text task scored by generation)"),
                        (opts.unit not in ("block", "expert"), f"--unit {opts.unit} (sublayers)")):
        if asked:
            raise DepthlabError(f"{what} is not done for an image-text-to-text wrapper; prune its blocks with "
                                "--tower language|vision")
    tower_family(config, tower, "prune")
    if opts.unit == "expert":  # the language tower's routed experts (depthlab.prune.wrapper_experts)
        if tower != "language":
            raise DepthlabError(f"--unit expert removes routed experts of the language tower; --tower {tower} has "
                                "none (use --tower language)")
        return
    if n_layers is not None:
        opts.validate(n_layers)
    if opts.blocks:
        check_tower(config, tower, "prune", opts.blocks)
    if opts.remove is not None and n_layers is not None:
        check_removable(opts.method, opts.remove, n_layers, block_limits(config, tower))


def check_config_json(request: Request) -> None:
    """Before anything is loaded: an image-text model directory's refusals from its config.json."""
    from depthlab.targets.wrappers import image_text_config

    if not isinstance(request.target, (str, Path)):
        return
    config = image_text_config(request.target)
    if config is not None and wrapper_of(config) is not None:
        tower_family(config, request.opts.tower, "prune")
        refuse(request.opts, config, tower_layers(config, request.opts.tower))


def is_wrapper(target: Any) -> bool:
    """Whether an opened target is an image-text-to-text wrapper (either engine)."""
    return wrapper_of(wrapper_config(target) or {}) is not None


def check_model(request: Request, target: Any) -> None:
    """The refusals of :func:`refuse` against the opened wrapper (its tower's block count)."""
    if target.tower != request.opts.tower:
        raise DepthlabError(f"the target was opened for its {target.tower} tower, and --tower {request.opts.tower} "
                            "was asked; open it with the same tower")
    refuse(request.opts, wrapper_config(target), target.info["n_layers"])
    if request.opts.unit == "expert":
        from depthlab.prune.wrapper_experts import check

        check(target, request.opts)


# ---------------------------------------------------------------------------------------------- measuring
def tower_batches(target: Any, opts: PruneOptions) -> Any:
    """The tower's held-out data: text (language), image-text items (vision)."""
    from depthlab.analysis.diagnostics.heldout import ImageTextBatches
    from depthlab.analysis.diagnostics.options import DiagnoseOptions
    from depthlab.prune.pipeline import held_out_batches

    if opts.tower == "vision":
        return ImageTextBatches(target, DiagnoseOptions(data=opts.data, images=opts.images))
    return held_out_batches(target, opts)


class InMemoryTower:
    """The measurements of a tower loaded in memory: its capture (the tower's blocks, the target's forward)."""

    def __init__(self, target: Any, opts: PruneOptions) -> None:
        self.target, self.opts = target, opts
        self.batches = tower_batches(target, opts)
        self.cap = capture_of(target)
        self.n_layers = self.cap.n_layers

    def survey(self, name: str = "survey") -> Survey:
        from depthlab.prune.select import survey_model

        return survey_model(ResidualCapture(self.cap.model, find_layers(self.cap.model, self.opts.tower),
                                            self.cap.forward), self.batches)

    def select(self, survey: Survey, allowed: Any) -> Any:
        o = self.opts
        return select_blocks(o.method, self.cap, self.batches, survey, remove=o.remove, budget=o.budget,
                             allowed=allowed)

    def joint_loss(self, blocks: list[int]) -> float:
        return joint_removal_loss(self.cap, self.batches, blocks)


class PayloadLoss:
    """Summed answer loss per batch payload (a vision lane), over a sweep of image-text batches."""

    def __init__(self) -> None:
        self.sums: dict[int, float] = {}
        self.counts: dict[int, int] = {}

    def logits(self, lane: int, index: int, batch: Any, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.sums[batch.payload] = self.sums.get(batch.payload, 0.0) + s
        self.counts[batch.payload] = self.counts.get(batch.payload, 0) + n

    def states(self, index: int, batch: Any, states: list[torch.Tensor]) -> None:
        pass

    def loss(self, payload: int) -> float:
        return self.sums[payload] / max(self.counts[payload], 1)

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "counts": self.counts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums, self.counts = dict(state["sums"]), dict(state["counts"])


class StreamedVision:
    """The measurements of a streamed wrapper's vision tower: its states read with the vision tower whole, losses
    by sweeps of the language tower carrying one batch per (item, vision lane)."""

    def __init__(self, target: Any, opts: PruneOptions, settings: Any) -> None:
        from depthlab.targets.stream.sweep import Sweeper

        self.target, self.opts = target, opts
        self.batches = tower_batches(target, opts)
        self.sweeper = Sweeper(target, settings)
        self.n_layers = len(target.source.vision_blocks())
        self.steps = 0

    def _losses(self, name: str, lanes: list[tuple[int, tuple[int, ...]]]) -> PayloadLoss:
        from depthlab.analysis.diagnostics.streamed import vision_lanes
        from depthlab.targets.stream.lanes import Lane

        consumer = PayloadLoss()
        self.sweeper.sweep(name, vision_lanes(self.batches.rows, lanes), [Lane("base")], False, consumer)
        return consumer

    def survey(self, name: str = "survey") -> Survey:
        src, L = self.target.source, self.n_layers
        angular, influence = AngularAccumulator(L + 1), InfluenceAccumulator(L)
        with src.images():
            for inputs, _ in self.batches.rows:
                states = src.vision_states(inputs["input_ids"].to(self.target.device), inputs)
                angular.update(states)
                influence.update(states)
        base = self._losses(name, [(0, ())])
        return Survey(base.loss(0), base.counts[0], angular.mean(), influence.result())

    def greedy_losses(self, removed: set[int], candidates: list[int]) -> dict[int, float]:
        self.steps += 1
        lanes = [(m, tuple(sorted(removed | {m}))) for m in candidates]
        consumer = self._losses(f"greedy-vision-{self.steps}", lanes)
        return {m: consumer.loss(m) for m in candidates}

    def joint_loss(self, blocks: list[int]) -> float:
        return self._losses("joint-vision-" + "-".join(map(str, sorted(blocks))), [(0, tuple(sorted(blocks)))]).loss(0)

    def select(self, survey: Survey, allowed: Any) -> Any:
        o = self.opts
        return select_blocks(o.method, self, None, survey, remove=o.remove, budget=o.budget,
                             joint_loss=self.joint_loss, losses_of=self.greedy_losses, allowed=allowed)


class StreamedLanguage:
    """The measurements of a streamed wrapper's language tower: :class:`depthlab.prune.streamed.StreamedMeasure`."""

    def __init__(self, target: Any, opts: PruneOptions, settings: Any) -> None:
        from depthlab.prune.streamed import StreamedMeasure
        from depthlab.targets.stream.sweep import SweepBatch

        self.opts, self.batches = opts, tower_batches(target, opts)
        self.measure = StreamedMeasure(target, [SweepBatch(x, y) for x, y in self.batches], settings)
        self.n_layers, self.sweeper = self.measure.n_layers, self.measure.sweeper

    def survey(self, name: str = "survey") -> Survey:
        return self.measure.survey(name)

    def joint_loss(self, blocks: list[int]) -> float:
        return self.measure.joint_loss(blocks)

    def select(self, survey: Survey, allowed: Any) -> Any:
        o, m = self.opts, self.measure
        return select_blocks(o.method, m, None, survey, remove=o.remove, budget=o.budget, joint_loss=m.joint_loss,
                             losses_of=m.greedy_losses, allowed=allowed)


def tower_measure(target: Any, opts: PruneOptions, settings: Any = None) -> Any:
    """The measurements of ``target``'s tower on its engine."""
    if engine_of(target) != "streamed":
        return InMemoryTower(target, opts)
    return (StreamedVision if opts.tower == "vision" else StreamedLanguage)(target, opts, settings)


# ---------------------------------------------------------------------------------------------- probes and checks
def prune_wrapper(target: Any, opts: PruneOptions, out: Path, command: str | None, settings: Any = None
                  ) -> dict[str, Any]:
    """Prune ``opts.tower`` of the wrapper ``target`` (either engine) and write the whole wrapper, ``prune.json`` and
    ``report.html`` into ``out``, whole or not at all; returns the report (:func:`depthlab.prune.prune_target`'s
    shape). Run by :func:`depthlab.prune.prune_target` once its checks have passed."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.prune_report import write_report

    if opts.unit == "expert":
        from depthlab.prune.wrapper_experts import prune_wrapper_experts

        return prune_wrapper_experts(target, opts, out, command, settings)
    t0 = time.time()
    measure = tower_measure(target, opts, settings)
    before = measure.survey()
    sel = _choose(measure, opts, before, wrapper_config(target))
    ids, inputs = probes(target, opts)
    streamed = engine_of(target) == "streamed"
    with publish_dir(out) as tmp:
        if streamed:
            check, after, cost = _cut_streamed(target, opts, sel, ids, inputs, measure, tmp, settings)
        else:
            check, after, cost = _cut_in_memory(target, opts, sel, ids, inputs, tmp)
        report = _report(target, opts, sel, before, after, measure, cost, command)
        report["export"] = {**check, "dir": str(out)}
        report["seconds"] = round(time.time() - t0, 2)
        write_report(report, tmp)
    return report


def _choose(measure: Any, opts: PruneOptions, before: Survey, config: Any) -> Any:
    from depthlab.prune.select import Selection, check_blocks

    if opts.blocks is not None:
        blocks = check_blocks(opts.blocks, measure.n_layers)
        return Selection("user", blocks, measure.joint_loss(blocks))
    sel = measure.select(before, block_limits(config, opts.tower))
    if not sel.removed:
        raise DepthlabError(f"no block can be removed within --budget {opts.budget:g} nats with method {opts.method} "
                            f"(held-out loss {before.loss:.4f}); raise the budget")
    return sel


def _provenance(target: Any, opts: PruneOptions, sel: Any) -> dict[str, Any]:
    return {"pruned_from": str(target.name), "tower": opts.tower, "removed_blocks": sel.removed,
            "method": sel.method, "healed_steps": 0}


def _cut_in_memory(target: Any, opts: PruneOptions, sel: Any, ids: torch.Tensor, inputs: Any, tmp: Path
                   ) -> tuple[dict[str, Any], Survey, dict[str, Any]]:
    """The surgery on the loaded wrapper (in place), its save with the processor files, and the checks."""
    from depthlab.hf.loading import third_party_output
    from depthlab.prune.export import drop_layers
    from depthlab.prune.shards import copy_side_files

    model, tower = target.model, opts.tower
    refs = in_memory_logits(target, tower, sel.removed, ids, inputs)
    original = model_cost(model, tower)
    drop_layers(model, sel.removed, inplace=True, tower=tower)
    got = in_memory_logits(target, tower, [], ids, inputs)
    skip = max(float((a - b).abs().max()) for a, b in zip(got, refs))
    model.config.depthlab = {**(getattr(model.config, "depthlab", None) or {}), **_provenance(target, opts, sel)}
    with third_party_output(None if opts.progress else False):
        model.save_pretrained(str(tmp))
    copy_side_files(Path(target.info["source"]), tmp)
    check = transformers_check(tmp, ids, inputs, refs, next(model.parameters()).dtype,
                               next(model.parameters()).device, tower)
    after = InMemoryTower(target, opts).survey()
    return {**check, "max_abs_logit_diff_vs_skipping_in_original": skip}, after, \
        {"original": original, "pruned": model_cost(model, tower)}


def _cut_streamed(target: Any, opts: PruneOptions, sel: Any, ids: torch.Tensor, inputs: Any, measure: Any,
                  tmp: Path, settings: Any) -> tuple[dict[str, Any], Survey, dict[str, Any]]:
    """The checkpoint cut shard by shard (the processor files copied), read back layer by layer against the
    original with the blocks skipped, and loaded with plain transformers when it fits."""
    from depthlab.prune.shards import write_pruned_shards
    from depthlab.targets.stream.open import locate, open_streamed

    tower, src = opts.tower, target.source
    written = write_pruned_shards(target.path, sel.removed, tmp, _provenance(target, opts, sel), tower=tower)
    refs = streamed_logits(target, measure.sweeper, tower, sel.removed, ids, inputs, "probe-original")
    found = locate(str(tmp), tower)
    pruned = open_streamed(str(tmp), target.device, src.dtype, src.compute_dtype, found=found)
    pruned.processor = target.processor
    after_measure = tower_measure(pruned, opts, settings)
    got = streamed_logits(pruned, after_measure.sweeper, tower, [], ids, inputs, "probe-pruned")
    diff = max(float((a - b).abs().max()) for a, b in zip(got, refs))
    check: dict[str, Any] = {"max_abs_logit_diff": diff, "max_abs_logit_diff_vs_skipping_in_original": diff,
                             "loaded_with": "depthlab, layer by layer", "n_layers_loaded": pruned.info["n_layers"],
                             "architecture": pruned.info["architecture"], "generated_tokens": None,
                             "generate_cache_matches_no_cache": None, "written": written}
    check = transformers_check_if_fits(check, tmp, ids, inputs, refs, target, tower)
    return check, after_measure.survey("survey-pruned"), \
        {"original": stored_cost(target, tower), "pruned": stored_cost(pruned, tower)}


def _report(target: Any, opts: PruneOptions, sel: Any, before: Survey, after: Survey, measure: Any,
            cost: dict[str, Any], command: str | None) -> dict[str, Any]:
    """prune.json's sections (the shape :func:`depthlab.prune.prune_target` writes for a text model)."""
    L = measure.n_layers
    data = {"spec": opts.data, "split": "val" if opts.tower == "language" else "items", "tokens": before.tokens,
            "seq_len": measure.batches.seq_len}
    if opts.tower == "vision":
        data["measure"] = "the loss of each image-text item's answer given its image and question"
    engine = engine_record(target)
    if engine_of(target) == "streamed":
        st = measure.sweeper.stats
        engine.update(sweeps=st.passes, weight_passes=st.weight_passes, layers_computed=st.layers_computed,
                      bytes_read=target.source.store.meter.bytes_read)
    engine["not_done"] = "healing, --generate and the generation latency (not done for image-text wrappers)"
    return {
        "model": {k: v for k, v in target.info.items() if k != "config"}, "tower": opts.tower,
        "method": sel.method, "removed_blocks": sel.removed,
        "numbering": f"1-based block numbers of the wrapper's {opts.tower} tower (block l reads x^l; 1 = first block)",
        "kept_blocks": [l for l in range(1, L + 1) if l not in sel.removed], "removed_depths": None,
        "n_layers": {"original": L, "pruned": L - len(sel.removed)},
        "selection": {"remove": opts.remove, "budget": opts.budget, "blocks": opts.blocks, "joint_loss": sel.loss,
                      **sel.details},
        "data": data, "loss": {"original": before.loss, "pruned": after.loss, "healed": None},
        "ppl": {"original": perplexity(before.loss), "pruned": perplexity(after.loss), "healed": None},
        "angular": {"original": before.angular, "pruned": after.angular}, "cost": cost,
        "options": {**asdict(opts), "heal": asdict(opts.heal)}, "command": command, "engine": engine,
        "generate": None, "latency": None, "run_dir": None,
    }
