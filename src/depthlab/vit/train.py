"""A small standalone ViT trainer (AdamW + warm-up + cosine), for tests and first measurements.

The project's main trainer (``depthlab.train``) will drive ViTs in a later phase; this one returns what
the paper's Table 5 and Figure 8 need: held-out top-1 accuracy, loss and the variance of each block's output.
"""

from __future__ import annotations

import math
import time

import torch

from depthlab.vit.config import ViTConfig
from depthlab.vit.data import ImageData
from depthlab.vit.model import ViT, build_vit


@torch.no_grad()
def evaluate(model: ViT, data: ImageData, batch_size: int = 512) -> dict:
    """Held-out top-1 accuracy, mean cross-entropy, and each block's output variance (over all held-out
    images, tokens and channels; block l's output is ``hidden_states[l]``)."""
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    sums: list[float] | None = None
    sq: list[float] | None = None
    count = 0
    for i in range(0, len(data.test_y), batch_size):
        x, y = data.test_x[i:i + batch_size], data.test_y[i:i + batch_size]
        out = model(x, labels=y, output_hidden_states=True)
        correct += int((out.logits.argmax(-1) == y).sum())
        loss_sum += float(out.loss) * len(y)
        n += len(y)
        hs = [h.double() for h in out.hidden_states[1:]]
        s, q = [float(h.sum()) for h in hs], [float((h * h).sum()) for h in hs]
        sums = s if sums is None else [a + b for a, b in zip(sums, s)]
        sq = q if sq is None else [a + b for a, b in zip(sq, q)]
        count += hs[0].numel()
    variances = [q / count - (s / count) ** 2 for s, q in zip(sums, sq)]
    model.train()
    return {"accuracy": correct / n, "loss": loss_sum / n, "layer_variance": variances}


def fit(cfg: ViTConfig, data: ImageData, steps: int = 300, lr: float = 1e-3, batch_size: int = 64, seed: int = 0,
        weight_decay: float = 0.05, warmup: int | None = None, clip: float = 1.0) -> dict:
    """Train ``cfg`` on ``data`` for ``steps`` AdamW steps (linear warm-up, cosine decay to 0) and evaluate.

    Returns ``evaluate``'s held-out ``accuracy``, ``loss`` and ``layer_variance`` (one per block), plus
    ``train_loss`` (mean of the last 20 steps), ``seconds`` and the trained ``model``. Weight decay spares
    biases, norms, gains, the class token and the position embeddings."""
    torch.manual_seed(seed)
    model = build_vit(cfg)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "pos_embed" not in n and "cls_token" not in n]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "pos_embed" not in n
                                                               and "cls_token" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.999))
    warmup = max(1, steps // 10) if warmup is None else warmup

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    batches = data.batches(batch_size, seed=seed)
    start, losses = time.perf_counter(), []
    model.train()
    for _ in range(steps):
        x, y = next(batches)
        loss = model(x, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        losses.append(loss.item())
    result = evaluate(model, data)
    result.update(train_loss=sum(losses[-20:]) / len(losses[-20:]), steps=steps, seconds=time.perf_counter() - start,
                  scheme=cfg.scheme, scheme_options=dict(cfg.scheme_options), seed=seed)
    result["model"] = model
    return result
