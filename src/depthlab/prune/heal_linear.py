"""``--heal linear``: each removed span of blocks replaced by a linear map fitted by least squares, folded into the
kept weights (ReplaceMe, Shopkhoev et al., arXiv 2505.02819): no training, no new parameter, a plain checkpoint of the
same family.

    maps = fit_in_memory(capture, calibration, spans([9, 10, 11]), HealOptions(mode="linear"))  # on the original
    pruned = drop_layers(model, [9, 10, 11]); fold_maps(find_layers(pruned), maps, [9, 10, 11])

For a span of removed blocks a..b (1-based) and p = a − 1, the last kept block before it, on calibration tokens:

    mid = x^p + attn_p(x^p)      block p's output with its MLP branch zeroed
    M   = x^a − mid              block p's MLP output: what its down projection writes into the stream
    R   = x^{b+1} − mid          what block p's MLP and the span add together on top of mid

T = argmin ‖M T − R‖² + λ‖T − I‖² (λ = 1e-6 · tr(MᵀM)/d keeps it defined on few tokens). In the pruned model block p
outputs mid + M T ≈ x^{b+1}, and M T = h W_downᵀ T = h (Tᵀ W_down)ᵀ, so W_down ← Tᵀ W_down (and a bias b ← Tᵀ b):
block p's down projection carries the span. Forms (``--heal-linear``): ``full`` (d × d), ``diagonal`` (one gain per
coordinate), ``lowrank`` (I + U Vᵀ of rank ``--heal-linear-rank``: the truncated SVD of the full solution's T − I).
The statistics are MᵀM and MᵀR in float64, 2·d² numbers per span (268 MB at d = 4096), summed one batch at a time;
the streamed engine gathers them in one sweep of the original over the calibration tokens
(:class:`LinearConsumer`: block p re-run on its input while it is loaded, R once the span's output is known).

What cannot be folded is refused before any work (:func:`check_linear`): a span starting at block 1 (no kept block
before it; ``--remove`` / ``--budget`` then choose among sets that keep block 1), a block p with no single MLP down
projection (an MoE block) or whose MLP output is normalised before the residual add (Gemma, OLMo 2:
``post_feedforward_layernorm``), a depthlab run (heal it with ``--heal lora``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.prune.options import HealOptions
from depthlab.prune.projections import output_projection
from depthlab.targets.branches import branch_ends, zeroed

log = logging.getLogger(__name__)

RIDGE = 1e-6  # λ relative to the mean of diag(MᵀM)
#: Modules that normalise a block's MLP output before the residual add: a map on the stream cannot be folded through.
OUTPUT_NORMS = ("post_feedforward_layernorm",)


def spans(removed: Sequence[int]) -> list[tuple[int, int]]:
    """The maximal runs (a, b) of consecutive removed blocks (1-based, inclusive), in order."""
    out: list[tuple[int, int]] = []
    for b in sorted(removed):
        if out and out[-1][1] == b - 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def first_block_rule(blocks: Sequence[int]) -> str | None:
    """The selection's rule under ``--heal linear``: block 1 stays (a span starting there has no block to fold into)."""
    return ("--heal linear folds each removed span into the kept block before it, and block 1 has none"
            if 1 in blocks else None)


def check_linear(target: Any, layers: Sequence[nn.Module], blocks: Sequence[int] | None) -> None:
    """Refuse, before any work, what ``--heal linear`` cannot fold: a depthlab run, blocks whose MLP is not one down
    projection or is normalised after it; with ``--blocks``, a span starting at block 1."""
    if getattr(target, "kind", "hf-causal-lm") != "hf-causal-lm":
        raise DepthlabError("--heal linear folds its maps into a Hugging Face model's down projections; heal a depthlab "
                            "run with --heal lora (or export it first: depthlab export)")
    for i, layer in enumerate(layers, start=1):
        norm = next((n for n in OUTPUT_NORMS if isinstance(getattr(layer, n, None), nn.Module)), None)
        if norm is not None:
            raise DepthlabError(f"--heal linear: block {i} normalises its MLP output ({norm}) before the residual add, "
                                "so a linear map on the stream cannot be folded into its down projection; use --heal lora")
        try:
            output_projection(layer, "mlp")
        except DepthlabError:
            raise DepthlabError(f"--heal linear: block {i} ({type(layer).__name__}) has no single MLP down projection "
                                "(an MoE block?) to fold a map into; use --heal lora") from None
    if blocks is not None and 1 in blocks:
        first = spans(blocks)[0]
        raise DepthlabError(f"--heal linear: the removed span {first[0]}..{first[1]} starts at block 1, so no kept block "
                            "before it can carry its map; keep block 1")


