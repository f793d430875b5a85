"""``depthlab prune`` on a model read one layer at a time: choose, cut and check without holding the model.

    target = load_target("path/to/hf-dir", dtype=torch.bfloat16, stream=True)
    report = prune_target(target, PruneOptions(method="angular-block", remove=8), "pruned/x")   # depthlab.prune
    # prune_target checks the request (check_plan, check_model below among them), then runs prune_streamed

The same choices as in memory (:func:`depthlab.prune.select.select_blocks`: greedy removal, angular-block,
block influence, ``--blocks``; ``--remove`` or ``--budget``), measured by sweeps of the streamed engine
(:mod:`depthlab.targets.stream.sweep`): the survey (loss, all-pairs angular distance, block influence) is
one sweep; each greedy step is one sweep carrying one lane per candidate block; each joint loss is one
sweep. The checkpoint is then cut file by file (:mod:`depthlab.prune.shards`) and checked: the logits of
the written checkpoint, read layer by layer, against the original model with those blocks skipped; and,
when the pruned model fits in memory, loaded with plain ``transformers`` (logits, cached ``generate``).
Healing (``--heal lora``) loads the written checkpoint, the kept blocks only, in their stored dtype, trains LoRA
adapters over it and writes the merged weights back (:mod:`depthlab.prune.heal_stored`); the healed checkpoint is
then surveyed and checked layer by layer like the pruned one, against the healed model's own logits. The
generation latency needs both models in memory: not measured here.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.angular import AngularAccumulator
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.analysis.diagnostics.streamed import LossConsumer, joint_loss
from depthlab.base.errors import DepthlabError
from depthlab.base.metrics import perplexity
from depthlab.base.progress import logs_to_stderr
from depthlab.hf.families import INFERRED
from depthlab.prune.export import require_exact
from depthlab.prune.options import PruneOptions
from depthlab.prune.pipeline import allowed_of, check_options, held_out_batches
from depthlab.prune.select import InfluenceAccumulator, Selection, Survey, check_blocks, select_blocks
from depthlab.prune.shards import write_pruned_shards
from depthlab.targets.engine import MEMORY_FRACTION, EnginePlan, available_memory, engine_record
from depthlab.targets.frame import Request
from depthlab.targets.stream.lanes import Lane
from depthlab.targets.stream.open import StreamTarget, locate, open_streamed, stored_bytes
from depthlab.targets.stream.sweep import SweepBatch, Sweeper, SweepSettings

log = logging.getLogger(__name__)


class SurveyConsumer:
    """The base lane's loss, all-pairs angular distance and block influence (``survey_model``'s numbers)."""

    def __init__(self, n_layers: int) -> None:
        self.angular, self.influence = AngularAccumulator(n_layers + 1), InfluenceAccumulator(n_layers)
        self.total, self.count = 0.0, 0

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.total, self.count = self.total + s, self.count + n

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        self.angular.update(states)
        self.influence.update(states)

    def survey(self) -> Survey:
        if self.count == 0:
            raise DepthlabError("the held-out data gave no tokens to evaluate")
        return Survey(self.total / self.count, self.count, self.angular.mean(), self.influence.result())

    def state_dict(self) -> dict[str, Any]:
        return {"angular": [self.angular.sum, self.angular.count], "influence": [self.influence.sum, self.influence.count],
                "loss": [self.total, self.count]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.angular.sum, self.angular.count = state["angular"]
        self.influence.sum, self.influence.count = state["influence"]
        self.total, self.count = state["loss"]


class LogitsConsumer:
    """Keeps the logits of every lane (a probe batch)."""

    def __init__(self) -> None:
        self.out: dict[int, torch.Tensor] = {}

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        self.out[lane] = logits.detach().float().cpu()

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"out": self.out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.out = dict(state["out"])


class StreamedMeasure:
    """Every measurement pruning needs, as sweeps over one target's layers on the held-out text."""

    def __init__(self, target: StreamTarget, text: list[SweepBatch], settings: SweepSettings) -> None:
        self.target, self.text = target, text
        self.sweeper = Sweeper(target, settings)
        self.steps = 0

    @property
    def n_layers(self) -> int:
        return self.target.source.n_layers

    def survey(self, name: str = "survey") -> Survey:
        consumer = SurveyConsumer(self.n_layers)
        self.sweeper.sweep(name, self.text, [Lane("base")], True, consumer)
        return consumer.survey()

    def joint_loss(self, blocks: list[int]) -> float:
        return joint_loss(self.sweeper, self.text, blocks)

    def greedy_losses(self, removed: set[int], candidates: list[int]) -> dict[int, float]:
        """Loss with ``removed`` and each candidate removed: one sweep, one lane per candidate."""
        base = frozenset(removed)
        lanes = [Lane("base", base), *(Lane(f"candidate:{m}", base | {m}) for m in candidates)]
        consumer = LossConsumer(len(lanes))
        self.steps += 1
        self.sweeper.sweep(f"greedy-{self.steps}", self.text, lanes, False, consumer)
        return {m: consumer.loss(i) for i, m in enumerate(candidates, start=1)}

    def logits(self, ids: torch.Tensor, skip: list[int], name: str) -> torch.Tensor:
        consumer = LogitsConsumer()
        self.sweeper.sweep(name, [SweepBatch(ids, states=False)], [Lane("probe", frozenset(skip))], False, consumer)
        return consumer.out[0]


