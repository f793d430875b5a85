"""``prune --unit attn|mlp``: remove attention or MLP sublayers instead of whole blocks (LLM-Drop, BlockPruner).

    report = prune_units_in_memory(target, PruneOptions(unit="attn", remove=4), "pruned/attn-4")

A unit is one block's attention (or MLP) branch. Choosing, on held-out text (block numbers 1-based):

- ``removal``: greedy, as for blocks: remove the unit whose removal costs least, re-measure, repeat (trying block
  m's unit re-runs only blocks m..L from the cached states of the model pruned so far);
- ``angular-block`` / ``influence``: the units whose branch turns the residual stream least, d(before, after)
  (LLM-Drop's similarity of a module's input and output; the two rank units alike, arccos being monotone);
- ``--blocks``: the blocks whose unit goes.

The removal zeroes the unit's output projection (``o_proj`` / ``down_proj``, and a bias), so the export is an
ordinary checkpoint of the same architecture that plain transformers loads, with the in-memory pruned model's
logits (checked), but **no faster there**: transformers still runs the zeroed projections. depthlab's own model
skips them (:class:`SkippedBranch` in place of the branch): the report's latency compares that with the original,
and the export's latency with it, so both speeds are on record.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import ResidualCapture, capture_of
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.analysis.diagnostics.sublayers import SublayerAccumulator
from depthlab.base.errors import DepthlabError
from depthlab.data.batches import IGNORE_INDEX
from depthlab.prune.export import cost, generation_latency, hf_model_of, lm_logits, plain_weights, verify_export, write_hf
from depthlab.prune.pipeline import check_in_memory, held_out_batches
from depthlab.prune.projections import output_projection
from depthlab.prune.prune_report import units_report, write_units_report
from depthlab.prune.select import largest_within_budget
from depthlab.prune.skip import write_skip
from depthlab.targets.branches import UNITS, check_sublayers, unit_modules, zeroed
from depthlab.targets.layers import find_layers

log = logging.getLogger(__name__)

#: The module a depthlab model skips for each unit (its branch's compute).
BRANCH = {"attn": "attn", "mlp": "ffn"}


def zero_units(model: nn.Module, unit: str, blocks: Sequence[int]) -> nn.Module:
    """A copy of ``model`` whose ``unit`` of each of ``blocks`` (1-based) has a zero output projection (an HF model
    with LayerNorm Scaling hooks gets them folded into its norms, as the block export does, so that its export loads
    in plain transformers with the same function)."""
    from depthlab.hf.lns import fold_layernorm_scaling, is_layernorm_scaled

    model = copy.deepcopy(model)
    plain_weights(model)  # a dequantised GGUF model keeps transformers' quantizer, which refuses save_pretrained
    if is_layernorm_scaled(model):
        model = fold_layernorm_scaling(model, inplace=True)
    layers = find_layers(model)
    with torch.no_grad():
        for b in blocks:
            proj = output_projection(layers[b - 1], unit)
            proj.weight.zero_()
            if proj.bias is not None:
                proj.bias.zero_()
    return model


class SkippedBranch(nn.Module):
    """A removed branch in depthlab's own model: zeros of the input's shape, no compute."""

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        return torch.zeros_like(x)


def skipping_model(model: nn.Module, unit: str, blocks: Sequence[int]) -> nn.Module | None:
    """depthlab's own model with the removed branches not computed (None for HF models: they have no such slot)."""
    from depthlab.models.decoder import DecoderLM

    if not isinstance(model, DecoderLM):
        return None
    model = copy.deepcopy(model)
    for b in blocks:
        setattr(model.blocks[b - 1], BRANCH[unit], SkippedBranch())
    return model


# ---------------------------------------------------------------------------------------------- choosing
@torch.no_grad()
def units_loss(cap: ResidualCapture, batches, unit: str, removed: Sequence[int]) -> float:
    """Held-out loss with ``unit`` of every block in ``removed`` zeroed (recomputed)."""
    mods = unit_modules(cap.layers, unit)
    total, count = 0.0, 0
    with zeroed(*[mods[b - 1] for b in removed]):
        for x, y in batches:
            s, n = nll_sum(cap.forward(x), y)
            total, count = total + s, count + n
    return total / max(count, 1)


@torch.no_grad()
def _greedy_candidates(cap: ResidualCapture, batches, unit: str, removed: set[int]) -> dict[int, float]:
    mods = unit_modules(cap.layers, unit)
    cands = [m for m in range(1, cap.n_layers + 1) if m not in removed]
    sums, count = dict.fromkeys(cands, 0.0), 0
    with zeroed(*[mods[b - 1] for b in removed]):
        for x, y in batches:
            _, states = cap.run(x)
            for m in cands:
                with zeroed(mods[m - 1]):
                    sums[m] += nll_sum(cap.run_from(x, states, m), y)[0]
            count += int((y != IGNORE_INDEX).sum())
    return {m: s / max(count, 1) for m, s in sums.items()}


