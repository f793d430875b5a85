"""Hugging Face -> depthlab: an HF Llama-layout decoder read as a depthlab ``DecoderLM``.

    model = from_hf("path/to/llama")                      # HF Llama / Mistral / Qwen2 / Qwen3 (or .gguf)

Only exact conversions: ``from_hf`` gives identical logits. Which families convert, and how each differs from
Llama (Qwen2's q/k/v biases, Qwen3's QK-norm, whether a sliding window is on), is their registry entry's
:class:`~depthlab.hf.families.Conversion`. The way back is :mod:`depthlab.hf.export` (``to_hf``).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.hf.families import conversion_of
from depthlab.hf.loading import load_pretrained
from depthlab.models.config import ModelConfig
from depthlab.models.decoder import DecoderLM, model_with_weights
from depthlab.models.schemes import BASELINE_SCHEME, scheme_names

log = logging.getLogger(__name__)
LNS_SCHEME = scheme_names(lns=True)[0]  # what an HF checkpoint marked with LNS (after-norm) loads as

# depthlab key pattern -> HF key pattern (per-layer keys use {i})
_KEY_MAP: list[tuple[str, str]] = [
    (r"embed\.weight", "model.embed_tokens.weight"),
    (r"blocks\.(\d+)\.attn_norm\.weight", "model.layers.{0}.input_layernorm.weight"),
    (r"blocks\.(\d+)\.attn\.(q|k|v|o)_proj\.(weight|bias)", "model.layers.{0}.self_attn.{1}_proj.{2}"),
    (r"blocks\.(\d+)\.attn\.(q|k)_norm\.weight", "model.layers.{0}.self_attn.{1}_norm.weight"),  # Qwen3
    (r"blocks\.(\d+)\.ffn_norm\.weight", "model.layers.{0}.post_attention_layernorm.weight"),
    (r"blocks\.(\d+)\.ffn\.(gate|up|down)_proj\.weight", "model.layers.{0}.mlp.{1}_proj.weight"),
    (r"norm\.weight", "model.norm.weight"),
    (r"lm_head\.weight", "lm_head.weight"),
]


def hf_key(depthlab_key: str) -> str:
    """The HF Llama state-dict key of a depthlab parameter."""
    for pattern, target in _KEY_MAP:
        m = re.fullmatch(pattern, depthlab_key)
        if m:
            return target.format(*m.groups())
    raise DepthlabError(f"parameter {depthlab_key!r} has no counterpart in a vanilla Llama checkpoint")


# ---------------------------------------------------------------------------------------- from_hf
def _rope_theta(hf_cfg: Any) -> float:
    params = getattr(hf_cfg, "rope_parameters", None) or getattr(hf_cfg, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise DepthlabError(f"RoPE type {rope_type!r} is not supported; choose one of: default")
    theta = params.get("rope_theta", getattr(hf_cfg, "rope_theta", None))
    if theta is None:
        raise DepthlabError("the HF config has no rope_theta")
    return float(theta)


def config_from_hf(hf_cfg: Any, scheme: str = "pre", **overrides: Any) -> ModelConfig:
    """A ModelConfig with the shape of an HF Llama/Mistral/Qwen2/Qwen3 config."""
    model_type = getattr(hf_cfg, "model_type", None)
    conv = conversion_of(model_type)
    if getattr(hf_cfg, "hidden_act", "silu") != "silu":
        raise DepthlabError(f"unsupported activation {hf_cfg.hidden_act!r}; choose one of: silu")
    if getattr(hf_cfg, "mlp_bias", False) or (not conv.qkv_bias and getattr(hf_cfg, "attention_bias", False)):
        raise DepthlabError(f"{model_type} checkpoints with attention_bias/mlp_bias are not supported "
                            "(depthlab has biases on q/k/v only, the Qwen2 shape)")
    window = getattr(hf_cfg, "sliding_window", None)
    if window and (not conv.window_switch or getattr(hf_cfg, conv.window_switch, False)):
        log.warning("%s uses sliding-window attention (%d); depthlab attends to the full context, "
                    "so logits match only for sequences up to %d tokens", model_type, window, window)
    heads = hf_cfg.num_attention_heads
    head_dim = getattr(hf_cfg, "head_dim", None)
    fields = dict(
        name=getattr(hf_cfg, "name_or_path", None) or getattr(hf_cfg, "_name_or_path", None) or model_type,
        vocab_size=hf_cfg.vocab_size,
        n_layers=hf_cfg.num_hidden_layers,
        d_model=hf_cfg.hidden_size,
        n_heads=heads,
        n_kv_heads=getattr(hf_cfg, "num_key_value_heads", None) or heads,
        head_dim=None if head_dim in (None, hf_cfg.hidden_size // heads) else head_dim,
        d_ff=hf_cfg.intermediate_size,
        max_seq_len=getattr(hf_cfg, "max_position_embeddings", 2048),
        norm_eps=float(hf_cfg.rms_norm_eps),
        rope_theta=_rope_theta(hf_cfg),
        qkv_bias=conv.qkv_bias,
        qk_norm=conv.qk_norm,
        tie_embeddings=bool(getattr(hf_cfg, "tie_word_embeddings", False)),
        init_std=float(getattr(hf_cfg, "initializer_range", 0.02)),
        scheme=scheme,
        extra={"hf_model_type": model_type},
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def load_hf_model(path: str | Path, gguf_file: str | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load an HF causal LM from a directory, a hub name (online), or a ``.gguf`` file."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if gguf_file is None and path.suffix == ".gguf":
        if not path.is_file():
            raise DepthlabError(f"GGUF file {str(path)!r} does not exist")
        path, gguf_file = path.parent, path.name
    kwargs: dict[str, Any] = {"dtype": dtype}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    return load_pretrained(path, AutoModelForCausalLM, **kwargs)


def _scheme_for(hf_cfg: Any, scheme: str | None) -> str:
    """The scheme to build: an LNS-marked HF config must load as ``lns`` (see depthlab.hf.lns)."""
    from depthlab.hf.lns import layernorm_scaling_marker

    lns = layernorm_scaling_marker(hf_cfg) is not None
    if scheme is None:
        return LNS_SCHEME if lns else BASELINE_SCHEME
    if lns and scheme != LNS_SCHEME:
        raise DepthlabError(
            f"this HF model was trained with LayerNorm Scaling (config.layernorm_scaling); loading it as "
            f"scheme {scheme!r} would give a different model: use scheme={LNS_SCHEME!r}, or fold it first with "
            "depthlab.hf.fold_layernorm_scaling"
        )
    return scheme


@torch.no_grad()
def from_hf(
    model_or_path: nn.Module | str | Path,
    scheme: str | None = None,
    *,
    gguf_file: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> DecoderLM:
    """A depthlab model with the weights of an HF Llama-shaped causal LM (identical logits for
    ``scheme="pre"``). Other schemes with the same parameters (``lns``, init-only schemes) load too:
    e.g. an HF model trained with LNS loads back with ``scheme="lns"``. ``scheme=None`` (default):
    ``"lns"`` when the HF config records LayerNorm Scaling (``depthlab.hf.apply_layernorm_scaling``),
    else ``"pre"``; an LNS checkpoint is never read as another scheme."""
    cfg = _config_before_load(model_or_path, scheme) if gguf_file is None else None
    hf_model = model_or_path if isinstance(model_or_path, nn.Module) else load_hf_model(model_or_path, gguf_file, dtype)
    scheme = _scheme_for(hf_model.config, scheme)
    cfg = cfg or config_from_hf(hf_model.config, scheme)
    hf_state = hf_model.state_dict()
    state = {}
    for key in _depthlab_keys(cfg):
        source = hf_key(key)
        if source not in hf_state:
            raise DepthlabError(f"scheme {scheme!r} needs {key!r}, which the HF checkpoint lacks ({source!r})")
        state[key] = hf_state[source].detach().to(dtype)
    extra = {k for k in hf_state if k.startswith("model.") or k == "lm_head.weight"} - {hf_key(k) for k in state}
    if extra - {"lm_head.weight"}:
        raise DepthlabError(f"HF weights depthlab cannot place: {sorted(extra)[:4]}")
    return model_with_weights(cfg, state, "the HF checkpoint")


def _config_before_load(source: Any, scheme: str | None) -> ModelConfig | None:
    """The depthlab config of an HF model directory's config.json, before any weight is read: a family or shape
    depthlab cannot convert (``finetune`` of a GPT-2, a BERT) is refused in one line at once; None for a model
    already loaded, a hub name or a GGUF file (read by the loader)."""
    if isinstance(source, nn.Module):
        return None
    path = Path(source).expanduser()
    if not (path.is_dir() and (path / "config.json").is_file()):
        return None
    from transformers import AutoConfig

    try:
        hf_cfg = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    except Exception:  # noqa: BLE001 - the loader reads it again and names what is wrong
        return None
    return config_from_hf(hf_cfg, _scheme_for(hf_cfg, scheme))


def _depthlab_keys(cfg: ModelConfig) -> list[str]:
    """State-dict keys of a depthlab model of ``cfg`` (a tied head shares the embedding's)."""
    with torch.device("meta"):
        keys = list(DecoderLM(cfg).state_dict())
    return [k for k in keys if not (cfg.tie_embeddings and k == "lm_head.weight")]


__all__ = ["from_hf", "config_from_hf", "load_hf_model", "hf_key"]