def streamed_cost(target: StreamTarget, seq_len: int) -> dict[str, int]:
    """:func:`depthlab.prune.export.cost` from the checkpoint's tensor index: parameters, and forward FLOPs per
    token (2 per weight of every linear layer, LM head included, + 2·T·q_out per layer for attention)."""
    source = target.source
    index = source.store.index
    layer = re.compile(rf"^{re.escape(source.family.layers)}\.\d+\.")
    linear = sum(i.numel for k, i in index.items() if layer.match(k) and len(i.shape) == 2)
    head = index[source.keys_of(source.head_modules[-1])[0]]
    attn = sum(2 * seq_len * i.shape[0] for k, i in index.items() if layer.match(k) and k.endswith("q_proj.weight"))
    return {"params": sum(i.numel for i in index.values()), "flops_per_token": 2 * (linear + head.numel) + attn,
            "n_layers": target.source.n_layers}


STREAMED_HF_ONLY = ("streamed pruning writes HF checkpoints from HF safetensors directories; prune a depthlab run in "
                    "memory (--no-stream)")


def check_plan(request: Request, plan: EnginePlan) -> None:
    """What a streamed prune cannot do, refused once the engine is chosen (no weight read): ``--generate`` (it needs
    the model in memory), healing removed sublayers (it would move their zeroed projections), a depthlab run
    (streamed pruning writes HF checkpoints), healing other than LoRA."""
    opts = request.opts
    if not plan.streamed:
        return
    if opts.generate:
        raise DepthlabError("--generate needs the model in memory; the streamed engine scores likelihood only "
                            "(--no-stream)")
    if opts.unit == "expert" and opts.heal.steps > 0:
        raise DepthlabError("--heal with --unit expert needs the model in memory (the streamed heal reads the checkpoint's "
                            "tensors by module name, and experts are stored one by one); drop --heal-steps or add "
                            "--no-stream")
    if opts.unit != "block" and opts.heal.steps > 0:
        raise DepthlabError(f"--heal with --unit {opts.unit} needs the model in memory (healing the written checkpoint "
                            "would move its zeroed projections); drop --heal-steps or add --no-stream")
    if plan.found is not None and plan.found.kind != "hf":
        raise DepthlabError(STREAMED_HF_ONLY)
    if opts.heal.steps > 0 and opts.heal.mode != "lora":
        raise DepthlabError(f"--heal {opts.heal.mode} trains every weight with its optimizer state, and this model is "
                            "streamed: heal it with --heal lora (only the kept blocks are loaded, frozen in their "
                            "stored dtype), or use --no-stream")


def check_model(request: Request, target: StreamTarget) -> None:
    """The block ranges against the opened model and what its family's config allows (the in-memory checks)."""
    if target.kind != "hf-causal-lm":  # a target opened directly, without a plan that located it
        raise DepthlabError(STREAMED_HF_ONLY)
    check_options(request.opts, target.source.n_layers, target.source.skeleton.config)