class SpanFit:
    """Per span: Σ MᵀM and Σ MᵀR (float64), added one batch of calibration tokens at a time."""

    def __init__(self, span_list: Sequence[tuple[int, int]]) -> None:
        self.spans = list(span_list)
        self.A: dict[int, torch.Tensor] = {}
        self.B: dict[int, torch.Tensor] = {}
        self.tokens = 0

    def add(self, k: int, M: torch.Tensor, R: torch.Tensor) -> None:
        """Span k's rows: M and R (..., d)."""
        M, R = M.reshape(-1, M.shape[-1]).double(), R.reshape(-1, R.shape[-1]).double()
        if k not in self.A:
            d = M.shape[1]
            self.A[k] = torch.zeros(d, d, dtype=torch.float64, device=M.device)
            self.B[k] = torch.zeros(d, d, dtype=torch.float64, device=M.device)
        self.A[k] += M.T @ M
        self.B[k] += M.T @ R

    def solve(self, form: str = "full", rank: int = 64) -> dict[int, torch.Tensor]:
        """{span index: T (d × d, float64)} in ``form`` (see the module docstring)."""
        out = {}
        for k in range(len(self.spans)):
            A, B = self.A[k], self.B[k]
            d = A.shape[0]
            lam = RIDGE * float(torch.diagonal(A).mean()) + 1e-12
            eye = torch.eye(d, dtype=A.dtype, device=A.device)
            if form == "diagonal":
                out[k] = torch.diag((torch.diagonal(B) + lam) / (torch.diagonal(A) + lam))
                continue
            T = torch.linalg.solve(A + lam * eye, B + lam * eye)
            if form == "lowrank":
                U, S, Vh = torch.linalg.svd(T - eye)
                r = min(rank, d)
                T = eye + (U[:, :r] * S[:r]) @ Vh[:r]
            out[k] = T
        return out

    def relative_error(self, k: int, T: torch.Tensor, rr: float) -> float:
        """‖M T − R‖² / ‖R‖² on the calibration tokens (``rr`` = Σ‖R‖²), from the sums alone."""
        A, B = self.A[k], self.B[k]
        err = float(torch.trace(T.T @ A @ T) - 2 * torch.trace(T.T @ B)) + rr
        return err / max(rr, 1e-30)

    def state_dict(self) -> dict[str, Any]:
        return {"A": self.A, "B": self.B, "tokens": self.tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.A, self.B, self.tokens = dict(state["A"]), dict(state["B"]), int(state["tokens"])


def span_terms(layer: nn.Module, call: Any, x_p: torch.Tensor, x_a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mid, M) of kept block p: its output with the MLP branch zeroed, and its MLP output x^a − mid."""
    with torch.no_grad(), zeroed(branch_ends(layer)[1]):
        mid = call(layer, x_p)
    return mid, x_a - mid


@torch.no_grad()
def fit_in_memory(cap: Any, batches: Any, span_list: Sequence[tuple[int, int]]) -> tuple[SpanFit, dict[int, float]]:
    """The statistics of every span over ``batches`` (one captured forward each); also Σ‖R‖² per span."""
    fit, rr = SpanFit(span_list), dict.fromkeys(range(len(span_list)), 0.0)
    for x, _ in batches:
        _, states, calls = cap.run(x, keep_calls=True)
        for k, (a, b) in enumerate(span_list):
            p = a - 1
            mid, M = span_terms(cap.layers[p - 1], calls[p - 1], states[p - 1], states[a - 1])
            R = states[b] - mid
            fit.add(k, M, R)
            rr[k] += float(R.double().pow(2).sum())
        fit.tokens += x.numel()
        del states, calls
    return fit, rr


@torch.no_grad()
def fold(layer: nn.Module, T: torch.Tensor) -> None:
    """W_down ← Tᵀ W_down (and b ← Tᵀ b) of ``layer``'s MLP, in place, in its own dtype."""
    proj = output_projection(layer, "mlp")
    Tt = T.T.to(torch.float64)
    proj.weight.copy_((Tt @ proj.weight.double()).to(proj.weight.dtype))
    if proj.bias is not None:
        proj.bias.copy_((Tt @ proj.bias.double()).to(proj.bias.dtype))


def kept_index(p: int, removed: Sequence[int]) -> int:
    """Block p's 1-based number in the pruned model."""
    return p - sum(1 for r in removed if r < p)


def calibration(target: Any, opts: HealOptions, seq_len: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``opts.calib_tokens`` tokens of the train split of ``opts.data`` in batches (the fit's calibration set)."""
    from depthlab.data import load_sequences

    seqs = load_sequences(opts.data, target.tokenizer, seq_len, split="train", seed=opts.seed)
    rows, out = max(1, -(-opts.calib_tokens // seq_len)), []
    for i in range(-(-rows // batch_size)):
        x, y = seqs.rank_batch(i, batch_size)
        n = min(batch_size, rows - i * batch_size)  # the last batch: only the rows still wanted
        out.append((x[:n], y[:n]))
    return out


def record(fit: SpanFit, maps: dict[int, torch.Tensor], rr: dict[int, float], opts: HealOptions, seconds: float
           ) -> dict[str, Any]:
    """The heal's record (prune.json's ``heal``)."""
    return {"mode": "linear", "form": opts.linear, "rank": opts.linear_rank if opts.linear == "lowrank" else None,
            "spans": [list(s) for s in fit.spans], "fold": [a - 1 for a, _ in fit.spans],
            "calibration_tokens": fit.tokens, "data": opts.data, "ridge": RIDGE,
            "relative_error": [fit.relative_error(k, maps[k], rr[k]) for k in range(len(fit.spans))],
            "identity_error": [fit.relative_error(k, torch.eye(maps[k].shape[0], dtype=torch.float64), rr[k])
                               for k in range(len(fit.spans))],
            "seconds": round(seconds, 2), "trained_params": 0}


def heal_in_memory(target: Any, cap: Any, removed: Sequence[int], opts: Any) -> tuple[dict[int, torch.Tensor], Any]:
    """Fit every span's map on the original (before the surgery); returns the maps and a finisher that folds them
    into the pruned model (``finish(pruned_layers) -> heal record``)."""
    t0 = time.perf_counter()
    span_list = spans(removed)
    data = calibration(target, opts.heal, opts.seq_len, opts.batch_size)
    fit, rr = fit_in_memory(cap, data, span_list)
    maps = fit.solve(opts.heal.linear, opts.heal.linear_rank)
    fitted = time.perf_counter() - t0

    def finish(layers: Sequence[nn.Module]) -> dict[str, Any]:
        t1 = time.perf_counter()
        for k, (a, _) in enumerate(span_list):
            fold(layers[kept_index(a - 1, removed) - 1], maps[k])
        info = record(fit, maps, rr, opts.heal, fitted + time.perf_counter() - t1)
        log.info("linear heal: %d span(s) fitted on %d tokens, relative error %s (identity: %s) in %.1f s",
                 len(span_list), fit.tokens, [f"{e:.3f}" for e in info["relative_error"]],
                 [f"{e:.3f}" for e in info["identity_error"]], info["seconds"])
        return info
    return maps, finish


# ---------------------------------------------------------------------------------------------- streamed
class LinearConsumer:
    """The statistics of every span from one sweep of the original over the calibration batches: block p re-run on
    x^p while it is loaded (the layer tap: mid, M), R from the span's output once the states are in (at the head)."""

    def __init__(self, span_list: Sequence[tuple[int, int]]) -> None:
        self.fit = SpanFit(span_list)
        self.rr = dict.fromkeys(range(len(span_list)), 0.0)
        self.mid: dict[tuple[int, int], torch.Tensor] = {}  # (batch, span) -> block p's output without its MLP

    def logits(self, lane: int, index: int, batch: Any, logits: torch.Tensor) -> None:
        pass

    def layer(self, j: int, index: int, batch: Any, layer: nn.Module, call: Any, x: torch.Tensor,
              out: torch.Tensor) -> None:
        for k, (a, _) in enumerate(self.fit.spans):
            if a - 1 == j:
                self.mid[(index, k)], _ = span_terms(layer, call, x, out)

    def states(self, index: int, batch: Any, states: list[torch.Tensor]) -> None:
        for k, (a, b) in enumerate(self.fit.spans):
            mid = self.mid.pop((index, k))
            R = states[b] - mid
            self.fit.add(k, states[a - 1] - mid, R)
            self.rr[k] += float(R.double().pow(2).sum())
        self.fit.tokens += batch.ids.numel()

    def state_dict(self) -> dict[str, Any]:
        return {"fit": self.fit.state_dict(), "rr": self.rr, "mid": self.mid}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fit.load_state_dict(state["fit"])
        self.rr, self.mid = dict(state["rr"]), dict(state["mid"])


def heal_streamed(target: Any, removed: Sequence[int], opts: Any, settings: Any
                  ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Fit every span's map on the streamed original (one sweep over the calibration tokens); returns the kept blocks'
    down projections with their maps folded in ({checkpoint key: tensor in its stored dtype}, what the shard writer
    writes in their place) and the heal record."""
    from safetensors import safe_open

    from depthlab.targets.stream.lanes import Lane
    from depthlab.targets.stream.sweep import SweepBatch, Sweeper, Taps

    t0 = time.perf_counter()
    span_list = spans(removed)
    consumer = LinearConsumer(span_list)
    data = [SweepBatch(x, y) for x, y in calibration(target, opts.heal, opts.seq_len, opts.batch_size)]
    Sweeper(target, settings).sweep("linear-heal", data, [Lane("base")], True, consumer,
                                    taps=Taps(layer=consumer.layer))
    maps = consumer.fit.solve(opts.heal.linear, opts.heal.linear_rank)
    src, replace = target.source, {}
    for k, (a, _) in enumerate(span_list):
        Tt = maps[k].T
        for key in src.keys_of(output_projection(src.layers[a - 2], "mlp")):
            with safe_open(str(src.store.index[key].file), "pt") as f:
                w = f.get_tensor(key)
            replace[key] = (Tt @ w.double()).to(w.dtype).contiguous()
    return replace, record(consumer.fit, maps, consumer.rr, opts.heal, time.perf_counter() - t0)
