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
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from depthlab.data import IGNORE_INDEX
from depthlab.train import distributed as D
from depthlab.train.config import TrainConfig
from depthlab.train.optim import FUSED_DEVICES, lr_at, set_lr

#: A factory of fresh autocast (or null) contexts, one per forward.
Autocast = Callable[[], contextlib.AbstractContextManager[Any]]


def uses_bf16(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the run's forward runs under bf16 autocast: ``cfg.dtype`` bf16, or auto on CUDA."""
    return cfg.dtype == "bf16" or cfg.weights == "bf16" or (cfg.dtype == "auto" and device.type == "cuda")


def autocast_for(cfg: TrainConfig, device: torch.device) -> Autocast:
    """A factory of the run's autocast context: bf16 when ``cfg.dtype`` says so (``auto``: on CUDA)."""
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if uses_bf16(cfg, device) else contextlib.nullcontext


def execution_plan(cfg: TrainConfig, device: torch.device, compile_auto: bool = False) -> str:
    """How the steps run, for the run's one-line plan, e.g. ``cpu, fp32, eager (auto: 0.6M tokens), fused adam``
    (``compile_auto``: the compile choice was :func:`choose_compile`'s, not the user's)."""
    precision = "bf16 autocast (fp32 weights)" if uses_bf16(cfg, device) else "fp32"
    fused = "fused " if device.type in FUSED_DEVICES else ""
    if cfg.weights == "bf16":
        precision = "bf16 weights, no fp32 copy" + (", linears upcast to fp32" if device.type == "cpu" else
                                                    ", bf16 autocast")
        fused = "stochastic-rounding "
    mode = "compiled" if cfg.compile else "eager"
    if compile_auto:
        tokens = cfg.steps * cfg.batch_size * cfg.seq_len
        mode += f" (auto: {tokens / 1e6:.1f}M tokens; compiled on a CPU from {CPU_COMPILE_TOKENS / 1e6:.0f}M)"
    return f"{device.type}, {precision}, {mode}, {fused}{cfg.optimizer}"


class Forward:
    """``forward(x, y=None, hidden=False, logits=False) -> LossOutput``: the (wrapped) loss module on
    the run's device, under its autocast. Inputs move to the device here.

    ``compiled`` (``torch.compile(module)``, with ``--compile``) serves the training call only: gradients
    on, loss only. Evaluation (no_grad) and the depth probes (hidden states, hooks, patched blocks) run
    the eager module: compiled, each of them would be another graph (a recompile per removed block), and
    the probes' hooks would run inside compiled code."""

    def __init__(self, module: nn.Module, device: torch.device, autocast: Autocast,
                 compiled: Callable[..., D.LossOutput] | None = None) -> None:
        self.module, self.device, self.autocast, self.compiled = module, device, autocast, compiled

    def __call__(self, x: torch.Tensor, y: torch.Tensor | None = None, hidden: bool = False,
                 logits: bool = False) -> D.LossOutput:
        with self.autocast():
            labels = None if y is None else y.to(self.device, non_blocking=True)
            if logits:
                return self.module(x.to(self.device, non_blocking=True), labels, hidden, True)
            train_call = self.compiled is not None and not hidden and torch.is_grad_enabled()
            return (self.compiled if train_call else self.module)(x.to(self.device, non_blocking=True), labels, hidden)

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
#: (benchmarks/README.md). The CUDA default stays eager until a GPU measurement says otherwise.
CPU_COMPILE_TOKENS = 4_000_000


def choose_compile(cfg: TrainConfig, device: torch.device) -> bool:
    """``cfg.compile`` when set; auto (None): on a CPU with a C++ compiler (inductor needs one) for a run of at
    least :data:`CPU_COMPILE_TOKENS` tokens, else eager."""
    if cfg.compile is not None or cfg.weights == "bf16":
        return bool(cfg.compile)
    tokens = (cfg.steps or 0) * (cfg.batch_size or 0) * (cfg.seq_len or 0)
    has_cxx = any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))
    return device.type == "cpu" and tokens >= CPU_COMPILE_TOKENS and has_cxx


def compile_for_training(module: nn.Module) -> Callable[..., D.LossOutput]:
    """``torch.compile(module)`` (inductor): the training call of ``--compile``. The module itself stays
    eager, so its state dict keeps its own names (no ``_orig_mod.`` prefix) and evaluation can use it."""
    return torch.compile(module)


@dataclass(frozen=True)
class StepResult:
    step: int
    loss: float  # mean loss over the global batch's target tokens (non-finite: nothing was updated)
    lr: float
    tokens: int  # target tokens of the global batch
    grad_norm: float | None  # global gradient norm before clipping (only with cfg.grad_clip)


def train_step(step: int, forward: Forward, model: nn.Module, optimizer: torch.optim.Optimizer, train_data: Any,
               cfg: TrainConfig, env: D.DistEnv) -> StepResult:
    """Optimizer step ``step`` (1-based): schedule the lr, accumulate this rank's slice of the global
    batch, clip, update. A non-finite loss drops the gradients, updates nothing and is returned for
    the caller to stop on."""
    lr = lr_at(step - 1, cfg)
    set_lr(optimizer, lr)
    x, y = train_data.rank_batch(step - 1, cfg.batch_size, env.rank, env.world_size)
    loss, n_global = accumulate_gradients(forward, x, y, cfg, env)
    if not math.isfinite(loss):
        optimizer.zero_grad(set_to_none=True)
        return StepResult(step, loss, lr, n_global, None)
    grad_norm = None
    if cfg.grad_clip is not None:
        total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        grad_norm = float(total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return StepResult(step, loss, lr, n_global, grad_norm)


def accumulate_gradients(forward: Forward, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
                         env: D.DistEnv) -> tuple[float, int]:
    """Backward over this rank's micro-batches of ``(x, y)`` so that the summed gradient is that of
    the mean loss over the global batch's target tokens. Returns (that mean loss, the global count)."""
    world, micro = env.world_size, cfg.micro_batch_size
    accum = cfg.accum_steps(world)
    n_global = int(D.all_reduce_sum(torch.tensor((y != IGNORE_INDEX).sum().item(), dtype=torch.int64), env))
    loss_sum = torch.zeros((), dtype=torch.float64)
    for m in range(accum):
        xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
        n_micro = int((ym != IGNORE_INDEX).sum())
        with D.grad_sync(forward.module, env, sync=m == accum - 1):
            loss = forward(xm, ym).loss
            if n_micro == 0:
                loss = loss.nan_to_num(0.0) * 0.0
            # sum of token losses / global token count; x world because DDP/FSDP average over ranks
            (loss * (n_micro * world / max(n_global, 1))).backward()
        loss_sum += loss.detach().double().cpu() * n_micro
    D.all_reduce_sum(loss_sum, env)
    return (loss_sum / max(n_global, 1)).item(), n_global
