"""Model families the trainer drives: what differs between a language model and a ViT, in one place.

    family = family_of(model_cfg)            # by config type: ModelConfig -> "lm", ViTConfig -> "vit"
    run = family.open_run(model_cfg, train_cfg, out, resume, env)   # checks (+ tokenizer for LMs)
    data = family.load_data(run, env)        # TrainData: .train.rank_batch(step, ...), held-out, probe batch
    model = family.build(run.model_cfg, device)
    module = family.loss_module(model)       # forward(x, y, hidden, logits) -> LossOutput
    evaluator = family.evaluator(forward, data, env, model, cfg)    # .evaluate() -> result with .record/.summary

The loop (``depthlab.train.loop``) only ever calls these; ``config.json`` records ``family`` so that
``load_run`` and ``diagnose`` rebuild the right model (runs written before families existed are LMs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from depthlab.config import PRESETS, ModelConfig
from depthlab.errors import DepthlabError, choices
from depthlab.train import distributed as D
from depthlab.train import vit_family as V
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData, load_train_data
from depthlab.train.evaluator import Evaluator
from depthlab.train.rundir import open_run
from depthlab.train.step import Forward
from depthlab.vit.config import VIT_PRESETS, ViTConfig


@dataclass(frozen=True)
class Family:
    """How the trainer builds, feeds and evaluates one kind of model."""

    name: str  # recorded in config.json
    config_type: type
    presets: tuple[str, ...]
    open_run: Callable[..., Any]  # (model_cfg, train_cfg, out, resume, env) -> RunSetup
    load_data: Callable[..., TrainData]  # (run, env) -> TrainData
    build: Callable[..., nn.Module]  # (model_cfg, device) -> model
    loss_module: Callable[[nn.Module], nn.Module]  # model -> module(x, y, hidden, logits) -> LossOutput
    evaluator_type: type  # an Evaluator
    from_preset: Callable[..., Any]  # (preset, **overrides) -> config
    configure: Callable[..., Any]  # (config, **overrides) -> config
    with_weights: Callable[..., nn.Module]  # (config, state, where, device) -> model holding exactly state
    metric: str  # the held-out headline metric in summary.json: eval_ppl / eval_acc
    resolve_train: Callable[..., TrainConfig]  # (train_cfg, model_cfg) -> resolved TrainConfig (defaults filled)

    def evaluator(self, forward: Forward, data: TrainData, env: D.DistEnv, model: nn.Module,
                  cfg: TrainConfig) -> Evaluator:
        return self.evaluator_type(forward, data.eval_batches, data.probe_batch, env, model=model,
                                   probe_labels=data.probe_labels, track_depth=cfg.track_depth,
                                   track_removal=cfg.track_removal)


def _build_lm(cfg: ModelConfig, device: Any = None) -> nn.Module:
    """``depthlab.model.build_model``, looked up at call time (tests spy on it there)."""
    import depthlab.model

    return depthlab.model.build_model(cfg, device=device)


def _lm() -> Family:
    from depthlab.configure import configure, from_preset
    from depthlab.model import model_with_weights

    return Family("lm", ModelConfig, tuple(PRESETS), open_run,
                  lambda run, env: load_train_data(run.cfg, run.tokenizer, env), _build_lm, D.LMLoss, Evaluator,
                  from_preset, configure, model_with_weights, "eval_ppl", lambda t, m: t.resolve(m))


def _vit() -> Family:
    from depthlab.vit.config import vit_configure, vit_from_preset
    from depthlab.vit.model import build_vit, vit_with_weights

    return Family("vit", ViTConfig, tuple(VIT_PRESETS), V.open_vit_run, V.load_vit_data, build_vit, V.ViTLoss,
                  V.ImageEvaluator, vit_from_preset, vit_configure, vit_with_weights, "eval_acc", V.vit_train_config)


FAMILIES: dict[str, Family] = {f.name: f for f in (_lm(), _vit())}
ALL_PRESETS: tuple[str, ...] = tuple(p for f in FAMILIES.values() for p in f.presets)


def family_of(model_cfg: Any) -> Family:
    """The family of a model config (by its type)."""
    for family in FAMILIES.values():
        if isinstance(model_cfg, family.config_type):
            return family
    raise DepthlabError(f"no training family for a {type(model_cfg).__name__}; give a ModelConfig or a ViTConfig")


def family_named(name: str | None) -> Family:
    """The family ``config.json`` names (None: a run from before families, an LM)."""
    if (name or "lm") not in FAMILIES:
        raise DepthlabError(f"unknown model family {name!r} in the run's config.json; {choices(FAMILIES)}")
    return FAMILIES[name or "lm"]


def family_of_preset(preset: str) -> Family:
    for family in FAMILIES.values():
        if preset in family.presets:
            return family
    raise DepthlabError(f"unknown preset {preset!r}; {choices(ALL_PRESETS)}")


def model_from_preset(preset: str, **overrides: Any) -> Any:
    """A ModelConfig or ViTConfig of ``preset`` with fields / scheme options replaced."""
    return family_of_preset(preset).from_preset(preset, **overrides)


def model_config_from_saved(saved: dict[str, Any]) -> Any:
    """The model config a run's config.json records, as its family's config type."""
    return family_named(saved.get("family")).config_type.from_dict(saved["model"])
