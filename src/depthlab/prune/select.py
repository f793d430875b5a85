"""Which blocks to remove: four ways to choose, each from held-out text read once per batch.

    survey = survey_model(cap, batches)                        # loss, all-pairs angular matrix, block influence
    removed = angular_block(survey.angular, n)                 # Gromov et al. 2024
    removed = lowest_influence(survey.influence, n)            # ShortGPT
    path = greedy_removal(cap, batches, n=6)                   # SLEB-style greedy, re-measured after each removal

Block numbers are 1-based positions in the model given (block l reads the residual state x^l).

Methods and their sources:

- ``removal``: greedy, SLEB-style (Song et al. 2024, "SLEB: Streamlining LLMs through Redundancy
  Verification and Elimination of Transformer Blocks"): remove the block whose removal costs least on
  held-out text, re-measure with it gone, repeat. depthlab scores a candidate by held-out next-token
  loss (SLEB uses perplexity: the same order). Each step caches the residual states of the model as
  pruned so far, so trying block m recomputes only the blocks after m.
- ``angular-block``: Gromov et al. 2024, "The Unreasonable Ineffectiveness of the Deeper Layers":
  for n blocks, the contiguous run l..l+n-1 minimising d(x^l, x^{l+n}) = arccos(cos)/pi. The paper
  measures the angle at the last token of each sequence; depthlab averages it over every held-out
  token (the matrix :mod:`depthlab.analysis.diagnostics.angular` computes). Ties go to the deeper run.
- ``influence``: ShortGPT's Block Influence (Men et al. 2024, "ShortGPT: Layers in Large Language
  Models are More Redundant Than You Expect"): BI_l = 1 - E_tokens cos(x^l, x^{l+1}); the n blocks
  with the lowest BI go. Accumulated as per-block sums, batch by batch: memory does not grow with
  the number of tokens.
- ``--blocks``: the user's own choice.

Blocks a model's config cannot lose (``allowed``, from the family registry's config limits: Gemma 4 with KV sharing
cannot lose a block whose keys and values later blocks reuse, nor leave a sliding-attention block last) are never
candidates: every method picks only sets the export can write (:func:`block_limits`), and a request no such set
meets is refused in one line before any pass over data (:func:`check_removable`).

``--budget NATS``: the most blocks whose joint removal keeps the held-out loss within NATS of the
full model's (for ``removal`` the greedy path stops at the first step over budget; for the others the
k-th choice is checked jointly, by galloping and bisection over k).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from depthlab.analysis.diagnostics.angular import AngularAccumulator
from depthlab.analysis.diagnostics.capture import ResidualCapture
from depthlab.analysis.diagnostics.removal import joint_removal_loss, nll_sum
from depthlab.base.errors import DepthlabError, choices
from depthlab.models.decoder import IGNORE_INDEX
from depthlab.prune.options import METHODS
from depthlab.prune.options import check_blocks as _check_blocks

log = logging.getLogger(__name__)

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]
#: Why the 1-based blocks given cannot go together (one line), or None when they can.
Allowed = Callable[[Sequence[int]], "str | None"]


def block_limits(config: Any, tower: str = "language") -> Allowed | None:
    """What an HF model's config lets go (the family registry's config limits, as data; ``tower``: of an image-text
    wrapper, with the wrapper's own limits), None for no config."""
    if config is None:
        return None
    from depthlab.hf.wrappers import tower_limit

    return lambda blocks: tower_limit(config, tower, "prune", sorted(blocks))


def _ok(allowed: Allowed | None, blocks: Iterable[int]) -> bool:
    return allowed is None or allowed(sorted(blocks)) is None


def most_removable(n_layers: int, allowed: Allowed | None) -> list[int]:
    """A largest set of blocks that can go together, as far as greedy passes find it (each block in turn, first to
    last, then last to first, joining when the set stays allowed, in passes until one adds none: a KV producer can
    go once its consumers have; at most L - 1)."""
    best: list[int] = []
    for order in (range(1, n_layers + 1), range(n_layers, 0, -1)):
        chosen: list[int] = []
        grew = True
        while grew:
            grew = False
            for b in order:
                if len(chosen) < n_layers - 1 and b not in chosen and _ok(allowed, [*chosen, b]):
                    chosen.append(b)
                    grew = True
        best = max(best, sorted(chosen), key=len)
    return best


