"""A decoder's layout read from the model itself, for a ``model_type`` the family registry has no row for.

    fields = layout(model)                  # {"base": "model", "blocks": "layers", "norm": "norm", ...} or "refused"
    fields = layout_of_config(config)       # the same, from the class transformers builds for it (meta device)
    norms = probe_pre_norms(config)         # (("input_layernorm", "post_attention_layernorm"), 0.0) or the reason

:mod:`depthlab.hf.families` turns these fields into a :class:`~depthlab.hf.families.Family` marked ``inferred``
(this module knows nothing of it, so the registry imports it and not the other way). What is read:

- **the blocks**: the one ``ModuleList`` of ``num_hidden_layers`` modules (when several have that length, the one
  whose modules are classes of the model's ``_no_split_modules``); its path split at the model's
  ``base_model_prefix`` gives ``base`` and ``blocks``;
- **the final norm**: the norm module among the block list's siblings (the one registered after the list when
  several are; none: the LM head reads the last block's output);
- **per-layer config fields**: every list of ``num_hidden_layers`` entries (cut with the blocks), maps keyed by layer
  index, lists of layer indices by their name (``*_layer_indices``, ``*_layer_ids``, ``mlp_only_layers``...:
  renumbered) and the registry's index rules whose field the config has;
- **the pre-norms** (LayerNorm Scaling; :func:`probe_pre_norms`): on a tiny random model of the same family and
  flags (:func:`depthlab.hf.shrink.tiny_overrides`), the block's direct norm children whose input is the residual
  stream ahead of a branch that is added back to it (the block's output is its input plus some of its children's
  outputs), and whether they compute ``weight · x̂`` or ``(1 + weight) · x̂``.

What cannot be read from the structure (a block that reads per-token values, several residual streams, a config
integer that places layers) is not guessed: the streamed engine's forward and a pruned export are checked against
the model's own forward before anything is written (:mod:`depthlab.targets.stream.agree`,
:func:`depthlab.prune.export.require_exact`), and refused in one line when they differ.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from depthlab.hf.family_rules import INDEX_RULES, config_field

#: Every capability an unreadable layout refuses (the registry's CAPABILITIES, repeated: no import of the registry).
ALL = ("diagnose", "stream", "prune", "lns", "monitor")

#: Config fields listing 0-based layer indices, by name: renumbered when layers are cut.
INDEX_LIST = r"^(mlp_only_layers|moe_layers)$|_layer_(indices|ids)$|^layer_(indices|ids)$"

#: Config maps keyed by small integers that are not layer indices.
NOT_LAYER_MAPS = frozenset({"id2label", "label2id"})

#: Config fields counting experts: a model with more than one is "MoE" in the README's kind column.
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def as_config(config: Any) -> Any:
    """A transformers config from a config (returned as is) or config.json's dict (its tagged inf/NaN decoded as
    transformers' own reader decodes them); a one-line ValueError for a model type transformers does not know (code
    from the hub is never run)."""
    if not isinstance(config, dict):
        return config
    from transformers import CONFIG_MAPPING, PreTrainedConfig

    model_type = config.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"model type {model_type!r} is not one this transformers knows (remote code is not run)")
    # config.json as transformers writes it tags inf/NaN ({"__float__": "Infinity"}, Mamba-2's time_step_limit);
    # its own reader decodes them before from_dict, and so must every reader of the raw JSON
    return CONFIG_MAPPING[model_type].from_dict(PreTrainedConfig._decode_special_floats(dict(config)))


def config_key(config: Any) -> str:
    """A config as a cache key (its full JSON)."""
    values = config if isinstance(config, dict) else config.to_dict()
    return json.dumps(values, sort_keys=True, default=str)


def meta_model(config: Any) -> Any:
    """The causal LM transformers builds for ``config``, on the meta device (no memory, no weight read)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(as_config(config), trust_remote_code=False)


