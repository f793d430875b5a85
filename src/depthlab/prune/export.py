"""Block surgery and export: a pruned model as a Hugging Face checkpoint any runtime loads.

    pruned = drop_layers(hf_model, [21, 22, 23])         # a copy with 3 decoder layers fewer
    write_hf(pruned, "pruned/x", tokenizer)              # safetensors + config.json + tokenizer
    check = verify_export("pruned/x", pruned, ids)       # reload with plain transformers: logits, generate

What changes in an HF causal LM when layers go:

- the layer ``ModuleList`` keeps the surviving layers, in order;
- every ``layer_idx`` attribute inside them (attention modules index the KV cache with it) is
  renumbered 0..k-1, so ``generate`` with a cache works;
- ``config.num_hidden_layers`` becomes k and every per-layer fact the family's entry names is cut
  (:func:`depthlab.hf.families.cut_config`): per-layer lists (``layer_types``, ``mlp_layer_types``,
  ``no_rope_layers``) sliced, index lists (``mlp_only_layers``, ``moe_layers``) renumbered, index rules
  (``max_window_layers``, ``first_k_dense_replace``, ``decoder_sparse_step``) rewritten;
- tied embeddings stay tied (the copy shares the embedding and head as the original does).

A model with LayerNorm Scaling hooks (``depthlab.hf.apply_layernorm_scaling``) is folded first: each
surviving layer keeps its *original* depth's 1/sqrt(l), in its norm weights. A depthlab model is
converted with :func:`depthlab.hf.to_hf_model`, which folds LNS at each block's own depth.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.capture import find_layers
from depthlab.base.errors import DepthlabError
from depthlab.hf.families import INFERRED, get_path, layer_slice_index, split_path, supporting
from depthlab.hf.wrappers import check_tower, cut_tower, model_tower_family

log = logging.getLogger(__name__)

#: HF ``model_type`` values whose layer list, KV-cache indexing and per-layer config depthlab knows.
PRUNABLE_MODEL_TYPES: tuple[str, ...] = tuple(supporting("prune"))


#: Largest |Δ logit| between a pruned export and the original with those blocks skipped, by compute dtype, accepted
#: for an inferred layout (:func:`require_exact`).
EXPORT_TOL: dict[str, float] = {"float32": 1e-3, "float64": 1e-6, "bfloat16": 0.25, "float16": 0.05}


def check_prunable(model: nn.Module, tower: str = "language") -> None:
    """Refuse what the surgery does not know: an unknown HF architecture, a depthlab scheme that a
    vanilla Llama cannot express (``tower``: an image-text wrapper's, :mod:`depthlab.hf.wrappers`)."""
    from depthlab.models.decoder import DecoderLM

    if isinstance(model, DecoderLM):
        from depthlab.hf import folded_state_dict

        with torch.device("meta"):
            folded_state_dict(DecoderLM(model.cfg))  # raises DepthlabError naming the exportable schemes
        return
    model_tower_family(model, tower, "prune")  # one line naming the families that can, or why this one cannot
    if not hasattr(model, "generate"):
        raise DepthlabError(f"{type(model).__name__} is not a causal LM; depthlab prune needs one")
    find_layers(model, tower)


def plain_weights(model: nn.Module) -> None:
    """A GGUF checkpoint is dequantised on load (plain tensors) but keeps transformers' GGUF quantizer,
    which refuses ``save_pretrained``: drop it, so the pruned copy saves as ordinary safetensors."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return
    method = str(getattr(quantizer.quantization_config, "quant_method", "")).lower()
    if "gguf" not in method:
        raise DepthlabError(f"cannot prune a model quantized with {method!r}: load it in full precision (fp32/bf16)")
    model.hf_quantizer = None
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


@torch.no_grad()
def drop_layers(model: nn.Module, removed: Sequence[int], inplace: bool = False, tower: str = "language") -> nn.Module:
    """An HF causal LM without the decoder layers ``removed`` (1-based): layers, ``layer_idx`` and
    config renumbered (see the module docstring). LNS hooks are folded first. A copy unless ``inplace``.
    ``tower``: which block list of an image-text wrapper loses them (its config cut by the wrapper entry's rules:
    :func:`depthlab.hf.wrappers.cut_tower`)."""
    from depthlab.hf.lns import fold_layernorm_scaling, is_layernorm_scaled

    check_prunable(model, tower)
    from depthlab.models.decoder import DecoderLM

    if not isinstance(model, DecoderLM):
        check_tower(model.config, tower, "prune", removed)  # blocks the config cannot lose, before any work
    if is_layernorm_scaled(model):
        model = fold_layernorm_scaling(model, inplace=inplace)  # each layer's own 1/sqrt(l), in its weights
        inplace = True
    if not inplace:
        model = copy.deepcopy(model)
    plain_weights(model)
    fam = model_tower_family(model, tower, "prune")  # read before the cut: an inferred layout by the block count
    owner, attr = split_path(model, fam.layers)
    layers = getattr(owner, attr)
    n = len(layers)
    gone = set(removed)
    bad = sorted(b for b in gone if not 1 <= b <= n)
    if bad or len(gone) >= n:
        raise DepthlabError(f"cannot remove blocks {sorted(gone)} from a model of {n} (1..{n}, keep at least one)")
    keep = [i for i in range(n) if i + 1 not in gone]
    for new, old in enumerate(keep):
        for module in layers[old].modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new
    setattr(owner, attr, nn.ModuleList(layers[i] for i in keep))
    _cut_layer_slices(model, keep, tower, fam)
    cut_tower(model.config, tower, keep, n)
    if fam.inferred:  # the export's record says so (config.json's "depthlab")
        model.config.depthlab = {**(getattr(model.config, "depthlab", None) or {}), "layout": INFERRED}
    return model


def require_exact(model_type: str, check: dict[str, Any], dtype: Any = None) -> None:
    """For a layout inferred from the model: a one-line DepthlabError when the pruned export's logits differ from the
    original's with those blocks skipped (``check``'s max |Δ| over ``EXPORT_TOL`` of ``dtype``) or its cached
    ``generate`` from its uncached one, raised inside the publishing block, so nothing is written."""
    tol = EXPORT_TOL.get(str(dtype).replace("torch.", ""), EXPORT_TOL["float32"])
    diffs = [check.get(k) for k in ("max_abs_logit_diff_vs_skipping_in_original", "max_abs_logit_diff")]
    worst = max((d for d in diffs if d is not None), default=0.0)
    if not worst <= tol:
        raise DepthlabError(f"depthlab cannot prune {model_type} (layout inferred): the pruned export's logits differ "
                            f"from the original's with those blocks skipped by {worst:.2e} (> {tol:g}); nothing written")
    if check.get("generate_cache_matches_no_cache") is False:
        raise DepthlabError(f"depthlab cannot prune {model_type} (layout inferred): the pruned export's cached "
                            "generate differs from its uncached one; nothing written")


def _cut_layer_slices(model: nn.Module, keep: list[int], tower: str, fam: Any) -> None:
    """Tensors holding one slice per layer (the family's ``layer_slices``: Gemma 4's per-layer embedding table and
    projection) cut to the kept layers' slices, the module's sizes with them."""
    from depthlab.hf.wrappers import tower_config

    for key in fam.layer_slices:
        path, _, name = key.rpartition(".")
        module = get_path(model, path)
        dim, index = layer_slice_index(fam, key, tower_config(model.config, tower), keep)
        weight = getattr(module, name)
        setattr(module, name, nn.Parameter(weight.index_select(dim, torch.tensor(index, device=weight.device)),
                                           requires_grad=weight.requires_grad))
        if isinstance(module, nn.Embedding):
            module.embedding_dim = module.weight.shape[1]
        elif isinstance(module, nn.Linear):
            module.out_features, module.in_features = module.weight.shape


def hf_model_of(model: nn.Module) -> nn.Module:
    """The HF model to export: a depthlab model converted (LNS folded per block), an HF one as is."""
    from depthlab.models.decoder import DecoderLM

    if isinstance(model, DecoderLM):
        from depthlab.hf import to_hf_model

        return to_hf_model(model, next(model.parameters()).dtype).to(next(model.parameters()).device)
    return model


def write_hf(model: nn.Module, out: str | Path, tokenizer: Any = None, provenance: dict | None = None) -> Path:
    """``save_pretrained`` (safetensors) plus the tokenizer; ``provenance`` lands in config.json under ``depthlab``."""
    from depthlab.hf.export import save_hf_checkpoint
    from depthlab.hf.tokenizers import set_special_token_ids

    if tokenizer is not None and not hasattr(getattr(tokenizer, "tok", None), "all_special_ids"):
        set_special_token_ids(model, tokenizer)  # a depthlab tokenizer: its ids, not LlamaConfig's bos=1 / eos=2
    if provenance is not None:
        model.config.depthlab = {**(getattr(model.config, "depthlab", None) or {}), **provenance}
    return save_hf_checkpoint(model, out, tokenizer)


@torch.no_grad()
def verify_export(out: str | Path, reference: nn.Module, ids: torch.Tensor, new_tokens: int = 8) -> dict[str, Any]:
    """Reload ``out`` with plain ``AutoModelForCausalLM.from_pretrained`` and compare its logits on
    ``ids`` with ``reference`` (max |Δ|); greedy-generate ``new_tokens`` with the KV cache and without."""
    from transformers import AutoModelForCausalLM

    dtype = next(reference.parameters()).dtype
    device = next(reference.parameters()).device
    loaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=dtype, trust_remote_code=False).to(device).eval()
    if device.type == "cpu" and dtype == torch.bfloat16:  # computed as load_target computes the reference
        from depthlab.targets.upcast import upcast_while_computing

        upcast_while_computing(loaded)
    ids = ids.to(device)
    ref = lm_logits(reference, ids)
    got = lm_logits(loaded, ids)
    prompt = ids[:1, : min(8, ids.shape[1])]
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    with_cache = loaded.generate(prompt, use_cache=True, **kw)
    without = loaded.generate(prompt, use_cache=False, **kw)
    return {"max_abs_logit_diff": float((ref.float() - got.float()).abs().max()),
            "n_layers_loaded": int(loaded.config.num_hidden_layers),
            "architecture": type(loaded).__name__,
            "generated_tokens": with_cache[0, prompt.shape[1]:].tolist(),
            "generate_cache_matches_no_cache": bool(torch.equal(with_cache, without))}


def lm_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of a depthlab model or an HF causal LM (no cache), either of them possibly wrapped with
    LoRA adapters (a peft model: its base model decides how it is called)."""
    from depthlab.models.decoder import DecoderLM

    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    if isinstance(base, DecoderLM):
        return model(ids).logits
    return model(input_ids=ids, use_cache=False).logits


