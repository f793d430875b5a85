"""DecoderLM: embed -> blocks -> final norm -> LM head. Knows nothing of training, IO or devices.

``SchemedModel`` is what every model family shares (``DecoderLM`` here, ``depthlab.models.vit.ViT``): blocks from
the scheme registry, the scheme's init rule, a meta-device parameter count, and one way to build a model
that holds given weights (no init pass, every key checked, a shape mismatch named in one line).

The residual stream at block boundaries is exposed for the diagnostics:
``hidden_states[0]`` is the embedding output (input of block 1), ``hidden_states[l]`` the output
of block ``l`` (before the final norm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from depthlab.base.errors import DepthlabError, first_line
from depthlab.models.config import ModelConfig, SchemedConfig
from depthlab.models.nn.attention import RotaryEmbedding
from depthlab.models.schemes import decoder_parts, get_scheme

IGNORE_INDEX = -100  # label of a target that counts in no loss (padding, a masked prompt); as in transformers


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    loss: torch.Tensor | None = None  # mean token cross-entropy when labels were given
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L+1 tensors (B, T, D)


class SchemedModel(nn.Module):
    """Base of every model family: ``cfg`` (a :class:`~depthlab.models.config.SchemedConfig`) and ``blocks`` built
    from its registry scheme. Subclasses build their modules in ``__init__`` and may add ``init_own``
    (their own parameters, initialised after the scheme's rule) and ``tied_keys`` / ``tie_weights``."""

    cfg: SchemedConfig

    def init_own(self) -> None:
        """Initialise the family's own parameters (after the scheme's rule, before its post-init)."""

    def tied_keys(self) -> set[str]:
        """State-dict keys that alias another weight (re-tied after loading, never required in a state)."""
        return set()

    def tie_weights(self) -> None:
        """Re-establish aliased weights (after construction and after ``load_state_dict(assign=True)``)."""

    def reset_parameters(self) -> None:
        """(Re-)initialise with the scheme's rule; also materialises a model built on ``meta``."""
        scheme = get_scheme(self.cfg.scheme)
        with torch.no_grad():
            scheme.init(self)
            self.init_own()
        if scheme.post_init is not None:
            scheme.post_init(self)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def build(cls, cfg: SchemedConfig, device: torch.device | str | None = None) -> "SchemedModel":
        """Build and initialise a model. On ``device="meta"`` the weights stay unmaterialised: call
        ``model.to_empty(device=...)`` then ``model.reset_parameters()``."""
        with torch.device(device or "cpu"):
            model = cls(cfg)
            if str(device) != "meta":
                model.reset_parameters()
        return model

    @classmethod
    def count_params(cls, cfg: SchemedConfig) -> int:
        """Parameter count of the model ``cfg`` describes, from its modules built on the meta device."""
        with torch.device("meta"):
            return cls(cfg).num_params()

    @classmethod
    def with_weights(cls, cfg: SchemedConfig, state: dict[str, torch.Tensor], where: str,
                     device: torch.device | str | None = None) -> "SchemedModel":
        """A model of ``cfg`` holding exactly ``state``: built on the meta device, so no init pass runs
        (Admin's profiling included) on weights about to be replaced. ``where`` names the source in errors."""
        with torch.device("meta"):
            model = cls(cfg)
        try:
            missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        except RuntimeError as err:  # shape mismatch: weights of another size than the config says
            detail = next((ln.strip() for ln in str(err).splitlines() if "size mismatch" in ln), first_line(err))
            raise DepthlabError(f"{where} does not match its config ({cfg.n_layers} layers, d_model {cfg.d_model}): "
                                f"{detail[:200]}") from None
        model.tie_weights()
        missing = [k for k in missing if k not in model.tied_keys()]
        if missing or unexpected:
            raise DepthlabError(f"{where} does not match scheme {cfg.scheme!r}: "
                                f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
        return model.to(device or "cpu").eval()


class DecoderLM(SchemedModel):
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
        self.tie_weights()
        self.rope = RotaryEmbedding(cfg.dim_head, cfg.rope_theta)

    def tied_keys(self) -> set[str]:
        return {"lm_head.weight"} if self.cfg.tie_embeddings else set()

    def tie_weights(self) -> None:
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

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
    def features(self, input_ids: torch.Tensor, output_hidden_states: bool = False
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The LM head's input, the final norm's output (B, T, D), and the L+1 block-boundary states when asked:
        everything of :meth:`forward` but the head (:func:`depthlab.models.nn.loss.linear_cross_entropy` takes
        it from here, so that the (B, T, V) logits are never whole)."""
        h = self.embed_norm(self.embed(input_ids))  # (B, T, D)
        rope = self.rope(input_ids.shape[1], h.device)
        hidden = [h] if output_hidden_states else None
        for block in self.blocks:
            h = block(h, rope)
            if hidden is not None:
                hidden.append(h)
        return self.norm(h), tuple(hidden) if hidden is not None else None

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T) token ids
        labels: torch.Tensor | None = None,  # (B, T) next-token targets, IGNORE_INDEX (-100) = ignore
        output_hidden_states: bool = False,
    ) -> LMOutput:
        x, hidden = self.features(input_ids, output_hidden_states)
        logits = self.lm_head(x)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return LMOutput(logits, loss, hidden)

    def profile_input(self, batch: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Random model inputs for profiling passes at init (Admin): ``batch`` rows of token ids."""
        return torch.randint(self.cfg.vocab_size, (batch, min(128, self.cfg.max_seq_len)), generator=generator)



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
    """Build and initialise a decoder (:meth:`SchemedModel.build`); on ``device="meta"`` the weights stay
    unmaterialised: call ``model.to_empty(device=...)`` then ``model.reset_parameters()``."""
    return DecoderLM.build(cfg, device)  # type: ignore[return-value]


def model_with_weights(cfg: ModelConfig, state: dict[str, torch.Tensor], where: str,
                       device: torch.device | str | None = None) -> DecoderLM:
    """A decoder holding exactly ``state`` (:meth:`SchemedModel.with_weights`)."""
    return DecoderLM.with_weights(cfg, state, where, device)  # type: ignore[return-value]
