"""The in-memory engine of ``diagnose``: every diagnostic of a loaded :class:`~depthlab.targets.Target` in one
pass over the held-out batches.

    target = load_target("smollm2")
    report = diagnose_in_memory(target, DiagnoseOptions(data="builtin", tokens=16384))
    # diagnose(target, ...) (depthlab.analysis.diagnostics.engines) runs this, or the layer-streamed engine

Per batch: one captured forward (all residual states), the angular / variance accumulators, and —
for causal LMs — the removal sweep replaying the cached states. Memory depends on the batch, never
on the number of tokens. Then the Jacobians on a few sampled tokens, the summary, the report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from depthlab.analysis.diagnostics.angular import AngularAccumulator, adjacent, pair_matrix_to_layout
from depthlab.analysis.diagnostics.capture import capture_of
from depthlab.analysis.diagnostics.depthmap import DepthMap
from depthlab.analysis.diagnostics.jacobian import block_jacobians
from depthlab.analysis.diagnostics.lens import LensAccumulator, tuned_lens_compare
from depthlab.analysis.diagnostics.mc import MCAccumulator, load_mc
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.removal import RemovalAccumulator, joint_removal_loss, nll_sum
from depthlab.analysis.diagnostics.sublayers import SublayerAccumulator, check_sublayers
from depthlab.analysis.diagnostics.summary import removable_blocks, summary_sentence
from depthlab.analysis.diagnostics.variance import VarianceAccumulator
from depthlab.base.errors import DepthlabError
from depthlab.base.metrics import perplexity
from depthlab.base.progress import logs_to_stderr, progress
from depthlab.targets.target import Target

log = logging.getLogger(__name__)


def _tqdm(total: int | None, desc: str, enabled: bool, unit: str = "it"):
    """A progress bar on a terminal, ETA log lines otherwise (``depthlab.base.progress``)."""
    return progress(total, desc, unit, enabled)


def _split(opts: DiagnoseOptions, target: Target) -> str:
    if opts.split != "auto":
        return opts.split
    return "val" if opts.data == "builtin" or str(target.info.get("source", "")).startswith("depthlab run") else "all"


class TextBatches:
    """Re-iterable (inputs, labels) pairs over held-out text, via depthlab.data."""

    def __init__(self, target: Target, opts: DiagnoseOptions) -> None:
        from depthlab.data import eval_token_batches

        if target.tokenizer is None:
            raise DepthlabError(f"{target.name!r} comes without a tokenizer; cannot turn --data text into tokens")
        if opts.tokens < 1 or opts.seq_len < 2 or opts.batch_size < 1:
            raise DepthlabError("--tokens and --batch-size must be positive and --seq-len at least 2")
        self.causal = target.causal
        seq_len = opts.seq_len
        limit = target.max_seq_len
        if limit is not None and seq_len > limit:
            log.warning("--seq-len %d exceeds what %s accepts; using %d", seq_len, target.name, limit)
            seq_len = limit
        self.seq_len = seq_len
        window = seq_len + 1 if self.causal else seq_len
        n_seq = -(-opts.tokens // seq_len)
        self.split = _split(opts, target)
        self.inner = eval_token_batches(opts.data, target.tokenizer, n_seq * window, window, opts.batch_size, split=self.split)
        self.requested = n_seq * seq_len
        self.device = target.device

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        for b in self.inner:
            b = b.to(self.device)
            yield (b[:, :-1], b[:, 1:]) if self.causal else (b, None)

    @property
    def short(self) -> bool:
        return self.inner.short


@logs_to_stderr
def diagnose_in_memory(target: Target, opts: DiagnoseOptions | None = None, command: str | None = None
                       ) -> dict[str, Any]:
    """All diagnostics of ``target``, loaded in memory; returns the report dict (plain numbers, JSON-ready, plus the
    Jacobian matrices under the private key ``_matrices``)."""
    opts = opts or DiagnoseOptions()
    t0 = time.time()
    cap = capture_of(target)
    L = cap.n_layers
    batches = target.batches_for(opts) if target.batches_for is not None else TextBatches(target, opts)
    tuned = opts.tuned_lens and opts.lens and target.causal
    if tuned:
        check_tuned_lens(batches, opts)
    streamed = _stream(cap, batches, target, opts)
    report = _stream_report(streamed, target, opts, batches, command)
    if tuned:
        report["lens"]["tuned"] = _tuned_lens(cap, batches, opts)
    depth_map = _depth_map(cap, batches)
    if depth_map is not None:  # Attention Residuals: which earlier sources each layer reads
        report["depth_attention"] = depth_map
    if opts.mc and target.causal and target.tokenizer is not None:
        report["mc"] = _mc(cap, target, opts, L)
    if opts.jacobian:
        jac = _jacobians(cap, streamed.jac_seqs, batches.seq_len, opts, L)
        report["_matrices"] = jac.pop("matrices")
        report["jacobian"] = jac
    if "removal" in report:
        joint = (lambda skip: joint_removal_loss(cap, batches, skip)) if opts.joint_check else None
        report["removal"]["removable"] = removable_blocks(report["removal"], opts.loss_budget, joint)
    report["summary"] = summary_sentence(report, opts.identity_threshold, opts.loss_budget)
    report["seconds"] = round(time.time() - t0, 2)
    return report


@dataclass
class _Streamed:
    """What one pass over the held-out batches accumulates."""

    angular: AngularAccumulator
    variance: VarianceAccumulator
    removal: RemovalAccumulator | None  # causal LMs with opts.removal
    jac_seqs: list[torch.Tensor] = field(default_factory=list)  # the first jac_samples input rows
    base_loss: float = 0.0  # summed loss when there is no removal sweep (causal LMs)
    base_count: int = 0
    sublayers: SublayerAccumulator | None = None  # causal LMs with opts.sublayers (in memory only)
    lens: LensAccumulator | None = None  # causal LMs with opts.lens (in memory only)


def _stream(cap, batches: TextBatches, target: Target, opts: DiagnoseOptions) -> _Streamed:
    """Per batch: one captured forward, the angular / variance accumulators, the removal sweep (or
    the plain loss); keeps a few input rows for the Jacobians. Raises when the data gave nothing."""
    L = cap.n_layers
    removal = RemovalAccumulator(L) if (opts.removal and target.causal) else None
    acc = _Streamed(AngularAccumulator(L + 1), VarianceAccumulator(L + 1), removal)
    if opts.sublayers and target.causal:
        try:
            check_sublayers(cap.layers)
            acc.sublayers = SublayerAccumulator(L, removal=removal is not None)
        except DepthlabError as err:  # a family whose blocks name their branches otherwise: whole blocks only
            log.info("no attention/MLP units for %s: %s", target.name, err)
    acc.lens = LensAccumulator(L) if (opts.lens and target.causal) else None
    n_batches = -(-(batches.requested // batches.seq_len) // opts.batch_size)
    # the captured forward, one replay per removed block, two per block's sublayers, one head per lens state
    passes = 1 + (L if removal is not None else 0) + (2 * L if acc.sublayers and removal else 0) + (L + 1 if acc.lens else 0)
    desc = "residual stream" + (" + removal sweep" if removal else "") + (" + sublayers" if acc.sublayers else "") + (
        " + logit lens" if acc.lens else "")
    with _tqdm(n_batches * passes, desc, opts.progress, "pass") as bar:
        for x, y in batches:
            logits, states, calls = cap.run(x, keep_calls=True)
            bar.update(1)
            acc.angular.update(states)
            acc.variance.update(states)
            if removal is not None:
                removal.update(cap, x, y, logits, states, on_layer=lambda: bar.update(1))
            if acc.sublayers is not None:
                acc.sublayers.update(cap, x, y, logits, states, calls, on_pass=lambda: bar.update(1))
            if acc.lens is not None:
                acc.lens.update(cap, x, y, logits, states, on_state=lambda: bar.update(1))
            elif target.causal:
                s, n = nll_sum(logits, y)
                acc.base_loss, acc.base_count = acc.base_loss + s, acc.base_count + n
            if len(acc.jac_seqs) < opts.jac_samples:
                acc.jac_seqs.extend(row.detach() for row in x[: opts.jac_samples - len(acc.jac_seqs)])
            del logits, states, calls
    if acc.angular.count == 0:
        raise DepthlabError(f"data {opts.data!r} gave no {batches.split} text to evaluate (empty, or shorter than one "
                            f"sequence of {batches.seq_len + int(target.causal)} tokens)")
    if batches.short:
        log.warning("data %r holds only %d tokens in its %s split (asked for %d): using what there is",
                    opts.data, acc.angular.count, batches.split, opts.tokens)
    return acc


def _stream_report(acc: _Streamed, target: Target, opts: DiagnoseOptions, batches: TextBatches,
                   command: str | None) -> dict[str, Any]:
    """The report's model, data, angular, variance, removal and loss sections."""
    mean = acc.angular.mean()
    L = mean.shape[0] - 1
    report: dict[str, Any] = {
        "model": {"name": target.name, "kind": target.kind, **{k: v for k, v in target.info.items() if k != "config"}},
        "model_config": target.info.get("config"),
        "data": {"spec": opts.data, "split": batches.split, "tokens": acc.angular.count,
                 "tokens_requested": opts.tokens, "short": batches.short, "seq_len": batches.seq_len,
                 "batch_size": opts.batch_size},
        "options": asdict(opts),
        "command": command,
        "angular": {
            "layout": "matrix[n-1][l-1] = d(x^l, x^{l+n}) = mean over tokens of arccos(cos)/pi; "
                      "x^l = input of block l, x^{L+1} = output of block L; null where l+n > L+1",
            "matrix": pair_matrix_to_layout(mean),
            "adjacent": adjacent(mean),  # block l = d(x^l, x^{l+1})
            "to_last": [float(mean[i, L]) for i in range(L)],  # d(x^l, x^{L+1})
        },
        "variance": acc.variance.result(),
    }
    if acc.removal is not None:
        report["removal"] = acc.removal.result()
        r = report["removal"]
        # a classifier (ViT) has a top-1 accuracy, not a perplexity
        report["loss"] = {"loss": r["base_loss"], **({"accuracy": r["base_accuracy"]} if "base_accuracy" in r
                                                     else {"ppl": r["base_ppl"]})}
    elif target.causal and acc.base_count:
        report["loss"] = {"loss": acc.base_loss / acc.base_count, "ppl": perplexity(acc.base_loss / acc.base_count)}
    if acc.sublayers is not None:
        report["sublayers"] = acc.sublayers.result()
    if acc.lens is not None:
        report["lens"] = acc.lens.result()
    return report