def wrapper_reason(config: Any) -> str | None:
    """Why ``config`` is not a decoder this module reads (an encoder-decoder, a wrapper around a text decoder), or
    None."""
    if config_field(config, "is_encoder_decoder", False):
        return "an encoder-decoder (is_encoder_decoder), not a decoder-only causal LM"
    subs = config if isinstance(config, dict) else config.to_dict()
    towers = [k for k in ("text_config", "vision_config", "audio_config") if isinstance(subs.get(k), dict)]
    if towers:
        return (f"a wrapper of several towers ({', '.join(towers)}): its text decoder is for the wrapper rules to "
                "find, not inferred")
    return None


def encoder_reason(is_decoder: Any, path: str) -> str | None:
    """Why a model whose block list is at ``path`` is an encoder, not a causal LM (its config's ``is_decoder`` false,
    and its blocks under an ``encoder``; a config class without the field, e.g. CPM-Ant's, is no encoder), or None."""
    if is_decoder is False and "encoder" in path.split("."):
        return f"an encoder (its blocks are {path}, is_decoder is false), not a causal LM"
    return None


# ---------------------------------------------------------------------------------------------- the structure
def block_list(model: Any, n: int) -> tuple[str, Any] | str:
    """(path, ModuleList) of the ``n`` blocks, or why there is none (a line that holds for any ``n``: the table of
    :mod:`depthlab.hf.structure` stores it)."""
    from torch import nn

    lists = [(p, m) for p, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if len(lists) > 1:
        keep = set(getattr(model, "_no_split_modules", None) or ())
        lists = [(p, m) for p, m in lists if any(type(b).__name__ in keep for b in m)] or lists
    if not lists:
        return f"no ModuleList of one module per block (num_hidden_layers) in {type(model).__name__}"
    if len(lists) > 1:
        return (f"{len(lists)} ModuleLists of one module per block in {type(model).__name__} "
                f"({', '.join(p for p, _ in lists[:4])}): which holds the blocks cannot be told")
    return lists[0]


def search_layers(model: Any) -> Any:
    """The first non-empty ModuleList at :data:`~depthlab.hf.structure.LAYER_PATHS` under the model's base model, then
    the model; or None (:func:`~depthlab.targets.layers.find_layers`' search where no layout is read)."""
    from torch import nn

    from depthlab.hf.structure import LAYER_PATHS

    for root in (getattr(model, "base_model", None), model):
        for path in LAYER_PATHS if root is not None else ():
            try:
                layers = root.get_submodule(path)
            except AttributeError:
                continue
            if isinstance(layers, nn.ModuleList) and len(layers) > 0:
                return layers
    return None


def is_norm(module: Any) -> bool:
    """A normalisation module: its class says so (LayerNorm, RMSNorm, GroupNorm, a family's own *Norm)."""
    return "norm" in type(module).__name__.lower()


def _final_norm(owner: Any, attr: str) -> str | None:
    """The name of the norm beside the block list: the first registered after it, else one before it that is not an
    embedding norm (OPT registers its final norm first), else None."""
    order = [name for name, m in owner.named_children() if name != attr and is_norm(m)]
    names = [name for name, _ in owner.named_children()]
    after = [name for name in order if names.index(name) > names.index(attr)]
    before = [name for name in order if name not in after and "emb" not in name]
    return after[0] if after else (before[-1] if before else None)


def _split_base(model: Any, path: str) -> tuple[str, str]:
    """(base, path below it): the block list's path split at the causal LM's base model."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and path.startswith(f"{prefix}."):
        return prefix, path[len(prefix) + 1:]
    return "", path


def layer_fields(config: Any, n: int) -> dict[str, tuple[str, ...]]:
    """The config's per-layer facts: lists of ``n`` entries, maps keyed by layer index, lists of layer indices (by
    name), and the registry's index rules whose field it has."""
    values = config if isinstance(config, dict) else config.to_dict()
    lists, maps, indices = [], [], []
    for key, v in values.items():
        if isinstance(v, (list, tuple)) and re.search(INDEX_LIST, key) and all(isinstance(i, int) for i in v):
            indices.append(key)
        elif isinstance(v, (list, tuple)) and len(v) == n and n > 1:
            lists.append(key)
        elif key not in NOT_LAYER_MAPS and isinstance(v, dict) and v and all(str(i).isdigit() and int(i) < n for i in v):
            maps.append(key)
    rules = [name for name in INDEX_RULES if values.get(name) is not None]
    return {"layer_lists": tuple(lists), "layer_maps": tuple(maps), "index_lists": tuple(indices),
            "index_rules": tuple(rules)}


