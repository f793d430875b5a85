"""One optimizer step, and the forward call every training and evaluation pass goes through.

    forward = Forward(module, device, autocast_for(cfg, device))
    result = train_step(step, forward, model, optimizer, data.train, cfg, env)   # StepResult

One step = one global batch of ``batch_size`` sequences (global sequences ``(step-1)*B .. step*B-1``
of the seeded order), split across ranks, then into micro-batches. The loss is the mean over every
non-pad target token of the global batch, whatever the split, so a run on N ranks with accumulation
computes the same update as one process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.probes import grad_norm_tensor
from depthlab.data import IGNORE_INDEX
from depthlab.models.nn.norms import lift_constants
from depthlab.targets.layers import find_layers
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.optim import FUSED_DEVICES, lr_at, set_lr, skips_on_device

#: A factory of fresh autocast (or null) contexts, one per forward.
Autocast = Callable[[], contextlib.AbstractContextManager[Any]]


def uses_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the run's forward runs under bf16 autocast: ``cfg.dtype`` bf16, or auto on CUDA."""
    return cfg.dtype == "bf16" or cfg.weights == "bf16" or (cfg.dtype == "auto" and device.type == "cuda")


def autocast_for(cfg: TrainConfig, device: torch.device) -> Autocast:
    """A factory of the run's autocast context: bf16 when ``cfg.dtype`` says so (``auto``: on CUDA)."""
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if uses_bf16(cfg, device) else contextlib.nullcontext


def execution_plan(cfg: TrainConfig, device: torch.device, compile_auto: bool = False, n_params: int = 0) -> str:
    """How the steps run, for the run's one-line plan, e.g. ``cpu, fp32, eager (auto: 0.6M tokens), fused adam``
    (``compile_auto``: the compile choice was :func:`choose_compile`'s, not the user's; ``n_params`` its input)."""
    precision = "bf16 autocast (fp32 weights)" if uses_bf16(cfg, device) else "fp32"
    fused = "fused " if device.type in FUSED_DEVICES else ""
    if cfg.weights == "bf16":
        precision = "bf16 weights, no fp32 copy" + (", linears upcast to fp32" if device.type == "cpu" else
                                                    ", bf16 autocast")
        fused = "stochastic-rounding "
    mode = "compiled" if cfg.compile else "eager"
    if compile_auto:
        tokens = cfg.steps * cfg.batch_size * cfg.seq_len
        if device.type == "cuda":
            mode += (f" (auto: {6.0 * n_params * tokens:.1e} training FLOPs; compiled on CUDA from "
                     f"{CUDA_COMPILE_FLOPS:.0e}, where the compile is repaid: 1.59x eager measured on an H200)")
        else:
            mode += f" (auto: {tokens / 1e6:.1f}M tokens; compiled on a CPU from {CPU_COMPILE_TOKENS / 1e6:.0f}M)"
    optimizer = f"muon + {fused}adamw" if cfg.optimizer == "muon" else f"{fused}{cfg.optimizer}"
    return f"{device.type}, {precision}, {mode}, {optimizer}"


