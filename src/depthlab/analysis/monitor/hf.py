"""Depth tracking inside a Hugging Face ``Trainer``, logged through the Trainer's own reporters.

    from depthlab.analysis.monitor import DepthMonitorCallback
    trainer = Trainer(model=model, args=args, train_dataset=train)
    DepthMonitorCallback(probe_ids, every=50).attach(trainer)   # probe_ids: LongTensor (B, T + 1)
    trainer.train()
    # trainer.state.log_history holds {"depth/angular/block_07": ..., "step": 50}, and so does every
    # reporter that args.report_to names (wandb, tensorboard, trackio, ...)

At the start, after every ``every``-th optimizer step and after the last one, the callback probes the
model (:class:`~depthlab.analysis.monitor.core.DepthMonitor`) and hands the scalars to ``trainer.log``: the one
door through which the Trainer's own numbers reach ``state.log_history`` and every ``report_to``
integration. A ``TrainerCallback`` is given the model but not the Trainer, hence :meth:`attach`.
The HF reporters prefix keys that are not ``eval_*`` with ``train/`` (``rewrite_logs``): a dashboard shows
``train/depth/angular/block_07``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from depthlab.analysis.monitor.core import DepthMonitor, LayersArg
from depthlab.analysis.monitor.names import DEPTH
from depthlab.base.errors import DepthlabError


class DepthMonitorCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that probes depth on ``probe_ids`` every ``every`` optimizer steps.

    ``probe_ids``: token ids (B, T + 1), inputs and next-token labels (or an ``(inputs, labels)`` pair);
    ``layers``, ``removal``, ``removal_every``: as for :class:`DepthMonitor`; ``at_start``: also probe
    before the first step (step 0, as depthlab's trainer does)."""

    def __init__(self, probe_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor], every: int = 100, *,
                 layers: LayersArg = None, removal: bool = True, removal_every: int = 4, at_start: bool = True) -> None:
        self.probe_ids, self.every, self.layers = probe_ids, every, layers
        self.removal, self.removal_every, self.at_start = removal, removal_every, at_start
        self.trainer: Any = None
        self.monitor: DepthMonitor | None = None

    def attach(self, trainer: Any) -> DepthMonitorCallback:
        """Log through ``trainer`` (and add this callback to it unless it was given in ``callbacks=``). The
        Trainer's console printers (PrinterCallback, ProgressCallback) show only the deepest-third curves of a
        probe, not its 5 L per-block scalars (a dict of ~46 keys per probe at L = 8); ``log_history`` and every
        reporter still get all of them."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, (PrinterCallback, ProgressCallback)) and not hasattr(callback, "_depth_brief"):
                callback.on_log = _brief(callback.on_log)
                callback._depth_brief = True
        return self

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.trainer is None:
            raise DepthlabError("DepthMonitorCallback needs its Trainer to log through: "
                                "DepthMonitorCallback(probe_ids, every=N).attach(trainer) before trainer.train()")
        self.monitor = DepthMonitor(model, self.probe_ids, self.every, layers=self.layers, removal=self.removal,
                                    removal_every=self.removal_every)
        if self.at_start and state.global_step == 0:
            self._probe(0, last=False)

    def on_step_end(self, args, state, control, **kwargs):
        last = state.global_step >= state.max_steps or control.should_training_stop
        self._probe(state.global_step, last)

    def on_train_end(self, args, state, control, **kwargs):
        if self.monitor is not None and self.monitor.last_step != state.global_step:  # stopped early
            self._probe(state.global_step, last=True)

    def _probe(self, step: int, last: bool) -> None:
        scalars = self.monitor.step(step, last)
        if scalars:
            self.trainer.log(scalars)


def _brief(printer_on_log: Any) -> Any:
    """A console printer's ``on_log`` that leaves out the per-block ``depth/...`` scalars (kept: the
    ``depth_deepest_third/...`` curves and every key of the Trainer's own)."""

    def on_log(args, state, control, logs=None, **kwargs):
        if logs:
            logs = {k: v for k, v in logs.items() if not k.startswith(f"{DEPTH}/")}
        return printer_on_log(args, state, control, logs=logs, **kwargs)

    return on_log