def _kind(config: Any, blocks: Any) -> str:
    if any((config_field(config, name, 0) or 0) > 1 for name in EXPERT_COUNTS):
        return "MoE"
    return "hybrid" if len({type(b).__name__ for b in blocks}) > 1 else "dense"


def layout(model: Any) -> dict[str, Any]:
    """The Family fields read from a causal LM (on any device, the meta device included): ``base``, ``blocks``,
    ``norm`` ("" for none), per-layer config fields, ``kind``; ``refused`` says why a capability cannot be had."""
    config = model.config
    why = wrapper_reason(config)
    n = config_field(config, "num_hidden_layers")
    if why is None and not isinstance(n, int):
        why = "its config has no num_hidden_layers (no block count to find the blocks by)"
    found = why if why is not None else block_list(model, n)
    if isinstance(found, str):
        return {"refused": dict.fromkeys(ALL, found)}
    path, blocks = found
    why = encoder_reason(config_field(config, "is_decoder", None), path)
    if why is not None:
        return {"refused": dict.fromkeys(ALL, why)}
    owner_path, _, attr = path.rpartition(".")
    owner = model.get_submodule(owner_path) if owner_path else model
    base, below = _split_base(model, path)
    norm = _final_norm(owner, attr)
    norm_path = ".".join(p for p in (below.rpartition(".")[0], norm) if p) if norm else ""
    return {"base": base, "blocks": below, "norm": norm_path, "kind": _kind(config, blocks), "refused": {},
            **layer_fields(config, n)}


def structural_reason(config: dict[str, Any]) -> str | None:
    """Why a model type outside the registry has no layout depthlab can infer, from config.json's fields and the
    committed class structure (:mod:`depthlab.hf.structure`); None when that cannot tell (or it has one)."""
    from depthlab.hf.structure import structure_of

    why = wrapper_reason(config)
    if why is not None:
        return why
    causal = (structure_of(config["model_type"]) or {}).get("causal")
    if causal is None:
        return None
    if "refused" in causal:
        return causal["refused"]
    # config.json without is_decoder: the config class's own default, as the loaded config has it
    return encoder_reason(config.get("is_decoder", causal.get("is_decoder")), causal["blocks"])


@functools.lru_cache(maxsize=64)
def _layout_of_json(key: str) -> dict[str, Any]:
    config = json.loads(key)
    why = wrapper_reason(config)
    if why is not None:
        return {"refused": dict.fromkeys(ALL, why)}
    try:
        model = meta_model(config)
    except Exception as err:  # noqa: BLE001 - transformers refuses a config in many ways
        from depthlab.base.errors import first_line

        return {"refused": dict.fromkeys(ALL, f"transformers cannot build it: {first_line(err)[:160]}")}
    return layout(model)


def layout_of_config(config: Any) -> dict[str, Any]:
    """:func:`layout` of the class transformers builds for ``config`` (a config or config.json's dict), built on the
    meta device once per distinct config; a refusal the committed class structure already decides
    (:func:`structural_reason`) is returned without building anything."""
    raw = config if isinstance(config, dict) else config.to_dict()
    why = structural_reason(raw) if isinstance(raw.get("model_type"), str) else None
    if why is not None:
        return {"refused": dict.fromkeys(ALL, why)}
    try:
        values = as_config(config).to_dict()
    except Exception as err:  # noqa: BLE001 - transformers' config validation raises many kinds
        from depthlab.base.errors import first_line

        return {"refused": dict.fromkeys(ALL, f"transformers refuses its config: {first_line(err)[:160]}")}
    return _layout_of_json(config_key(values))


