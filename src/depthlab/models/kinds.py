"""depthlab's own kinds of model: what makes a decoder LM and what makes a ViT classifier, in one table.

    kind = kind_of(cfg)                          # by config type: ModelConfig -> "lm", ViTConfig -> "vit"
    kind = kind_named(saved.get("family"))       # the name a run's config.json records (none: "lm")
    kind = kind_of_preset("vit-tiny")            # by preset name
    model = kind.build(cfg, device)              # initialised by the scheme's rule
    model = kind.with_weights(cfg, state, where, device)   # holding exactly ``state``

Making a model is all a kind says here; how the trainer feeds and evaluates each kind is
``depthlab.train.family``. Configs come from :func:`depthlab.models.configure.from_preset` for either kind.
(A run's config.json records its kind under the key ``family``, as runs always have; the transformers families
depthlab reads are another registry, :mod:`depthlab.hf.families`.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, choices
from depthlab.models.config import ModelConfig, SchemedConfig, ViTConfig
from depthlab.models.decoder import SchemedModel
from depthlab.models.presets import PRESETS, VIT_PRESETS

__all__ = ["ModelKind", "MODEL_KINDS", "kind_of", "kind_named", "kind_of_preset", "config_from_saved"]


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: its config type, its presets and how to build it."""

    name: str  # recorded in config.json
    config_type: type[SchemedConfig]
    presets: tuple[str, ...]
    model_type: Callable[[], type[SchemedModel]]  # the model class, imported when first needed

    def build(self, cfg: SchemedConfig, device: torch.device | str | None = None) -> SchemedModel:
        return self.model_type().build(cfg, device)

    def with_weights(self, cfg: SchemedConfig, state: dict[str, torch.Tensor], where: str,
                     device: torch.device | str | None = None) -> SchemedModel:
        return self.model_type().with_weights(cfg, state, where, device)

    def num_params(self, cfg: SchemedConfig) -> int:
        return self.model_type().count_params(cfg)


class _LM(ModelKind):
    def build(self, cfg: SchemedConfig, device: torch.device | str | None = None) -> SchemedModel:
        import depthlab.models.decoder  # looked up at call time: tests spy on depthlab.models.decoder.build_model

        return depthlab.models.decoder.build_model(cfg, device=device)  # type: ignore[arg-type]


def _decoder() -> type[SchemedModel]:
    from depthlab.models.decoder import DecoderLM

    return DecoderLM


def _vit() -> type[SchemedModel]:
    from depthlab.models.vit.model import ViT

    return ViT


MODEL_KINDS: dict[str, ModelKind] = {k.name: k for k in (_LM("lm", ModelConfig, tuple(PRESETS), _decoder),
                                                         ModelKind("vit", ViTConfig, tuple(VIT_PRESETS), _vit))}


def kind_of(cfg: Any) -> ModelKind:
    """The kind of a model config (by its type)."""
    for kind in MODEL_KINDS.values():
        if isinstance(cfg, kind.config_type):
            return kind
    raise DepthlabError(f"no model kind for a {type(cfg).__name__}; give a ModelConfig or a ViTConfig")


def kind_named(name: str | None) -> ModelKind:
    """The kind ``config.json`` names under ``family`` (None: a run from before kinds, an LM)."""
    if (name or "lm") not in MODEL_KINDS:
        raise DepthlabError(f"unknown model family {name!r} in the run's config.json; {choices(MODEL_KINDS)}")
    return MODEL_KINDS[name or "lm"]


def kind_of_preset(preset: str) -> ModelKind:
    for kind in MODEL_KINDS.values():
        if preset in kind.presets:
            return kind
    raise DepthlabError(f"unknown preset {preset!r}; {choices(p for k in MODEL_KINDS.values() for p in k.presets)}")


def config_from_saved(saved: dict[str, Any]) -> SchemedConfig:
    """The model config a run's config.json records, as its kind's config type."""
    return kind_named(saved.get("family")).config_type.from_dict(saved["model"])
