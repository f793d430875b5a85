"""``prune_target``: remove blocks from a model, on the engine of the target it is given.

    report = prune_target("path/to/hf-dir", PruneOptions(remove=8, stream=True), "pruned/x")   # a path: opts.stream
    report = prune_target(load_target("smollm2"), PruneOptions(method="removal", remove=6), "pruned/smollm2-24")
    report["engine"]                                                   # {"name": "in-memory", "line": "in memory (...)"}

A target loaded in memory runs :func:`~depthlab.prune.pipeline.prune_in_memory` (healing, latency, a depthlab run
directory for depthlab models); one opened to be read layer by layer runs
:func:`~depthlab.prune.streamed.prune_streamed` (HF safetensors directories; LoRA healing), or for ``--unit attn|mlp``
:func:`~depthlab.prune.streamed_units.prune_units_streamed` (no healing). The choice of engine is
made when the target is opened (:func:`depthlab.targets.load_target`, ``stream=``); an ``opts.stream`` that
contradicts the target given is refused in one line. :func:`check_target` makes every refusal of either engine
before any pass over data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics.streamed import SweepSettings
from depthlab.base.errors import DepthlabError
from depthlab.prune.options import PruneOptions
from depthlab.prune.pipeline import check_in_memory, prune_in_memory
from depthlab.prune.streamed import check_stream_target, prune_streamed
from depthlab.prune.streamed_units import check_units_streamed, prune_units_streamed
from depthlab.prune.units import prune_units_in_memory
from depthlab.targets.engine import engine_of
from depthlab.targets.load import target_for


def check_target(target: Any, opts: PruneOptions, out: str | Path) -> Any:
    """Every refusal that needs the opened model (an encoder, a scheme Llama cannot express, healing of a streamed
    model, block ranges) and a free ``out``, before any pass over data; returns the target (a path opened as
    ``opts.stream`` says)."""
    target = target_for(target, opts.stream)
    if engine_of(target) == "streamed":
        if opts.generate:
            raise DepthlabError("--generate needs the model in memory; the streamed engine scores likelihood only "
                                "(--no-stream)")
        if opts.unit != "block":
            check_units_streamed(target, opts)  # first: its --heal refusal is the one that applies
        check_stream_target(target, opts, Path(out))
    else:
        check_in_memory(target, opts, Path(out))
    return target


def prune_target(target: Any, opts: PruneOptions, out: str | Path, command: str | None = None,
                 settings: SweepSettings | None = None) -> dict[str, Any]:
    """Prune ``target`` (a :class:`~depthlab.targets.Target`, a streamed target, or a path / name opened with
    ``opts.stream``) as ``opts`` says and write the HF checkpoint, ``prune.json`` and ``report.html`` into ``out``,
    whole or not at all; returns the report (``report["engine"]`` says which engine ran and why). ``settings``: the
    streamed sweeps' (memory budget, rows per call, resume directory)."""
    target = target_for(target, opts.stream)
    if engine_of(target) == "streamed":
        if opts.unit != "block":
            return prune_units_streamed(target, opts, out, command, settings)
        return prune_streamed(target, opts, out, command, settings)
    if opts.unit != "block":
        return prune_units_in_memory(target, opts, out, command)
    return prune_in_memory(target, opts, out, command)