def _longest_run(n_layers: int, allowed: Allowed | None) -> int:
    """The most consecutive blocks that can go together (angular-block removes a run)."""
    return max((n for n in range(1, n_layers) for l in range(1, n_layers - n + 2)
                if _ok(allowed, range(l, l + n))), default=0)


def check_removable(method: str, remove: int | None, n_layers: int, allowed: Allowed | None) -> None:
    """Before any pass over data: one line when this model's config cannot lose ``remove`` blocks chosen by
    ``method`` (angular-block: that many consecutive ones), naming the blocks that cannot go and why."""
    if allowed is None or remove is None:
        return
    most = _longest_run(n_layers, allowed) if method == "angular-block" else len(most_removable(n_layers, allowed))
    if remove <= most:
        return
    alone = {b: allowed([b]) for b in range(1, n_layers + 1)}
    why = "; ".join(dict.fromkeys(w for w in alone.values() if w is not None)) \
        or allowed(range(n_layers - remove + 1, n_layers + 1))
    what = "consecutive blocks" if method == "angular-block" else "blocks"
    raise DepthlabError(f"--remove {remove} --method {method}: this model's config lets at most {most} {what} of "
                        f"{n_layers} go together ({why}); ask for fewer, or choose --blocks")


class InfluenceAccumulator:
    """ShortGPT Block Influence: running sums of cos(x^l, x^{l+1}) per block, one row of tokens at a time."""

    def __init__(self, n_layers: int) -> None:
        self.sum = torch.zeros(n_layers, dtype=torch.float64)
        self.count = 0

    @torch.no_grad()
    def update(self, states: Sequence[torch.Tensor]) -> None:
        for l in range(len(states) - 1):
            cos = F.cosine_similarity(states[l].float(), states[l + 1].float(), dim=-1)  # (B, T)
            self.sum[l] += cos.sum(dtype=torch.float64).cpu()
        self.count += states[0].shape[0] * states[0].shape[1]

    def result(self) -> list[float]:
        """BI_l = 1 - mean cos(x^l, x^{l+1}), l = 1..L."""
        if self.count == 0:
            raise ValueError("no tokens were added")
        return [1.0 - float(s) / self.count for s in self.sum]


@dataclass
class Survey:
    """One pass of a model over held-out text."""

    loss: float  # mean next-token loss
    tokens: int
    angular: torch.Tensor  # (L+1, L+1) mean arccos(cos)/pi between states
    influence: list[float]  # BI_l, l = 1..L


@torch.no_grad()
def survey_model(cap: ResidualCapture, batches: Batches, on_batch: Callable[[int], None] | None = None) -> Survey:
    """Loss, all-pairs angular distance and block influence of the model, in one streaming pass."""
    angular = AngularAccumulator(cap.n_layers + 1)
    influence = InfluenceAccumulator(cap.n_layers)
    total, count = 0.0, 0
    for x, y in batches:
        logits, states = cap.run(x)
        angular.update(states)
        influence.update(states)
        s, n = nll_sum(logits, y)
        total, count = total + s, count + n
        del logits, states
        if on_batch is not None:
            on_batch(y.shape[0])
    if count == 0:
        raise DepthlabError("the held-out data gave no tokens to evaluate")
    return Survey(total / count, count, angular.mean(), influence.result())


def angular_block(angular: torch.Tensor, n: int, allowed: Allowed | None = None) -> list[int]:
    """Gromov et al.: blocks l..l+n-1 for the l minimising d(x^l, x^{l+n}); ``angular`` is (L+1, L+1). Only runs
    ``allowed`` lets go together are candidates."""
    L = angular.shape[0] - 1
    if not 1 <= n < L:
        raise ValueError(f"n must lie in 1..{L - 1}, got {n}")
    runs = [l for l in range(1, L - n + 2) if _ok(allowed, range(l, l + n))]
    if not runs:
        raise DepthlabError(f"no {n} consecutive blocks of this model can go together: "
                            f"{allowed(range(L - n + 1, L + 1))}")  # type: ignore[misc]
    best = min(runs, key=lambda l: (float(angular[l - 1, l - 1 + n]), -l))
    return list(range(best, best + n))