class Forward:
    """``forward(x, y=None, hidden=False, logits=False) -> LossOutput``: the (wrapped) loss module on
    the run's device, under its autocast. Inputs move to the device here (on CUDA through pinned memory, so the
    copy does not make the host wait for the device).

    ``compiled`` (``torch.compile(module)``, with ``--compile``) serves the training call only: gradients
    on, loss only. Evaluation (no_grad) and the depth probes (hidden states, hooks, patched blocks) run
    the eager module: compiled, each of them would be another graph (a recompile per removed block), and
    the probes' hooks would run inside compiled code.

    ``diverged``: a 0-dim flag on the device, 1 once a training loss was NaN/inf (:meth:`flag_nonfinite`);
    :func:`train_step` hands it to a fused optimizer as ``found_inf``."""

    def __init__(self, module: nn.Module, device: torch.device, autocast: Autocast,
                 compiled: Callable[..., D.LossOutput] | None = None) -> None:
        self.module, self.device, self.autocast, self.compiled = module, device, autocast, compiled
        self.diverged: torch.Tensor | None = None

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the run's device; from the CPU to CUDA through pinned memory (an asynchronous copy: a copy from
        pageable memory waits for everything queued on the device before it)."""
        if self.device.type == "cuda" and t.device.type == "cpu":
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def flag_nonfinite(self, loss: torch.Tensor) -> torch.Tensor:
        """Set :attr:`diverged` when ``loss`` is NaN/inf (on the device, no host sync); returns the flag."""
        bad = (~torch.isfinite(loss.detach())).to(torch.float32)
        self.diverged = bad if self.diverged is None else torch.maximum(self.diverged, bad)
        return self.diverged

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None, hidden: bool = False,
                 logits: bool = False) -> D.LossOutput:
        with self.autocast():
            labels = None if y is None else self.to_device(y)
            if logits:
                return self.module(self.to_device(x), labels, hidden, True)
            train_call = self.compiled is not None and not hidden and torch.is_grad_enabled()
            return (self.compiled if train_call else self.module)(self.to_device(x), labels, hidden)

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        """Inside: the module in eval mode; back to train mode after."""
        self.module.eval()
        try:
            yield
        finally:
            self.module.train()


#: ``compile=None`` (auto) compiles on a CPU when the run trains at least this many tokens: the compiled step is
#: 1.1-1.2x the eager one there, and a cold inductor compile costs 60-75 s on a quiet 2-core machine (up to
#: ~430 s on a loaded one), so it is repaid after ~1.5M (quiet) to ~3M (loaded) tokens of `tiny`
#: (benchmarks/README.md).
CPU_COMPILE_TOKENS = 4_000_000
#: ... and on CUDA when the run's training compute (6 x parameters x tokens) is at least this many FLOPs. Measured on
#: an H200 (bf16, llama-130m, seq 1024, 16,384 tokens a step; benchmarks/results/gpu/2026-11-26-h200): compiled
#: 447,785 tokens/s against 281,051 eager (1.59x), the first step compiling for 22-32 s (Pre-LN). The compile is
#: repaid after 30 s / (1/281,051 - 1/447,785 s per token) = 23M tokens of llama-130m, 1.8e16 FLOPs; a larger
#: model saves more per token for a compile that grows more slowly (llama-1b: 44.5 s), so FLOPs, not tokens.
CUDA_COMPILE_FLOPS = 2e16


def has_triton() -> bool:
    """Whether Triton, inductor's compiler for CUDA kernels, is installed."""
    return importlib.util.find_spec("triton") is not None


def choose_compile(cfg: TrainConfig, device: torch.device, n_params: int = 0) -> bool:
    """``cfg.compile`` when set; auto (None): on CUDA with Triton (inductor's GPU compiler) for a run of at least
    :data:`CUDA_COMPILE_FLOPS` training FLOPs (``n_params``: the model's parameter count), on a CPU with a C++
    compiler (inductor's CPU one) for a run of at least :data:`CPU_COMPILE_TOKENS` tokens, else eager (and never with
    bf16 weights)."""
    if cfg.compile is not None or cfg.weights == "bf16":
        return bool(cfg.compile)
    tokens = (cfg.steps or 0) * (cfg.batch_size or 0) * (cfg.seq_len or 0)
    if device.type == "cuda":
        return 6.0 * n_params * tokens >= CUDA_COMPILE_FLOPS and has_triton()
    has_cxx = any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))
    return device.type == "cpu" and tokens >= CPU_COMPILE_TOKENS and has_cxx


def compile_for_training(module: nn.Module, mode: str | None = None) -> Callable[..., D.LossOutput]:
    """``torch.compile(module)`` (inductor): the training call of ``--compile``. The module itself stays
    eager, so its state dict keeps its own names (no ``_orig_mod.`` prefix) and evaluation can use it. ``mode``:
    torch.compile's (``reduce-overhead``: CUDA graphs; benchmarks/train_throughput.py's ``+cudagraphs``).

    Constant scales (LNS's 1/sqrt(l)) are lifted to data first on a CPU only
    (:func:`depthlab.models.nn.norms.lift_constants`): the blocks then share their compiled kernels, so LNS compiles
    as fast as Pre-LN; on an H200 that halved LNS's compile (65 s -> 30 s at llama-130m) but cost 3 % of its
    steady-state throughput (lns/pre 0.970 against 0.998 with the literals; 0.979 at llama-1b;
    benchmarks/results/gpu/2026-11-26-h200-run2), which outweighs 35 s once a run trains for more than ~20
    minutes, so CUDA keeps the literals."""
    first = next(module.parameters(), None)
    if first is None or first.device.type != "cuda":
        lift_constants(module)
    return torch.compile(module, mode=mode)


