"""``diagnose`` on a model read one layer at a time.

    target = load_target("path/to/hf-dir", dtype=torch.bfloat16, stream=True)   # depthlab.targets: the engine's choice
    report = diagnose_streamed(target, DiagnoseOptions(tokens=256), out=Path("reports/x"))
    # or diagnose(target, ...), which runs the engine of the target it is given

The report has the in-memory engine's shape (``depthlab.analysis.diagnostics.runner``; the same accumulators fill
it, the same functions write it) plus ``engine``: which engine ran, why, and what it read. One sweep
(:mod:`depthlab.analysis.diagnostics.streamed`) carries the base stream, one stream per removed block and the
multiple-choice batches; with the attention / MLP units, one stream per zeroed branch too (2L more, each born at
its block, as a removal stream is) and each block's branches measured while it is loaded; the logit lens decodes
the base stream's L+1 states with the final norm and head while they are loaded for the streams' logits (one
state's logits of a few sequences alive at a time). The joint check of the removable set is one more sweep per
evaluated set. Block Jacobians need the model in memory and are not computed when streaming.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from depthlab.analysis.diagnostics.angular import AngularAccumulator
from depthlab.analysis.diagnostics.lens import LensAccumulator
from depthlab.analysis.diagnostics.mc import MCAccumulator, load_mc
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.removal import RemovalAccumulator, nll_sum
from depthlab.analysis.diagnostics.runner import TextBatches, _stream_report, _Streamed
from depthlab.analysis.diagnostics.streamed import (
    Stream,
    SweepBatch,
    Sweeper,
    SweepSettings,
    Taps,
    clear_state,
    hold_state,
    removal_streams,
    sublayer_streams,
)
from depthlab.analysis.diagnostics.sublayers import UNITS, SublayerAccumulator, check_sublayers
from depthlab.analysis.diagnostics.summary import removable_blocks, summary_sentence
from depthlab.analysis.diagnostics.variance import VarianceAccumulator
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import duration, logs_to_stderr
from depthlab.targets.engine import engine_record as target_engine
from depthlab.targets.layerwise import StreamTarget

log = logging.getLogger(__name__)


def state_dir(out: str | Path) -> Path:
    """Where a streamed sweep writing to ``out`` keeps its resume state: a hidden sibling of ``out``
    (``out`` itself appears only once the report is complete)."""
    out = Path(out)
    return out.parent / f".{out.name}.stream-state"


JACOBIAN_NOTE = "not computed: block Jacobians need the model in memory (run with --no-stream)"


# ---------------------------------------------------------------------------------------------- consumers
class LossConsumer:
    """Summed next-token loss of every stream over the held-out batches."""

    def __init__(self, n_streams: int) -> None:
        self.sums, self.count = [0.0] * n_streams, 0

    def logits(self, stream: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.sums[stream] += s
        if stream == 0:
            self.count += n

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        pass

    def loss(self, stream: int) -> float:
        return self.sums[stream] / max(self.count, 1)

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums, self.count = list(state["sums"]), int(state["count"])


class DiagnoseConsumer:
    """The diagnose accumulators, fed by one sweep: stream 0 is the model, stream l the model without block l
    (with ``removal``), then with ``sublayers`` and ``removal`` the streams of :func:`sublayer_streams` (block l's
    attention zeroed: L + l; its MLP: 2L + l). ``sublayers`` takes the layer tap (each block's branches while it is
    loaded), ``lens`` the head tap (each state decoded by the final norm and head)."""

    def __init__(self, n_layers: int, removal: bool, mc: MCAccumulator | None, sublayers: bool = False,
                 lens: bool = False) -> None:
        self.n_layers = n_layers
        self.angular, self.variance = AngularAccumulator(n_layers + 1), VarianceAccumulator(n_layers + 1)
        self.removal = RemovalAccumulator(n_layers) if removal else None
        self.base_loss, self.base_count, self.mc = 0.0, 0, mc
        self.sublayers = SublayerAccumulator(n_layers, removal=removal) if sublayers else None
        self.lens = LensAccumulator(n_layers) if lens else None

    def streams(self) -> list[Stream]:
        """The streams this consumer reads, in its order."""
        L, sub = self.n_layers, self.sublayers is not None and self.removal is not None
        return [Stream("base"), *(removal_streams(L) if self.removal is not None else []), *(sublayer_streams(L) if sub else [])]

    def taps(self) -> Taps:
        return Taps(layer=self._layer if self.sublayers is not None else None,
                    head=self._head if self.lens is not None else None)

    def logits(self, stream: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        if batch.labels is None:  # a multiple-choice batch
            self.mc.score(stream, batch.payload, batch.ids, logits)
            return
        s, n = nll_sum(logits, batch.labels)
        L = self.n_layers
        if self.removal is None:
            self.base_loss, self.base_count = self.base_loss + s, self.base_count + n
        elif stream == 0:
            self.removal.base, self.removal.count = self.removal.base + s, self.removal.count + n
        elif stream <= L:
            self.removal.removed[stream - 1] += s
        else:  # an attention / MLP unit zeroed
            unit, l = UNITS[(stream - L - 1) // L], (stream - L - 1) % L + 1
            self.sublayers.removed[unit][l - 1] += s

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        self.angular.update(states)
        self.variance.update(states)
        if self.sublayers is not None:
            self.sublayers.count += states[0].shape[0] * states[0].shape[1]

    def _layer(self, j: int, index: int, batch: SweepBatch, layer, call, x: torch.Tensor, out: torch.Tensor) -> None:
        self.sublayers.add_block(j, layer, call, x, out)

    def _head(self, index: int, batch: SweepBatch, states: list[torch.Tensor], head, rows: int) -> None:
        self.lens.decode_states(states, head, batch.labels, rows)

    def finish(self) -> None:
        """The sublayer units' base loss is the removal sweep's (the same stream 0)."""
        if self.sublayers is not None and self.removal is not None:
            self.sublayers.base, self.sublayers.labels_count = self.removal.base, self.removal.count

    def state_dict(self) -> dict[str, Any]:
        v, r = self.variance, self.removal
        out = {"angular": [self.angular.sum, self.angular.count], "base": [self.base_loss, self.base_count],
               "variance": [v.sum, v.sumsq, v.norm_sum, v.tok_var_sum, v.tokens, v.width]}
        if r is not None:
            out["removal"] = [r.base, r.removed, r.count]
        if self.mc is not None:
            out["mc"] = [self.mc.scores, self.mc.nchars]
        for name in ("sublayers", "lens"):
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
        for name in ("sublayers", "lens"):
            if getattr(self, name) is not None:
                getattr(self, name).load_state_dict(state[name])


# ---------------------------------------------------------------------------------------------- diagnose
def text_batches(target: StreamTarget, opts: DiagnoseOptions) -> tuple[TextBatches, list[SweepBatch]]:
    """The held-out batches ``diagnose`` reads (the in-memory engine's), as sweep batches; raises on no text."""
    batches = TextBatches(target, opts)
    text = [SweepBatch(x, y) for x, y in batches]
    if not text:
        raise DepthlabError(f"data {opts.data!r} gave no {batches.split} text to evaluate (empty, or shorter than one "
                            f"sequence of {batches.seq_len + 1} tokens)")
    return batches, text


def joint_loss(sweeper: Sweeper, text: list[SweepBatch], skip: list[int]) -> float:
    """Held-out loss with the blocks ``skip`` removed together: one sweep, one log line."""
    consumer = LossConsumer(1)
    t0 = time.perf_counter()
    sweeper.sweep("joint-" + "-".join(map(str, sorted(skip))), text, [Stream("joint", frozenset(skip))], False,
                  consumer, show=False)
    blocks = sorted(skip)
    shown = ", ".join(map(str, blocks[:6])) + (f", … ({len(blocks)} in all)" if len(blocks) > 6 else "")
    log.info("removable blocks, joint check: %d removed together (%s): loss %.4f, %s", len(blocks), shown,
             consumer.loss(0), duration(time.perf_counter() - t0))
    return consumer.loss(0)


@logs_to_stderr
def diagnose_streamed(target: StreamTarget, opts: DiagnoseOptions | None = None, command: str | None = None,
                      out: Path | None = None, settings: SweepSettings | None = None) -> dict[str, Any]:
    """What :func:`~depthlab.analysis.diagnostics.diagnose` reports (Jacobians excepted), the model read one layer at
    a time. ``out``: the report directory; the resume state lives beside it (:func:`state_dir`) while the sweep
    runs."""
    opts = opts or DiagnoseOptions()
    if opts.tuned_lens:
        raise DepthlabError("--tuned-lens needs the model in memory (its maps are fitted on the kept states); drop "
                            "--tuned-lens or add --no-stream")
    t0 = time.time()
    settings = settings or SweepSettings(progress=opts.progress)
    if settings.state_dir is None and out is not None:
        settings.state_dir = state_dir(out)
    with hold_state(settings.state_dir, out):  # one writer of the resume state (re-entrant: the CLI holds it too)
        return _diagnose_streamed(target, opts, command, settings, t0)


def _diagnose_streamed(target: StreamTarget, opts: DiagnoseOptions, command: str | None, settings: SweepSettings,
                       t0: float) -> dict[str, Any]:
    sweeper = Sweeper(target, settings)
    L = target.source.n_layers
    batches, text = text_batches(target, opts)
    mc, mc_batches = _mc_batches(target, opts, L)
    consumer = DiagnoseConsumer(L, opts.removal, mc, _sublayers(target, opts), opts.lens)
    sweeper.sweep("diagnose", text + mc_batches, consumer.streams(), True, consumer, taps=consumer.taps())
    consumer.finish()
    acc = _Streamed(consumer.angular, consumer.variance, consumer.removal, [], consumer.base_loss, consumer.base_count,
                    consumer.sublayers, consumer.lens)
    if batches.short:
        log.warning("data %r holds only %d tokens in its %s split (asked for %d): using what there is",
                    opts.data, acc.angular.count, batches.split, opts.tokens)
    report = _stream_report(acc, target, opts, batches, command)
    if mc is not None:
        report["mc"] = {**mc.result(), "file": str(opts.mc)}
    if "removal" in report:
        joint = (lambda skip: joint_loss(sweeper, text, skip)) if opts.joint_check else None
        report["removal"]["removable"] = removable_blocks(report["removal"], opts.loss_budget, joint)
    report["summary"] = summary_sentence(report, opts.identity_threshold, opts.loss_budget)
    report["engine"] = engine_record(sweeper, target)
    report["seconds"] = round(time.time() - t0, 2)
    return report


def _sublayers(target: StreamTarget, opts: DiagnoseOptions) -> bool:
    """Whether the attention / MLP units are measured: asked for, and the blocks keep branches depthlab knows
    (else whole blocks only, with the line the in-memory engine logs)."""
    if not opts.sublayers:
        return False
    try:
        check_sublayers(target.source.layers)
    except DepthlabError as err:
        log.info("no attention/MLP units for %s: %s", target.name, err)
        return False
    return True


def _mc_batches(target: StreamTarget, opts: DiagnoseOptions, L: int) -> tuple[MCAccumulator | None, list[SweepBatch]]:
    if not opts.mc or target.tokenizer is None:
        return None, []
    mc = MCAccumulator(load_mc(opts.mc, opts.mc_limit), L)
    tok = target.tokenizer
    return mc, [SweepBatch(ids, None, chunk, states=False)
                for chunk, ids in mc.batches(tok.encode, opts.batch_size, tok.pad_id, target.max_seq_len, tok.eos_id)]


def engine_record(sweeper: Sweeper, target: StreamTarget) -> dict[str, Any]:
    """``report["engine"]``: which engine ran, why, and what it read and held."""
    src, st = sweeper.source, sweeper.stats
    return {**target_engine(target), "compute_dtype": str(src.compute_dtype).replace("torch.", ""),
            "weight_passes": st.weight_passes, "sweeps": st.passes, "layers_computed": st.layers_computed,
            "block_evals": st.block_evals, "token_evals": st.token_evals, "head_tokens": st.head_tokens,
            "bytes_read": src.store.meter.bytes_read,
            "checkpoint_bytes": src.store.nbytes(), "peak_weight_bytes": src.store.meter.peak,
            "stream_bytes": st.stream_bytes, "resumed": st.resumed, "sweep_seconds": round(st.seconds, 2),
            "jacobian": JACOBIAN_NOTE}


def finish(out: Path) -> None:
    """The report is written: drop the resume state."""
    clear_state(state_dir(out))
