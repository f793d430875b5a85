"""Routed experts of MoE decoder layers: which blocks route, how many experts each holds, and the surgery that removes
some of them. Where the experts sit is the family's :class:`~depthlab.hf.families.Experts` entry (registry data).

    spec = experts_spec(config)                        # the family's entry (one line naming the MoE families if none)
    moe = moe_layers(layers, spec)                     # {1-based block: MoeLayer} for the blocks that route
    with experts_removed(moe, {3: [0, 5]}):            # block 3 computes as the model without experts 0 and 5
        loss = ...
    remove_experts(moe, {3: [0, 5]}); cut_count(config, spec, kept=n - 2)     # for good: the export

Every function takes a block list (the model's own, a streamed skeleton's, a vision-language wrapper's language
tower) and a config, so a tower plugs in as it is.

The surgery is the same for every family: in the router and the experts module, each tensor whose first dim is the
expert count keeps the kept experts' rows (the router's weight, bias and score-correction bias; the fused gate/up
and down projections and their biases), and the modules' integer expert counts become the new count. The pruned
layer then computes what the original computes with those experts never routed to: softmax (or sigmoid) and top-k
over the kept experts' scores, as a checkpoint with the experts' tensors and the router's rows removed and the
config's count cut does when plain transformers loads it. Shared experts are other modules: never touched.

**One count per model.** transformers builds every MoE layer of these families from the config's single count
(:data:`SAME_COUNT`), so the same number of experts goes from every MoE layer.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.hf.families import FAMILIES, Experts, config_field, get_path, known_family

#: Why the same number of experts goes from every MoE layer (the report says it).
SAME_COUNT = ("transformers builds every MoE layer from the config's one expert count (a per_layer_config override of "
              "it is ignored by these families' modeling code in transformers 5.24), so every MoE layer keeps the same "
              "number of experts: the same number goes from each")
#: The integer attributes of a router / experts / MoE block that hold the expert count (set to the kept count).
COUNT_ATTRS = ("num_experts", "num_local_experts", "n_routed_experts", "out_features")
#: A per-expert checkpoint key (experts stored one by one): its expert index.
EXPERT_KEY = re.compile(r"^(.*\.experts\.)(\d+)(\..*)$")


def moe_families() -> list[str]:
    """The model types whose entry has routed experts."""
    return [t for t, f in FAMILIES.items() if f.experts is not None]


def experts_spec(config: Any) -> Experts:
    """The family's experts entry; one line naming the MoE families when it has none (a dense model)."""
    model_type = config_field(config, "model_type")
    fam = known_family(model_type)
    if fam is None or fam.experts is None:
        what = f"{fam.name} (model type {model_type!r})" if fam is not None else f"model type {model_type!r}"
        raise DepthlabError(f"--unit expert needs an MoE model; {what} has no routed experts "
                            f"(MoE families: {', '.join(moe_families())})")
    return fam.experts


@dataclass
class MoeLayer:
    """One routing block: its MoE module, router and experts, and how many experts it routes to."""

    block: int  # 1-based block number
    module: nn.Module  # the layer's MoE module
    router: nn.Module
    experts: nn.Module
    n: int  # routed experts
    top_k: int  # experts per token
    groups: int = 1  # the router picks among this many groups of experts first (DeepSeek-V3's n_group)
    dense: bool = False  # every expert runs on the gate-scaled input (Llama 4)


def _count(experts: nn.Module) -> int:
    n = getattr(experts, "num_experts", None)
    if isinstance(n, int):
        return n
    return next(p for p in experts.parameters() if p.dim() >= 2).shape[0]


def moe_layers(layers: Sequence[nn.Module], spec: Experts, config: Any = None) -> dict[int, MoeLayer]:
    """{1-based block: its :class:`MoeLayer`} for the blocks of ``layers`` whose MoE module holds routed experts
    (``config``: the top-k and group counts; default: the routers' own)."""
    out: dict[int, MoeLayer] = {}
    for i, layer in enumerate(layers, start=1):
        block = get_path(layer, spec.block)
        experts = getattr(block, spec.experts, None) if block is not None else None
        router = getattr(block, spec.router, None) if block is not None else None
        if not isinstance(experts, nn.Module) or not isinstance(router, nn.Module):
            continue
        top_k = getattr(router, "top_k", None) or config_field(config, "num_experts_per_tok", 1)
        groups = int(config_field(config, spec.groups, 1) or 1) if spec.groups else 1
        out[i] = MoeLayer(i, block, router, experts, _count(experts), int(top_k), groups, spec.dense)
    return out


def fixed_routes(config: Any, spec: Experts) -> list[int]:
    """1-based blocks whose routes are a fixed token table (DeepSeek-V4's ``hash_moe`` layers): removing one of their
    experts would leave the tokens routed to it nowhere."""
    types = list(config_field(config, "mlp_layer_types", None) or [])
    return [i for i, t in enumerate(types, start=1) if t in spec.fixed_routes]


