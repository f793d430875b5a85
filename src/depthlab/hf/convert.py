"""Hugging Face <-> depthlab conversion.

    model = from_hf("path/to/llama")                      # HF Llama / Mistral / Qwen2 / Qwen3 (or .gguf)
    to_hf(model, "out/")                                  # vanilla checkpoint, LNS folded in

Only exact conversions: ``from_hf`` gives identical logits; ``to_hf`` refuses schemes that a
vanilla Llama cannot express. Folding is exact because RMSNorm(x)·γ·s = RMSNorm(x)·(γ·s), and a
gain g on a branch output is diag(g)·W_out.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError, choices
from depthlab.hf.architectures import CONVERTIBLE_MODEL_TYPES
from depthlab.hf.loading import load_pretrained
from depthlab.models.config import ModelConfig
from depthlab.models.configure import scheme_option
from depthlab.models.decoder import DecoderLM, model_with_weights
from depthlab.models.nn.blocks import PreNormBlock
from depthlab.models.nn.norms import ChannelGain, RMSNorm, ScalarGain, Scale
from depthlab.models.schemes import BASELINE_SCHEME, LNS_POSITIONS, SCHEMES, scheme_names

log = logging.getLogger(__name__)
#: The HF families converted into a depthlab DecoderLM (the Llama layout).
SUPPORTED_MODEL_TYPES = CONVERTIBLE_MODEL_TYPES
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
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DepthlabError(f"unsupported HF model_type {model_type!r}; {choices(SUPPORTED_MODEL_TYPES)}")
    if getattr(hf_cfg, "hidden_act", "silu") != "silu":
        raise DepthlabError(f"unsupported activation {hf_cfg.hidden_act!r}; choose one of: silu")
    if getattr(hf_cfg, "mlp_bias", False) or (model_type != "qwen2" and getattr(hf_cfg, "attention_bias", False)):
        raise DepthlabError(f"{model_type} checkpoints with attention_bias/mlp_bias are not supported "
                            "(depthlab has biases on q/k/v only, the Qwen2 shape)")
    window = getattr(hf_cfg, "sliding_window", None)
    if window and (model_type != "qwen2" or getattr(hf_cfg, "use_sliding_window", False)):
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
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
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
    hf_model = model_or_path if isinstance(model_or_path, nn.Module) else load_hf_model(model_or_path, gguf_file, dtype)
    scheme = _scheme_for(hf_model.config, scheme)
    cfg = config_from_hf(hf_model.config, scheme)
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


def _depthlab_keys(cfg: ModelConfig) -> list[str]:
    """State-dict keys of a depthlab model of ``cfg`` (a tied head shares the embedding's)."""
    with torch.device("meta"):
        keys = list(DecoderLM(cfg).state_dict())
    return [k for k in keys if not (cfg.tie_embeddings and k == "lm_head.weight")]


# ------------------------------------------------------------------------------------------ to_hf
class _NotFoldable(Exception):
    pass


_FACTORS: dict[type, Callable[[nn.Module], float | torch.Tensor]] = {
    nn.Identity: lambda m: 1.0,
    Scale: lambda m: m.scale,
    ScalarGain: lambda m: m.gain.detach().float(),
    ChannelGain: lambda m: m.gain.detach().float(),
}


def _factor(module: nn.Module, where: str) -> float | torch.Tensor:
    """The multiplier a slot module applies, if it is a fixed or learnable scaling; else refuse."""
    if type(module) not in _FACTORS:
        raise _NotFoldable(f"{where} is a {type(module).__name__}")
    return _FACTORS[type(module)](module)


def _check_outside_blocks(model: DecoderLM) -> None:
    if not isinstance(model.embed_norm, nn.Identity):
        raise _NotFoldable(f"the embedding output passes through a {type(model.embed_norm).__name__}")
    if type(model.norm) is not RMSNorm or model.norm.scale != 1.0:
        raise _NotFoldable(f"the final norm is a {type(model.norm).__name__}")
    if model.cfg.qk_norm and model.cfg.qkv_bias:
        raise _NotFoldable("QK-norm with q/k/v biases has no transformers counterpart (Qwen3 biases o_proj too)")


def _fold(model: DecoderLM) -> dict[str, torch.Tensor]:
    """Every scaling folded into neighbouring weights (depthlab keys); ``_NotFoldable`` where Llama cannot."""
    _check_outside_blocks(model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for i, block in enumerate(model.blocks):
        where = f"block {i + 1}"
        if not isinstance(block, PreNormBlock):
            raise _NotFoldable(f"{where} is a {type(block).__name__}: its norm sits after the residual add")
        if not isinstance(block.resid_scale, nn.Identity):
            raise _NotFoldable(f"{where} scales the residual stream itself")
        for branch, out_proj in (("attn", "attn.o_proj"), ("ffn", "ffn.down_proj")):
            if not isinstance(getattr(block, f"{branch}_prescale"), nn.Identity):
                raise _NotFoldable(f"{where} scales the input of its {branch} norm (RMSNorm's eps breaks folding)")
            norm = getattr(block, f"{branch}_norm")
            if type(norm) is not RMSNorm:
                raise _NotFoldable(f"{where} {branch} norm is a {type(norm).__name__}")
            state[f"blocks.{i}.{branch}_norm.weight"] *= norm.scale  # LNS after the norm
            gain = _factor(getattr(block, f"{branch}_out"), f"{where} {branch} output")
            if isinstance(gain, torch.Tensor):
                gain = gain.reshape(-1, 1)  # (D_out, 1) or (1, 1): row j of W_out times gain[j]
            state[f"blocks.{i}.{out_proj}.weight"] *= gain
        for qk in ("q_norm", "k_norm"):
            norm = getattr(block.attn, qk)
            if not isinstance(norm, nn.Identity) and (type(norm) is not RMSNorm or norm.scale != 1.0):
                raise _NotFoldable(f"{where} {qk} is a {type(norm).__name__}")
    return state


@torch.no_grad()
def folded_state_dict(model: DecoderLM) -> dict[str, torch.Tensor]:
    """depthlab state dict with every scaling folded into neighbouring weights, in HF key names."""
    try:
        state = _fold(model)
    except _NotFoldable as err:
        raise DepthlabError(
            f"scheme {model.cfg.scheme!r} cannot be written as a vanilla Llama checkpoint ({err}); "
            f"exportable: {', '.join(exportable_schemes())} (LNS at positions {', '.join(exportable_lns_positions())})"
        ) from None
    skip = {"lm_head.weight"} if model.cfg.tie_embeddings else set()
    return {hf_key(k): v for k, v in state.items() if not k.endswith(".gain") and k not in skip}


def hf_tokenizer(tokenizer: Any) -> Any | None:
    """A ``transformers`` tokenizer for a depthlab one (to ship beside an export), or None for the
    byte tokenizer, which has no HF equivalent."""
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

    inner = getattr(tokenizer, "tok", None)
    if isinstance(inner, PreTrainedTokenizerBase):
        return inner
    if inner is not None and hasattr(inner, "token_to_id"):  # a tokenizers.Tokenizer (our BPE)
        eos = inner.id_to_token(tokenizer.eos_id)
        pad = inner.id_to_token(tokenizer.pad_id)
        return PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=eos, pad_token=pad)
    return None


def special_token_ids(tokenizer: Any) -> dict[str, int | None]:
    """``bos_token_id`` / ``eos_token_id`` / ``pad_token_id`` of a depthlab (or HF) tokenizer; None
    where it has no such token, or when there is no tokenizer."""
    if tokenizer is None:
        return {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    inner = getattr(tokenizer, "tok", None)
    bos = getattr(inner, "bos_token_id", None)
    eos = getattr(tokenizer, "eos_id", getattr(tokenizer, "eos_token_id", None))
    pad = getattr(tokenizer, "pad_id", getattr(tokenizer, "pad_token_id", None))
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


def set_special_token_ids(hf_model: nn.Module, tokenizer: Any) -> None:
    """Write the tokenizer's own special-token ids into the model's config and generation config (not
    the LlamaConfig defaults bos=1 / eos=2, which name ordinary tokens of a depthlab vocabulary), so
    ``generate()`` stops at the tokenizer's EOS."""
    for key, value in special_token_ids(tokenizer).items():
        setattr(hf_model.config, key, value)
        if getattr(hf_model, "generation_config", None) is not None:
            setattr(hf_model.generation_config, key, value)


def save_hf_checkpoint(hf_model: nn.Module, out_dir: str | Path, tokenizer: Any = None) -> Path:
    """``save_pretrained`` (safetensors) into ``out_dir`` plus the tokenizer's HF files (a warning when
    the tokenizer has no HF equivalent, e.g. ``bytes``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(out, safe_serialization=True)
    if tokenizer is not None:
        hf_tok = hf_tokenizer(tokenizer)
        if hf_tok is None:
            log.warning("tokenizer %r has no Hugging Face equivalent; the checkpoint has no tokenizer files",
                        getattr(tokenizer, "spec", tokenizer))
        else:
            hf_tok.save_pretrained(out)
    return out


def _foldable(scheme: str, **options: Any) -> bool:
    """Whether a model of ``scheme`` (with ``options``) folds into a vanilla Llama checkpoint: decided
    by its structure, on a two-block probe built on the meta device."""
    with torch.device("meta"):
        probe = DecoderLM(ModelConfig(n_layers=2, d_model=8, n_heads=2, d_ff=8, vocab_size=8, scheme=scheme,
                                      scheme_options=options))
    try:
        _fold(probe)
        return True
    except _NotFoldable:
        return False


@functools.cache
def exportable_schemes() -> tuple[str, ...]:
    """Schemes (at their default options) whose models fold into a vanilla Llama checkpoint."""
    return tuple(name for name in SCHEMES if _foldable(name))


@functools.cache
def exportable_lns_positions() -> tuple[str, ...]:
    """LNS positions whose models fold exactly (a scale before the norm, or on the residual, does not)."""
    return tuple(p for p in LNS_POSITIONS if _foldable(scheme_names(lns=True)[0], position=p))


def refused_schemes() -> tuple[str, ...]:
    """Schemes ``to_hf`` / ``depthlab export`` refuse (generated from the registry, for docs and help)."""
    return tuple(name for name in SCHEMES if name not in exportable_schemes())


def hf_config_for(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Any:
    """A transformers LlamaConfig for a depthlab shape; Qwen2Config when q/k/v carry biases, Qwen3Config
    with QK-norm."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.dim_head,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        initializer_range=cfg.init_std,
        hidden_act="silu",
        dtype=dtype,
    )
    if cfg.qk_norm:
        return Qwen3Config(**common, attention_bias=False, use_sliding_window=False)
    if cfg.qkv_bias:
        return Qwen2Config(**common, use_sliding_window=False)
    return LlamaConfig(**common, attention_bias=False, mlp_bias=False)


@torch.no_grad()
def to_hf_model(model: DecoderLM, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The equivalent vanilla transformers model (in memory), LNS and branch gains folded."""
    from transformers import AutoModelForCausalLM

    state = folded_state_dict(model)
    hf_cfg = hf_config_for(model.cfg, dtype)
    hf_model = AutoModelForCausalLM.from_config(hf_cfg, dtype=dtype)
    missing, unexpected = hf_model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.cfg.tie_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"HF export key mismatch: missing={missing[:4]} unexpected={unexpected[:4]}")
    if model.cfg.tie_embeddings:
        hf_model.tie_weights()
    return hf_model.eval()


def to_hf(model: DecoderLM, out_dir: str | Path, *, dtype: torch.dtype = torch.float32, tokenizer: Any = None,
          command: str | None = None) -> Path:
    """Write a Hugging Face checkpoint (safetensors + config.json) that plain
    ``AutoModelForCausalLM.from_pretrained(out_dir)`` loads with no custom code, same logits.
    ``tokenizer``: a depthlab tokenizer (or an HF one) to save beside it; ``command``: the command line that made
    it, recorded in config.json's ``depthlab`` section (``exported_by``)."""
    import depthlab  # the version only

    hf_model = to_hf_model(model, dtype)
    hf_model.config.depthlab = {
        "version": depthlab.__version__,
        "source_scheme": model.cfg.scheme,
        "scheme_options": model.cfg.scheme_options,
        "lns_position": scheme_option(model.cfg, "position") if model.cfg.scheme in scheme_names(lns=True) else None,
        "folded": True,  # the scalings are in the weights: this is a vanilla model
        **({"exported_by": command} if command else {}),
    }
    set_special_token_ids(hf_model, tokenizer)
    out = save_hf_checkpoint(hf_model, out_dir, tokenizer)
    (out / "depthlab_config.json").write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    log.info("wrote Hugging Face checkpoint to %s", out)
    return out


__all__ = ["from_hf", "to_hf", "to_hf_model", "config_from_hf", "hf_config_for", "load_hf_model",
           "folded_state_dict", "exportable_schemes", "exportable_lns_positions", "refused_schemes", "hf_key",
           "hf_tokenizer", "special_token_ids", "set_special_token_ids", "SUPPORTED_MODEL_TYPES"]