def _timed_generate(model: nn.Module, prompt: torch.Tensor, new_tokens: int) -> float:
    kw = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "use_cache": True,
          "pad_token_id": 0}
    if prompt.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(prompt, **kw)
    if prompt.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


@torch.no_grad()
def generation_latency(models: dict[str, nn.Module], prompt: torch.Tensor, new_tokens: int = 16,
                       repeats: int = 5) -> dict[str, dict[str, Any]]:
    """Greedy ``generate`` of ``new_tokens`` (KV cache) after ``prompt`` (1, T) by each model: median
    seconds of ``repeats`` rounds, the models interleaved within a round (fair under a drifting load)."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        _timed_generate(model, prompt, 2)  # warm-up
    for _ in range(repeats):
        for name, model in models.items():
            times[name].append(_timed_generate(model, prompt, new_tokens))
    out = {}
    for name, ts in times.items():
        sec = sorted(ts)[len(ts) // 2]
        out[name] = {"seconds": sec, "tokens_per_s": new_tokens / sec, "new_tokens": new_tokens,
                     "prompt_tokens": int(prompt.shape[1]), "repeats": repeats, "device": str(prompt.device)}
    return out


def cost(model: nn.Module, seq_len: int) -> dict[str, int]:
    """Parameters (and stored buffers) and forward FLOPs per token at context ``seq_len``: 2 per weight of every linear
    layer (LM head included) + 2·T·(heads·head_dim) per layer for the causal attention scores and mixing."""
    stored = {id(p): p for p in model.parameters()}  # and the buffers a checkpoint stores (routing tables, biases):
    for module in model.modules():                   # what the streamed engine counts from the checkpoint's index
        stored.update({id(b): b for name, b in module._buffers.items()
                       if b is not None and name not in module._non_persistent_buffers_set})
    n_params = sum(t.numel() for t in stored.values())
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    layers = find_layers(model)
    attn = 0
    for layer in layers:
        q = next((m for name, m in layer.named_modules() if name.endswith("q_proj")), None)
        attn += 2 * seq_len * (q.out_features if q is not None else 0)
    return {"params": n_params, "flops_per_token": 2 * linear + attn, "n_layers": len(layers)}
