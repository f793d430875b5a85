"""The one-sentence verdict: which blocks are near-identity, how many could go for a loss budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from depthlab.base.metrics import perplexity


def ranges(blocks: Sequence[int]) -> str:
    """[1, 2, 3, 7, 9, 10] -> '1-3, 7, 9-10'."""
    out, blocks = [], sorted(blocks)
    i = 0
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
            j += 1
        out.append(str(blocks[i]) if i == j else f"{blocks[i]}-{blocks[j]}")
        i = j + 1
    return ", ".join(out)


def removable_blocks(removal: dict[str, Any], budget: float,
                     joint_loss: Callable[[list[int]], float] | None = None) -> dict[str, Any]:
    """The largest k such that removing the k blocks with the smallest single-removal loss increase
    keeps the loss within ``budget`` nats of the full model. With ``joint_loss`` (loss with a set of
    blocks removed together) k is found by galloping + bisection on the real joint loss (about
    2 log2 k passes, one when no block fits);
    without it, the single-removal increases are summed (an estimate). Blocks whose removal was not measurable
    (None: KV sharing) are never counted removable."""
    base, delta = removal["base_loss"], removal["delta_loss"]
    order = [l for _, l in sorted((d, l) for l, d in enumerate(delta, start=1) if d is not None)]
    if joint_loss is None:
        k, acc = 0, 0.0
        for l in order:
            if acc + max(delta[l - 1], 0.0) > budget:
                break
            acc += max(delta[l - 1], 0.0)
            k += 1
        return {"budget": budget, "k": k, "blocks": sorted(order[:k]), "loss": base + acc, "checked": False}
    cache: dict[int, float] = {0: base}

    def loss(k: int) -> float:
        if k not in cache:
            cache[k] = joint_loss(order[:k])
        return cache[k]

    # gallop up from k = 1 (one pass when nothing fits), then bisect; never remove every block
    top = min(len(order), len(delta) - 1)
    lo, step = 0, 1
    while lo < top and loss(min(lo + step, top)) - base <= budget:
        lo = min(lo + step, top)
        step *= 2
    hi = min(lo + step, top) - 1 if lo < top else lo  # loss(hi + 1) is over budget (or hi = top)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if loss(mid) - base <= budget:
            lo = mid
        else:
            hi = mid - 1
    return {"budget": budget, "k": lo, "blocks": sorted(order[:lo]), "loss": loss(lo), "checked": True,
            "evaluated": {str(k): v for k, v in sorted(cache.items())}}


def summary_sentence(report: dict[str, Any], identity_threshold: float, budget: float) -> str:
    adj = report["angular"]["adjacent"]
    L = len(adj)
    near = [l for l, d in enumerate(adj, start=1) if d < identity_threshold]
    if near:
        first = (f"{len(near)} of {L} blocks are near-identity (adjacent angular distance < {identity_threshold:g}): "
                 f"blocks {ranges(near)}")
    else:
        low = min(range(L), key=lambda i: adj[i])
        first = (f"no block is near-identity (every adjacent angular distance is >= {identity_threshold:g}; "
                 f"the smallest is {adj[low]:.3f} at block {low + 1})")
    rem = report.get("removal", {}).get("removable")
    if rem is None:
        return first + "."
    eff = report.get("effective_depth")
    third = "" if eff is None else (
        f"; effective depth {eff['n']} of {eff['n_layers']} blocks ({100 * eff['share']:.0f} %: their removal costs more "
        f"than {100 * eff['threshold']:g} % of the loss, {eff['threshold_nats']:.3f} nats)")
    base = report["removal"]["base_loss"]
    how = "removed together" if rem["checked"] else "estimated from single removals"
    if rem["k"] == 0:
        d = report["removal"]["delta_loss"]
        cheapest = min((i for i in range(L) if d[i] is not None), key=lambda i: d[i], default=None)
        if cheapest is None:
            return f"{first}; no block's removal could be measured{third}."
        second = (f"no block can be removed within a {budget:g}-nat loss budget (the cheapest, block {cheapest + 1}, "
                  f"costs {d[cheapest]:+.3f} nats)")
    else:
        second = (f"{rem['k']} block{'s' if rem['k'] > 1 else ''} ({ranges(rem['blocks'])}) can be removed within a "
                  f"{budget:g}-nat loss budget ({how}: loss {base:.3f} -> {rem['loss']:.3f}, "
                  f"ppl {perplexity(base):.2f} -> {perplexity(rem['loss']):.2f})")
    return f"{first}; {second}{third}."