# ---------------------------------------------------------------------------------------------- the pre-norms
def _first(x: Any) -> Any:
    import torch

    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return x if isinstance(x, torch.Tensor) else None


class _Probe:
    """One forward of a model with hooks on some blocks: each block's input and output, each of its norm children's
    inputs; the outputs of the norms named in ``zeroed`` replaced by zeros (their branches then read nothing)."""

    def __init__(self, blocks: list[Any]) -> None:
        self.blocks = blocks
        self.zeroed: set[str] = set()
        self.io: dict[int, tuple[Any, Any]] = {}
        self.inputs: dict[int, dict[str, list[Any]]] = {}
        self.handles = []
        for i, block in enumerate(blocks):
            self.handles.append(block.register_forward_hook(functools.partial(self._block, i), with_kwargs=True))
            for name, child in block.named_children():
                if is_norm(child):
                    self.handles.append(child.register_forward_pre_hook(functools.partial(self._norm_in, i, name)))
                    self.handles.append(child.register_forward_hook(functools.partial(self._norm_out, name)))

    def _block(self, i: int, module: Any, args: tuple, kwargs: dict, out: Any) -> None:
        h = args[0] if args and hasattr(args[0], "shape") else kwargs.get("hidden_states")
        self.io[i] = (h, _first(out))

    def _norm_in(self, i: int, name: str, module: Any, args: tuple) -> None:
        self.inputs.setdefault(i, {}).setdefault(name, []).append(_first(args))

    def _norm_out(self, name: str, module: Any, args: tuple, out: Any) -> Any:
        if name not in self.zeroed:
            return None
        return (out[0].new_zeros(out[0].shape), *out[1:]) if isinstance(out, tuple) else out.new_zeros(out.shape)

    def run(self, model: Any, ids: Any, zeroed: list[str]) -> tuple[dict, dict]:
        import torch

        self.zeroed, self.io, self.inputs = set(zeroed), {}, {}
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        return self.io, self.inputs

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _close(a: Any, b: Any) -> bool:
    import torch

    if a is None or b is None or a.shape != b.shape:
        return False
    return bool(torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5 * max(1.0, float(b.abs().max()))))


def _stream_passes(a: tuple[dict, dict], b: tuple[dict, dict], name: str | None) -> bool:
    """Whether, in every probed block, ``name``'s input (None: the block's output) minus the block's input is the
    same for two different inputs: it is the residual stream plus what does not depend on it."""
    (io_a, in_a), (io_b, in_b) = a, b
    for i, (h_a, out_a) in io_a.items():
        h_b, out_b = io_b[i]
        if name is None:
            pairs = [(out_a, out_b)]
        else:
            pairs = list(zip(in_a.get(i, {}).get(name, []), in_b.get(i, {}).get(name, [])))
        if any(x_a is None or x_b is None or not _close(x_a - h_a, x_b - h_b) for x_a, x_b in pairs):
            return False
    return True


