"""Depth tracking for any training loop: how much each block does, probed on a fixed batch every N steps.

    monitor = DepthMonitor(model, probe_ids, every=100)       # probe_ids (B, T + 1): inputs and next tokens
    for step in range(1, steps + 1):
        ...                                                   # forward, backward, optimizer step
        scalars = monitor.step(step, last=step == steps)      # None, or {"depth/angular/block_07": ...}
        if scalars:
            wandb.log(scalars, step=step)                     # or any logger

A probe is :func:`depthlab.analysis.diagnostics.probes.depth_probe`, the function depthlab's own trainer calls
at its probe steps: one captured forward of the probe batch (in eval mode, without gradients; the model's
train/eval flags are restored after) gives per block the output variance, the angular distance
d(x^l, x^{l+1}), the contribution ‖x^{l+1} − x^l‖ / ‖x^l‖ and the pre-norm gain, and the removal sweep
(L partial forwards reusing the captured states) the Δloss of skipping each block, with the logit lens of each
block's output; and from the gradients the training step left (still there when ``step`` runs after
``optimizer.step()`` and before ``zero_grad``; else kept by :meth:`DepthMonitor.record_grads`) each block's
gradient norm, ``depth/grad_norm/block_07``. The schedule is the
trainer's too: a probe at every ``every``-th step and at the last, the removal sweep at every
``removal_every``-th of them (and at the start and the last); so on a depthlab model, with the trainer's
probe batch, the series equal the ones the trainer writes to metrics.jsonl.

The blocks are found as the diagnostics find them (:func:`depthlab.targets.find_layers`: depthlab models,
Hugging Face decoders and encoders, any model with a ``layers`` / ``h`` / ``transformer.h`` ModuleList);
``layers=`` names them for other models: a dotted path (``"transformer.h"``, ``"model.layers"``) or the
container itself (a ModuleList, or a ModuleDict such as torchtitan's ``layers``, in its order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from depthlab.analysis.diagnostics.probes import depth_probe, grad_norm_tensor
from depthlab.analysis.monitor.names import probe_scalars
from depthlab.base.errors import DepthlabError
from depthlab.hf.wrappers import WRAPPERS, text_forward
from depthlab.targets.layers import find_layers

LayersArg = str | nn.Module | Sequence[nn.Module] | None
ProbeBatch = torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]


def resolve_layers(model: nn.Module, layers: LayersArg = None) -> list[nn.Module]:
    """The blocks of ``model`` in order: :func:`find_layers` when ``layers`` is None, else the container
    at the dotted path ``layers`` or ``layers`` itself (ModuleList, ModuleDict, Sequential, a list)."""
    if layers is None:
        return list(find_layers(model))
    found: Any = layers
    if isinstance(layers, str):
        found = model
        for part in layers.split("."):
            if not hasattr(found, part):
                raise DepthlabError(f"layers={layers!r}: {type(found).__name__} has no attribute {part!r}; give the "
                                    f"dotted path of the block list, e.g. 'transformer.h', 'layers', 'model.layers'")
            found = getattr(found, part)
    if isinstance(found, nn.ModuleDict):
        blocks = list(found.values())
    elif isinstance(found, nn.ModuleList | nn.Sequential | list | tuple):
        blocks = list(found)
    else:
        raise DepthlabError(f"layers={layers!r} is a {type(found).__name__}; give a ModuleList, a ModuleDict, a list "
                            f"of blocks or the dotted path of one")
    if not blocks or not all(isinstance(b, nn.Module) for b in blocks):
        raise DepthlabError(f"layers={layers!r} holds {len(blocks)} entries, not a non-empty list of modules")
    return blocks


def logits_of(out: Any) -> torch.Tensor:
    """The logits in a model's output: the output itself, its ``.logits``, or the first item of a tuple."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, tuple | list) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise DepthlabError(f"cannot find logits in the model's output ({type(out).__name__}); pass forward=ids -> logits")