class UnitMeasure(Protocol):
    """What choosing units needs of an engine: in memory (:class:`MemoryUnits`) or read one layer at a time
    (:class:`depthlab.prune.streamed_units.StreamedUnits`); the choice itself (:func:`choose_units`) is shared."""

    unit: str
    n_layers: int

    def survey(self) -> tuple[float, dict[str, Any]]: ...  # held-out loss, per-unit contribution and angle

    def candidates(self, removed: set[int]) -> dict[int, float]: ...  # loss with removed + each other unit zeroed

    def loss(self, removed: Sequence[int]) -> float: ...  # loss with the units of ``removed`` zeroed together


class MemoryUnits:
    """:class:`UnitMeasure` on a model in memory (replays from cached states)."""

    def __init__(self, cap: ResidualCapture, batches: Any, unit: str) -> None:
        self.cap, self.batches, self.unit, self.n_layers = cap, batches, unit, cap.n_layers

    def survey(self) -> tuple[float, dict[str, Any]]:
        return survey_units(self.cap, self.batches)

    def candidates(self, removed: set[int]) -> dict[int, float]:
        return _greedy_candidates(self.cap, self.batches, self.unit, removed)

    def loss(self, removed: Sequence[int]) -> float:
        return units_loss(self.cap, self.batches, self.unit, removed)


def greedy_units(measure: UnitMeasure, n: int | None, budget: float | None, base: float
                 ) -> tuple[list[int], list[dict[str, Any]]]:
    unit, removed = measure.unit, set()
    path: list[dict[str, Any]] = []
    while len(removed) < (n if n is not None else measure.n_layers):
        losses = measure.candidates(removed)
        block = min(losses, key=lambda m: (losses[m], -m))
        if budget is not None and losses[block] - base > budget:
            break
        removed.add(block)
        path.append({"block": block, "loss": losses[block], "candidates": {str(k): v for k, v in losses.items()}})
        log.info("greedy %s removal: step %d removes block %d's %s (loss %.4f)", unit, len(path), block, unit,
                 losses[block])
    return sorted(removed), path


def survey_units(cap: ResidualCapture, batches) -> tuple[float, dict[str, Any]]:
    """Held-out loss and, per unit, each block's branch contribution and angular distance (no removal)."""
    acc = SublayerAccumulator(cap.n_layers, removal=False)
    total, count = 0.0, 0
    for x, y in batches:
        logits, states, calls = cap.run(x, keep_calls=True)
        acc.update(cap, x, y, logits, states, calls)
        s, n = nll_sum(logits, y)
        total, count = total + s, count + n
    if count == 0:
        raise DepthlabError("the held-out data gave no tokens to evaluate")
    return total / count, acc.result()


def choose_units(measure: UnitMeasure, opts: Any) -> tuple[float, dict[str, Any], list[int], dict[str, Any]]:
    """(held-out loss, unit survey, the blocks whose ``opts.unit`` goes, selection details), on either engine."""
    unit, L = opts.unit, measure.n_layers
    base, survey = measure.survey()
    if opts.blocks is not None:
        return base, survey, sorted(opts.blocks), {"method": "user"}
    if opts.method == "removal":
        removed, path = greedy_units(measure, opts.remove, opts.budget, base)
        details: dict[str, Any] = {"method": "removal", "greedy_path": path}
    else:
        angle = survey[unit]["angular"]
        order = sorted(range(1, L + 1), key=lambda l: (angle[l - 1], -l))
        choose = lambda k: sorted(order[:k])  # noqa: E731
        details = {"method": opts.method, "angular": angle}
        if opts.remove is not None:
            removed = choose(opts.remove)
        else:
            k, evaluated = largest_within_budget(choose, measure.loss, base, opts.budget, L)
            removed, details["budget_evaluated"] = choose(k), {str(i): v for i, v in sorted(evaluated.items())}
    if not removed:
        raise DepthlabError(f"no {unit} sublayer can be removed within --budget {opts.budget:g} nats with method "
                            f"{opts.method} (held-out loss {base:.4f}); raise the budget")
    return base, survey, removed, details


# ---------------------------------------------------------------------------------------------- the pipeline
def check_units(target: Any, opts: Any) -> None:
    """Refuse before any pass over data: blocks without known branches or output projections, ranges."""
    layers = find_layers(target.model)
    check_sublayers(layers)
    for layer in layers:
        output_projection(layer, opts.unit)
    if opts.remove is not None and opts.remove > len(layers):
        raise DepthlabError(f"--remove {opts.remove} is out of range: the model has {len(layers)} {opts.unit} sublayers")


