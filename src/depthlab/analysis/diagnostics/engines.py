"""``diagnose``: all diagnostics of a model, on the engine of the target it is given.

    report = diagnose("path/to/hf-dir", DiagnoseOptions(stream=True))            # a path: opened as opts.stream says
    report = diagnose(load_target("runs/lns", stream=None), DiagnoseOptions())    # in memory, or streamed if too big
    report["engine"]                                                              # {"name": "streamed", "line": ...}

A target loaded in memory runs :func:`~depthlab.analysis.diagnostics.runner.diagnose_in_memory`; one opened to be
read layer by layer (:class:`~depthlab.targets.layerwise.StreamTarget`) runs
:func:`~depthlab.analysis.diagnostics.streamed_runner.diagnose_streamed`. The choice of engine is made when the
target is opened (:func:`depthlab.targets.load_target`, ``stream=``); an ``opts.stream`` that contradicts the target
given is refused in one line rather than silently run on the other engine. Both engines give the same numbers
(tested to 1e-5) and the same report, whose ``engine`` says which ran and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics.options import DiagnoseOptions
from depthlab.analysis.diagnostics.runner import diagnose_in_memory
from depthlab.analysis.diagnostics.streamed import SweepSettings
from depthlab.analysis.diagnostics.streamed_runner import diagnose_streamed
from depthlab.targets.engine import engine_of, engine_record
from depthlab.targets.load import target_for


def diagnose(target: Any, opts: DiagnoseOptions | None = None, command: str | None = None, out: str | Path | None = None,
             settings: SweepSettings | None = None) -> dict[str, Any]:
    """All diagnostics of ``target`` (a :class:`~depthlab.targets.Target`, a streamed target, or a path / name that
    :func:`~depthlab.targets.load_target` opens with ``opts.stream``); returns the report dict (plain numbers,
    JSON-ready, plus the Jacobian matrices under the private key ``_matrices`` when they were computed).
    ``out``: where the report will be written; a streamed sweep keeps its resume state beside it.
    ``settings``: the streamed sweep's (memory budget, rows per call, resume directory)."""
    opts = opts or DiagnoseOptions()
    target = target_for(target, opts.stream)
    opts.check_blocks(target.info.get("n_layers"))  # --jac-layers against the model: before any pass over data
    if engine_of(target) == "streamed":
        return diagnose_streamed(target, opts, command, Path(out) if out is not None else None, settings)
    report = diagnose_in_memory(target, opts, command)
    report["engine"] = engine_record(target)
    return report
