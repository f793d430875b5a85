"""The in-memory engine of ``prune``: diagnosis -> choice of blocks -> surgery -> (healing) -> HF export -> checks
-> report.

    target = load_target("smollm2")
    report = prune_in_memory(target, PruneOptions(method="removal", remove=6), "pruned/smollm2-24")
    # prune_target(target, ...) (depthlab.prune.dispatch) checks the request, then runs this or the streamed engine

Everything the user can get wrong is checked by the dispatcher before any pass over data (:func:`check_model` is
its check of the loaded model), and the output directory appears only once the export is verified and reported: a
bad request or a budget no block fits writes nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import ResidualCapture, capture_of
from depthlab.analysis.diagnostics.removal import joint_removal_loss
from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import fresh_out
from depthlab.base.metrics import perplexity
from depthlab.base.progress import logs_to_stderr
from depthlab.hf.families import INFERRED
from depthlab.prune.export import (
    check_prunable,
    cost,
    drop_layers,
    generation_latency,
    hf_model_of,
    lm_logits,
    require_exact,
    verify_export,
    write_hf,
)
from depthlab.prune.heal import check_heal, heal
from depthlab.prune.heal_linear import first_block_rule, heal_in_memory
from depthlab.prune.options import PruneOptions
from depthlab.prune.select import (
    Selection,
    Survey,
    block_limits,
    check_blocks,
    check_removable,
    select_blocks,
    survey_model,
)
from depthlab.targets.engine import engine_record
from depthlab.targets.layers import find_layers
from depthlab.targets.target import Target

log = logging.getLogger(__name__)


def check_options(opts: PruneOptions, n_layers: int | None = None, hf_config: Any = None) -> None:
    """Refuse a bad request before any computation (the CLI exits 2 with this one line): what needs no model
    when ``n_layers`` is None (before loading it), then the block ranges once the model is loaded, and given blocks
    the HF model's config cannot lose (``hf_config``: Gemma 4's KV-sharing producers), or a ``--remove N`` that
    config cannot meet."""
    opts.validate(n_layers)
    check_heal(opts.heal)
    if opts.heal.mode == "linear" and opts.unit != "block":
        raise DepthlabError(f"--heal linear fits a map over each removed span of blocks; --unit {opts.unit} removes no "
                            "block (heal it with --heal lora, or none)")
    if hf_config is not None and opts.blocks and opts.unit == "block":
        from depthlab.hf.families import check_config

        check_config(hf_config, "prune", opts.blocks)
    if n_layers is not None and opts.remove is not None and opts.unit == "block":
        allowed = allowed_of(hf_config, opts)
        if allowed is not None:
            check_removable(opts.method, opts.remove, n_layers, allowed)


def allowed_of(hf_config: Any, opts: PruneOptions) -> Any:
    """Which sets of blocks may go together: the family's config limits and, with ``--heal linear``, block 1 kept
    (:func:`depthlab.prune.select.block_limits`, :func:`depthlab.prune.heal_linear.first_block_rule`); None: any."""
    limits = block_limits(hf_config)
    if opts.heal.mode != "linear":
        return limits
    return lambda blocks: first_block_rule(blocks) or (limits(blocks) if limits is not None else None)


def hf_config_of(target: Target) -> Any:
    """The HF config of an HF causal LM target (what its family's config limits read), else None."""
    return target.model.config if target.kind == "hf-causal-lm" else None


def held_out_batches(target: Target, opts: PruneOptions):
    from depthlab.analysis.diagnostics.heldout import TextBatches
    from depthlab.analysis.diagnostics.options import DiagnoseOptions

    return TextBatches(target, DiagnoseOptions(data=opts.data, split="val", tokens=opts.tokens, seq_len=opts.seq_len,
                                            batch_size=opts.batch_size))


def _bar(total: int, desc: str, enabled: bool):
    """A bar on a terminal, ETA log lines otherwise (``depthlab.base.progress``)."""
    from depthlab.base.progress import progress

    return progress(total, desc, "seq", enabled)


def choose(target: Target, opts: PruneOptions, batches) -> tuple[Survey, Selection]:
    """Survey the model on held-out text, then pick the blocks; refuses a budget no block fits."""
    cap = capture_of(target)
    n_seq = -(-opts.tokens // opts.seq_len)
    with _bar(n_seq, "held-out pass", opts.progress) as bar:
        before = survey_model(cap, batches, bar.update)
    if opts.blocks is not None:
        blocks = check_blocks(opts.blocks, cap.n_layers)
        return before, Selection("user", blocks, joint_removal_loss(cap, batches, blocks))
    passes = n_seq * (opts.remove or cap.n_layers) if opts.method == "removal" else None
    with _bar(passes, f"choosing blocks ({opts.method})", opts.progress) as bar:
        sel = select_blocks(opts.method, cap, batches, before, remove=opts.remove, budget=opts.budget,
                            on_batch=bar.update, allowed=allowed_of(hf_config_of(target), opts))
    if not sel.removed:
        raise DepthlabError(f"no block can be removed within --budget {opts.budget:g} nats with method {opts.method} "
                            f"(held-out loss {before.loss:.4f}); raise the budget")
    return before, sel


def prune_model(model: nn.Module, removed: list[int]) -> nn.Module:
    """The pruned working model: a depthlab model stays one (each kept block keeps its original depth in
    ``ModelConfig.block_depths``); an HF model loses its layers in place (see :func:`drop_layers`: ``model`` is
    the pruned model afterwards, so no second copy of the weights exists)."""
    from depthlab.models.decoder import DecoderLM

    if isinstance(model, DecoderLM):
        from depthlab.prune.pruned_run import drop_blocks

        return drop_blocks(model, removed)
    return drop_layers(model, removed, inplace=True)


def _capture(model: nn.Module) -> ResidualCapture:
    return ResidualCapture(model, find_layers(model), lambda ids: lm_logits(model, ids))


def _probe_ids(batches) -> torch.Tensor:
    x, _ = next(iter(batches))
    return x[:2, :64]


def _survey(model: nn.Module, batches) -> dict[str, Any]:
    s = survey_model(_capture(model), batches)
    return {"loss": s.loss, "ppl": perplexity(s.loss), "tokens": s.tokens, "angular": s.angular, "influence": s.influence}


def check_in_memory(target: Target, opts: PruneOptions, out: Path) -> int:
    """A free ``out`` and :func:`check_model`, for an engine run without the dispatcher's checks
    (``depthlab.prune.units.prune_units_in_memory`` makes its own); returns the model's block count."""
    fresh_out(out)
    return check_model(target, opts)


def check_model(target: Target, opts: PruneOptions) -> int:
    """Every refusal that needs the loaded model (an encoder, a scheme Llama cannot express, block ranges), before
    any pass over data; returns the model's block count."""
    if not target.causal:
        raise DepthlabError(f"{target.name!r} is an encoder; depthlab prune needs a causal LM")
    check_prunable(target.model)
    n_layers = len(find_layers(target.model))
    check_options(opts, n_layers, hf_config_of(target))
    return n_layers


@logs_to_stderr
def prune_in_memory(target: Target, opts: PruneOptions, out: str | Path, command: str | None = None) -> dict[str, Any]:
    """Prune ``target`` as ``opts`` says and write the HF checkpoint, ``prune.json`` and ``report.html``
    into ``out`` (plus ``out/run``, a depthlab run directory, for depthlab models). Returns the report. Run by
    :func:`depthlab.prune.prune_target` once its checks have passed (``--unit block``).

    An HF model is pruned in place (``target.model`` is the pruned, healed model afterwards); nothing the size of
    the model is copied for the comparisons (the original's measured before the surgery) or the export check.

    ``out`` appears whole or not at all (:func:`depthlab.base.fileio.publish_dir`: a hidden sibling renamed once
    the export is verified and the report written): a crash never leaves an unverified half-checkpoint."""
    from depthlab.base.fileio import publish_dir
    from depthlab.hf.loading import third_party_output
    from depthlab.prune.prune_report import write_report

    t0 = time.time()
    out = Path(out)
    L = len(find_layers(target.model))
    batches = held_out_batches(target, opts)
    before, sel = choose(target, opts, batches)
    gen = _generative(target, target.model, opts, {}, "original")
    ids = _probe_ids(batches)
    skip_ref = _capture(target.model).run_without(ids, sel.removed)
    original = _original_record(target.model, ids, batches.seq_len, opts.latency_tokens)  # before the surgery
    finish_linear = (heal_in_memory(target, _capture(target.model), sel.removed, opts)[1]  # fitted on the original
                     if opts.heal.mode == "linear" else None)
    pruned = prune_model(target.model, sel.removed)  # in place: no copy of the original is kept
    with torch.no_grad():
        skip_diff = float((lm_logits(pruned, ids).float() - skip_ref.float()).abs().max())
    del skip_ref
    after = _survey(pruned, batches)
    _generative(target, pruned, opts, gen, "pruned")
    healed, heal_info = None, None
    if finish_linear is not None:
        healed, heal_info = pruned, finish_linear(find_layers(pruned))  # the maps folded in place
    elif opts.heal.active:
        healed, heal_info = heal(pruned, target.tokenizer, opts.heal)  # in place: its survey is taken
    final = healed if healed is not None else pruned
    final_hf = hf_model_of(final)
    with publish_dir(out) as tmp:
        with third_party_output(None if opts.progress else False):  # transformers' bars: on a terminal only
            write_hf(final_hf, tmp, target.tokenizer, {"pruned_from": str(target.name),
                                                       "removed_blocks": sel.removed, "method": sel.method,
                                                       "healed_steps": opts.heal.steps,
                                                       "healed": opts.heal.mode if opts.heal.active else None})
            check = verify_export(tmp, final_hf, ids)
        if INFERRED in str(target.info.get("layout")):  # nothing is published when the export is not exact
            exact = {**check, "max_abs_logit_diff_vs_skipping_in_original": skip_diff}
            require_exact(str(target.info.get("model_type")), exact, target.info.get("dtype"))
        report = {
            "model": {k: v for k, v in target.info.items() if k != "config"},
            "method": sel.method, "removed_blocks": sel.removed,
            "numbering": "1-based block numbers of the model given to prune (block l reads x^l; 1 = first block)",
            "kept_blocks": [l for l in range(1, L + 1) if l not in sel.removed],
            "removed_depths": _original_depths(target.model, sel.removed),
            "n_layers": {"original": L, "pruned": L - len(sel.removed)},
            "selection": {"remove": opts.remove, "budget": opts.budget, "blocks": opts.blocks,
                          "joint_loss": sel.loss, **sel.details},
            "data": {"spec": opts.data, "split": "val", "tokens": before.tokens, "seq_len": batches.seq_len},
            "loss": {"original": before.loss, "pruned": after["loss"], "healed": None},
            "ppl": {"original": perplexity(before.loss), "pruned": after["ppl"], "healed": None},
            "angular": {"original": before.angular, "pruned": after["angular"]},
            "export": {**check, "dir": str(out), "max_abs_logit_diff_vs_skipping_in_original": skip_diff},
            "cost": {"original": original["cost"], "pruned": cost(final_hf, batches.seq_len)},
            "options": {**asdict(opts), "heal": asdict(opts.heal)},
            "command": command,
            "engine": engine_record(target),
        }
        if healed is not None:
            h = _survey(healed, batches)
            report["loss"]["healed"], report["ppl"]["healed"] = h["loss"], h["ppl"]
            report["angular"]["healed"] = h["angular"]
            report["heal"] = heal_info
            _generative(target, healed, opts, gen, "healed")
        report["generate"] = gen or None
        report["latency"] = _latency(original["latency"], final_hf, ids, opts.latency_tokens)
        report["run_dir"] = str(out / "run") if _maybe_run_dir(target, final, tmp, report) else None
        report["seconds"] = round(time.time() - t0, 2)
        write_report(report, tmp)
    return report


def _generative(target: Target, model: nn.Module, opts: PruneOptions, into: dict[str, Any], stage: str
                ) -> dict[str, Any]:
    """With ``--generate``: the exact-match accuracy of ``model`` at ``stage`` (original, pruned, healed)."""
    if opts.generate:
        from depthlab.prune.prune_generate import generative_accuracy

        into[stage] = generative_accuracy(target, model, opts)
    return into


def _original_depths(model: nn.Module, removed: list[int]) -> list[int] | None:
    """For a depthlab model pruned before: the original depths of the removed blocks (else None)."""
    depths = getattr(getattr(model, "cfg", None), "block_depths", None)
    return [depths[l - 1] for l in removed] if depths else None


def _prompt(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return ids[:1, : min(16, ids.shape[1])].to(next(model.parameters()).device)


def _original_record(model: nn.Module, ids: torch.Tensor, seq_len: int, new_tokens: int) -> dict[str, Any]:
    """The original model's cost and generation latency, measured before it is pruned in place (so no copy of it
    is kept for the comparison; a depthlab model's HF form is converted for this and dropped)."""
    hf = hf_model_of(model)
    return {"cost": cost(hf, seq_len), "latency": generation_latency({"original": hf}, _prompt(hf, ids), new_tokens)}


def _latency(original: dict[str, Any], pruned: nn.Module, ids: torch.Tensor, new_tokens: int) -> dict[str, Any]:
    lat = {**original, **generation_latency({"pruned": pruned}, _prompt(pruned, ids), new_tokens)}
    return {**lat, "speedup": lat["original"]["seconds"] / lat["pruned"]["seconds"],
            "order": "original measured before the surgery, pruned after (the model is pruned in place)"}


def _maybe_run_dir(target: Target, final: nn.Module, out: Path, report: dict[str, Any]) -> str | None:
    from depthlab.models.decoder import DecoderLM

    if target.kind != "depthlab" or not isinstance(final, DecoderLM):
        return None
    from depthlab.prune.pruned_run import write_run

    return str(write_run(final, target, out / "run", report))
