"""The streamed engine of ``diagnose``: a model read one layer at a time feeds the measures, in one sweep.

    fed = feed(target, opts, measures, SweepSettings(state_dir=root))    # target: a StreamTarget

One sweep (:mod:`depthlab.targets.stream.sweep`) carries the base lane, one lane per removed block, one per swapped
pair of adjacent blocks (held back a layer, applied with the previous layer kept loaded: two layers resident while a
swap lane needs them) and the multiple-choice batches; with the attention / MLP units, one lane per zeroed branch
too (2L more, each born at its block, as a removal lane is) and each block's branches measured while it is loaded
(the layer tap); the logit lens decodes the base lane's L+1 states with the final norm and head while they are
loaded for the lanes' logits (the head tap, one state's logits of a few sequences alive at a time).
:class:`MeasuresConsumer` maps the lanes to the measures and saves their sums with the sweep's resume state. The
joint check of the removable set is one more sweep per evaluated set. Block Jacobians and the tuned lens need the
model in memory: the dispatcher refuses them when asked for, and the report says the Jacobians were not computed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.heldout import TextBatches
from depthlab.analysis.diagnostics.measures import Fed, Measures, no_text
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.removal import nll_sum
from depthlab.base.progress import duration
from depthlab.targets.branches import UNITS
from depthlab.targets.engine import engine_record as target_engine
from depthlab.targets.stream.lanes import Lane, removal_lanes, sublayer_lanes, swap_lanes
from depthlab.targets.stream.sweep import SweepBatch, Sweeper, SweepSettings, Taps

log = logging.getLogger(__name__)

JACOBIAN_NOTE = "not computed: block Jacobians need the model in memory (run with --no-stream)"


class LossConsumer:
    """Summed next-token loss of every lane over the held-out batches."""

    def __init__(self, n_lanes: int) -> None:
        self.sums, self.count = [0.0] * n_lanes, 0

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        self.sums[lane] += s
        if lane == 0:
            self.count += n

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        pass

    def loss(self, lane: int) -> float:
        return self.sums[lane] / max(self.count, 1)

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums, self.count = list(state["sums"]), int(state["count"])


def joint_loss(sweeper: Sweeper, text: list[SweepBatch], skip: list[int]) -> float:
    """Held-out loss with the blocks ``skip`` removed together: one sweep, one log line."""
    consumer = LossConsumer(1)
    t0 = time.perf_counter()
    sweeper.sweep("joint-" + "-".join(map(str, sorted(skip))), text, [Lane("joint", frozenset(skip))], False,
                  consumer, show=False)
    blocks = sorted(skip)
    shown = ", ".join(map(str, blocks[:6])) + (f", … ({len(blocks)} in all)" if len(blocks) > 6 else "")
    log.info("removable blocks, joint check: %d removed together (%s): loss %.4f, %s", len(blocks), shown,
             consumer.loss(0), duration(time.perf_counter() - t0))
    return consumer.loss(0)


class MeasuresConsumer:
    """The measures, fed by one sweep: lane 0 is the model, lane l the model without block l (with ``removal``),
    then with units and removal the lanes of :func:`sublayer_lanes` (block l's attention zeroed: L + l; its MLP:
    2L + l), then with the swap test the lanes of :func:`swap_lanes` (blocks l and l+1 exchanged). The units take
    the layer tap (each block's branches while it is loaded), the lens the head tap (each
    state decoded by the final norm and head). Its sums are the measures' (:meth:`Measures.state_dict`)."""

    def __init__(self, measures: Measures) -> None:
        self.m = measures
        self._swap0 = len(self._lanes())  # index of the first swap lane

    def _lanes(self) -> list[Lane]:
        L, m = self.m.n_layers, self.m
        units = m.sublayers is not None and m.removal is not None
        return [Lane("base"), *(removal_lanes(L) if m.removal is not None else []), *(sublayer_lanes(L) if units else [])]

    def lanes(self) -> list[Lane]:
        """The lanes this consumer reads, in its order."""
        return self._lanes() + (swap_lanes(self.m.n_layers) if self.m.swap is not None else [])

    def taps(self) -> Taps:
        return Taps(layer=self._layer if self.m.sublayers is not None else None,
                    head=self._head if self.m.lens is not None else None)

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        m, L = self.m, self.m.n_layers
        if batch.labels is None:  # a multiple-choice batch (the swap lanes carry it too, unscored)
            if m.swap is None or lane < self._swap0:
                m.mc.score(lane, batch.payload, batch.ids, logits)
            return
        s, n = nll_sum(logits, batch.labels)
        if m.swap is not None and (lane == 0 or lane >= self._swap0):
            m.swap.add(lane - self._swap0 + 1 if lane else None, s, n)
            if lane:
                return
        if m.removal is None:
            m.add_loss(s, n)
        elif lane == 0:
            m.removal.base, m.removal.count = m.removal.base + s, m.removal.count + n
        elif lane <= L:
            m.removal.removed[lane - 1] += s
        else:  # an attention / MLP unit zeroed
            unit, l = UNITS[(lane - L - 1) // L], (lane - L - 1) % L + 1
            m.sublayers.removed[unit][l - 1] += s

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        self.m.add_states(states)
        if self.m.sublayers is not None:
            self.m.sublayers.count += states[0].shape[0] * states[0].shape[1]

    def _layer(self, j: int, index: int, batch: SweepBatch, layer, call, x: torch.Tensor, out: torch.Tensor) -> None:
        self.m.sublayers.add_block(j, layer, call, x, out)

    def _head(self, index: int, batch: SweepBatch, states: list[torch.Tensor], head, rows: int) -> None:
        self.m.lens.decode_states(states, head, batch.labels, rows)

    def finish(self) -> None:
        """The units' base loss is the removal lanes' (the same lane 0)."""
        m = self.m
        if m.sublayers is not None and m.removal is not None:
            m.sublayers.base, m.sublayers.labels_count = m.removal.base, m.removal.count

    def state_dict(self) -> dict[str, Any]:
        return self.m.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m.load_state_dict(state)


def layers(target: Any) -> list[nn.Module]:
    """The blocks of the streamed model's skeleton (on the meta device: their classes, no weights); a wrapper's
    vision tower: its vision blocks."""
    return list(target.source.vision_blocks() if target.tower == "vision" else target.source.layers)


def feed(target: Any, opts: DiagnoseOptions, measures: Measures, settings: SweepSettings) -> Fed:
    """Every measure of ``measures`` over the held-out batches of ``target`` (read one layer at a time), in one
    sweep; the sweep's progress saved in ``settings.state_dir`` when it is set. A wrapper's vision tower:
    :func:`feed_vision`."""
    if target.tower == "vision":
        return feed_vision(target, opts, measures, settings)
    sweeper = Sweeper(target, settings)
    batches = TextBatches(target, opts)
    text = [SweepBatch(x, y) for x, y in batches]
    if not text:
        raise no_text(opts, batches, True)
    consumer = MeasuresConsumer(measures)
    sweeper.sweep("diagnose", text + _mc_batches(target, opts, measures), consumer.lanes(), True, consumer,
                  taps=consumer.taps())
    consumer.finish()
    return Fed(batches, lambda skip: joint_loss(sweeper, text, skip), lambda: engine_record(sweeper, target))


def _mc_batches(target: Any, opts: DiagnoseOptions, measures: Measures) -> list[SweepBatch]:
    """The multiple-choice batches, carried by the same sweep (no states kept)."""
    if measures.mc is None:
        return []
    tok = target.tokenizer
    return [SweepBatch(ids, None, chunk, states=False)
            for chunk, ids in measures.mc.batches(tok.encode, opts.batch_size, tok.pad_id, target.max_seq_len,
                                                  tok.eos_id)]


def engine_record(sweeper: Sweeper, target: Any) -> dict[str, Any]:
    """``report["engine"]``: which engine ran, why, and what it read and held (the joint checks' sweeps included)."""
    src, st = sweeper.source, sweeper.stats
    return {**target_engine(target), "compute_dtype": str(src.compute_dtype).replace("torch.", ""),
            "weight_passes": st.weight_passes, "sweeps": st.passes, "layers_computed": st.layers_computed,
            "block_evals": st.block_evals, "token_evals": st.token_evals, "head_tokens": st.head_tokens,
            "bytes_read": src.store.meter.bytes_read,
            "checkpoint_bytes": src.store.nbytes(), "peak_weight_bytes": src.store.meter.peak,
            "stream_bytes": st.lane_bytes, "resumed": st.resumed, "sweep_seconds": round(st.seconds, 2),
            "jacobian": JACOBIAN_NOTE}


# ---------------------------------------------------------------------------------------------- a vision tower
class VisionConsumer:
    """The language sweep of a wrapper's vision tower: each batch is one image-text item in one vision lane (its
    ``payload``: 0 the model, l the model without vision block l); its logits give that lane's answer loss."""

    def __init__(self, measures: Measures) -> None:
        self.m = measures

    def logits(self, lane: int, index: int, batch: SweepBatch, logits: torch.Tensor) -> None:
        s, n = nll_sum(logits, batch.labels)
        m, l = self.m, batch.payload
        if m.removal is None:
            m.add_loss(s, n)
        elif l == 0:
            m.removal.base, m.removal.count = m.removal.base + s, m.removal.count + n
        else:
            m.removal.removed[l - 1] += s

    def states(self, index: int, batch: SweepBatch, states: list[torch.Tensor]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return self.m.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.m.load_state_dict(state)


def vision_lanes(rows: list[tuple[dict, torch.Tensor]], lanes: list[tuple[int, tuple[int, ...]]]) -> list[SweepBatch]:
    """One sweep batch per (image-text item, vision lane): the item's ids, answer labels and inputs, the lane's
    skipped vision blocks (:data:`~depthlab.targets.stream.wrapper.SKIP`), its number as the payload."""
    from depthlab.targets.stream.wrapper import SKIP

    out = []
    for payload, skip in lanes:
        for inputs, labels in rows:
            rest = {k: v for k, v in inputs.items() if k != "input_ids"}
            out.append(SweepBatch(inputs["input_ids"], labels, payload, states=False, inputs={**rest, SKIP: skip}))
    return out


def feed_vision(target: Any, opts: DiagnoseOptions, measures: Measures, settings: SweepSettings) -> Fed:
    """A wrapper's vision tower, streamed: its states on each item's images (the vision tower read whole, the
    language blocks not run), then one sweep of the language tower carrying every (item, vision lane) batch: the
    model, and the model without each vision block (its removal measured by the answers' loss)."""
    from depthlab.analysis.diagnostics.heldout import ImageTextBatches

    src = target.source
    batches = ImageTextBatches(target, opts)
    with src.images():
        for inputs, _ in batches.rows:
            measures.add_states(src.vision_states(inputs["input_ids"].to(target.device), inputs))
    lanes = [(0, ())] + ([(l, (l,)) for l in range(1, measures.n_layers + 1)] if measures.removal else [])
    sweeper = Sweeper(target, settings)
    sweeper.sweep("diagnose-vision", vision_lanes(batches.rows, lanes), [Lane("base")], False,
                  VisionConsumer(measures))

    def joint(skip: list[int]) -> float:
        consumer = LossConsumer(1)
        sweeper.sweep("joint-vision-" + "-".join(map(str, sorted(skip))),
                      vision_lanes(batches.rows, [(0, tuple(sorted(skip)))]), [Lane("base")], False, consumer,
                      show=False)
        return consumer.loss(0)

    return Fed(batches, joint, lambda: engine_record(sweeper, target))
