"""Model families: what makes a decoder LM and what makes a ViT classifier, in one table.

    family = family_of(cfg)                      # by config type: ModelConfig -> "lm", ViTConfig -> "vit"
    family = family_named(saved.get("family"))   # the name a run's config.json records (none: "lm")
    family = family_of_preset("vit-tiny")        # by preset name
    model = family.build(cfg, device)            # initialised by the scheme's rule
    model = family.with_weights(cfg, state, where, device)   # holding exactly ``state``

Making a model is all a family says here; how the trainer feeds and evaluates each family is
``depthlab.train.family``. Configs come from :func:`depthlab.models.configure.from_preset` for either family.
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

__all__ = ["Family", "FAMILIES", "family_of", "family_named", "family_of_preset", "config_from_saved"]


@dataclass(frozen=True)
class Family:
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


class _LM(Family):
    def build(self, cfg: SchemedConfig, device: torch.device | str | None = None) -> SchemedModel:
        import depthlab.models.decoder  # looked up at call time: tests spy on depthlab.models.decoder.build_model

        return depthlab.models.decoder.build_model(cfg, device=device)  # type: ignore[arg-type]


def _decoder() -> type[SchemedModel]:
    from depthlab.models.decoder import DecoderLM

    return DecoderLM


def _vit() -> type[SchemedModel]:
    from depthlab.models.vit.model import ViT

    return ViT


FAMILIES: dict[str, Family] = {f.name: f for f in (_LM("lm", ModelConfig, tuple(PRESETS), _decoder),
                                                   Family("vit", ViTConfig, tuple(VIT_PRESETS), _vit))}


def family_of(cfg: Any) -> Family:
    """The family of a model config (by its type)."""
    for family in FAMILIES.values():
        if isinstance(cfg, family.config_type):
            return family
    raise DepthlabError(f"no model family for a {type(cfg).__name__}; give a ModelConfig or a ViTConfig")


def family_named(name: str | None) -> Family:
    """The family ``config.json`` names (None: a run from before families, an LM)."""
    if (name or "lm") not in FAMILIES:
        raise DepthlabError(f"unknown model family {name!r} in the run's config.json; {choices(FAMILIES)}")
    return FAMILIES[name or "lm"]


def family_of_preset(preset: str) -> Family:
    for family in FAMILIES.values():
        if preset in family.presets:
            return family
    raise DepthlabError(f"unknown preset {preset!r}; {choices(p for f in FAMILIES.values() for p in f.presets)}")


def config_from_saved(saved: dict[str, Any]) -> SchemedConfig:
    """The model config a run's config.json records, as its family's config type."""
    return family_named(saved.get("family")).config_type.from_dict(saved["model"])
