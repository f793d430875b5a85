"""Healing: a short continued training of a pruned model, so the blocks left adapt to the gap.

    losses = heal(pruned, tokenizer, HealOptions(data="builtin", steps=200))

Deliberately small (the project's trainer, ``depthlab.train``, is the place for real training): packed
windows of the *train* split of a depthlab data spec (``builtin``, a file, a directory, a glob,
``hf:NAME``, token shards), AdamW, linear warm-up then constant learning rate, gradient clipping at 1.0,
a progress bar. ``mode="full"`` trains every weight; ``mode="lora"`` trains LoRA adapters on the
attention and MLP projections (needs the PyPI package ``peft``) and merges them back, so the result
is again a plain model.

Memory (LoRA): the base weights stay frozen in the dtype they are held in (bf16 when loaded so), the adapters
and their AdamW state are fp32 (a few MB per block), so nothing the size of the model is added. The loss of an
HF model is taken from its last hidden states through the LM head in chunks of rows, each recomputed in the
backward (:func:`chunked_lm_loss`): the (B, T, V) logits and their gradient never exist at once. Activation
checkpointing (recompute each layer in the backward) is on where it pays (``HealOptions.checkpoint``): when the
activations would outweigh the weights held, so that they, not the model, would set the peak (a small model on
long batches: SmolLM2-135M's 8 x 256 tokens), or take more than a quarter of the free memory; otherwise (an 8B
model on 256 tokens) it would cost a third more compute to save little. While healing, glibc gives freed
activations back to the system (``HealOptions.return_memory``, :func:`depthlab.base.memory.freed_memory_returned`):
without it a CPU heal's peak is what the heap kept (SmolLM2: 3.98 GB against 1.60 GB, for 9.5 s a step against 14.7).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.base.extras import needs
from depthlab.models.decoder import IGNORE_INDEX
from depthlab.prune.export import lm_logits
from depthlab.prune.options import HealOptions
from depthlab.targets.layers import find_layers

log = logging.getLogger(__name__)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def check_heal(opts: HealOptions) -> None:
    """Refuse bad healing options before anything is computed."""
    opts.validate()
    if opts.mode == "lora" and opts.steps > 0 and importlib.util.find_spec("peft") is None:
        raise needs("--heal lora (or use --heal full)", "lora")


HEAD_ROWS = 1024  # token rows per chunk of the LM head in the healing loss


def _with_lora(model: nn.Module, rank: int) -> nn.Module:
    """``model`` with LoRA adapters (fp32, whatever the base weights' dtype) on its projections; the base frozen."""
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = [t for t in LORA_TARGETS if t in names]
    if not targets:
        raise DepthlabError(f"no LoRA target among the model's linear layers; expected some of {LORA_TARGETS}")
    net = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets),
                         autocast_adapter_dtype=True)
    for p in net.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # adapters and their AdamW state in fp32
    return net


def activation_bytes(model: nn.Module, tokens: int, seq_len: int) -> int:
    """An estimate of the activations a training step of ``tokens`` token rows keeps for the backward: per layer
    and row about 12 residual-width and 4 MLP-width tensors, plus the (B, H, T, T) attention weights."""
    cfg = getattr(model, "config", None) or getattr(model, "cfg", None)
    d = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", 0)
    f = getattr(cfg, "intermediate_size", None) or getattr(cfg, "d_ff", None) or 4 * d
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_heads", 1)
    size = 4  # the arithmetic is fp32 unless the weights compute in bf16 themselves
    per_layer = tokens * (12 * d + 4 * f) * size + 2 * tokens * heads * seq_len * size
    return per_layer * len(find_layers(model))


def weight_bytes(model: nn.Module) -> int:
    """The bytes the model's parameters take as held (tied weights once)."""
    return sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())


def checkpoint_pays(need: int, weights: int, free: int | None) -> bool:
    """Whether recomputing activations in the backward pays: when the ``need`` bytes of activations would outweigh
    the ``weights`` held (they would set the peak) or take more than a quarter of the ``free`` memory."""
    return need > weights or (free is not None and need > free / 4)


def _checkpointing(model: nn.Module, opts: HealOptions) -> bool:
    """Turn activation checkpointing on where it pays (``opts.checkpoint``; None: :func:`checkpoint_pays`);
    returns whether it is on."""
    from depthlab.targets.engine import available_memory

    want, weights = opts.checkpoint, weight_bytes(model)
    need = activation_bytes(model, opts.batch_size * opts.seq_len, opts.seq_len)
    if want is None:
        want = checkpoint_pays(need, weights, available_memory(next(model.parameters()).device))
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x; before: gradient_...
    if want and not callable(enable) and not callable(getattr(model, "gradient_checkpointing_enable", None)):
        log.info("activation checkpointing: %s has none; healing without it", type(model).__name__)
        return False
    if want and callable(enable):
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif want:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    log.info("activation checkpointing %s (activations estimated at %.2f GiB, weights %.2f GiB)", "on" if want else "off",
             need / 2**30, weights / 2**30)
    return bool(want)


