"""``prune --unit attn|mlp`` on a model read one layer at a time: the in-memory choice, measured by sweeps.

    target = load_target("path/to/hf-dir", stream=True)
    report = prune_target(target, PruneOptions(unit="attn", method="removal", remove=4), "pruned/attn-4")
    # prune_target (depthlab.prune) checks the request (check_model below among them), then runs prune_units_streamed

The choice is :func:`depthlab.prune.units.choose_units`, the in-memory one, fed by sweeps of the streamed engine
(:mod:`depthlab.targets.stream.sweep`) through :class:`StreamedUnits`: the survey (loss, and each block's
attention / MLP contribution and angular distance, measured while the block is loaded) is one sweep; each greedy
step is one sweep carrying one lane per candidate (``Lane.zero``: the base with the units removed so far zeroed,
each candidate born at its block with its unit zeroed too); each joint loss (``--budget``) is one sweep.

The export is the checkpoint copied shard by shard with the removed units' output projections (``o_proj`` /
``down_proj`` and their biases, found by the table the in-memory export uses,
:data:`depthlab.prune.projections.OUT_PROJ`, on the model's own layer classes) written as zeros
(:func:`depthlab.prune.shards.write_pruned_shards`): the same architecture and depth, which plain ``transformers``
loads with the in-memory unit-pruned export's logits, and no faster there. It is checked layer by layer (the
written files against the original with those branches zeroed) and, when it fits in memory, with plain
``transformers`` (logits, cached ``generate``). Not done here: healing (refused in one line before any work,
:func:`depthlab.prune.streamed.check_plan`: the LoRA heal of the written checkpoint would move the zeroed
projections), ``--generate`` and the generation latency (they need the model in memory).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.analysis.diagnostics.streamed import LossConsumer
from depthlab.analysis.diagnostics.sublayers import SublayerAccumulator
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import logs_to_stderr
from depthlab.prune.options import PruneOptions
from depthlab.prune.pipeline import held_out_batches
from depthlab.prune.prune_report import units_report, write_units_report
from depthlab.prune.streamed import LogitsConsumer, streamed_cost, sweep_engine, with_transformers_check
from depthlab.prune.units import choose_units, output_projection
from depthlab.targets.branches import check_sublayers
from depthlab.targets.frame import Request
from depthlab.targets.stream.lanes import Lane
from depthlab.targets.stream.open import StreamTarget, open_streamed
from depthlab.targets.stream.sweep import SweepBatch, Sweeper, SweepSettings, Taps

log = logging.getLogger(__name__)


def check_model(request: Request, target: StreamTarget) -> None:
    """Refuse before any pass over data blocks without known branches or output projections (the in-memory engine's
    checks, on the skeleton's layer classes)."""
    layers = target.source.layers
    check_sublayers(layers)
    for layer in layers:
        output_projection(layer, request.opts.unit)


def zeroed_keys(target: StreamTarget, unit: str, blocks: Sequence[int]) -> frozenset[str]:
    """Checkpoint keys of the output projections (weight, bias) of ``unit`` in ``blocks`` (1-based)."""
    src = target.source
    return frozenset(k for b in blocks for k in src.keys_of(output_projection(src.layers[b - 1], unit)))


@dataclass
class _SurveyConsumer:
    """The base lane's loss and each block's two branches (contribution, angle) while the block is loaded."""

    acc: SublayerAccumulator
    total: float = 0.0
    count: int = 0

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.total, self.count = self.total + s, self.count + n

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        self.acc.count += states[0].shape[0] * states[0].shape[1]

    def layer(self, j: int, index: int, batch: SweepBatch, layer, call, x: torch.Tensor, out: torch.Tensor) -> None:
        self.acc.add_block(j, layer, call, x, out)

    def state_dict(self) -> dict[str, Any]:
        return {"acc": self.acc.state_dict(), "loss": [self.total, self.count]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.acc.load_state_dict(state["acc"])
        self.total, self.count = state["loss"]


class StreamedUnits:
    """:class:`depthlab.prune.units.UnitMeasure` by sweeps over a streamed target's layers."""

    def __init__(self, target: StreamTarget, text: list[SweepBatch], settings: SweepSettings, unit: str) -> None:
        self.target, self.text, self.unit = target, text, unit
        self.sweeper = Sweeper(target, settings)
        self.n_layers = target.source.n_layers
        self.steps = 0

    def _zero(self, blocks: Sequence[int]) -> frozenset[tuple[int, str]]:
        return frozenset((b, self.unit) for b in blocks)

    def survey(self) -> tuple[float, dict[str, Any]]:
        consumer = _SurveyConsumer(SublayerAccumulator(self.n_layers, removal=False))
        self.sweeper.sweep("units-survey", self.text, [Lane("base")], True, consumer, taps=Taps(layer=consumer.layer))
        if consumer.count == 0:
            raise DepthlabError("the held-out data gave no tokens to evaluate")
        return consumer.total / consumer.count, consumer.acc.result()

    def candidates(self, removed: set[int]) -> dict[int, float]:
        """Loss with ``removed`` and each other block's unit zeroed: one sweep, one lane per candidate."""
        cands = [m for m in range(1, self.n_layers + 1) if m not in removed]
        base = self._zero(removed)
        lanes = [Lane("base", zero=base), *(Lane(f"candidate:{m}", zero=base | self._zero([m])) for m in cands)]
        consumer = LossConsumer(len(lanes))
        self.steps += 1
        self.sweeper.sweep(f"units-greedy-{self.steps}", self.text, lanes, False, consumer)
        return {m: consumer.loss(i) for i, m in enumerate(cands, start=1)}

    def loss(self, removed: Sequence[int]) -> float:
        consumer = LossConsumer(1)
        name = "units-joint-" + "-".join(map(str, sorted(removed)))
        self.sweeper.sweep(name, self.text, [Lane("joint", zero=self._zero(removed))], False, consumer, show=False)
        return consumer.loss(0)

    def logits(self, ids: torch.Tensor, removed: Sequence[int], name: str) -> torch.Tensor:
        consumer = LogitsConsumer()
        self.sweeper.sweep(name, [SweepBatch(ids, states=False)], [Lane("probe", zero=self._zero(removed))], False,
                           consumer, show=False)
        return consumer.out[0]


@logs_to_stderr
def prune_units_streamed(target: StreamTarget, opts: PruneOptions, out: Path, command: str | None,
                         settings: SweepSettings) -> dict[str, Any]:
    """Remove ``opts.unit`` sublayers of ``target``, reading it one layer at a time; write the checkpoint (zeroed
    projections), ``prune.json`` and ``report.html`` into ``out``, whole or not at all. Returns the report (the
    in-memory :func:`depthlab.prune.units.prune_units_in_memory`'s shape; no latency, no healing). Run by
    :func:`depthlab.prune.prune_target` once its checks have passed, holding the resume state."""
    from depthlab.base.fileio import publish_dir
    from depthlab.prune.shards import write_pruned_shards
    from depthlab.prune.skip import write_skip

    t0 = time.time()
    batches = held_out_batches(target, opts)
    text = [SweepBatch(x, y) for x, y in batches]
    if not text:
        raise DepthlabError("the held-out data gave no tokens to evaluate")
    measure = StreamedUnits(target, text, settings, opts.unit)
    base, survey, removed, details = choose_units(measure, opts)
    with publish_dir(out) as tmp:
        written = write_pruned_shards(target.path, [], tmp, {"pruned_from": str(target.name), "removed_units": opts.unit,
                                      "removed_blocks": removed, "method": details["method"]}, target.tokenizer,
                                      zeroed=zeroed_keys(target, opts.unit, removed))
        skip = write_skip(tmp, opts.unit, removed)
        src = target.source
        pruned = StreamedUnits(open_streamed(str(tmp), target.device, src.dtype, src.compute_dtype), text, settings,
                               opts.unit)
        losses = {"original": base, "pruned": pruned.loss([])}
        report = units_report(target, opts, removed, details, survey, losses, {}, batches, command,
                              streamed_cost(target, batches.seq_len))
        check = verify_units_streamed(measure, pruned, text[0].ids[:2, :64], removed, tmp)
        report.update(export={**check, "dir": str(out), "written": written, "per_layer_config": skip}, latency=None,
                      heal=None, engine=_engine(measure, pruned), seconds=round(time.time() - t0, 2))
        write_units_report(report, tmp)
    return report


def verify_units_streamed(original: StreamedUnits, pruned: StreamedUnits, ids: torch.Tensor, removed: list[int],
                          out: Path) -> dict[str, Any]:
    """The written checkpoint (zeroed projections), read layer by layer, against the original with those branches
    zeroed; loaded with plain ``transformers`` too (logits, cached ``generate``) when it fits in memory."""
    hooked = original.logits(ids, removed, "probe-original")
    got = pruned.logits(ids, [], "probe-pruned")
    diff = float((hooked - got).abs().max())
    target = pruned.target
    check: dict[str, Any] = {"max_abs_logit_diff_zeroed_vs_hooked": diff, "max_abs_logit_diff": diff,
                             "loaded_with": "depthlab, layer by layer", "architecture": target.info["architecture"],
                             "n_layers_loaded": target.source.n_layers, "generated_tokens": None,
                             "generate_cache_matches_no_cache": None}
    return with_transformers_check(check, out, ids, hooked, target)


def _engine(measure: StreamedUnits, pruned: StreamedUnits) -> dict[str, Any]:
    return sweep_engine(measure, pruned, "healing, --generate and generation latency (they need the model in memory)")