def choose_streamed(measure: StreamedMeasure, opts: PruneOptions) -> tuple[Survey, Selection]:
    """The survey, then the blocks (the in-memory choice, measured by sweeps)."""
    before = measure.survey()
    if opts.blocks is not None:
        blocks = check_blocks(opts.blocks, measure.n_layers)
        return before, Selection("user", blocks, measure.joint_loss(blocks))
    sel = select_blocks(opts.method, measure, None, before, remove=opts.remove, budget=opts.budget,
                        joint_loss=measure.joint_loss, losses_of=measure.greedy_losses,
                        allowed=allowed_of(measure.target.source.skeleton.config, opts))
    if not sel.removed:
        raise DepthlabError(f"no block can be removed within --budget {opts.budget:g} nats with method {opts.method} "
                            f"(held-out loss {before.loss:.4f}); raise the budget")
    return before, sel


@logs_to_stderr
def prune_streamed(target: StreamTarget, opts: PruneOptions, out: Path, command: str | None,
                   settings: SweepSettings) -> dict[str, Any]:
    """Prune ``target`` as ``opts`` says, reading it one layer at a time; write the HF checkpoint, ``prune.json``
    and ``report.html`` into ``out``, whole or not at all (a hidden sibling renamed once verified and reported).
    Returns the report (:func:`depthlab.prune.prune_target`'s shape). Run by :func:`depthlab.prune.prune_target`
    once its checks have passed, holding the resume state (``settings.state_dir``)."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.prune_report import write_report

    t0 = time.time()
    batches = held_out_batches(target, opts)
    measure = StreamedMeasure(target, [SweepBatch(x, y) for x, y in batches], settings)
    if not measure.text:
        raise DepthlabError("the held-out data gave no tokens to evaluate")
    before, sel = choose_streamed(measure, opts)
    replace, linear = None, None
    if opts.heal.mode == "linear":  # the maps, fitted on the original's activations; folded as the shards are written
        from depthlab.prune.heal_linear import heal_streamed

        replace, linear = heal_streamed(target, sel.removed, opts, settings)
    with publish_dir(out) as tmp:
        written = write_pruned_shards(target.path, sel.removed, tmp, {"pruned_from": str(target.name),
                                      "removed_blocks": sel.removed, "method": sel.method,
                                      "healed_steps": opts.heal.steps, "healed": opts.heal.mode if opts.heal.active
                                      else None}, target.tokenizer, replace=replace)
        pruned = _read_back(tmp, out, target)
        after_measure = StreamedMeasure(pruned, measure.text, settings)
        after = after_measure.survey("survey-pruned")
        ids = measure.text[0].ids[:2, :64]
        if linear is not None:
            check = verify_linear_streamed(after_measure, ids, tmp)
        else:
            check = verify_streamed(measure, after_measure, ids, sel.removed, tmp)
        if INFERRED in str(target.info.get("layout")):  # nothing is published when the export is not exact
            require_exact(str(target.info.get("model_type")), check, target.source.compute_dtype)
        report = _report(target, pruned, opts, sel, before, after, batches, measure, after_measure)
        if linear is not None:  # the written checkpoint is the healed one; the pruned loss is the selection's
            report["loss"].update(pruned=sel.loss, healed=after.loss)
            report["ppl"].update(pruned=perplexity(sel.loss), healed=perplexity(after.loss))
            report["angular"]["healed"] = report["angular"].pop("pruned")
            report["heal"] = linear
        if opts.heal.steps > 0:
            check = _heal_streamed(target, opts, tmp, ids, measure.text, settings, report, check)
        report.update(export={**check, "dir": str(out), "written": written}, command=command,
                      seconds=round(time.time() - t0, 2))
        write_report(report, tmp)
    return report


def _heal_streamed(target: StreamTarget, opts: PruneOptions, tmp: Path, ids: torch.Tensor, text: list[SweepBatch],
                   settings: SweepSettings, report: dict[str, Any], pruned_check: dict[str, Any]) -> dict[str, Any]:
    """Heal the checkpoint written in ``tmp`` (the kept blocks only, in memory once), then survey the healed files
    layer by layer and check them against the healed model's logits; fills ``report``'s healed entries and returns
    the export check (the cut's own check, against skipping in the original, kept under ``pruned_cut``)."""
    from depthlab.prune.heal_stored import heal_stored

    src = target.source
    info, probe = heal_stored(tmp, target.tokenizer, opts.heal, ids, target.device, src.compute_dtype)
    healed = StreamedMeasure(open_streamed(str(tmp), target.device, src.dtype, src.compute_dtype), text, settings)
    survey = healed.survey("survey-healed")
    report["loss"]["healed"], report["ppl"]["healed"] = survey.loss, perplexity(survey.loss)
    report["angular"]["healed"] = survey.angular
    report["heal"] = info
    report["engine"]["healed_sweeps"] = healed.sweeper.stats.passes
    report["engine"]["not_done"] = "generation latency (it needs the original and pruned models in memory)"
    got = healed.logits(ids, [], "probe-healed")
    diff = float((probe - got).abs().max())
    check = {**pruned_check, "max_abs_logit_diff": diff, "pruned_cut": pruned_check,
             "loaded_with": "depthlab, layer by layer (healed files vs the healed model in memory)",
             "generated_tokens": None, "generate_cache_matches_no_cache": None}
    free = available_memory(target.device)
    need = stored_bytes(locate(str(tmp)), src.compute_dtype)
    if free is not None and need <= MEMORY_FRACTION * free:
        check.update(transformers_check(tmp, ids, probe, src.compute_dtype, target.device))
    return check


def _report(target: StreamTarget, pruned: StreamTarget, opts: PruneOptions, sel: Any, before: Any, after: Any,
            batches: Any, measure: StreamedMeasure, after_measure: StreamedMeasure) -> dict[str, Any]:
    """prune.json's sections the streamed path fills (the shape :func:`depthlab.prune.prune_target` writes)."""
    L = measure.n_layers
    return {
        "model": {k: v for k, v in target.info.items() if k != "config"},
        "method": sel.method, "removed_blocks": sel.removed,
        "numbering": "1-based block numbers of the model given to prune (block l reads x^l; 1 = first block)",
        "kept_blocks": [l for l in range(1, L + 1) if l not in sel.removed], "removed_depths": None,
        "n_layers": {"original": L, "pruned": L - len(sel.removed)},
        "selection": {"remove": opts.remove, "budget": opts.budget, "blocks": opts.blocks, "joint_loss": sel.loss,
                      **sel.details},
        "data": {"spec": opts.data, "split": "val", "tokens": before.tokens, "seq_len": batches.seq_len},
        "loss": {"original": before.loss, "pruned": after.loss, "healed": None},
        "ppl": {"original": perplexity(before.loss), "pruned": perplexity(after.loss), "healed": None},
        "angular": {"original": before.angular, "pruned": after.angular},
        "cost": {"original": streamed_cost(target, batches.seq_len), "pruned": streamed_cost(pruned, batches.seq_len)},
        "options": {**asdict(opts), "heal": asdict(opts.heal)},
        "latency": None, "run_dir": None,
        "engine": _engine(measure, after_measure),
    }


def _read_back(tmp: Path, out: Path, target: StreamTarget) -> StreamTarget:
    """The written checkpoint opened for streaming; one line naming ``out`` when it is not what its config.json says
    (a config field placing layers that the cut did not rewrite): nothing is published."""
    try:
        return open_streamed(str(tmp), target.device, target.source.dtype, target.source.compute_dtype)
    except DepthlabError as err:
        why = str(err).replace(str(tmp), str(out))
        raise DepthlabError(f"the pruned checkpoint does not read back as its own config.json describes ({why}); "
                            "nothing written") from None


def verify_streamed(original: StreamedMeasure, pruned: StreamedMeasure, ids: torch.Tensor, removed: list[int],
                    out: Path) -> dict[str, Any]:
    """The written checkpoint against the original with ``removed`` skipped: read layer by layer always, and
    loaded with plain ``transformers`` (logits, ``generate`` with and without the KV cache) when it fits."""
    ref = original.logits(ids, removed, "probe-original")
    got = pruned.logits(ids, [], "probe-pruned")
    streamed_diff = float((ref - got).abs().max())
    target = pruned.target
    check: dict[str, Any] = {"max_abs_logit_diff_vs_skipping_in_original": streamed_diff,
                             "max_abs_logit_diff": streamed_diff, "loaded_with": "depthlab, layer by layer",
                             "n_layers_loaded": target.source.n_layers, "architecture": target.info["architecture"],
                             "generated_tokens": None, "generate_cache_matches_no_cache": None}
    return with_transformers_check(check, out, ids, ref, target)


def with_transformers_check(check: dict[str, Any], out: Path, ids: torch.Tensor, ref: torch.Tensor,
                            target: StreamTarget) -> dict[str, Any]:
    """``check`` (the written checkpoint read back layer by layer) updated by :func:`transformers_check` against
    ``ref`` when the checkpoint fits in memory; else it stands, and the log says why."""
    found = locate(str(out))
    need = stored_bytes(found, target.source.compute_dtype) if not isinstance(found, str) else None
    free = available_memory(target.device)
    if need is None or (free is not None and need > MEMORY_FRACTION * free):
        size = "size unknown" if need is None else f"{need / 2**30:.1f} GiB in {str(target.source.compute_dtype)[6:]}"
        log.info("the pruned model (%s) would not fit in memory: its export is checked layer by layer, without "
                 "transformers' generate", size)
        return check
    check.update(transformers_check(out, ids, ref, target.source.compute_dtype, target.device))
    return check


def verify_linear_streamed(healed: StreamedMeasure, ids: torch.Tensor, out: Path) -> dict[str, Any]:
    """The linearly healed checkpoint read layer by layer against plain ``transformers``' load of it (logits, cached
    ``generate``) when it fits in memory (the maps change the function: there is no original to skip blocks in)."""
    got = healed.logits(ids, [], "probe-healed")
    target = healed.target
    check: dict[str, Any] = {"max_abs_logit_diff_vs_skipping_in_original": None, "max_abs_logit_diff": None,
                             "loaded_with": "depthlab, layer by layer", "n_layers_loaded": target.source.n_layers,
                             "architecture": target.info["architecture"], "generated_tokens": None,
                             "generate_cache_matches_no_cache": None,
                             "compared": "transformers' load of the healed checkpoint vs depthlab's layer-by-layer read"}
    return with_transformers_check(check, out, ids, got, target)


@torch.no_grad()
def transformers_check(out: Path, ids: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype,
                        device: torch.device) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype, trust_remote_code=False).to(device).eval()
    got = loaded(input_ids=ids.to(device), use_cache=False).logits.float().cpu()
    prompt = ids[:1, : min(8, ids.shape[1])].to(device)
    kw = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    with_cache = loaded.generate(prompt, use_cache=True, **kw)
    without = loaded.generate(prompt, use_cache=False, **kw)
    return {"max_abs_logit_diff": float((ref - got).abs().max()), "loaded_with": "transformers (AutoModelForCausalLM)",
            "n_layers_loaded": int(loaded.config.num_hidden_layers), "architecture": type(loaded).__name__,
            "generated_tokens": with_cache[0, prompt.shape[1]:].tolist(),
            "generate_cache_matches_no_cache": bool(torch.equal(with_cache, without))}


def _engine(measure: StreamedMeasure, after: StreamedMeasure) -> dict[str, Any]:
    return sweep_engine(measure, after, "healing and generation latency (they need the model in memory)")


def sweep_engine(measure: Any, after: Any, not_done: str) -> dict[str, Any]:
    """``report["engine"]`` of a streamed prune: what the selection's sweeps (``measure``) and the written model's
    check (``after``) read and computed, and what the streamed engine does not do (``not_done``)."""
    st, meter = measure.sweeper.stats, measure.target.source.store.meter
    return {**engine_record(measure.target), "compute_dtype": str(measure.target.source.compute_dtype).replace("torch.", ""),
            "sweeps": st.passes, "weight_passes": st.weight_passes, "layers_computed": st.layers_computed,
            "block_evals": st.block_evals, "token_evals": st.token_evals, "head_tokens": st.head_tokens,
            "sweep_seconds": round(st.seconds, 2), "bytes_read": meter.bytes_read, "peak_weight_bytes": meter.peak,
            "stream_bytes": st.lane_bytes, "resumed": st.resumed,
            "pruned_sweeps": after.sweeper.stats.passes, "pruned_bytes_read": after.target.source.store.meter.bytes_read,
            "not_done": not_done}
