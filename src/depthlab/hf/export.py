"""depthlab -> Hugging Face: a depthlab model written as a vanilla transformers checkpoint.

    to_hf(model, "out/")                                  # vanilla checkpoint, LNS folded in

``to_hf`` refuses schemes that a vanilla Llama cannot express. Folding is exact because RMSNorm(x)·γ·s =
RMSNorm(x)·(γ·s), and a gain g on a branch output is diag(g)·W_out. The family written is the registry's
convertible family of the model's layout (:func:`depthlab.hf.families.export_family`: Llama, Qwen2 with q/k/v
biases, Qwen3 with QK-norm).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.hf.convert import hf_key
from depthlab.hf.families import export_family
from depthlab.hf.tokenizers import hf_tokenizer, set_special_token_ids
from depthlab.models.config import ModelConfig
from depthlab.models.configure import scheme_option
from depthlab.models.decoder import DecoderLM
from depthlab.models.nn.blocks import PreNormBlock
from depthlab.models.nn.norms import ChannelGain, RMSNorm, ScalarGain, Scale
from depthlab.models.schemes import LNS_POSITIONS, SCHEMES, scheme_names

log = logging.getLogger(__name__)


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
    """The transformers config of a depthlab shape, in the registry's convertible family of its layout (Llama;
    Qwen2 when q/k/v carry biases, Qwen3 with QK-norm)."""
    from transformers import AutoConfig

    fam = export_family(cfg.qkv_bias, cfg.qk_norm)
    return AutoConfig.for_model(
        fam.model_type,
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
        **fam.convert.export,
    )


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
    from depthlab.base.fileio import publish

    # published whole (a temporary sibling, renamed): a full disk is one line naming it and leaves nothing behind
    # (safetensors' raw "SafetensorError ... os error 28" and a partial directory before)
    with publish(out_dir, directory=True, if_exists="refuse") as tmp:
        save_hf_checkpoint(hf_model, tmp, tokenizer)
        (tmp / "depthlab_config.json").write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    out = Path(out_dir)
    log.info("wrote Hugging Face checkpoint to %s", out)
    return out


__all__ = ["to_hf", "to_hf_model", "hf_config_for", "folded_state_dict", "exportable_schemes",
           "exportable_lns_positions", "refused_schemes", "save_hf_checkpoint"]
