"""Anything measurable, loaded into one shape (:class:`Target`): depthlab runs (LM or ViT), Hugging Face
model directories, GGUF files, hub ids, ``preset:NAME`` and the offline short names (``smollm2``, ``minilm``).

    from depthlab.targets import load_target, load_run
    target = load_target("smollm2")                  # Target(model, name, kind, tokenizer, info, ...)
    model, tokenizer, config = load_run("runs/lns")  # a depthlab run directory

Modules: :mod:`~depthlab.targets.load` (``load_target``), :mod:`~depthlab.targets.runs` (run directories),
:mod:`~depthlab.targets.layers` (``find_layers``: where a model keeps its blocks),
:mod:`~depthlab.targets.target` (the ``Target`` record). Diagnostics, evaluation, pruning and fine-tuning
all start from here.
"""

from depthlab.base.lazy import lazy_exports

__all__ = ["Target", "load_target", "load_run", "run_target", "find_layers", "SHORT_NAMES", "TARGET_FORMS"]

__getattr__ = lazy_exports(__name__, {
    "Target": "depthlab.targets.target", "load_target": "depthlab.targets.load", "SHORT_NAMES": "depthlab.targets.load",
    "TARGET_FORMS": "depthlab.targets.load", "load_run": "depthlab.targets.runs", "run_target": "depthlab.targets.runs",
    "find_layers": "depthlab.targets.layers"})
