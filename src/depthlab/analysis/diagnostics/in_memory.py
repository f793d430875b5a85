"""The in-memory engine of ``diagnose``: the loaded model's blocks feed the measures, one captured forward a batch.

    fed = feed(target, opts, measures)         # measures: depthlab.analysis.diagnostics.measures.Measures

Per batch: one captured forward (all residual states) for the angular distance and variance; for causal LMs the
removal sweep, the attention / MLP units and the logit lens replay the cached states (each replay starts at the block
it changes). Memory depends on the batch, never on the number of tokens. Then what needs the whole model: the tuned
lens, the depth-attention map, the multiple-choice drop, the block Jacobians on a few sampled tokens. The dispatcher
(:mod:`~depthlab.analysis.diagnostics.dispatch`) has made every check before; the measures write the report.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import ResidualCapture, capture_of
from depthlab.analysis.diagnostics.depthmap import DepthMap
from depthlab.analysis.diagnostics.heldout import held_out
from depthlab.analysis.diagnostics.jacobian import block_jacobians
from depthlab.analysis.diagnostics.lens import tuned_lens_compare
from depthlab.analysis.diagnostics.measures import Fed, Measures, no_text
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.removal import joint_removal_loss, nll_sum
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import progress
from depthlab.targets.engine import engine_record
from depthlab.targets.layers import find_layers

log = logging.getLogger(__name__)


def layers(target: Any) -> list[nn.Module]:
    """The blocks of the loaded model (what the measures are built for)."""
    return list(find_layers(target.model, target.tower))


def feed(target: Any, opts: DiagnoseOptions, measures: Measures) -> Fed:
    """Every measure of ``measures`` over the held-out batches of ``target`` (loaded in memory)."""
    cap = capture_of(target)
    batches = target.batches_for(opts) if target.batches_for is not None else held_out(target, opts)
    jac_seqs = _pass(cap, batches, target, opts, measures)
    if opts.tuned_lens and measures.lens is not None:
        measures.tuned_lens = _tuned_lens(cap, batches, opts)
    depth_map = _depth_map(cap, batches)
    if depth_map is not None:  # Attention Residuals: which earlier sources each layer reads
        measures.extra["depth_attention"] = depth_map
    if measures.mc is not None:
        _mc(cap, target, opts, measures)
    if opts.jacobian:
        jac = _jacobians(cap, jac_seqs, batches.seq_len, opts)
        measures.extra["_matrices"] = jac.pop("matrices")
        measures.extra["jacobian"] = jac
    return Fed(batches, lambda skip: joint_removal_loss(cap, batches, skip), lambda: engine_record(target))


def _pass(cap: ResidualCapture, batches: Any, target: Any, opts: DiagnoseOptions, m: Measures) -> list[torch.Tensor]:
    """Per batch: one captured forward, the states to the measures, the removal / units / lens replays (or the
    plain loss); returns the first ``jac_samples`` input rows for the Jacobians. Raises when the data gave nothing."""
    L = cap.n_layers
    units = m.sublayers is not None and m.removal is not None
    # the captured forward, one replay per removed block / swapped pair, two per block's sublayers, one head per lens state
    passes = 1 + (L if m.removal else 0) + (L - 1 if m.swap else 0) + (2 * L if units else 0) + (L + 1 if m.lens else 0)
    desc = "residual stream" + (" + removal sweep" if m.removal else "") + (" + swap test" if m.swap else "") + (
        " + sublayers" if m.sublayers else "") + (" + logit lens" if m.lens else "")
    jac_seqs: list[torch.Tensor] = []
    n_batches = getattr(batches, "n_batches", None)  # image-text items count themselves; text by its windows
    if n_batches is None:
        n_batches = -(-(batches.requested // batches.seq_len) // opts.batch_size)
    with progress(n_batches * passes, desc, "pass", opts.progress) as bar:
        for x, y in batches:
            logits, states, calls = cap.run(x, keep_calls=True)
            bar.update(1)
            m.add_states(states)
            if m.removal is not None:
                m.removal.update(cap, x, y, logits, states, on_layer=lambda: bar.update(1))
            if m.swap is not None:
                m.swap.update(cap, x, y, logits, states, calls, on_pair=lambda: bar.update(1))
            if m.sublayers is not None:
                m.sublayers.update(cap, x, y, logits, states, calls, on_pass=lambda: bar.update(1))
            if m.lens is not None:
                m.lens.update(cap, x, y, logits, states, on_state=lambda: bar.update(1))
            elif target.causal:
                m.add_loss(*nll_sum(logits, y))
            if opts.jacobian and len(jac_seqs) < opts.jac_samples:
                jac_seqs.extend(row.detach() for row in x[: opts.jac_samples - len(jac_seqs)])
            del logits, states, calls
    if m.angular.count == 0:
        raise no_text(opts, batches, target.causal)
    return jac_seqs


def _tuned_lens(cap: ResidualCapture, batches: Any, opts: DiagnoseOptions) -> dict[str, Any]:
    """The tuned lens (:class:`~depthlab.analysis.diagnostics.lens.TunedLens`) against the plain lens on unseen text:
    fitted on the even batches, measured on the odd ones (two at least: checked before loading by the dispatcher)."""
    items = list(batches)
    if len(items) < 2:  # the data was shorter than asked
        raise DepthlabError(f"--tuned-lens needs two held-out batches (one to fit, one to measure); data {opts.data!r} "
                            f"gave {len(items)}")
    with progress(len(items), "tuned lens", "batch", opts.progress) as bar:
        return tuned_lens_compare(cap, items[0::2], items[1::2], cap.n_layers, on_batch=lambda: bar.update(1))


@torch.no_grad()
def _depth_map(cap: ResidualCapture, batches: Any) -> dict[str, Any] | None:
    """The depth-attention map (:mod:`~depthlab.analysis.diagnostics.depthmap`) over the same held-out batches,
    one more forward each; None (and no forward) for a model without depth readers."""
    acc = DepthMap.of(cap.model)
    if acc is None:
        return None
    with acc.recording():
        for x, _ in batches:
            cap.forward(x)
    return acc.result()


def _mc(cap: ResidualCapture, target: Any, opts: DiagnoseOptions, m: Measures) -> None:
    n = sum(len(it.choices) for it in m.mc.items)
    with progress(n, "multiple choice", "choice", opts.progress) as bar:
        m.mc.run(cap, target.tokenizer.encode, opts.batch_size, target.device, pad_id=target.tokenizer.pad_id,
                 max_len=target.max_seq_len, removal=opts.removal, progress=bar.update,
                 prefix_id=target.tokenizer.eos_id)


def _jacobians(cap: ResidualCapture, seqs: list[torch.Tensor], seq_len: int, opts: DiagnoseOptions) -> dict[str, Any]:
    """The block Jacobians of ``opts.jac_layers`` (all blocks by default; their range checked by the dispatcher) at
    sampled positions of the first input rows."""
    if not seqs:
        return {"layers": [], "tokens": 0, "per_layer": [], "matrices": {}}
    gen = torch.Generator().manual_seed(opts.seed)
    hi = max(1, min(opts.jac_context, seq_len))
    positions = torch.randint(0, hi, (len(seqs),), generator=gen).tolist()
    layers = opts.jac_layers or list(range(1, cap.n_layers + 1))
    keep = opts.heatmap_layers or sorted({layers[0], layers[len(layers) // 3], layers[(2 * len(layers)) // 3], layers[-1]})
    keep = [l for l in keep if l in layers]
    with progress(len(seqs) * len(layers), "block Jacobians", "jac", opts.progress) as bar:
        out = block_jacobians(cap, seqs, positions, layers, keep=keep, on_step=bar.update)
    out["positions"] = positions
    out["heatmap_layers"] = keep
    return out