def lowest_influence(influence: Sequence[float], n: int, allowed: Allowed | None = None) -> list[int]:
    """ShortGPT: the n blocks with the lowest Block Influence (ties: the deeper block); with ``allowed``, each block
    in that order joins when the set stays allowed, in passes until n are chosen or a pass adds none (a block can
    become removable once another has gone: a KV producer once its consumers have)."""
    order = sorted(range(1, len(influence) + 1), key=lambda l: (influence[l - 1], -l))
    chosen = _lowest(order, n, allowed)
    if len(chosen) < n:
        rest = [l for l in order if l not in chosen]
        raise DepthlabError(f"only {len(chosen)} of the {n} lowest-influence blocks asked for can go together "
                            f"({sorted(chosen)}; not {rest[:n - len(chosen)]}: the model's config)")
    return sorted(chosen)


def _lowest(order: Sequence[int], n: int, allowed: Allowed | None) -> list[int]:
    """Up to ``n`` blocks of ``order`` (lowest influence first), each joining when the set stays allowed."""
    chosen: list[int] = []
    grew = True
    while grew and len(chosen) < n:
        grew = False
        for l in order:
            if len(chosen) < n and l not in chosen and _ok(allowed, [*chosen, l]):
                chosen.append(l)
                grew = True
                break  # start again from the lowest: it may have become removable
    return chosen


@dataclass
class GreedyStep:
    block: int  # removed at this step (1-based, numbering of the model given)
    loss: float  # held-out loss with every block removed so far
    candidates: dict[int, float] = field(default_factory=dict)  # loss with each candidate removed


@torch.no_grad()
def _greedy_losses(cap: ResidualCapture, batches: Batches, removed: set[int], candidates: list[int],
                   on_batch: Callable[[int], None] | None) -> dict[int, float]:
    """Held-out loss of the model without ``removed`` and one candidate, for every candidate."""
    sums, count = dict.fromkeys(candidates, 0.0), 0
    for x, y in batches:
        _, states = cap.run_removed(x, removed)
        for m in candidates:
            out = cap.run_skipping(x, states, {m} | {s for s in removed if s > m})
            sums[m] += nll_sum(out, y)[0]
            del out
        count += int((y != IGNORE_INDEX).sum())
        del states
        if on_batch is not None:
            on_batch(y.shape[0])
    return {m: s / max(count, 1) for m, s in sums.items()}


GreedyLosses = Callable[[set[int], list[int]], dict[int, float]]  # (removed, candidates) -> loss with each one more


def greedy_removal(cap: ResidualCapture, batches: Batches, n: int | None = None, budget: float | None = None,
                   base_loss: float | None = None, on_batch: Callable[[int], None] | None = None, *,
                   losses_of: GreedyLosses | None = None, allowed: Allowed | None = None) -> list[GreedyStep]:
    """SLEB-style greedy removal: ``n`` steps, or (with ``budget`` and ``base_loss``) as many as stay
    within ``budget`` nats of ``base_loss``. Returns the steps taken, in order. ``losses_of`` measures the
    candidates another way (the streamed engine); ``cap`` then only gives ``n_layers``. Only blocks ``allowed``
    lets go with those removed so far are candidates; none left ends the path."""
    L = cap.n_layers
    steps: list[GreedyStep] = []
    removed: set[int] = set()
    limit = n if n is not None else L - 1
    if losses_of is None:
        def losses_of(done: set[int], cands: list[int]) -> dict[int, float]:
            return _greedy_losses(cap, batches, done, cands, on_batch)
    while len(steps) < limit:
        cands = [m for m in range(1, L + 1) if m not in removed and _ok(allowed, removed | {m})]
        if not cands:
            log.info("greedy removal: no further block can go with blocks %s (the model's config)", sorted(removed))
            break
        losses = losses_of(removed, cands)
        block = min(losses, key=lambda m: (losses[m], -m))
        if budget is not None and losses[block] - base_loss > budget:
            break
        removed.add(block)
        steps.append(GreedyStep(block, losses[block], losses))
        log.info("greedy removal: step %d removes block %d (loss %.4f)", len(steps), block, losses[block])
    return steps


