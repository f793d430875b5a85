"""The rules a family entry names (:mod:`depthlab.hf.families`): how a config integer that depends on layer positions
is rewritten when layers are cut (:data:`INDEX_RULES`), what some configs of a family cannot do
(:data:`CONFIG_LIMITS`, with :data:`LIMIT_NOTES` for the README table), and the fix-ups a family's random test model
needs (``Family.tiny_fixup``). Functions of a config or a model alone: they know no family, so a new family reuses
them and a new rule is one function here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def config_field(config: Any, name: str, default: Any = None) -> Any:
    """A config field, from a transformers config or config.json's dict."""
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


# ---------------------------------------------------------------------------------------------- index rules
def _count_below(name: str) -> Callable[[Any, Sequence[int], int], None]:
    """An integer meaning "the first k layers": becomes the number of kept layers below k."""
    def rule(config: Any, keep: Sequence[int], n_layers: int) -> None:
        k = getattr(config, name, None)
        if isinstance(k, int):
            setattr(config, name, sum(1 for i in keep if i < k))
    return rule


def _count_last(name: str) -> Callable[[Any, Sequence[int], int], None]:
    """An integer meaning "the last k layers": becomes the number of kept layers among them."""
    def rule(config: Any, keep: Sequence[int], n_layers: int) -> None:
        k = getattr(config, name, None)
        if isinstance(k, int):
            setattr(config, name, sum(1 for i in keep if i >= n_layers - k))
    return rule


def _sparse_step(config: Any, keep: Sequence[int], n_layers: int) -> None:
    """Qwen-MoE ``decoder_sparse_step`` (layer i is MoE when (i+1) % step == 0 and i is not in ``mlp_only_layers``):
    a step > 1 does not survive a cut, so the dense layers are listed in ``mlp_only_layers`` and the step becomes 1."""
    step = getattr(config, "decoder_sparse_step", None)
    if not isinstance(step, int) or step <= 1:
        return
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    dense |= {i for i in range(n_layers) if (i + 1) % step != 0}
    config.mlp_only_layers = sorted(i for i in range(n_layers) if i in dense)  # renumbered by index_lists after
    config.decoder_sparse_step = 1


#: Config integers that depend on layer positions, by name: each rewrites the config for the kept layers
#: (0-based ``keep``) before the per-layer and index lists are cut.
INDEX_RULES: dict[str, Callable[[Any, Sequence[int], int], None]] = {
    "max_window_layers": _count_below("max_window_layers"),  # Qwen2/3: layers below it attend fully
    "first_k_dense_replace": _count_below("first_k_dense_replace"),  # DeepSeek: the first k layers are dense
    "num_dense_layers": _count_below("num_dense_layers"),  # AFMoE, LFM2-MoE: the first k layers are dense
    "decoder_sparse_step": _sparse_step,
    "num_kv_shared_layers": _count_last("num_kv_shared_layers"),  # Gemma 4: the last k layers reuse earlier K/V
}


# ---------------------------------------------------------------------------------------------- config limits
def _kv_sharing(config: Any, capability: str, removed: Sequence[int]) -> str | None:
    """Gemma 4's KV sharing: the last ``num_kv_shared_layers`` blocks reuse the keys and values of the last earlier
    block of their attention type (its producer). Streaming does not carry them from block to block; pruning keeps
    the function only while every producer with a kept consumer stays, and the last kept block is full attention
    (transformers forces it)."""
    n, shared = config_field(config, "num_hidden_layers"), config_field(config, "num_kv_shared_layers", 0) or 0
    types = list(config_field(config, "layer_types", None) or [])
    if capability == "stream" and shared:
        return (f"blocks {n - shared + 1}..{n} reuse the keys and values of earlier blocks (num_kv_shared_layers="
                f"{shared}), which the layer-by-layer engine does not carry from block to block")
    if capability != "prune" or len(types) != n:
        return None
    gone, first = set(removed), n - shared
    keep = [i for i in range(n) if i + 1 not in gone]
    if shared:
        producers = {t: max(i for i in range(first) if types[i] == t) for t in set(types[first:])}
        lost = sorted(p + 1 for t, p in producers.items() if p + 1 in gone
                      and any(i >= first and types[i] == t for i in keep))
        if lost:
            return (f"blocks {lost} cannot go: blocks {first + 1}..{n} reuse their keys and values "
                    f"(num_kv_shared_layers={shared}), and no config can point them elsewhere")
    if keep and types[keep[-1]] != "full_attention":
        return (f"blocks {sorted(gone)} cannot all go: block {keep[-1] + 1} ({types[keep[-1]]}) would become the last, "
                "and Gemma 4's config forces its last block to full attention")
    return None


#: What each config limit means for a capability, as the README table's notes say it.
LIMIT_NOTES: dict[str, dict[str, str]] = {"kv_sharing": {
    "diagnose": "with KV sharing, removing a block whose keys and values later blocks reuse has no defined output (no "
                "pruned model computes it): its removal Δloss is reported as not measurable (null, with the reason)",
    "stream": "not with KV sharing (num_kv_shared_layers > 0: later blocks reuse the keys and values of earlier ones, "
              "which the layer-by-layer engine does not carry); refused in one line",
    "prune": "a block whose keys and values later blocks reuse (KV sharing) cannot go, nor blocks that would leave a "
             "sliding-attention block last: --remove / --budget choose among the others (every method, both engines), "
             "and a request they cannot meet or --blocks naming them is refused in one line, before any work"}}
