"""The measures ``diagnose`` takes of one model: built once, fed by either engine, written into one report.

    measures = Measures.build(target, opts, layers)    # which measures apply (options x model), each accumulator once
    ...                                                # an engine feeds them (in_memory.feed / streamed.feed)
    report = measures.report(target, opts, batches, command, joint)   # every section, the removable set, the summary

What is measured (docs/paper.md §5): the angular distance of all pairs of residual states and their variance
(every model); for causal LMs the removal loss of each block (``removal``), the loss with each adjacent pair of
blocks exchanged (``swap``) and the effective depth read from the removal losses (:mod:`.depthuse`), the attention / MLP units
(``sublayers``, when the blocks keep branches depthlab knows), the logit lens (``lens``) and a multiple-choice drop
(``mc``). The in-memory engine adds what needs the whole model: block Jacobians, the tuned lens, the depth-attention
map (``extra``: sections it writes as they are). The streamed engine's resume state holds these sums
(:meth:`state_dict`; the format of every release, so a rerun continues an older run's state).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from depthlab.analysis.diagnostics.angular import AngularAccumulator, adjacent, pair_matrix_to_layout
from depthlab.analysis.diagnostics.depthuse import SwapAccumulator, effective_depth
from depthlab.analysis.diagnostics.heldout import TextBatches
from depthlab.analysis.diagnostics.lens import LensAccumulator
from depthlab.analysis.diagnostics.mc import MCAccumulator, load_mc
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.removal import RemovalAccumulator
from depthlab.analysis.diagnostics.sublayers import SublayerAccumulator
from depthlab.analysis.diagnostics.summary import removable_blocks, summary_sentence
from depthlab.analysis.diagnostics.variance import VarianceAccumulator
from depthlab.base.errors import DepthlabError
from depthlab.base.metrics import perplexity
from depthlab.targets.branches import check_sublayers

log = logging.getLogger(__name__)

#: The kind of target that is an image-text wrapper's vision tower (depthlab.targets.wrappers).
IMAGE_TEXT = "hf-image-text"
#: What the report of a vision tower says of its removal measure, and of what it does not measure.
VISION_REMOVAL = ("the loss of each image-text item's answer given its image and question, with the vision block "
                  "removed (the language model's use of the image)")
VISION_NOT_MEASURED = ("attention / MLP units, the logit lens and block Jacobians (they read a decoder's stream), "
                       "the multiple-choice drop (a text task)")
ANGULAR_LAYOUT = ("matrix[n-1][l-1] = d(x^l, x^{l+n}) = mean over tokens of arccos(cos)/pi; x^l = input of block l, "
                  "x^{L+1} = output of block L; null where l+n > L+1")


class Measures:
    """The accumulators of one diagnosis (None: that measure does not apply), their sums and their report."""

    def __init__(self, n_layers: int, angular: AngularAccumulator, variance: VarianceAccumulator,
                 removal: RemovalAccumulator | None = None, sublayers: SublayerAccumulator | None = None,
                 lens: LensAccumulator | None = None, mc: MCAccumulator | None = None) -> None:
        self.n_layers = n_layers
        self.angular, self.variance, self.removal = angular, variance, removal
        self.sublayers, self.lens, self.mc = sublayers, lens, mc
        self.base_loss, self.base_count = 0.0, 0  # summed loss when no removal sweep sums it (causal LMs)
        self.swap: SwapAccumulator | None = None  # adjacent blocks exchanged (depthuse), set by build
        self.extra: dict[str, Any] = {}  # report sections an engine computes whole (jacobian, depth_attention, ...)
        self.tuned_lens: dict[str, Any] | None = None  # the tuned lens against the plain one (in memory; lens.tuned)

    @classmethod
    def build(cls, target: Any, opts: DiagnoseOptions, layers: Sequence[nn.Module]) -> Measures:
        """The measures ``opts`` asks for that ``target`` allows: removal, units, lens and multiple choice for causal
        LMs; the units only for blocks whose branches depthlab knows (else whole blocks, said in one line)."""
        L, causal = len(layers), target.causal
        text = causal and target.kind != IMAGE_TEXT  # a vision tower: its states and the answers' loss only
        removal = RemovalAccumulator(L) if opts.removal and causal else None
        sublayers = None
        if opts.sublayers and text:
            try:
                check_sublayers(layers)
                sublayers = SublayerAccumulator(L, removal=removal is not None)
            except DepthlabError as err:  # a family whose blocks name their branches otherwise: whole blocks only
                log.info("no attention/MLP units for %s: %s", target.name, err)
        mc = None
        if opts.mc and text and target.tokenizer is not None:
            mc = MCAccumulator(load_mc(opts.mc, opts.mc_limit), L)
        m = cls(L, AngularAccumulator(L + 1), VarianceAccumulator(L + 1), removal, sublayers,
                LensAccumulator(L) if opts.lens and text else None, mc)
        m.swap = SwapAccumulator(L) if opts.swap and text and L > 1 else None
        return m

    # ------------------------------------------------------------------ fed by the engines
    def add_states(self, states: Sequence[Any]) -> None:
        """The residual states x^1..x^{L+1} of one batch (B, T, D each)."""
        self.angular.update(states)
        self.variance.update(states)

    def add_loss(self, total: float, count: int) -> None:
        """The model's summed held-out loss of one batch, when the removal sweep does not sum it."""
        self.base_loss, self.base_count = self.base_loss + total, self.base_count + count

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        v, r = self.variance, self.removal
        out = {"angular": [self.angular.sum, self.angular.count], "base": [self.base_loss, self.base_count],
               "variance": [v.sum, v.sumsq, v.norm_sum, v.tok_var_sum, v.tokens, v.width]}
        if r is not None:
            out["removal"] = [r.base, r.removed, r.count]
        if self.mc is not None:
            out["mc"] = [self.mc.scores, self.mc.nchars]
        for name in ("sublayers", "lens", "swap"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name).state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.angular.sum, self.angular.count = state["angular"]
        self.base_loss, self.base_count = state["base"]
        v = self.variance
        v.sum, v.sumsq, v.norm_sum, v.tok_var_sum, v.tokens, v.width = state["variance"]
        if self.removal is not None:
            self.removal.base, removed, self.removal.count = state["removal"]
            self.removal.removed = list(removed)
        if self.mc is not None:
            self.mc.scores, self.mc.nchars = state["mc"]
        for name in ("sublayers", "lens", "swap"):
            if getattr(self, name) is not None:
                getattr(self, name).load_state_dict(state[name])

    # ------------------------------------------------------------------ the report
    def report(self, target: Any, opts: DiagnoseOptions, batches: TextBatches, command: str | None,
               joint: Callable[[list[int]], float] | None) -> dict[str, Any]:
        """Every section of the report (the engine's record aside): what was measured, the removable set (checked
        by ``joint``, the loss with a set of blocks removed together, when ``opts.joint_check``), the summary."""
        if batches.short:
            log.warning("data %r holds only %d tokens in its %s split (asked for %d): using what there is",
                        opts.data, self.angular.count, batches.split, opts.tokens)
        report = {**self._header(target, opts, batches, command), **self._sections(target)}
        if self.mc is not None:
            report["mc"] = {**self.mc.result(), "file": str(opts.mc)}
        report.update(self.extra)
        if target.kind == IMAGE_TEXT:
            report["not_measured"] = VISION_NOT_MEASURED
            if "removal" in report:
                report["removal"]["measure"] = VISION_REMOVAL
        if "removal" in report:
            check = joint if opts.joint_check else None
            report["removal"]["removable"] = removable_blocks(report["removal"], opts.loss_budget, check)
            report["effective_depth"] = effective_depth(report["removal"], opts.effective_threshold)
        report["summary"] = summary_sentence(report, opts.identity_threshold, opts.loss_budget)
        return report

    def _header(self, target: Any, opts: DiagnoseOptions, batches: TextBatches, command: str | None) -> dict[str, Any]:
        return {"model": {"name": target.name, "kind": target.kind, **{k: v for k, v in target.info.items()
                                                                        if k != "config"}},
                "model_config": target.info.get("config"),
                "data": {"spec": opts.data, "split": batches.split, "tokens": self.angular.count,
                         "tokens_requested": opts.tokens, "short": batches.short, "seq_len": batches.seq_len,
                         "batch_size": opts.batch_size},
                "options": asdict(opts), "command": command}

    def _sections(self, target: Any) -> dict[str, Any]:
        """The angular, variance, removal, loss, sublayers and lens sections."""
        mean = self.angular.mean()
        L = mean.shape[0] - 1
        out: dict[str, Any] = {
            "angular": {"layout": ANGULAR_LAYOUT, "matrix": pair_matrix_to_layout(mean),
                        "adjacent": adjacent(mean),  # block l = d(x^l, x^{l+1})
                        "to_last": [float(mean[i, L]) for i in range(L)]},  # d(x^l, x^{L+1})
            "variance": self.variance.result(),
        }
        if self.removal is not None:
            r = out["removal"] = self.removal.result()
            # a classifier (ViT) has a top-1 accuracy, not a perplexity
            out["loss"] = {"loss": r["base_loss"], **({"accuracy": r["base_accuracy"]} if "base_accuracy" in r
                                                      else {"ppl": r["base_ppl"]})}
        elif target.causal and self.base_count:
            loss = self.base_loss / self.base_count
            out["loss"] = {"loss": loss, "ppl": perplexity(loss)}
        if self.swap is not None:
            out["swap"] = self.swap.result()
        if self.sublayers is not None:
            out["sublayers"] = self.sublayers.result()
        if self.lens is not None:
            out["lens"] = self.lens.result()
            if self.tuned_lens is not None:
                out["lens"]["tuned"] = self.tuned_lens
        return out


def no_text(opts: DiagnoseOptions, batches: TextBatches, causal: bool) -> DepthlabError:
    """The one line for held-out data that gave nothing to evaluate."""
    return DepthlabError(f"data {opts.data!r} gave no {batches.split} text to evaluate (empty, or shorter than one "
                         f"sequence of {batches.seq_len + int(causal)} tokens)")


@dataclass
class Fed:
    """What an engine hands back once it has fed the measures: the batches it read, the loss with a set of blocks
    removed together (the joint check of the removable set) and its record (``report["engine"]``, read once the
    joint checks have run too)."""

    batches: Any  # TextBatches, or a target's own (ViT images)
    joint: Callable[[list[int]], float]
    record: Callable[[], dict[str, Any]]
