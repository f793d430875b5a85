"""DecoderLM: embed -> blocks -> final norm -> LM head. Knows nothing of training, IO or devices.

The residual stream at block boundaries is exposed for the diagnostics:
``hidden_states[0]`` is the embedding output (input of block 1), ``hidden_states[l]`` the output
of block ``l`` (before the final norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.config import ModelConfig
from depthlab.errors import DepthlabError, first_line
from depthlab.nn.attention import RotaryEmbedding
from depthlab.schemes import decoder_parts, get_scheme

IGNORE_INDEX = -100  # label of a target that counts in no loss (padding, a masked prompt); as in transformers


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None = None  # mean token cross-entropy when labels were given
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, D)


class DecoderLM(nn.Module):
    """embed ─► embed_norm ─► block_1 … block_L (each from the registry, at its depth l) ─► norm ─► head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        scheme = get_scheme(cfg.scheme)
        options, parts = scheme.validate(cfg), decoder_parts(cfg)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.embed_norm = scheme.embed_norm(parts, options)  # nn.Identity but for Peri-LN
        self.blocks = nn.ModuleList(scheme.block(parts, options, layer) for layer in cfg.depths)
        self.norm = scheme.final_norm(parts, options)  # never scaled by LNS
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = RotaryEmbedding(cfg.dim_head, cfg.rope_theta)

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """(Re-)initialise with the scheme's rule; also materialises a model built on ``meta``."""
        scheme = get_scheme(self.cfg.scheme)
        with torch.no_grad():
            scheme.init(self)
        if scheme.post_init is not None:
            scheme.post_init(self)

    # ------------------------------------------------------------------ pieces (used by diagnostics)
    def run_blocks(self, h: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Apply blocks ``start .. stop-1`` (0-based positions) to a residual stream (B, T, D)."""
        rope = self.rope(h.shape[1], h.device)
        for block in self.blocks[start:stop]:
            h = block(h, rope)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head: residual stream (B, T, D) -> logits (B, T, V)."""
        return self.lm_head(self.norm(h))

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) token ids
        labels: torch.Tensor | None = None,  # (B, T) next-token targets, IGNORE_INDEX (-100) = ignore
        output_hidden_states: bool = False,
    ) -> LMOutput:
        h = self.embed_norm(self.embed(input_ids))  # (B, T, D)
        rope = self.rope(input_ids.shape[1], h.device)
        hidden = [h] if output_hidden_states else None
        for block in self.blocks:
            h = block(h, rope)
            if hidden is not None:
                hidden.append(h)
        logits = self.head(h)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return LMOutput(logits, loss, tuple(hidden) if hidden is not None else None)

    def profile_input(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random model inputs for profiling passes at init (Admin): ``batch`` rows of token ids."""
        return torch.randint(self.cfg.vocab_size, (batch, min(128, self.cfg.max_seq_len)), generator=generator)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def num_params(cfg: ModelConfig, include_embeddings: bool = True) -> int:
    """Parameter count of the model ``cfg`` describes, from its modules built on the meta device
    (no memory, no init); a tied head counts once."""
    with torch.device("meta"):
        model = DecoderLM(cfg)
    total = model.num_params()
    if not include_embeddings:
        total -= sum(p.numel() for p in {id(p): p for p in (model.embed.weight, model.lm_head.weight)}.values())
    return total


def build_model(cfg: ModelConfig, device: torch.device | str | None = None) -> DecoderLM:
    """Build and initialise a model. On ``device="meta"`` the weights stay unmaterialised: call
    ``model.to_empty(device=...)`` then ``model.reset_parameters()``."""
    with torch.device(device or "cpu"):
        model = DecoderLM(cfg)
        if str(device) != "meta":
            model.reset_parameters()
    return model


def model_with_weights(cfg: ModelConfig, state: dict[str, torch.Tensor], where: str,
                       device: torch.device | str | None = None) -> DecoderLM:
    """A model of ``cfg`` holding exactly ``state``: built on the meta device, so no init pass runs
    (Admin's profiling included) on weights about to be replaced. ``where`` names the source in errors."""

    with torch.device("meta"):
        model = DecoderLM(cfg)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:  # shape mismatch: weights of another size than the config says
        detail = next((ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln), first_line(err))
        raise DepthlabError(f"{where} does not match its config ({cfg.n_layers} layers, d_model {cfg.d_model}): "
                            f"{detail[:200]}") from None
    if cfg.tie_embeddings:
        model.lm_head.weight = model.embed.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise DepthlabError(f"{where} does not match scheme {cfg.scheme!r}: "
                            f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return model.to(device or "cpu").eval()
