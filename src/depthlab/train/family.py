"""How the trainer drives each model family: what differs between training a language model and a ViT.

    tf = train_family(model_cfg)             # by the config's model kind (depthlab.models.kinds)
    run = tf.open_run(model_cfg, train_cfg, out, resume, env)   # checks (+ tokenizer for LMs)
    data = tf.load_data(run, env)            # TrainData: .train.rank_batch(step, ...), held-out, probe batch
    model = tf.kind.build(run.model_cfg, device)
    module = tf.loss_module(model)           # forward(x, y, hidden, logits) -> LossOutput
    evaluator = tf.evaluator(forward, data, env, model, cfg)    # .evaluate() -> result with .record/.summary

The loop (``depthlab.train.loop``) only ever calls these; ``config.json`` records the family's name so
that ``load_run`` and ``diagnose`` rebuild the right model (runs written before families existed are LMs).
Building models is :mod:`depthlab.models.kinds`; the preset tables are :mod:`depthlab.models.presets`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from depthlab.models.kinds import ModelKind, kind_of
from depthlab.train import distributed as D
from depthlab.train import vit_family as V
from depthlab.train.config import TrainConfig
from depthlab.train.data import TrainData, load_train_data
from depthlab.train.evaluator import Evaluator
from depthlab.train.rundir import open_run
from depthlab.train.step import Forward


@dataclass(frozen=True)
class TrainFamily:
    """How the trainer opens, feeds and evaluates runs of one model family."""

    kind: ModelKind  # how its models are built (depthlab.models.kinds)
    open_run: Callable[..., Any]  # (model_cfg, train_cfg, out, resume, env) -> RunSetup
    load_data: Callable[..., TrainData]  # (run, env) -> TrainData
    loss_module: Callable[[nn.Module], nn.Module]  # model -> module(x, y, hidden, logits) -> LossOutput
    evaluator_type: type  # an Evaluator
    metric: str  # the held-out headline metric in summary.json: eval_ppl / eval_acc
    resolve_train: Callable[..., TrainConfig]  # (train_cfg, model_cfg) -> resolved TrainConfig (defaults filled)

    @property
    def name(self) -> str:
        return self.kind.name

    def evaluator(self, forward: Forward, data: TrainData, env: D.DistEnv, model: nn.Module,
                  cfg: TrainConfig) -> Evaluator:
        return self.evaluator_type(forward, data.eval_batches, data.probe_batch, env, model=model,
                                   probe_labels=data.probe_labels, track_depth=cfg.track_depth,
                                   track_removal=cfg.track_removal)


def _lm_data(run: Any, env: D.DistEnv) -> TrainData:
    return load_train_data(run.cfg, run.tokenizer, env)


_TRAINERS: dict[str, dict[str, Any]] = {
    "lm": dict(open_run=open_run, load_data=_lm_data, loss_module=D.LMLoss, evaluator_type=Evaluator,
               metric="eval_ppl", resolve_train=lambda t, m: t.resolve(m)),
    "vit": dict(open_run=V.open_vit_run, load_data=V.load_vit_data, loss_module=V.ViTLoss,
                evaluator_type=V.ImageEvaluator, metric="eval_acc", resolve_train=V.vit_train_config),
}


def train_family(model_cfg: Any) -> TrainFamily:
    """The trainer's side of ``model_cfg``'s family (DepthlabError for a config of no known family)."""
    kind = kind_of(model_cfg)
    return TrainFamily(kind, **_TRAINERS[kind.name])
