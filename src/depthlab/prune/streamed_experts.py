"""``prune --unit expert`` on a model read one layer at a time: the in-memory choice, measured by sweeps.

    target = open_streamed("path/to/moe")
    report = prune_target(target, PruneOptions(unit="expert", fraction=0.5), "pruned/moe-50")   # depthlab.prune

The choice is :func:`depthlab.prune.experts.choose_experts`, fed by :class:`StreamedExperts`: the survey is one
sweep (the loss, and each MoE block run again on its input while it is loaded, with the experts' scores recorded:
:meth:`depthlab.analysis.diagnostics.experts.ExpertAccumulator.add_block`); each joint loss (``--budget``) is one
sweep whose lane removes the experts (``Lane.experts``: each block computes as the pruned model,
:func:`depthlab.hf.experts.experts_removed`).

The export is the checkpoint copied shard by shard (:func:`depthlab.prune.shards.write_pruned_shards`): a removed
expert's tensors are not written, the kept ones renumbered (``experts.{j}.`` keys; fused tensors and the router's
weight, bias and score correction keep the kept rows: :func:`depthlab.hf.experts.key_plan`) and the config's count
cut. It is checked layer by layer (the written files against the original with those experts removed) and, when it
fits in memory, with plain ``transformers`` (logits, cached ``generate``). Healing needs the model in memory (refused
in one line before any work).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.experts import ExpertAccumulator
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.analysis.diagnostics.streamed import LossConsumer
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import logs_to_stderr
from depthlab.hf.experts import cut_count, experts_spec, key_plan
from depthlab.prune.experts import Removal, choose_experts, moe_of
from depthlab.prune.options import PruneOptions
from depthlab.prune.pipeline import held_out_batches
from depthlab.prune.streamed import LogitsConsumer, streamed_cost, sweep_engine, with_transformers_check
from depthlab.targets.stream.lanes import Lane
from depthlab.targets.stream.open import StreamTarget, open_streamed
from depthlab.targets.stream.sweep import SweepBatch, Sweeper, SweepSettings, Taps

log = logging.getLogger(__name__)


class _SurveyConsumer:
    """The base lane's loss and, through the layer tap, the experts' scores."""

    def __init__(self, acc: ExpertAccumulator) -> None:
        self.acc, self.total, self.count = acc, 0.0, 0

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.total, self.count = self.total + s, self.count + n

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        pass

    def layer(self, j: int, index: int, batch: SweepBatch, layer, call, x: torch.Tensor, out: torch.Tensor) -> None:
        self.acc.add_block(j, layer, call, x)

    def state_dict(self) -> dict[str, Any]:
        return {"acc": self.acc.state_dict(), "loss": [self.total, self.count]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acc.load_state_dict(state["acc"])
        self.total, self.count = state["loss"]


def expert_lane(key: str, removal: Removal) -> Lane:
    return Lane(key, experts=frozenset((b, e) for b, gone in removal.items() for e in gone))


def _name(prefix: str, removal: Removal) -> str:
    """A sweep's name (its resume directory) for a removal: short, whatever the number of experts."""
    text = json.dumps({str(b): sorted(g) for b, g in sorted(removal.items())})
    return f"{prefix}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


class StreamedExperts:
    """:class:`depthlab.prune.experts.ExpertMeasure` by sweeps over a streamed target's layers."""

    def __init__(self, target: StreamTarget, text: list[SweepBatch], settings: SweepSettings) -> None:
        self.target, self.text = target, text
        self.sweeper = Sweeper(target, settings)
        self.moe = moe_of(target.source.layers, target.source.skeleton.config.get_text_config())  # wrapper: language

    def survey(self) -> tuple[float, dict[str, Any]]:
        consumer = _SurveyConsumer(ExpertAccumulator(self.moe))
        self.sweeper.sweep("experts-survey", self.text, [Lane("base")], True, consumer, taps=Taps(layer=consumer.layer))
        if consumer.count == 0:
            raise DepthlabError("the held-out data gave no tokens to evaluate")
        return consumer.total / consumer.count, consumer.acc.result()

    def loss(self, removal: Removal) -> float:
        consumer = LossConsumer(1)
        self.sweeper.sweep(_name("experts-joint", removal), self.text, [expert_lane("joint", removal)], False,
                           consumer, show=False)
        return consumer.loss(0)

    def logits(self, ids: torch.Tensor, removal: Removal, name: str) -> torch.Tensor:
        consumer = LogitsConsumer()
        self.sweeper.sweep(name, [SweepBatch(ids, states=False)], [expert_lane("probe", removal)], False, consumer,
                           show=False)
        return consumer.out[0]