def check_tuned_lens(batches: TextBatches, opts: DiagnoseOptions) -> None:
    """The tuned lens fits on the even batches and is measured on the odd ones: at least two, said before any work."""
    n_batches = -(-(batches.requested // batches.seq_len) // opts.batch_size)
    if n_batches < 2:
        raise DepthlabError(f"--tuned-lens fits its maps on half the held-out batches and measures them on the other "
                            f"half: --tokens {opts.tokens} at --batch-size {opts.batch_size} makes {n_batches} batch; "
                            "raise --tokens or lower --batch-size")


def _tuned_lens(cap, batches: TextBatches, opts: DiagnoseOptions) -> dict[str, Any]:
    """The tuned lens (:class:`~depthlab.analysis.diagnostics.lens.TunedLens`) against the plain lens on unseen text."""
    items = list(batches)
    if len(items) < 2:
        raise DepthlabError(f"--tuned-lens needs two held-out batches (one to fit, one to measure); data {opts.data!r} "
                            f"gave {len(items)}")
    with _tqdm(len(items), "tuned lens", opts.progress, "batch") as bar:
        return tuned_lens_compare(cap, items[0::2], items[1::2], cap.n_layers, on_batch=lambda: bar.update(1))


@torch.no_grad()
def _depth_map(cap, batches: TextBatches) -> dict[str, Any] | None:
    """The depth-attention map (:mod:`~depthlab.analysis.diagnostics.depthmap`) over the same held-out batches,
    one more forward each; None (and no forward) for a model without depth readers."""
    acc = DepthMap.of(cap.model)
    if acc is None:
        return None
    with acc.recording():
        for x, _ in batches:
            cap.forward(x)
    return acc.result()


def _mc(cap, target: Target, opts: DiagnoseOptions, L: int) -> dict[str, Any]:
    items = load_mc(opts.mc, opts.mc_limit)
    acc = MCAccumulator(items, L)
    n = sum(len(it.choices) for it in items)
    with _tqdm(n, "multiple choice", opts.progress, "choice") as bar:
        acc.run(cap, target.tokenizer.encode, opts.batch_size, target.device, pad_id=target.tokenizer.pad_id,
                max_len=target.max_seq_len, removal=opts.removal, progress=bar.update,
                prefix_id=target.tokenizer.eos_id)
    out = acc.result()
    out["file"] = str(opts.mc)
    return out


def _jacobians(cap, seqs: list[torch.Tensor], seq_len: int, opts: DiagnoseOptions, L: int) -> dict[str, Any]:
    if not seqs:
        return {"layers": [], "tokens": 0, "per_layer": [], "matrices": {}}
    gen = torch.Generator().manual_seed(opts.seed)
    hi = max(1, min(opts.jac_context, seq_len))
    positions = torch.randint(0, hi, (len(seqs),), generator=gen).tolist()
    layers = opts.jac_layers or list(range(1, L + 1))
    bad = [l for l in layers if not 1 <= l <= L]
    if bad:
        raise DepthlabError(f"--jac-layers {bad} out of range 1..{L}")
    keep = opts.heatmap_layers or sorted({layers[0], layers[len(layers) // 3], layers[(2 * len(layers)) // 3], layers[-1]})
    keep = [l for l in keep if l in layers]
    with _tqdm(len(seqs) * len(layers), "block Jacobians", opts.progress, "jac") as bar:
        out = block_jacobians(cap, seqs, positions, layers, keep=keep, on_step=bar.update)
    out["positions"] = positions
    out["heatmap_layers"] = keep
    return out
