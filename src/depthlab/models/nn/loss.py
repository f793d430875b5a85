"""The LM head and its cross-entropy in chunks of rows: the (N, V) logits are never whole, forward or backward.

    loss = linear_cross_entropy(x, head.weight, labels)      # == F.cross_entropy(head(x).float(), labels)

``x`` (N, D) is the head's input (the final norm's output), ``weight`` (V, D) the LM head's, ``labels`` (N,) the
targets (``IGNORE_INDEX`` counts in no loss). The plain path materialises the logits at N x V, the largest tensor
of a training step (16,384 tokens x 32,000: 1 GB in bf16, 2 GB in fp32), keeps them for the backward and writes
their gradient at the same size. Here each chunk of ``rows`` rows makes its logits, their log-sum-exp, its loss
*and its gradients* (softmax minus one-hot: dx = g W, dW += gᵀ x) in the forward, and drops its logits before the
next chunk; the backward only scales the saved dx and dW by the incoming gradient (the loss is the last node of the
graph). The FLOPs are the plain path's (three N x D x V matmuls); the memory is one chunk's logits instead of N x V,
and a chunk small enough for the GPU's L2 cache keeps their traffic there (Liger-Kernel's fused linear
cross-entropy, arXiv 2410.10989; ``default_rows``).

Under autocast the matmuls run in the autocast dtype as the plain path's ``Linear`` does (bf16 on a GPU), the
log-sum-exp in fp32, and dW accumulates in fp32 over the chunks. A batch with no counted target gives a NaN loss,
as ``F.cross_entropy`` does, but zero gradients.
"""

from __future__ import annotations

import math

import torch

IGNORE_INDEX = -100  # as depthlab.models.decoder (and transformers)


def default_rows(n_rows: int, vocab: int, d_model: int) -> int:
    """Rows per chunk: ``n_rows / ceil(V / D)`` rounded up to a power of two (Liger-Kernel's rule: one chunk's logits
    about the size of the head's input), so that the chunk's logits stay small beside the step's activations."""
    chunks = max(1, math.ceil(vocab / max(d_model, 1)))
    return max(1, 1 << max(0, math.ceil(math.log2(max(1, math.ceil(n_rows / chunks))))))


class _LinearCrossEntropy(torch.autograd.Function):
    """The forward computes the loss and both gradients chunk by chunk; the backward scales them."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, rows: int,
                ignore_index: int) -> torch.Tensor:
        valid_all = labels != ignore_index
        count = valid_all.sum()
        scale = 1.0 / count.clamp(min=1).to(torch.float32)  # a tensor: no host sync
        loss_sum = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        w = weight if weight.dtype == x.dtype else weight.to(x.dtype)  # under autocast its matmuls cast both
        for start in range(0, x.shape[0], rows):
            xc, lc = x[start:start + rows], labels[start:start + rows]
            valid = valid_all[start:start + rows]
            target = lc.clamp(min=0).unsqueeze(1)  # an ignored label (negative) gathers column 0, masked below
            logits = (xc @ w.t()).float()  # (r, V); under autocast the matmul runs in its dtype, as Linear's does
            lse = torch.logsumexp(logits, dim=1)
            loss_sum = loss_sum + ((lse - logits.gather(1, target).squeeze(1)) * valid).sum()
            weights = valid.to(torch.float32) * scale  # d(mean loss) / d(row loss)
            g = (logits - lse.unsqueeze(1)).exp_().mul_(weights.unsqueeze(1))  # softmax, weighted
            g = g.scatter_add_(1, target, -weights.unsqueeze(1)).to(x.dtype)  # minus the one-hot target
            grad_x[start:start + rows] = g @ w
            grad_w += (g.t() @ xc).float()
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        return loss_sum / count

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x * grad_out, (grad_w * grad_out).to(ctx.weight_dtype), None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, rows: int | None = None,
                         ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Mean cross-entropy of ``x @ weight.T`` against ``labels`` over the counted targets, in chunks of ``rows``
    rows (default :func:`default_rows`); see the module docstring. ``x`` (N, D), ``weight`` (V, D), ``labels`` (N,)."""
    if x.dim() != 2 or labels.shape != x.shape[:1] or weight.shape[1] != x.shape[1]:
        raise ValueError(f"linear_cross_entropy: x (N, D), weight (V, D), labels (N,); got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(labels.shape)}")
    rows = rows or default_rows(x.shape[0], weight.shape[0], weight.shape[1])
    return _LinearCrossEntropy.apply(x, weight, labels, int(rows), ignore_index)