def default_forward(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """``ids -> logits`` for ``model``: ``model(ids)`` (HF models: ``use_cache=False``) read by :func:`logits_of`; an
    image-text wrapper's text-only forward (:func:`depthlab.hf.wrappers.text_forward`: Llama 4's through its
    language model)."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) in WRAPPERS:
        return text_forward(model)
    if getattr(config, "use_cache", None) is not None:
        return lambda ids: logits_of(model(input_ids=ids, use_cache=False))
    return lambda ids: logits_of(model(ids))


def split_probe(batch: ProbeBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, next-token labels) of a probe batch: token windows (B, T + 1) are shifted, as ``diagnose``
    reads held-out text; an ``(inputs, labels)`` pair is taken as it is (labels None: no removal sweep)."""
    if isinstance(batch, tuple | list):
        if len(batch) != 2 or not isinstance(batch[0], torch.Tensor) or not (batch[1] is None
                                                                              or isinstance(batch[1], torch.Tensor)):
            raise DepthlabError(f"probe_batch: give a (B, T+1) tensor of token ids or an (inputs, labels) pair of "
                                f"tensors, not a {type(batch).__name__} of {len(batch)} items")
        inputs, labels = batch
        _check_ids("probe_batch inputs", inputs, 2)
        if labels is not None and (labels.shape != inputs.shape or labels.is_floating_point() or labels.is_complex()):
            raise DepthlabError(f"probe_batch labels {tuple(labels.shape)} {labels.dtype}: give integer token ids of "
                                f"the inputs' shape {tuple(inputs.shape)}")
        return inputs, labels
    _check_ids("probe_batch", batch, 3)
    return batch[:, :-1], batch[:, 1:]


def _check_ids(what: str, ids: Any, min_len: int) -> None:
    if not isinstance(ids, torch.Tensor):
        raise DepthlabError(f"{what}: give a tensor of token ids of shape (B, T + 1), not a {type(ids).__name__}")
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < min_len:
        raise DepthlabError(f"{what} {tuple(ids.shape)}: expected token ids of shape (B, T{' + 1' if min_len == 3 else ''})"
                            f" with B >= 1 and T >= 2")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise DepthlabError(f"{what} holds {str(ids.dtype).replace('torch.', '')} values; give integer token ids "
                            "(torch.long)")
    if int(ids.min()) < 0:
        raise DepthlabError(f"{what} holds a negative token id ({int(ids.min())}); token ids start at 0")


def check_probe_fits(model: nn.Module, inputs: torch.Tensor) -> None:
    """The probe's token ids within the model's vocabulary and its length within the model's context (a longer
    batch would measure positions the model was never built for, or fail inside its embedding)."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if not isinstance(embed, nn.Embedding):
        embed = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    top = int(inputs.max())
    if embed is not None and top >= embed.num_embeddings:
        raise DepthlabError(f"probe_batch holds token id {top}, beyond the model's vocabulary of {embed.num_embeddings}")
    config = getattr(model, "config", None) or getattr(model, "cfg", None)
    context = next((getattr(config, k) for k in ("max_position_embeddings", "n_positions", "max_seq_len")
                    if isinstance(getattr(config, k, None), int)), None)
    if context is not None and inputs.shape[1] > context:
        raise DepthlabError(f"probe_batch has {inputs.shape[1]} input tokens per row, more than the model's context of "
                            f"{context}; give rows of at most {context} tokens (+1 for the labels)")


class DepthMonitor:
    """Per-block depth tracking of ``model`` on a fixed probe batch, every ``every`` steps."""

    def __init__(self, model: nn.Module, probe_batch: ProbeBatch, every: int = 100, *, layers: LayersArg = None,
                 removal: bool = True, removal_every: int = 4,
                 forward: Callable[[torch.Tensor], torch.Tensor] | None = None, grad_norms: bool = True) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise DepthlabError(f"every must be a positive number of steps, got {every!r}")
        if not isinstance(removal_every, int) or isinstance(removal_every, bool) or removal_every < 0:
            raise DepthlabError(f"removal_every must be a non-negative integer, got {removal_every!r}")
        self.model, self.every, self.removal_every = model, every, removal_every
        self.layers = resolve_layers(model, layers)
        self.inputs, self.labels = split_probe(probe_batch)
        check_probe_fits(model, self.inputs)
        self.removal = removal and self.labels is not None
        self.forward = forward or default_forward(model)
        self.records: list[dict[str, Any]] = []  # {"step": s, "layer_angular": [...], ...} per probe, as metrics.jsonl
        self.seconds = 0.0  # time spent probing
        self.timings: list[tuple[int, bool, float]] = []  # (step, with the removal sweep, seconds) per probe
        self.last_step: int | None = None
        self.grad_norms = grad_norms  # add layer_grad_norm from the gradients the step left (record_grads, or at step())
        self._grads: torch.Tensor | None = None  # kept by record_grads() for the next probe

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def due(self, step: int, last: bool = False) -> bool:
        """Whether ``step`` gets a probe: every ``every``-th step and the last (each step once)."""
        return step != self.last_step and (last or step % self.every == 0)

    def removal_due(self, step: int, last: bool = False) -> bool:
        """The trainer's schedule: the removal sweep at the start, the last step and every ``removal_every``-th probe."""
        if not self.removal:
            return False
        return step == 0 or last or (self.removal_every > 0 and (step // self.every) % self.removal_every == 0)

    @torch.no_grad()
    def probe(self, removal: bool | None = None) -> dict[str, list[float | None]]:
        """The per-block series now: ``{"layer_angular": [L floats], ...}`` (``removal``: with the Δloss
        sweep; None = whenever the batch has labels)."""
        removal = self.removal if removal is None else removal and self.labels is not None
        device = _device_of(self.model)
        flags = [(m, m.training) for m in self.model.modules()]
        t0 = time.perf_counter()
        self.model.eval()
        try:
            labels = self.labels.to(device) if self.labels is not None else None
            return depth_probe(self.model, self.inputs.to(device), labels, removal=removal, forward=self.forward,
                               layers=self.layers)
        finally:
            for m, was in flags:
                m.training = was
            self.seconds += time.perf_counter() - t0

    def record_grads(self) -> None:
        """Keep each block's gradient norm now, for the next probe: call it between ``backward`` and the
        optimizer's ``zero_grad`` when the probe runs after the gradients are gone (the HF callback does). Cheap
        and without a host sync (a norm per parameter)."""
        if self.grad_norms:
            self._grads = grad_norm_tensor(self.layers)

    def step(self, step: int, last: bool = False) -> dict[str, float] | None:
        """After optimizer step ``step`` (0: before training): when a probe is due, run it, keep its
        record in :attr:`records` and return its scalars (:func:`depthlab.analysis.monitor.names.probe_scalars`);
        else None."""
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise DepthlabError(f"step must be a non-negative integer (the optimizer step), got {step!r}")
        if self.last_step is not None and step < self.last_step:
            raise DepthlabError(f"step {step} comes after step {self.last_step}: give the steps in increasing order")
        if not self.due(step, last):
            return None
        removal, before = self.removal_due(step, last), self.seconds
        grads = self._grads if self._grads is not None else grad_norm_tensor(self.layers) if self.grad_norms else None
        self._grads = None
        series = self.probe(removal=removal)
        if grads is not None:  # the gradient of the step just taken (none before the first)
            series["layer_grad_norm"] = grads.tolist()
        self.timings.append((step, removal, self.seconds - before))
        self.last_step = step
        self.records.append({"step": step, **series})
        return probe_scalars(series)

    __call__ = step

    def write_figure(self, path: str, title: str = "") -> Any:
        """A block × step heatmap per tracked quantity of the probes so far (``depth_tracking.png`` of a run)."""
        from depthlab.analysis.monitor.charts import tracking_heatmap

        if not self.records:
            raise DepthlabError("no probe yet: call step() at a probe step (e.g. step(0)) before write_figure()")

        return tracking_heatmap(self.records, path, title)


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