def _find_pre_norms(model: Any, blocks: list[Any]) -> list[str] | str:
    """The pre-norms of ``blocks`` (direct norm children, in call order): a norm is one when, with the pre-norms
    found before it giving zeros, its input is the block's input plus what does not depend on it (the residual
    stream); with all of them giving zeros the block's output must be its input plus a constant (the stream passes
    the block un-normalised, so these norms feed every branch); else the reason."""
    import torch

    gen = torch.Generator().manual_seed(0)
    vocab = min(300, int(model.config.vocab_size))
    ids = [torch.randint(3, vocab, (1, 12), generator=gen) for _ in range(2)]
    probe = _Probe(blocks)
    try:
        _, inputs = probe.run(model, ids[0], [])
        order = list(dict.fromkeys(name for per in inputs.values() for name in per))
        found: list[str] = []
        for name in order:
            if _stream_passes(*(probe.run(model, x, found) for x in ids), name):
                found.append(name)
        passes = _stream_passes(*(probe.run(model, x, found) for x in ids), None)
    finally:
        probe.remove()
    if not found:
        return "no pre-norm found: no norm of its blocks reads the residual stream ahead of a branch"
    if not passes:
        return (f"its blocks are not pre-norm residual blocks: with {', '.join(found)} silenced the block's output "
                "still depends on more than its input (a norm on the residual stream itself)")
    return found


def _norm_offset(norm: Any, width: int) -> float | None:
    """``c`` for a norm computing ``(c + weight) · x̂`` (+ bias): 0 or 1 from its outputs at weights 0, 1, 2; None when
    its output is not of that form."""
    import torch

    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if weight is None or weight.dim() != 1:
        return None
    x = torch.randn(2, 3, width, generator=torch.Generator().manual_seed(0))
    saved = (weight.detach().clone(), bias.detach().clone() if bias is not None else None)
    outs = []
    with torch.no_grad():
        if bias is not None:
            bias.zero_()
        for w in (0.0, 1.0, 2.0):
            weight.fill_(w)
            outs.append(_first(norm(x)).float())
        weight.copy_(saved[0])
        if bias is not None:
            bias.copy_(saved[1])
    y0, y1, y2 = outs
    if not _close(y2 - y1, y1 - y0) or float((y1 - y0).abs().max()) == 0.0:
        return None
    for c in (0.0, 1.0):
        if _close(y0, c * (y1 - y0)):
            return c
    return None


def _tiny_of(config: Any) -> Any:
    """A small random causal LM of ``config``'s family and flags (:func:`depthlab.hf.shrink.small_model`)."""
    from depthlab.hf.shrink import small_model

    return small_model(as_config(config))


@functools.lru_cache(maxsize=64)
def _probe_json(key: str) -> tuple[tuple[str, ...], float] | str:
    from depthlab.base.errors import first_line

    try:
        model = _tiny_of(json.loads(key))
        found = layout(model)
        if "blocks" not in found:
            return next(iter(found["refused"].values()))
        blocks = list(model.get_submodule(".".join(p for p in (found["base"], found["blocks"]) if p)))
        probed = blocks[1:] if len(blocks) > 1 else blocks  # block 1's pre-norms are scaled by 1/sqrt(1): no-ops
        names = _find_pre_norms(model, probed)
    except Exception as err:  # noqa: BLE001 - a family's forward may fail in many ways on a probe
        return f"its pre-norms could not be probed on a small model of its family ({first_line(err)[:120]})"
    if isinstance(names, str):
        return names
    norms = [getattr(b, n) for b in probed for n in names if is_norm(getattr(b, n, None))]
    if any(getattr(m, "weight", None) is None for m in norms):
        return f"its pre-norms ({', '.join(names)}) have no weight to fold the scale into"
    offsets = {_norm_offset(m, model.config.hidden_size) for m in norms}
    if len(offsets) != 1 or None in offsets:
        return "its pre-norms do not compute (c + weight) * x_hat with one c (the scale cannot be folded into them)"
    return tuple(names), offsets.pop()


def probe_pre_norms(config: Any) -> tuple[tuple[str, ...], float] | str:
    """(the block's pre-norm attribute names, their ``c`` in ``(c + weight) · x̂``) of ``config``'s family, probed once
    per distinct config on a tiny random model of the same family and flags; or the one-line reason there are none."""
    try:
        values = as_config(config).to_dict()
    except Exception as err:  # noqa: BLE001 - transformers' config validation raises many kinds
        return f"transformers refuses its config: {err}"
    return _probe_json(config_key(values))