def check_removable(moe: Mapping[int, MoeLayer], removal: Mapping[int, Sequence[int]]) -> None:
    """One line when ``removal`` ({block: 0-based experts}) cannot be a model of this family: a block that does not
    route, an expert out of range or named twice, unequal counts between the MoE layers, fewer experts kept than a
    token routes to, or (grouped routers) unequal counts between the groups."""
    counts = set()
    for block in sorted(moe):
        gone = list(removal.get(block, ()))
        layer = moe[block]
        bad = [e for e in gone if not 0 <= e < layer.n]
        if bad:
            raise DepthlabError(f"expert {bad[0]} of block {block} does not exist: the block routes to experts "
                                f"0..{layer.n - 1}")
        if len(set(gone)) != len(gone):
            raise DepthlabError(f"block {block}: an expert is named twice ({','.join(map(str, gone))})")
        counts.add(len(gone))
        kept = layer.n - len(gone)
        if kept < max(layer.top_k, 1):
            raise DepthlabError(f"removing {len(gone)} of block {block}'s {layer.n} experts keeps {kept}, fewer than the "
                                f"{layer.top_k} each token is routed to; remove at most {layer.n - layer.top_k}")
        if layer.groups > 1:
            size = layer.n // layer.groups
            per = {g: sum(1 for e in gone if e // size == g) for g in range(layer.groups)}
            if len(set(per.values())) > 1 or size - per[0] < 2:
                raise DepthlabError(f"block {block} routes by {layer.groups} groups of {size} experts: remove the same "
                                    f"number from each group, keeping at least 2 per group (asked: {per})")
    extra = sorted(set(removal) - set(moe))
    if extra:
        raise DepthlabError(f"block {extra[0]} has no routed experts (the MoE blocks are {_ranges(sorted(moe))})")
    if len(counts) > 1:
        raise DepthlabError(f"the MoE blocks would keep different numbers of experts ({sorted(counts)} removed); "
                            f"{SAME_COUNT}")


def _ranges(blocks: list[int]) -> str:
    return ",".join(map(str, blocks)) if len(blocks) <= 8 else f"{blocks[0]}..{blocks[-1]} ({len(blocks)} blocks)"


# ---------------------------------------------------------------------------------------------- the surgery
def _sliced(layer: MoeLayer, keep: list[int]) -> list[tuple[nn.Module, str, str, Any]]:
    """Cut ``layer`` to the experts ``keep`` in place; returns what was replaced, (module, kind, name, old value)."""
    n, saved = layer.n, []
    index = None
    for module in (layer.router, layer.experts):
        for kind, table in (("param", module._parameters), ("buffer", module._buffers)):
            for name, t in list(table.items()):
                if t is None or t.dim() == 0 or t.shape[0] != n:
                    continue
                if index is None or index.device != t.device:
                    index = torch.tensor(keep, dtype=torch.long, device=t.device)
                new = t.detach().index_select(0, index)
                table[name] = nn.Parameter(new, requires_grad=t.requires_grad) if kind == "param" else new
                saved.append((module, kind, name, t))
    for module in (layer.module, layer.router, layer.experts):
        for attr in COUNT_ATTRS:
            if getattr(module, attr, None) == n and not isinstance(getattr(module, attr), bool):
                saved.append((module, "int", attr, n))
                setattr(module, attr, len(keep))
    return saved


def _restore(saved: list[tuple[nn.Module, str, str, Any]]) -> None:
    for module, kind, name, old in reversed(saved):
        if kind == "int":
            setattr(module, name, old)
        else:
            (module._parameters if kind == "param" else module._buffers)[name] = old


def kept_experts(layer: MoeLayer, removed: Sequence[int]) -> list[int]:
    gone = set(removed)
    return [e for e in range(layer.n) if e not in gone]


@contextlib.contextmanager
def experts_removed(moe: Mapping[int, MoeLayer], removal: Mapping[int, Sequence[int]]) -> Iterator[None]:
    """While inside, each block of ``removal`` computes without those experts (the pruned model's function); the
    original tensors are put back on exit."""
    saved: list = []
    try:
        for block, gone in removal.items():
            if gone:
                saved.extend(_sliced(moe[block], kept_experts(moe[block], gone)))
        yield
    finally:
        _restore(saved)


def remove_experts(moe: Mapping[int, MoeLayer], removal: Mapping[int, Sequence[int]]) -> None:
    """Remove the experts of ``removal`` ({block: 0-based experts}) in place, for good (each :class:`MoeLayer`'s count
    updated): the model then holds only the kept experts' tensors."""
    for block, gone in removal.items():
        if gone:
            layer = moe[block]
            _sliced(layer, kept_experts(layer, gone))
            layer.n -= len(gone)


def cut_count(config: Any, spec: Experts, kept: int) -> None:
    """The config's routed-expert count set to ``kept`` (the family's field, :attr:`Experts.count`)."""
    setattr(config, spec.count, kept)


# ---------------------------------------------------------------------------------------------- the checkpoint
def key_plan(keys_of: Any, moe: Mapping[int, MoeLayer], removal: Mapping[int, Sequence[int]],
             shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[str | None, list[int] | None]]:
    """How the checkpoint's tensors of the MoE blocks change when ``removal``'s experts go: {checkpoint key: (its new
    key, or None when it goes; the rows along dim 0 it keeps, or None when whole)}. ``keys_of(module)``: the
    checkpoint keys a module is loaded from (per-expert keys ``...experts.{j}....`` in most families' files: the
    removed ones dropped, the kept ones renumbered; fused tensors of first dim = the count: rows cut);
    ``shapes``: each key's stored shape."""
    plan: dict[str, tuple[str | None, list[int] | None]] = {}
    for block, gone in removal.items():
        layer = moe[block]
        keep = kept_experts(layer, gone)
        renumber = {old: new for new, old in enumerate(keep)}
        for module in (layer.router, layer.experts):
            for key in keys_of(module):
                m = EXPERT_KEY.match(key) if module is layer.experts else None
                if m is not None:
                    old = int(m.group(2))
                    plan[key] = (f"{m.group(1)}{renumber[old]}{m.group(3)}" if old in renumber else None, None)
                elif list(shapes[key])[:1] == [layer.n]:
                    plan[key] = (key, keep)
    return plan