def heal(model: nn.Module, tokenizer: Any, opts: HealOptions) -> tuple[nn.Module, dict[str, Any]]:
    """Train ``model`` (a depthlab DecoderLM or an HF causal LM) for ``opts.steps`` steps on the train
    split of ``opts.data``. Returns the healed model (LoRA merged) and the loss curve."""
    from depthlab.base.memory import freed_memory_returned
    from depthlab.base.progress import progress
    from depthlab.data import load_sequences

    check_heal(opts)
    if tokenizer is None:
        raise DepthlabError("healing needs the model's tokenizer to read --data; this model has none")
    device = next(model.parameters()).device
    seqs = load_sequences(opts.data, tokenizer, opts.seq_len, split="train", seed=opts.seed)
    torch.manual_seed(opts.seed)
    checkpointing = _checkpointing(model, opts)
    net = _with_lora(model, opts.lora_rank) if opts.mode == "lora" else model
    params = [p for p in net.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / max(1, opts.warmup)))
    curve, t0 = [], time.perf_counter()
    net.train()
    with progress(opts.steps, "healing", "step", opts.progress) as bar, freed_memory_returned(opts.return_memory):
        for step in range(opts.steps):  # a bar on a terminal (else ETA lines); freed activations back to the system
            curve.append(_heal_step(net, params, optim, sched, seqs.rank_batch(step, opts.batch_size), device))
            bar.update(1)
    net.eval()
    if checkpointing:
        (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    trained = sum(p.numel() for p in params)
    if opts.mode == "lora":
        net = net.merge_and_unload()
    wall = time.perf_counter() - t0
    log.info("healed %d steps in %.1f s (train loss %.3f -> %.3f)", opts.steps, wall,
             curve[0] if curve else float("nan"), curve[-1] if curve else float("nan"))
    return net, {"steps": opts.steps, "mode": opts.mode, "lr": opts.lr, "batch_size": opts.batch_size,
                 "seq_len": opts.seq_len, "data": opts.data, "train_loss": curve, "seconds": round(wall, 2),
                 "trained_params": trained, "weights_dtype": _dtype_name(net), "activation_checkpointing": checkpointing}


def _dtype_name(model: nn.Module) -> str:
    return str(next(model.parameters()).dtype).replace("torch.", "")


def _heal_step(net, params, optim, sched, batch, device) -> float:
    """One healing step on ``batch`` (x, y); its loss."""
    x, y = batch
    loss = lm_loss(net, x.to(device), y.to(device))
    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optim.step()
    sched.step()
    return float(loss.detach())


def lm_loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``net`` (a depthlab DecoderLM or an HF causal LM, maybe LoRA-wrapped) on
    ``x`` against ``y``: an HF model through :func:`chunked_lm_loss`, a depthlab one from its logits."""
    base = net.get_base_model() if callable(getattr(net, "get_base_model", None)) else net
    head = base.get_output_embeddings() if callable(getattr(base, "get_output_embeddings", None)) else None
    decoder = getattr(base, getattr(base, "base_model_prefix", ""), None)
    if head is None or not isinstance(decoder, nn.Module):
        logits = lm_logits(net, x)
        return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE_INDEX)
    hidden = decoder(input_ids=x, use_cache=False).last_hidden_state  # final norm applied, as the head reads it
    return chunked_lm_loss(hidden, head, y)


def chunked_lm_loss(hidden: torch.Tensor, head: nn.Module, y: torch.Tensor, rows: int = HEAD_ROWS) -> torch.Tensor:
    """Mean cross-entropy (fp32) of ``head(hidden)`` against ``y``, ``rows`` token rows at a time, each chunk's
    logits recomputed in the backward instead of kept (the same value as the whole (B, T, V) at once)."""
    from torch.utils.checkpoint import checkpoint

    h, t = hidden.flatten(0, 1), y.flatten()
    count = (t != IGNORE_INDEX).sum().clamp(min=1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(0, h.shape[0], rows):
        total = total + checkpoint(_nll_sum, h[i:i + rows], t[i:i + rows], head, use_reentrant=False)
    return total / count


def _nll_sum(h: torch.Tensor, t: torch.Tensor, head: nn.Module) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), t, ignore_index=IGNORE_INDEX, reduction="sum")
