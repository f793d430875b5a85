"""``prune_target``: remove blocks (or sublayers) from a model, in one frame: each check once, then one engine.

    report = prune_target("path/to/hf-dir", PruneOptions(remove=8, stream=True), "pruned/x")   # a path: opts.stream
    report = prune_target(load_target("smollm2"), PruneOptions(method="removal", remove=6), "pruned/smollm2-24")
    report["engine"]                                                   # {"name": "in-memory", "line": "in memory (...)"}

The walk, down once and back (``depthlab prune`` takes the same two steps, printing the plan in between):

1. ``with`` :func:`~depthlab.targets.frame.checked` and :data:`CHECKS`: the options and ``--out`` before anything
   is read, what the chosen engine cannot do once it is chosen, the block ranges and families once the model is
   opened: every refusal before any pass over data; a streamed run's resume state held to the end;
2. :func:`run`: the engine of the target: in memory :func:`~depthlab.prune.pipeline.prune_in_memory` (healing,
   latency, a depthlab run directory for depthlab models) or for ``--unit attn|mlp``
   :func:`~depthlab.prune.units.prune_units_in_memory`; streamed :func:`~depthlab.prune.streamed.prune_streamed`
   (HF safetensors directories; LoRA healing) or :func:`~depthlab.prune.streamed_units.prune_units_streamed`, their
   sweeps saving in the held state. Each writes ``out`` whole or not at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics.heldout import check_vision_data
from depthlab.base.progress import logs_to_stderr
from depthlab.prune import pipeline, streamed, streamed_units, wrappers
from depthlab.prune.options import PruneOptions
from depthlab.targets.engine import engine_of
from depthlab.targets.frame import Checks, Request, check_data, check_out, checked
from depthlab.targets.layers import find_layers
from depthlab.targets.stream.sweep import SweepSettings


def check_options(request: Request) -> None:
    """Every option's value, what needs no model (``--heal lora`` without peft too)."""
    pipeline.check_options(request.opts)


def check_family(request: Request) -> None:
    """A checkpoint directory whose family cannot be pruned (an encoder, a wrapper, no block list found), refused
    from its config.json alone, before any weight is read."""
    from depthlab.base.errors import DepthlabError
    from depthlab.hf.families import refusal_before_load

    why = refusal_before_load(request.target, "prune")
    if why is not None:
        raise DepthlabError(why)


def check_generate_file(request: Request) -> None:
    """The ``--generate`` task read whole before the model is loaded (it used to be read after the held-out pass
    and the whole block choice): a missing or malformed file is refused at once."""
    opts = request.opts
    if opts.generate is not None:
        from depthlab.analysis.evaluate.accuracy import load_tasks

        load_tasks(opts.generate, opts.generate_limit)


def check_model(request: Request, target: Any) -> None:
    """What needs the opened model, on its engine: block ranges and what the family's config allows; an encoder or
    a scheme Llama cannot express (in memory); blocks without known branches or output projections (``--unit``)."""
    opts = request.opts
    if wrappers.is_wrapper(target):  # an image-text-to-text wrapper: one of its towers
        wrappers.check_model(request, target)
        return
    if opts.unit == "expert":
        from depthlab.prune import experts

        if engine_of(target) == "streamed":
            streamed.check_model(request, target)
            experts.check_experts(target.source.layers, target.source.skeleton.config, opts)
        else:
            pipeline.check_model(target, opts)
            experts.check_in_memory(target, opts)
        return
    if opts.heal.mode == "linear":
        from depthlab.prune.heal_linear import check_linear

        layers = target.source.layers if engine_of(target) == "streamed" else find_layers(target.model)
        check_linear(target, layers, opts.blocks)
    if engine_of(target) == "streamed":
        streamed.check_model(request, target)
        if opts.unit != "block":
            streamed_units.check_model(request, target)
        return
    pipeline.check_model(target, opts)
    if opts.unit != "block":
        from depthlab.prune.units import check_units

        check_units(target, opts)


#: The refusals of ``prune``, by stage (:class:`~depthlab.targets.frame.Checks`): a new one is one more entry.
CHECKS = Checks(before_load=[check_options, check_family, wrappers.check_config_json, check_data, check_generate_file,
                             check_vision_data, check_out],
                on_plan=[streamed.check_plan], on_target=[check_model])


@logs_to_stderr
def prune_target(target: Any, opts: PruneOptions, out: str | Path, command: str | None = None,
                 settings: SweepSettings | None = None) -> dict[str, Any]:
    """Prune ``target`` (a :class:`~depthlab.targets.Target`, a streamed target, or a path / name opened with
    ``opts.stream``) as ``opts`` says and write the HF checkpoint, ``prune.json`` and ``report.html`` into ``out``,
    whole or not at all; returns the report (``report["engine"]`` says which engine ran and why). ``settings``: the
    streamed sweeps' (memory budget, rows per call)."""
    request = Request(target, opts, Path(out), command=command)
    with checked(request, CHECKS) as opened:
        return run(request, opened, settings)


def run(request: Request, target: Any, settings: SweepSettings | None = None) -> dict[str, Any]:
    """The prune of ``target``, inside :func:`~depthlab.targets.frame.checked` with :data:`CHECKS` (no check is made
    again here), on its engine."""
    opts, out, command = request.opts, request.out, request.command
    if wrappers.is_wrapper(target):
        sweep = settings or SweepSettings(progress=opts.progress)
        sweep.state_dir = request.state
        return wrappers.prune_wrapper(target, opts, out, command, sweep)
    if engine_of(target) == "streamed":
        sweep = settings or SweepSettings(progress=opts.progress)
        sweep.state_dir = request.state
        if opts.unit == "expert":
            from depthlab.prune.streamed_experts import prune_experts_streamed

            return prune_experts_streamed(target, opts, out, command, sweep)
        engine = streamed_units.prune_units_streamed if opts.unit != "block" else streamed.prune_streamed
        return engine(target, opts, out, command, sweep)
    if opts.unit == "expert":
        from depthlab.prune.experts import prune_experts_in_memory

        return prune_experts_in_memory(target, opts, out, command)
    if opts.unit != "block":
        from depthlab.prune.units import prune_units_in_memory

        return prune_units_in_memory(target, opts, out, command)
    return pipeline.prune_in_memory(target, opts, out, command)