def prune_units_in_memory(target: Any, opts: Any, out: str | Path, command: str | None = None) -> dict[str, Any]:
    """Remove ``opts.unit`` sublayers of ``target``, heal if asked, export (zeroed projections) and verify, measure
    both speeds and write ``prune.json`` + ``report.html`` into ``out`` (whole or not at all)."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.heal import heal
    from depthlab.prune.prune_generate import generative_accuracy

    t0 = time.time()
    out = Path(out)
    check_in_memory(target, opts, out)
    check_units(target, opts)
    batches = _Cached(held_out_batches(target, opts))
    cap = capture_of(target)
    base, survey, removed, details = choose_units(MemoryUnits(cap, batches, opts.unit), opts)
    ids = next(iter(batches))[0][:2, :64]
    mods = unit_modules(cap.layers, opts.unit)
    with torch.no_grad(), zeroed(*[mods[b - 1] for b in removed]):
        hooked = lm_logits(target.model, ids)
    pruned = zero_units(target.model, opts.unit, removed)
    with torch.no_grad():
        zero_diff = float((lm_logits(pruned, ids).float() - hooked.float()).abs().max())
    gen = {"original": generative_accuracy(target, target.model, opts)} if opts.generate else {}
    losses = {"original": base, "pruned": units_loss(capture_of_model(pruned), batches, opts.unit, [])}
    if opts.generate:
        gen["pruned"] = generative_accuracy(target, pruned, opts)
    heal_info = None
    if opts.heal.active:
        pruned, heal_info = heal(pruned, target.tokenizer, opts.heal)
        with torch.no_grad():  # healing may move a zeroed projection: keep the units removed
            pruned = zero_units(pruned, opts.unit, removed)
        losses["healed"] = units_loss(capture_of_model(pruned), batches, opts.unit, [])
        if opts.generate:
            gen["healed"] = generative_accuracy(target, pruned, opts)
    report = units_report(target, opts, removed, details, survey, losses, gen, batches, command,
                          cost(hf_model_of(target.model), batches.seq_len))
    report["heal"] = heal_info
    with publish_dir(out) as tmp:
        final_hf = hf_model_of(pruned)
        write_hf(final_hf, tmp, target.tokenizer, {"pruned_from": str(target.name), "removed_units": opts.unit,
                                                   "removed_blocks": removed, "method": report["method"]})
        skip = write_skip(tmp, opts.unit, removed)  # before the check: plain transformers loads it as written
        report["export"] = {**verify_export(tmp, final_hf, ids), "dir": str(out),
                            "max_abs_logit_diff_zeroed_vs_hooked": zero_diff, "per_layer_config": skip}
        report["latency"] = _latency(target.model, pruned, final_hf, opts, removed, ids)
        report["seconds"] = round(time.time() - t0, 2)
        write_units_report(report, tmp)
    return report


class _Cached:
    """The held-out batches tokenized once (the greedy search reads them once per step)."""

    def __init__(self, batches: Any) -> None:
        self.items, self.seq_len = list(batches), batches.seq_len

    def __iter__(self):
        return iter(self.items)


def capture_of_model(model: nn.Module) -> ResidualCapture:
    return ResidualCapture(model, find_layers(model), lambda ids: lm_logits(model, ids))


def _latency(original: nn.Module, pruned: nn.Module, exported: nn.Module, opts: Any, removed: list[int],
             ids: torch.Tensor) -> dict[str, Any]:
    """Greedy generation time: the original, the export as plain transformers runs it (zeroed projections still
    computed) and, for depthlab models, depthlab's own model with the removed branches skipped."""
    prompt = ids[:1, : min(16, ids.shape[1])]
    models = {"original": hf_model_of(original), "export (transformers)": exported}
    skipping = skipping_model(pruned, opts.unit, removed)
    if skipping is not None:
        models["depthlab, branches skipped"] = _Generating(skipping)
        models["depthlab original"] = _Generating(original)
    lat = generation_latency(models, prompt, opts.latency_tokens)
    out: dict[str, Any] = {"models": lat,
                           "export_speedup": lat["original"]["seconds"] / lat["export (transformers)"]["seconds"]}
    if skipping is not None:
        out["depthlab_speedup"] = lat["depthlab original"]["seconds"] / lat["depthlab, branches skipped"]["seconds"]
    return out


class _Generating:
    """A depthlab model behind ``generate``'s call (greedy, no KV cache: depthlab's decoder has none)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **_: Any) -> torch.Tensor:
        ids = prompt
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, self.model(ids).logits[:, -1:].argmax(-1)], dim=1)
        return ids


__all__ = ["UNITS", "prune_units_in_memory", "zero_units", "output_projection", "choose_units", "units_loss"]
