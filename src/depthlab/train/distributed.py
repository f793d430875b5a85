"""Everything distributed lives here; the model knows nothing of it.

    torchrun --nproc_per_node N -m depthlab train ... --dist ddp|fsdp

``setup`` joins the process group torchrun describes (NCCL on CUDA, gloo on CPU); ``wrap`` puts the
model behind a loss module (so every wrapper sees plain tensors) and applies DDP or FSDP2
(``fully_shard`` per block, then the root); ``grad_sync`` skips the all-reduce on all but the last
micro-step of an accumulated batch (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Iterator, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from depthlab.base.errors import ConfigError


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    mode: str = "none"  # none | ddp | fsdp
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1 or self.mode != "none"


def env_world_size() -> int:
    """The world size torchrun announces (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """True on rank 0 of a torchrun launch, and outside torchrun (the one place ``RANK`` is read
    besides :func:`setup`): for work only one process should do, e.g. drawing a run's figures."""
    return int(os.environ.get("RANK", "0")) == 0


def setup(mode: str, device: torch.device) -> DistEnv:
    """Join the torchrun process group for ``mode`` ("none" runs a single process)."""
    world = env_world_size()
    if mode == "none":
        if world > 1:
            raise ConfigError(f"launched with WORLD_SIZE={world} but --dist none; pass --dist ddp or --dist fsdp")
        return DistEnv()
    if "RANK" not in os.environ:
        raise ConfigError(f"--dist {mode} needs torchrun (e.g. torchrun --nproc_per_node 2 -m depthlab train ...)")
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    here = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
        here = True
    return DistEnv(rank, world, local, mode, here)


def teardown(env: DistEnv) -> None:
    if env.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


class LossOutput(NamedTuple):
    """What :class:`LMLoss` returns: tensors only (a NamedTuple is a pytree DDP/FSDP hooks walk)."""

    loss: torch.Tensor  # mean next-token loss; 0-dim zeros when no labels were given
    hidden_states: tuple[torch.Tensor, ...] = ()  # embedding output, then block 1..L outputs (when asked)
    logits: torch.Tensor | None = None  # (B, T, V), only when asked (the depth probes read them)


class LMLoss(nn.Module):
    """``(input_ids, labels, output_hidden_states) -> LossOutput``: the model behind one plain-tensor
    interface, so every distributed wrapper sees tensors in and tensors out.

    ``chunked_ce``: the training loss from the LM head in chunks of ``ce_rows`` rows
    (:func:`depthlab.models.nn.loss.linear_cross_entropy`; None: its default), the (B, T, V) logits never whole;
    calls that ask for the logits take the plain path. Off by default until a GPU measurement says it is faster
    (benchmarks/train_throughput.py ``+chunkce``; docs/performance.md)."""

    def __init__(self, model: nn.Module, chunked_ce: bool = False, ce_rows: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.chunked_ce, self.ce_rows = chunked_ce, ce_rows

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                output_hidden_states: bool = False, return_logits: bool = False) -> LossOutput:
        if self.chunked_ce and labels is not None and not return_logits:
            from depthlab.models.nn.loss import linear_cross_entropy

            x, hidden = self.model.features(input_ids, output_hidden_states)
            loss = linear_cross_entropy(x.flatten(0, 1), self.model.lm_head.weight, labels.flatten(), self.ce_rows)
            return LossOutput(loss, tuple(hidden or ()), None)
        out = self.model(input_ids, labels=labels, output_hidden_states=output_hidden_states)
        loss = out.loss if out.loss is not None else out.logits.new_zeros(())
        return LossOutput(loss, tuple(out.hidden_states or ()), out.logits if return_logits else None)


def wrap(model: nn.Module, env: DistEnv, device: torch.device, loss: type[nn.Module] | None = None) -> nn.Module:
    """The module the training loop calls: ``loss(model)`` (default LMLoss), under DDP or FSDP2 when distributed."""
    module = (loss or LMLoss)(model)
    if env.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    if env.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(module)
        return module
    return module


@contextlib.contextmanager
def grad_sync(module: nn.Module, env: DistEnv, sync: bool) -> Iterator[None]:
    """Inside: backward all-reduces gradients only when ``sync`` (the last micro-step)."""
    if env.mode == "ddp" and not sync:
        with module.no_sync():
            yield
    elif env.mode == "fsdp":
        module.set_requires_gradient_sync(sync)
        yield
    else:
        yield


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum ``t`` over ranks in place (a CPU tensor goes through the GPU under NCCL)."""
    if env.active and dist.is_initialized():
        if dist.get_backend() == "nccl" and t.device.type != "cuda":
            on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
            t.copy_(on_gpu.cpu())
        else:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(env: DistEnv) -> None:
    """Wait for every rank (no-op in a single process)."""
    if env.active and dist.is_initialized():
        dist.barrier()


def full_state_dicts(module: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer):
    """Full (unsharded, CPU) model and optimizer state dicts, keyed by the model's own names.
    Collective under FSDP: every rank must call it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    return msd, osd


def load_full_state_dicts(module: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer | None, msd: dict,
                          osd: dict | None) -> None:
    """Inverse of :func:`full_state_dicts` (every rank passes the full dicts)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, strict=True)
    set_model_state_dict(model, msd, options=opts)
    if optimizer is not None and osd is not None:
        set_optimizer_state_dict(model, optimizer, osd, options=opts)