#: What some configs of a family cannot do, by name: (config or config.json's dict, capability, removed 1-based
#: blocks) -> one line saying why, or None.
CONFIG_LIMITS: dict[str, Callable[[Any, str, Sequence[int]], str | None]] = {"kv_sharing": _kv_sharing}


# ---------------------------------------------------------------------------------------------- test-model fix-ups
def draw_hash_routes(model: Any) -> None:
    """DeepSeek-V4's hash-routing table (``tid2eid``) starts at zeros, every token to expert 0: drawn at random, so a
    test or a benchmark sees the per-block token ids matter as in a trained model."""
    import torch

    with torch.no_grad():
        for name, table in model.named_buffers():
            if name.endswith("tid2eid"):
                table.copy_(torch.randint(0, model.config.n_routed_experts, table.shape))


# ---------------------------------------------------------------------------------------------- wrapper rules
def _hidden_index(value: int, n_layers: int) -> int:
    """A ``hidden_states`` index (0: the embeddings, i: block i's output; negative from the end) as 0..n_layers."""
    return value if value >= 0 else n_layers + 1 + value


def _feature_layers(config: Any) -> list[int]:
    value = config_field(config, "vision_feature_layer")
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]


def vision_feature_layer_range(config: Any, n_layers: int) -> str | None:
    """Why ``vision_feature_layer`` names no state of a vision tower of ``n_layers`` blocks (transformers' forward ends
    on an IndexError mid-run), or None."""
    bad = [v for v in _feature_layers(config) if not -(n_layers + 1) <= v <= n_layers]
    if not bad:
        return None
    return (f"vision_feature_layer={config_field(config, 'vision_feature_layer')} names no state of the vision "
            f"tower's {n_layers} blocks (give {-(n_layers + 1)}..{n_layers})")


def vision_feature_layer(config: Any, keep: Sequence[int], n_layers: int) -> None:
    """LLaVA / Mistral 3's ``vision_feature_layer`` (an index, or a list, into the vision tower's ``hidden_states``:
    the states the projector reads) rewritten for the kept vision blocks ``keep`` (0-based) of ``n_layers``: it
    points at the same state, or, for a removed block, at the state that block's input was (what the original reads
    with that block skipped). A negative index stays negative (counted from the new end)."""
    value = config_field(config, "vision_feature_layer")

    def moved(v: int) -> int:
        p = _hidden_index(v, n_layers)
        new = sum(1 for i in keep if i < p)
        return new if v >= 0 else new - (len(keep) + 1)

    if isinstance(value, int) and not isinstance(value, bool):
        config.vision_feature_layer = moved(value)
    elif isinstance(value, (list, tuple)):
        config.vision_feature_layer = [moved(int(v)) for v in value]


def deepstack_blocks(config: Any) -> list[int]:
    """Qwen3-VL's deepstack: the 0-based vision blocks whose outputs are merged into the language model
    (``vision_config.deepstack_visual_indexes``); [] for a wrapper without."""
    vision = config_field(config, "vision_config") or {}
    return [int(i) for i in (config_field(vision, "deepstack_visual_indexes") or [])]


def _deepstack(config: Any, tower: str, capability: str, removed: Sequence[int]) -> str | None:
    """Qwen3-VL: the outputs of vision blocks ``deepstack_visual_indexes`` go through their own mergers and are
    added to the language stream at the image positions after language blocks 1..k (k: how many). A removed
    deepstack block leaves its merger nothing the original computes; a removed receiving language block moves
    the add to the next block: neither has a pruned model, so both are refused."""
    if capability != "prune":
        return None
    indexes = deepstack_blocks(config)
    if tower == "vision":
        lost = sorted(set(removed) & {i + 1 for i in indexes})
        if lost:
            return (f"vision blocks {lost} cannot go: their outputs feed the deepstack mergers "
                    f"(vision_config.deepstack_visual_indexes={indexes}), which no pruned config can point elsewhere")
        return None
    lost = sorted(set(removed) & set(range(1, len(indexes) + 1)))
    if lost:
        return (f"language blocks {lost} cannot go: the deepstack features of {len(indexes)} vision blocks are added "
                f"to the language stream after blocks 1..{len(indexes)} (one each, in order); removing one moves an add")
    return None


#: Wrapper config fields that depend on vision block positions, rewritten when vision blocks are cut (the wrapper
#: config, the kept 0-based vision blocks, their number before).
WRAPPER_RULES: dict[str, Callable[[Any, Sequence[int], int], None]] = {"vision_feature_layer": vision_feature_layer}
#: The range each of WRAPPER_RULES' fields must lie in (same names): (the wrapper config or config.json's dict, its
#: vision block count) -> one line saying why it does not, or None. Checked before anything is built.
WRAPPER_RANGES: dict[str, Callable[[Any, int], str | None]] = {"vision_feature_layer": vision_feature_layer_range}
#: What some wrappers cannot lose, by name: (the wrapper config or config.json's dict, tower, capability, removed
#: 1-based blocks of that tower) -> one line saying why, or None.
WRAPPER_LIMITS: dict[str, Callable[[Any, str, str, Sequence[int]], str | None]] = {"deepstack": _deepstack}
