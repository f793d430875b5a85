"""``prune --unit expert``: remove routed experts of an MoE model (REAP, routing frequency, or at random).

    report = prune_target(load_target("path/to/moe"), PruneOptions(unit="expert", fraction=0.25), "pruned/moe-75")
    report = prune_target("path/to/moe", PruneOptions(unit="expert", remove=2, method="frequency", stream=True), out)

Choosing, on held-out text (one pass, or one streamed sweep, measures the loss and every expert's scores,
:mod:`depthlab.analysis.diagnostics.experts`), per MoE block:

- ``reap`` (default): the experts of lowest REAP saliency (mean gate x ‖expert output‖ over the tokens routed to
  them; Lasby et al., arXiv 2510.13999) go first;
- ``frequency``: the experts fewest tokens are routed to go first;
- ``random``: a random order, seeded by the block number (the baseline the two are compared with);
- ``--experts BLOCK:EXPERT,...``: exactly those.

How many: ``--remove N`` per MoE block, ``--fraction F`` of each block's experts, or ``--budget NATS``: the most per
block whose joint removal costs at most that much held-out loss (galloping then bisection over the count, one joint
loss each, as for blocks: :func:`depthlab.prune.select.largest_within_budget`). transformers builds every MoE layer
from one config count (:data:`depthlab.hf.experts.SAME_COUNT`), so every MoE block loses the same number, and a
router that picks groups of experts first (DeepSeek-V3) loses the same number from each group. Shared experts are
never removed.

The export (:func:`depthlab.hf.experts.remove_experts`) holds the kept experts' tensors and the router's kept rows,
and the config's expert count cut: plain transformers loads it and computes what the original computes with those
experts never routed to (checked against the original with the experts removed in place). Healing (``--heal lora``,
``--heal full``) trains the pruned model before the export, as for blocks. The streamed engine
(:mod:`depthlab.prune.streamed_experts`) chooses the same experts by sweeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import ResidualCapture, capture_of
from depthlab.analysis.diagnostics.experts import ExpertAccumulator
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.base.errors import DepthlabError
from depthlab.hf.experts import (
    SAME_COUNT,
    MoeLayer,
    check_removable,
    cut_count,
    experts_removed,
    experts_spec,
    fixed_routes,
    moe_layers,
    remove_experts,
)
from depthlab.prune.options import PruneOptions, parse_experts
from depthlab.prune.select import largest_within_budget

log = logging.getLogger(__name__)

Removal = dict[int, list[int]]  # 1-based block -> the 0-based experts removed from it


# ---------------------------------------------------------------------------------------------- checks
def moe_of(layers: Sequence[nn.Module], config: Any) -> dict[int, MoeLayer]:
    """The MoE blocks of ``layers`` (a model's, a skeleton's, a language tower's), refusing in one line a dense model,
    one with no routing block, or one whose routes are a fixed token table."""
    spec = experts_spec(config)
    fixed = fixed_routes(config, spec)
    if fixed:
        raise DepthlabError(f"blocks {fixed} route each token id to fixed experts (mlp_layer_types "
                            f"{'/'.join(spec.fixed_routes)}): removing an expert would leave its tokens nowhere, and "
                            f"{SAME_COUNT.split(', so ')[0]}; depthlab cannot remove experts from this model")
    moe = moe_layers(layers, spec, config)
    if not moe:
        raise DepthlabError("--unit expert: no block of this model routes to experts (every MLP is dense)")
    return moe


def per_block(moe: Mapping[int, MoeLayer], opts: PruneOptions) -> int | None:
    """How many experts go from every MoE block (--remove, --fraction), checked against the model; None for
    --budget and --experts."""
    layer = moe[min(moe)]
    n, top_k, groups = layer.n, layer.top_k, layer.groups
    if opts.fraction is not None:
        k = round(opts.fraction * n)
        if k < 1:
            raise DepthlabError(f"--fraction {opts.fraction:g} of {n} experts removes none; give at least {1 / n:.3g}")
        what = f"--fraction {opts.fraction:g} ({k} of {n} experts)"
    elif opts.remove is not None:
        k, what = opts.remove, f"--remove {opts.remove}"
    else:
        return None
    most = most_removable(layer)
    if k > most:
        raise DepthlabError(f"{what} is out of range: each MoE block has {n} routed experts and routes each token to "
                            f"{top_k}" + (f" among {groups} groups (the same number goes from each, 2 stay per group)"
                                          if groups > 1 else "") + f", so remove at most {most}")
    if k % groups:
        raise DepthlabError(f"{what}: the router picks among {groups} groups of experts, and the same number must go "
                            f"from each; give a multiple of {groups}")
    return k


def most_removable(layer: MoeLayer) -> int:
    """The most experts one block can lose: keep its top-k (and, with groups, 2 per group, as many from each)."""
    if layer.groups > 1:
        size = layer.n // layer.groups
        return min(layer.n - layer.top_k, (size - 2) * layer.groups) // layer.groups * layer.groups
    return layer.n - layer.top_k


def check_experts(layers: Sequence[nn.Module], config: Any, opts: PruneOptions) -> dict[int, MoeLayer]:
    """Every refusal of ``--unit expert`` that needs the model's structure, before any pass over data; returns its
    MoE blocks."""
    moe = moe_of(layers, config)
    per_block(moe, opts)
    if opts.experts is not None:
        given = parse_experts(opts.experts)
        shared = experts_spec(config).shared
        for block, gone in given.items():
            layer = moe.get(block)
            if layer is not None and shared and any(e >= layer.n for e in gone):
                raise DepthlabError(f"--experts {block}:{max(gone)}: block {block} routes to experts 0..{layer.n - 1}; "
                                    "its shared expert is not one of them and is never removed")
        check_removable(moe, {b: given.get(b, []) for b in {*moe, *given}})
    return moe


# ---------------------------------------------------------------------------------------------- choosing
class ExpertMeasure(Protocol):
    """What choosing experts needs of an engine: in memory (:class:`MemoryExperts`) or by sweeps
    (:class:`depthlab.prune.streamed_experts.StreamedExperts`); the choice (:func:`choose_experts`) is shared."""

    moe: dict[int, MoeLayer]

    def survey(self) -> tuple[float, dict[str, Any]]: ...  # held-out loss, the experts' scores (ExpertAccumulator)

    def loss(self, removal: Removal) -> float: ...  # held-out loss with the experts of ``removal`` removed together


def ranking(scores: dict[str, Any], method: str, moe: Mapping[int, MoeLayer]) -> dict[int, list[int]]:
    """Per MoE block, its experts in the order they go: lowest ``reap`` or ``frequency`` first (ties: lower number
    first), or a random permutation seeded by the block number."""
    out = {}
    for b, layer in moe.items():
        if method == "random":
            out[b] = torch.randperm(layer.n, generator=torch.Generator().manual_seed(b)).tolist()
        else:
            score = scores["blocks"][str(b)][method]
            out[b] = sorted(range(layer.n), key=lambda e: (score[e], e))
    return out


def take(order: Mapping[int, list[int]], moe: Mapping[int, MoeLayer], k: int) -> Removal:
    """The first ``k`` experts of each block's order (with groups: the first k / groups of each group)."""
    out = {}
    for b, layer in moe.items():
        if layer.groups > 1:
            size = layer.n // layer.groups
            out[b] = sorted(e for g in range(layer.groups) for e in [x for x in order[b] if x // size == g][:k // layer.groups])
        else:
            out[b] = sorted(order[b][:k])
    return out


def choose_experts(measure: ExpertMeasure, opts: PruneOptions) -> tuple[float, dict[str, Any], Removal, dict[str, Any]]:
    """(held-out loss, the experts' scores, the experts removed per block, selection details), on either engine."""
    moe = measure.moe
    base, scores = measure.survey()
    details: dict[str, Any] = {"method": "user" if opts.experts is not None else opts.method, "same_count": SAME_COUNT}
    if opts.experts is not None:
        given = parse_experts(opts.experts)
        return base, scores, {b: sorted(given.get(b, [])) for b in moe}, details
    order = ranking(scores, opts.method, moe)
    details["order"] = {str(b): o for b, o in order.items()}
    if opts.method == "random":
        details["seed"] = "the block number (torch.Generator().manual_seed(block))"
    k = per_block(moe, opts)
    if k is None:  # --budget: the most per block within it
        step = max(layer.groups for layer in moe.values())
        most = min(most_removable(layer) for layer in moe.values()) // step
        m, evaluated = largest_within_budget(lambda m: take(order, moe, m * step), measure.loss, base, opts.budget, most)
        details["budget_evaluated"] = {str(i * step): v for i, v in sorted(evaluated.items())}
        if m == 0:
            raise DepthlabError(f"no expert can be removed within --budget {opts.budget:g} nats with method "
                                f"{opts.method} (held-out loss {base:.4f}); raise the budget")
        k = m * step
    details["per_block"] = k
    return base, scores, take(order, moe, k), details


class MemoryExperts:
    """:class:`ExpertMeasure` on a model in memory: one captured forward per batch records the experts' scores."""

    def __init__(self, cap: ResidualCapture, batches: Any, moe: dict[int, MoeLayer]) -> None:
        self.cap, self.batches, self.moe = cap, batches, moe

    @torch.no_grad()
    def survey(self) -> tuple[float, dict[str, Any]]:
        acc = ExpertAccumulator(self.moe)
        total, count = 0.0, 0
        with acc.recording():
            for x, y in self.batches:
                s, n = nll_sum(self.cap.forward(x), y)
                total, count = total + s, count + n
        if count == 0:
            raise DepthlabError("the held-out data gave no tokens to evaluate")
        return total / count, acc.result()

    @torch.no_grad()
    def loss(self, removal: Removal) -> float:
        total, count = 0.0, 0
        with experts_removed(self.moe, removal):
            for x, y in self.batches:
                s, n = nll_sum(self.cap.forward(x), y)
                total, count = total + s, count + n
        return total / max(count, 1)


# ---------------------------------------------------------------------------------------------- in memory
def check_in_memory(target: Any, opts: PruneOptions) -> dict[int, MoeLayer]:
    """``--unit expert`` on a loaded model: an HF causal LM with routed experts (the rest refused in one line)."""
    from depthlab.targets.layers import find_layers

    if target.kind != "hf-causal-lm":
        raise DepthlabError(f"--unit expert needs an MoE model from Hugging Face; {target.name!r} is a {target.kind} "
                            "model without routed experts")
    return check_experts(find_layers(target.model), target.model.config, opts)


def prune_experts_in_memory(target: Any, opts: PruneOptions, out: str | Path, command: str | None = None
                            ) -> dict[str, Any]:
    """Remove routed experts of ``target`` in place, heal if asked, export and verify, measure the speeds, and write
    ``prune.json`` + ``report.html`` into ``out`` (whole or not at all). Run by
    :func:`depthlab.prune.prune_target` once its checks have passed."""
    from depthlab.base.fileio import publish_dir
    from depthlab.hf.lns import fold_layernorm_scaling, is_layernorm_scaled
    from depthlab.prune.experts_report import experts_report, write_experts_report
    from depthlab.prune.export import cost, lm_logits, verify_export, write_hf
    from depthlab.prune.pipeline import _generative, _original_record, held_out_batches
    from depthlab.prune.units import _Cached

    t0 = time.time()
    model = target.model
    moe = check_in_memory(target, opts)
    batches = _Cached(held_out_batches(target, opts))
    cap = capture_of(target)
    measure = MemoryExperts(cap, batches, moe)
    base, scores, removal, details = choose_experts(measure, opts)
    ids = batches.items[0][0][:2, :64]
    with torch.no_grad(), experts_removed(moe, removal):
        masked = lm_logits(model, ids).float()
    gen = _generative(target, model, opts, {}, "original")
    original = _original_record(model, ids, batches.seq_len, opts.latency_tokens)  # before the surgery
    if is_layernorm_scaled(model):
        fold_layernorm_scaling(model, inplace=True)
    remove_experts(moe, removal)  # in place: no copy of the original is kept
    kept = moe[min(moe)].n
    cut_count(model.config, experts_spec(model.config), kept)
    losses: dict[str, float | None] = {"original": base, "pruned": measure.loss({}), "healed": None}
    _generative(target, model, opts, gen, "pruned")
    heal_info = None
    if opts.heal.active:
        from depthlab.prune.heal import heal

        model, heal_info = heal(model, target.tokenizer, opts.heal)
        losses["healed"] = MemoryExperts(_capture(model), batches, moe_of_model(model)).loss({})
        _generative(target, model, opts, gen, "healed")
    report = experts_report(target, opts, removal, details, scores, losses, gen, batches, command, moe, kept)
    report.update(heal=heal_info, cost={"original": original["cost"], "pruned": cost(model, batches.seq_len)})
    with publish_dir(out) as tmp:
        write_hf(model, tmp, target.tokenizer, {"pruned_from": str(target.name), "removed_experts": report["removed_experts"],
                                               "method": report["method"]})
        check = verify_export(tmp, model, ids)
        if heal_info is None:
            with torch.no_grad():
                check["max_abs_logit_diff_vs_removed_in_original"] = float((lm_logits(model, ids).float() - masked).abs().max())
        report["export"] = {**check, "dir": str(out)}
        report["latency"] = _latency(original["latency"], model, ids, opts.latency_tokens)
        report["seconds"] = round(time.time() - t0, 2)
        write_experts_report(report, tmp)
    return report


def _capture(model: nn.Module) -> ResidualCapture:
    from depthlab.prune.units import capture_of_model

    return capture_of_model(model)


def moe_of_model(model: nn.Module) -> dict[int, MoeLayer]:
    from depthlab.targets.layers import find_layers

    return moe_layers(find_layers(model), experts_spec(model.config), model.config)


def _latency(original: dict[str, Any], pruned: nn.Module, ids: torch.Tensor, new_tokens: int) -> dict[str, Any]:
    from depthlab.prune.pipeline import _latency as latency

    return latency(original, pruned, ids, new_tokens)
