"""Healing: a short continued training of a pruned model, so the blocks left adapt to the gap.

    losses = heal(pruned, tokenizer, HealOptions(data="builtin", steps=200))

Deliberately small (the project's trainer, ``depthlab.train``, is the place for real training): packed
windows of the *train* split of a depthlab data spec (``builtin``, a file, a directory, a glob,
``hf:NAME``, token shards), AdamW, linear warm-up then constant learning rate, gradient clipping at 1.0,
a progress bar. ``mode="full"`` trains every weight; ``mode="lora"`` trains LoRA adapters on the
attention and MLP projections (needs the PyPI package ``peft``) and merges them back, so the result
is again a plain model.
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

log = logging.getLogger(__name__)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def check_heal(opts: HealOptions) -> None:
    """Refuse bad healing options before anything is computed."""
    opts.validate()
    if opts.mode == "lora" and opts.steps > 0 and importlib.util.find_spec("peft") is None:
        raise needs("--heal lora (or use --heal full)", "lora")


def _with_lora(model: nn.Module, rank: int) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = [t for t in LORA_TARGETS if t in names]
    if not targets:
        raise DepthlabError(f"no LoRA target among the model's linear layers; expected some of {LORA_TARGETS}")
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets))


def heal(model: nn.Module, tokenizer: Any, opts: HealOptions) -> tuple[nn.Module, dict[str, Any]]:
    """Train ``model`` (a depthlab DecoderLM or an HF causal LM) for ``opts.steps`` steps on the train
    split of ``opts.data``. Returns the healed model (LoRA merged) and the loss curve."""
    from depthlab.base.progress import progress
    from depthlab.data import load_sequences

    check_heal(opts)
    if tokenizer is None:
        raise DepthlabError("healing needs the model's tokenizer to read --data; this model has none")
    device = next(model.parameters()).device
    seqs = load_sequences(opts.data, tokenizer, opts.seq_len, split="train", seed=opts.seed)
    torch.manual_seed(opts.seed)
    net = _with_lora(model, opts.lora_rank) if opts.mode == "lora" else model
    params = [p for p in net.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: min(1.0, (s + 1) / max(1, opts.warmup)))
    curve, t0 = [], time.perf_counter()
    net.train()
    with progress(opts.steps, "healing", "step", opts.progress) as bar:  # a bar on a terminal, else ETA lines
        for step in range(opts.steps):
            curve.append(_heal_step(net, params, optim, sched, seqs.rank_batch(step, opts.batch_size), device))
            bar.update(1)
    net.eval()
    if opts.mode == "lora":
        net = net.merge_and_unload()
    wall = time.perf_counter() - t0
    log.info("healed %d steps in %.1f s (train loss %.3f -> %.3f)", opts.steps, wall,
             curve[0] if curve else float("nan"), curve[-1] if curve else float("nan"))
    return net, {"steps": opts.steps, "mode": opts.mode, "lr": opts.lr, "batch_size": opts.batch_size,
                 "seq_len": opts.seq_len, "data": opts.data, "train_loss": curve, "seconds": round(wall, 2)}


def _heal_step(net, params, optim, sched, batch, device) -> float:
    """One healing step on ``batch`` (x, y); its loss."""
    x, y = batch
    logits = lm_logits(net, x.to(device))
    loss = F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), ignore_index=IGNORE_INDEX)
    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optim.step()
    sched.step()
    return float(loss.detach())