def write_experts(target: StreamTarget, moe: dict, removal: Removal, out: Path, provenance: dict[str, Any]
                  ) -> dict[str, Any]:
    """The checkpoint without the experts of ``removal``, shard by shard (see the module docstring)."""
    from depthlab.prune.shards import write_pruned_shards

    src = target.source
    shapes = {k: info.shape for k, info in src.store.index.items()}
    plan = key_plan(src.keys_of, moe, removal, shapes)
    kept = moe[min(moe)].n - len(next(iter(removal.values())))
    spec = experts_spec(src.skeleton.config.get_text_config())
    return write_pruned_shards(target.path, [], out, provenance, target.tokenizer, rekey=plan,
                               edit_config=lambda config: cut_count(config.get_text_config(), spec, kept))


def choose_streamed(target: StreamTarget, opts: PruneOptions, settings: SweepSettings) -> tuple:
    """The held-out batches, the streamed measure and the experts it chooses (one sweep): ``(batches, text batches,
    measure, (base loss, scores, removal, details), experts kept per block)``; shared by text MoEs and the MoE
    language tower of an image-text wrapper."""
    batches = held_out_batches(target, opts)
    text = [SweepBatch(x, y) for x, y in batches]
    if not text:
        raise DepthlabError("the held-out data gave no tokens to evaluate")
    measure = StreamedExperts(target, text, settings)
    chosen = choose_experts(measure, opts)
    kept = measure.moe[min(measure.moe)].n - len(next(iter(chosen[2].values())))
    return batches, text, measure, chosen, kept


@logs_to_stderr
def prune_experts_streamed(target: StreamTarget, opts: PruneOptions, out: Path, command: str | None,
                           settings: SweepSettings) -> dict[str, Any]:
    """Remove routed experts of ``target``, reading it one layer at a time; write the checkpoint, ``prune.json`` and
    ``report.html`` into ``out``, whole or not at all. Returns the report (the in-memory engine's shape; no latency,
    no healing). Run by :func:`depthlab.prune.prune_target` once its checks have passed, holding the resume state."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.experts_report import experts_report, write_experts_report

    t0 = time.time()
    batches, text, measure, (base, scores, removal, details), kept = choose_streamed(target, opts, settings)
    with publish_dir(out) as tmp:
        written = write_experts(target, measure.moe, removal, tmp, {
            "pruned_from": str(target.name), "removed_experts": {str(b): g for b, g in sorted(removal.items())},
            "method": details["method"]})
        src = target.source
        pruned = StreamedExperts(open_streamed(str(tmp), target.device, src.dtype, src.compute_dtype), text, settings)
        losses = {"original": base, "pruned": pruned.loss({}), "healed": None}
        report = experts_report(target, opts, removal, details, scores, losses, {}, batches, command, measure.moe, kept)
        check = verify_experts_streamed(measure, pruned, text[0].ids[:2, :64], removal, tmp)
        report.update(export={**check, "dir": str(out), "written": written}, latency=None, heal=None,
                      cost={"original": streamed_cost(target, batches.seq_len),
                            "pruned": streamed_cost(pruned.target, batches.seq_len)},
                      engine=experts_engine(measure, pruned), seconds=round(time.time() - t0, 2))
        write_experts_report(report, tmp)
    return report


def verify_experts_streamed(original: StreamedExperts, pruned: StreamedExperts, ids: torch.Tensor, removal: Removal,
                            out: Path) -> dict[str, Any]:
    """The written checkpoint, read layer by layer, against the original with the experts removed; loaded with plain
    ``transformers`` too (logits, cached ``generate``) when it fits in memory."""
    ref = original.logits(ids, removal, "probe-original")
    got = pruned.logits(ids, {}, "probe-pruned")
    diff = float((ref - got).abs().max())
    target = pruned.target
    check: dict[str, Any] = {"max_abs_logit_diff_vs_removed_in_original": diff, "max_abs_logit_diff": diff,
                             "loaded_with": "depthlab, layer by layer", "architecture": target.info["architecture"],
                             "generated_tokens": None, "generate_cache_matches_no_cache": None}
    return with_transformers_check(check, out, ids, ref, target)


def experts_engine(measure: StreamedExperts, pruned: StreamedExperts) -> dict[str, Any]:
    """``report["engine"]`` of a streamed expert prune (a text MoE's or a wrapper's language tower's)."""
    return sweep_engine(measure, pruned, "healing and generation latency (they need the model in memory)")