class StepResult:
    """What one optimizer step returns, its numbers still on the device: ``loss`` and ``grad_norm`` read them (a host
    sync), so a loop that reads them every N steps lets the device run ahead of the host in between."""

    def __init__(self, step: int, loss: torch.Tensor, lr: float, tokens: int, grad_norm: torch.Tensor | None,
                 deferred: bool) -> None:
        self.step, self.lr, self.tokens = step, lr, tokens  # tokens: target tokens of the global batch
        self.loss_t, self.grad_norm_t = loss, grad_norm  # 0-dim, on the device
        self.deferred = deferred  # a non-finite loss already kept this step and every later one from updating
        self.layer_grad_norm_t: torch.Tensor | None = None  # (L,) per-block gradient norms, when asked for

    @property
    def loss(self) -> float:
        """Mean loss over the global batch's target tokens (non-finite: nothing was updated)."""
        return float(self.loss_t)

    @property
    def grad_norm(self) -> float | None:
        """Global gradient norm before clipping (only with cfg.grad_clip)."""
        t = self.grad_norm_t
        return None if t is None else float(t.full_tensor() if hasattr(t, "full_tensor") else t)


def read_results(results: list[StepResult]) -> list[tuple[float, float | None]]:
    """(loss, grad norm) of each step, read from the device in one transfer (one host sync for them all)."""
    if not results:
        return []
    losses = torch.stack([r.loss_t for r in results]).tolist()
    return [(loss, r.grad_norm) for loss, r in zip(losses, results)]


def train_step(step: int, forward: Forward, model: nn.Module, optimizer: torch.optim.Optimizer, train_data: Any,
               cfg: TrainConfig, env: D.DistEnv, layer_grads: bool = False) -> StepResult:
    """Optimizer step ``step`` (1-based): schedule the lr, accumulate this rank's slice of the global
    batch, clip, update. A non-finite loss updates nothing and is returned for the caller to stop on.

    With a fused Adam(W) the host does not wait for the loss: the check runs on the device (the optimizer's
    ``found_inf``, as torch's GradScaler uses it), against a flag that stays set once a loss was non-finite
    (:attr:`Forward.diverged`), so neither that step nor any later one updates the weights before the caller reads
    the losses and stops. Other optimizers read the loss at once, as before.

    ``layer_grads``: keep each block's gradient norm before clipping (``StepResult.layer_grad_norm_t``, on the
    device; the probe steps ask for it)."""
    lr = lr_at(step - 1, cfg)
    set_lr(optimizer, lr)
    x, y = train_data.rank_batch(step - 1, cfg.batch_size, env.rank, env.world_size)
    loss, n_global = accumulate_gradients(forward, x, y, cfg, env)
    deferred = skips_on_device(optimizer)
    if not deferred and not math.isfinite(float(loss)):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(step, loss, lr, n_global, None, False)
    grad_norm = None
    per_layer = grad_norm_tensor(find_layers(model)) if layer_grads else None
    if cfg.grad_clip is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    if deferred:
        optimizer.found_inf = forward.flag_nonfinite(loss)  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    res = StepResult(step, loss, lr, n_global, grad_norm, deferred)
    res.layer_grad_norm_t = per_layer
    return res


def accumulate_gradients(forward: Forward, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
                         env: D.DistEnv) -> tuple[torch.Tensor, int]:
    """Backward over this rank's micro-batches of ``(x, y)`` so that the summed gradient is that of
    the mean loss over the global batch's target tokens. Returns (that mean loss: a 0-dim tensor on the device,
    float64 where the device has it; the global count). No host sync: the counts come from the CPU-side labels."""
    world, micro = env.world_size, cfg.micro_batch_size
    accum = cfg.accum_steps(world)
    n_global = int(D.all_reduce_sum(torch.tensor((y != IGNORE_INDEX).sum().item(), dtype=torch.int64), env))
    loss_sum = torch.zeros((), dtype=torch.float32 if forward.device.type == "mps" else torch.float64,
                           device=forward.device)
    for m in range(accum):
        xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
        n_micro = int((ym != IGNORE_INDEX).sum())
        with D.grad_sync(forward.module, env, sync=m == accum - 1):
            loss = forward(xm, ym).loss
            if n_micro == 0:
                loss = loss.nan_to_num(0.0) * 0.0
            # sum of token losses / global token count; x world because DDP/FSDP average over ranks
            (loss * (n_micro * world / max(n_global, 1))).backward()
        loss_sum += loss.detach().to(loss_sum.dtype) * n_micro
    D.all_reduce_sum(loss_sum, env)
    return loss_sum / max(n_global, 1), n_global
