"""``diagnose``: every diagnostic of a model, in one frame: each check once, then one engine, then one report.

    report = diagnose("path/to/hf-dir", DiagnoseOptions(stream=True), out="reports/x")   # a path: opened as asked
    report = diagnose(load_target("runs/lns", stream=None), DiagnoseOptions())          # an opened target: its engine
    report["engine"]                                   # {"name": "streamed", "line": "streamed, one layer at a time (...)"}

The walk, down once and back (``depthlab diagnose`` takes the same two steps, sizing its defaults in between):

1. ``with`` :func:`~depthlab.targets.frame.checked` and :data:`CHECKS`: the refusals the input alone decides, then
   those of the chosen engine, then those of the opened model, each before anything it does not need is read; a
   streamed run's resume state held from the engine's choice to the end (then removed);
2. :func:`run`: the measures built once (:class:`~depthlab.analysis.diagnostics.measures.Measures`), fed by the
   engine of the target (:mod:`~depthlab.analysis.diagnostics.in_memory` or
   :mod:`~depthlab.analysis.diagnostics.streamed`, its sweep saving in the held state), the report written by the
   measures and, with ``out``, published there (whole or not at all).

Both engines give the same numbers (tested to 1e-5) and the same report, whose ``engine`` says which ran and why.
The choice of engine is the library's (:func:`depthlab.targets.load.plan_target`, ``opts.stream``); a target
opened on the engine ``opts.stream`` contradicts is refused in one line rather than run on the other.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics import in_memory, streamed
from depthlab.analysis.diagnostics.heldout import check_vision_data
from depthlab.analysis.diagnostics.measures import Measures
from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.base.errors import DepthlabError
from depthlab.base.progress import logs_to_stderr
from depthlab.targets.engine import EnginePlan, engine_of
from depthlab.targets.frame import Checks, Request, check_data, check_out, checked
from depthlab.targets.stream.sweep import SweepSettings


# ---------------------------------------------------------------------------------------------- the checks
def check_options(request: Request) -> None:
    """Every option's value (one line naming the flag)."""
    request.opts.validate()


def check_mc_file(request: Request) -> None:
    """The ``--mc`` task read whole: a missing, non-UTF-8 or malformed file is refused before the model is loaded."""
    mc = request.opts.mc
    if mc is not None and not mc.startswith("hf:"):
        from depthlab.analysis.evaluate import load_tasks

        load_tasks([mc], request.opts.mc_limit)


def check_engine_options(request: Request, plan: EnginePlan) -> None:
    """What the streamed engine cannot do, asked of it: the tuned lens, Jacobians asked for by name (by default they
    are off when streaming, and the report says so)."""
    if not plan.streamed:
        return
    if request.opts.jacobian and "jacobian" in request.asked:
        raise DepthlabError("--jacobian needs the model in memory (block Jacobians are not streamed); drop --jacobian "
                            "or add --no-stream")
    if request.opts.tuned_lens:
        raise DepthlabError("--tuned-lens needs the model in memory (its maps are fitted on the kept states); drop "
                            "--tuned-lens or add --no-stream")


def check_blocks(request: Request, target: Any) -> None:
    """``--jac-layers`` / ``--heatmap-layers`` against the model's blocks."""
    request.opts.check_blocks(target.info.get("n_layers"))


def check_seq_len(request: Request, target: Any) -> None:
    """A ``--seq-len`` asked for past the model's context (a default one is cut to it, with a warning)."""
    limit, asked = target.max_seq_len, request.opts.seq_len
    if "seq_len" in request.asked and limit is not None and asked > limit:
        raise DepthlabError(f"--seq-len {asked} exceeds the context {target.name!r} was made for ({limit} tokens)")


def check_tuned_lens(request: Request, target: Any) -> None:
    """The tuned lens fits on the even batches and is measured on the odd ones: at least two."""
    opts = request.opts
    if not (opts.tuned_lens and opts.lens and target.causal):
        return
    seq_len = min(opts.seq_len, target.max_seq_len or opts.seq_len)
    n_seq = -(-opts.tokens // seq_len)
    n_batches = -(-n_seq // opts.batch_size)
    if n_batches < 2:
        raise DepthlabError(f"--tuned-lens fits its maps on half the held-out batches and measures them on the other "
                            f"half: --tokens {opts.tokens} at --batch-size {opts.batch_size} makes {n_batches} batch; "
                            "raise --tokens or lower --batch-size")


#: The refusals of ``diagnose``, by stage (:class:`~depthlab.targets.frame.Checks`): a new one is one more entry.
CHECKS = Checks(before_load=[check_options, check_data, check_mc_file, check_vision_data, check_out],
                on_plan=[check_engine_options],
                on_target=[check_blocks, check_seq_len, check_tuned_lens])


# ---------------------------------------------------------------------------------------------- the run
@logs_to_stderr
def diagnose(target: Any, opts: DiagnoseOptions | None = None, command: str | None = None,
             out: str | Path | None = None, settings: SweepSettings | None = None) -> dict[str, Any]:
    """All diagnostics of ``target`` (a :class:`~depthlab.targets.Target`, a streamed target, or a path / name that
    is opened as ``opts.stream`` says); returns the report dict (plain numbers, JSON-ready, plus the Jacobian matrices
    under the private key ``_matrices`` when they were computed). ``out``: a new directory the report is written
    into (report.json, figures, report.html), beside which a streamed run keeps its resume state. ``settings``: the
    streamed sweep's (memory budget, rows per call)."""
    request = Request(target, opts or DiagnoseOptions(), Path(out) if out is not None else None, command=command)
    with checked(request, CHECKS) as opened:
        return run(request, opened, settings)


@logs_to_stderr
def run(request: Request, target: Any, settings: SweepSettings | None = None) -> dict[str, Any]:
    """The diagnosis of ``target``, inside :func:`~depthlab.targets.frame.checked` with :data:`CHECKS` (no check is
    made again here), on its engine; published into ``request.out`` when set."""
    t0, opts = time.time(), request.opts
    if engine_of(target) == "streamed":
        measures = Measures.build(target, opts, streamed.layers(target))
        sweep = settings or SweepSettings(progress=opts.progress)
        sweep.state_dir = request.state
        fed = streamed.feed(target, opts, measures, sweep)
    else:
        measures = Measures.build(target, opts, in_memory.layers(target))
        fed = in_memory.feed(target, opts, measures)
    report = measures.report(target, opts, fed.batches, request.command, fed.joint)
    report["engine"] = fed.record()
    report["seconds"] = round(time.time() - t0, 2)
    if request.out is not None:
        publish(report, request.out)
    return report


def publish(report: dict[str, Any], out: Path) -> None:
    """The report written whole into ``out``: a hidden sibling renamed once complete."""
    from depthlab.analysis.diagnostics.report import write_report
    from depthlab.base.fileio import publish_dir

    with publish_dir(out) as tmp:
        write_report(report, tmp)
