"""Depth tracking inside a Lightning ``Trainer`` (``pip install lightning``), logged to its loggers.

    from depthlab.analysis.monitor.lightning import DepthMonitorLightning
    trainer = L.Trainer(max_steps=1000, logger=[CSVLogger("logs"), WandbLogger(project="x")],
                        callbacks=[DepthMonitorLightning(probe_ids, every=50)])
    trainer.fit(module, loader)

At the start, after every ``every``-th optimizer step (``trainer.global_step``; micro-batches of gradient
accumulation do not count) and after the last one, the callback probes the model
(:class:`~depthlab.analysis.monitor.core.DepthMonitor`) and writes the scalars to every logger of the Trainer
(``logger.log_metrics(scalars, step)``). ``module``: the dotted path of the network inside the
LightningModule (e.g. ``"model"`` for a wrapped HF model); default the LightningModule itself.
"""

from __future__ import annotations

from typing import Any

import torch

from depthlab.base.errors import DepthlabError

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    raise DepthlabError("depthlab.analysis.monitor.lightning needs Lightning: pip install lightning") from None

from depthlab.analysis.monitor.core import DepthMonitor, LayersArg


class DepthMonitorLightning(Callback):
    """A Lightning ``Callback`` probing depth on ``probe_ids`` every ``every`` optimizer steps (arguments as
    for :class:`~depthlab.analysis.monitor.hf.DepthMonitorCallback`, plus ``module`` and ``forward``)."""

    def __init__(self, probe_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor], every: int = 100, *,
                 module: str | None = None, layers: LayersArg = None, removal: bool = True, removal_every: int = 4,
                 at_start: bool = True, forward: Any = None) -> None:
        self.probe_ids, self.every, self.module, self.layers = probe_ids, every, module, layers
        self.removal, self.removal_every, self.at_start, self.forward = removal, removal_every, at_start, forward
        self.monitor: DepthMonitor | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model = pl_module
        for part in (self.module.split(".") if self.module else []):
            model = getattr(model, part)
        self.monitor = DepthMonitor(model, self.probe_ids, self.every, layers=self.layers, removal=self.removal,
                                    removal_every=self.removal_every, forward=self.forward)
        if self.at_start and trainer.global_step == 0:
            self._probe(trainer, 0, last=False)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step > 0:  # due() skips a step already probed (micro-batches of one optimizer step)
            self._probe(trainer, step, last=0 < trainer.max_steps <= step)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None and self.monitor.last_step != trainer.global_step:  # epochs ended, or stopped
            self._probe(trainer, trainer.global_step, last=True)

    def _probe(self, trainer: Any, step: int, last: bool) -> None:
        scalars = self.monitor.step(step, last)
        if scalars:
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=step)