def largest_within_budget(choose: Callable[[int], list[int]], loss_of: Callable[[list[int]], float], base: float,
                          budget: float, max_n: int) -> tuple[int, dict[int, float]]:
    """The largest k <= ``max_n`` whose choice ``choose(k)`` costs at most ``budget`` nats over
    ``base`` (galloping then bisection: about 2 log2 k joint evaluations; assumes cost grows with k)."""
    cache: dict[int, float] = {0: base}

    def ok(k: int) -> bool:
        if k not in cache:
            cache[k] = loss_of(choose(k))
        return cache[k] - base <= budget

    lo, step = 0, 1
    while lo < max_n and ok(min(lo + step, max_n)):
        lo, step = min(lo + step, max_n), step * 2
    hi = min(lo + step, max_n) - 1 if lo < max_n else lo
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo, cache


@dataclass
class Selection:
    method: str  # removal | angular-block | influence | user
    removed: list[int]  # 1-based, numbering of the model given
    loss: float | None = None  # held-out loss with them removed (jointly), when measured
    details: dict[str, Any] = field(default_factory=dict)


def check_blocks(blocks: Sequence[int], n_layers: int) -> list[int]:
    """The user's ``--blocks``, sorted: each in 1..L, no repeats, at least one block kept."""
    _check_blocks(list(blocks), n_layers)
    return sorted(blocks)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise DepthlabError(f"unknown --method {method!r}; {choices(METHODS)}")
    return method


def select_blocks(method: str, cap: ResidualCapture, batches: Batches, survey: Survey, *, remove: int | None = None,
                  budget: float | None = None, on_batch: Callable[[int], None] | None = None,
                  joint_loss: Callable[[list[int]], float] | None = None,
                  losses_of: GreedyLosses | None = None, allowed: Allowed | None = None) -> Selection:
    """The blocks ``method`` removes: ``remove`` of them, or the most within ``budget`` nats, only among sets
    ``allowed`` lets go (:func:`block_limits`). ``joint_loss`` and ``losses_of`` measure another way than replaying
    ``cap`` over ``batches`` (the streamed engine)."""
    check_method(method)
    L = cap.n_layers
    if joint_loss is None:
        def joint_loss(blocks: list[int]) -> float:
            return joint_removal_loss(cap, batches, blocks)
    if method == "removal":
        steps = greedy_removal(cap, batches, remove, budget, survey.loss, on_batch, losses_of=losses_of,
                               allowed=allowed)
        if remove is not None and len(steps) < remove:
            raise DepthlabError(f"--remove {remove}: greedy removal found only {len(steps)} blocks this model's config "
                                f"lets go together ({sorted(s.block for s in steps)})")
        path = [{"block": s.block, "loss": s.loss, "candidates": {str(k): v for k, v in s.candidates.items()}}
                for s in steps]
        return Selection(method, sorted(s.block for s in steps), steps[-1].loss if steps else survey.loss,
                         {"greedy_path": path})
    choose = (lambda k: angular_block(survey.angular, k, allowed)) if method == "angular-block" \
        else (lambda k: lowest_influence(survey.influence, k, allowed))
    details = {"influence": survey.influence} if method == "influence" else {}
    if remove is not None:
        removed = choose(remove)
        return Selection(method, removed, joint_loss(removed), details)
    most = L - 1 if allowed is None else _longest_run(L, allowed) if method == "angular-block" \
        else _reachable(survey.influence, allowed)
    k, evaluated = largest_within_budget(choose, joint_loss, survey.loss, budget, most)
    details["budget_evaluated"] = {str(i): v for i, v in sorted(evaluated.items())}
    return Selection(method, choose(k) if k else [], evaluated[k], details)


def _reachable(influence: Sequence[float], allowed: Allowed | None) -> int:
    """How many blocks :func:`lowest_influence` can pick under ``allowed``."""
    order = sorted(range(1, len(influence) + 1), key=lambda l: (influence[l - 1], -l))
    return len(_lowest(order, len(influence) - 1, allowed))
