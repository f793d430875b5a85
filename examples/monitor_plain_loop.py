"""Depth tracking in a plain PyTorch loop: a nanoGPT-style GPT (written here, ~50 lines) trained on
depthlab's built-in corpus, probed with ``depthlab.analysis.monitor.DepthMonitor``.

    python examples/monitor_plain_loop.py                         # CPU: well under a minute
    python examples/monitor_plain_loop.py --layers 12 --steps 2000 --every 100 --out runs/gpt-monitor

The monitor knows nothing of this model: ``layers="transformer.h"`` names its block list (nanoGPT's
layout; a ModuleDict such as torchtitan's ``layers`` works too), and the logits are read from the
model's ``(logits, loss)`` output. Each probe's scalars go wherever the loop logs (here: a JSON-lines
file; ``wandb.log(scalars, step=step)`` or a TensorBoard writer take them as they are), and
``monitor.write_figure`` draws the block × step heatmap at the end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from depthlab.data import build_tokenizer, eval_token_batches, load_sequences


class Block(nn.Module):
    """x + attn(ln_1(x)), then + mlp(ln_2(x)): a Pre-LN GPT-2 block."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.c_proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's layout: ``transformer.{wte, wpe, h, ln_f}`` and ``lm_head``; forward -> (logits, loss)."""

    def __init__(self, vocab: int, block_size: int, layers: int, d: int, heads: int) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block_size, d),
            h=nn.ModuleList(Block(d, heads) for _ in range(layers)), ln_f=nn.LayerNorm(d)))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in t.h:
            x = block(x)
        logits = self.lm_head(t.ln_f(x))  # (B, T, V)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--every", type=int, default=10, help="optimizer steps between depth probes")
    p.add_argument("--probe-rows", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/plain_loop_monitor")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> tuple[GPT, object]:
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(a.seed)
    tok = build_tokenizer("bytes")
    data = torch.as_tensor(load_sequences("builtin", tok, a.seq_len, split="train", seed=a.seed).rows, dtype=torch.long)
    held_out = eval_token_batches("builtin", tok, a.probe_rows * (a.seq_len + 1), a.seq_len + 1, a.probe_rows)
    model = GPT(tok.vocab_size, a.seq_len, a.layers, a.hidden, a.heads)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    steps, probe_every, log_file = a.steps, a.every, (out / "depth.jsonl").open("w")

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = data[torch.randint(len(data), (a.batch,))]
        return rows[:, :-1], rows[:, 1:]

    def log(step: int, scalars: dict[str, float]) -> None:
        log_file.write(json.dumps({"step": step, **scalars}) + "\n")

    # readme:start plain-loop
    from depthlab.analysis.monitor import DepthMonitor

    probe_ids = next(iter(held_out))                      # a fixed held-out batch of token ids, (B, T + 1)
    monitor = DepthMonitor(model, probe_ids, every=probe_every, layers="transformer.h")
    log(0, monitor.step(0))                               # before training
    for step in range(1, steps + 1):
        x, y = batch(step)
        logits, loss = model(x, y)
        loss.backward()
        opt.step()
        monitor.record_grads()                            # optional: keeps each block's gradient norm for the probe
        opt.zero_grad(set_to_none=True)
        scalars = monitor.step(step, last=step == steps)  # None, or {"depth/angular/block_01": ..., ...}
        if scalars:
            log(step, scalars)                            # e.g. wandb.log(scalars, step=step)
    monitor.write_figure(out / "depth_tracking.png")      # block x step heatmaps
    # readme:end

    log_file.close()
    return model, monitor


if __name__ == "__main__":
    _, m = main()
    last = m.records[-1]
    print(f"{len(m.records)} probes in {m.seconds:.1f}s; step {last['step']}: angular distance per block "
          + " ".join(f"{v:.3f}" for v in last["layer_angular"]))
