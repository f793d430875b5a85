"""The frame a command on a model runs in (``diagnose``, ``prune``): every check made once, as early as what it
needs allows, then the engine run with its resume state owned in one place.

    request = Request("path/to/model", opts, out=Path("reports/x"), dtype=torch.bfloat16)
    with checked(request, CHECKS) as target:     # every refusal before the first pass over data; the resume state held
        report = run(request, target)             # the engine (its sweeps save in request.state); then the state goes

The checks are lists, one per stage, each stage run as soon as what it needs is known (a later check is one more
entry in its stage's list, e.g. a refusal read from config.json):

1. ``before_load(request)``: what the input alone decides (option values, data files, ``--out``); nothing of the
   model is read.
2. ``on_plan(request, plan)``: the engine is chosen (:func:`depthlab.targets.load.plan_target`; a checkpoint that
   can stream has had its config.json and weight headers read, no weight): options the chosen engine cannot run.
3. ``on_target(request, target)``: the model is opened (its structure: blocks, layer classes; a streamed model's
   checkpoint checked whole, no layer held): block ranges, sublayer branches, families that cannot be pruned.

A target already opened (a library call) goes through the same three stages, its own plan standing for stage 2, so
no check depends on the way in. The frame is also the one owner of a streamed command's resume state
(:func:`depthlab.targets.stream.resume.owned_state`): taken once the engine is chosen, before any weight is read,
removed once the command's output is published; the in-memory engine has none.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import fresh_out
from depthlab.targets.engine import EnginePlan, engine_of
from depthlab.targets.stream.resume import owned_state


@dataclass
class Request:
    """What a command on a model was asked, before anything of the model is read."""

    target: Any  # a name or path (opened by :func:`checked`), or a target already opened
    opts: Any  # the command's options (DiagnoseOptions, PruneOptions); ``opts.stream`` chooses the engine
    out: Path | None = None  # where the command publishes its output (None: returned only)
    device: str | torch.device = "cpu"
    dtype: torch.dtype = torch.float32  # the weights'
    compute_dtype: torch.dtype | None = None  # the arithmetic's (None: the device's default for ``dtype``)
    scheme: str | None = None  # a preset:NAME target's
    progress: bool | None = None  # third-party loading bars (None: on a terminal)
    command: str | None = None  # the command line, for the report's provenance
    asked: frozenset[str] = frozenset()  # option names the user set (a default the engine cannot honour is dropped)
    state: Path | None = None  # the resume state the frame holds for a streamed command writing ``out`` (set by it)


@dataclass
class Checks:
    """The refusals of one command, by the stage that can make them (see the module docstring)."""

    before_load: list[Callable[[Request], None]] = field(default_factory=list)
    on_plan: list[Callable[[Request, EnginePlan], None]] = field(default_factory=list)
    on_target: list[Callable[[Request, Any], None]] = field(default_factory=list)


@contextlib.contextmanager
def checked(request: Request, checks: Checks, prepare: Callable[[Request, Any], None] | None = None) -> Iterator[Any]:
    """The target of ``request``, opened on the engine its options ask for once every check of ``checks`` has passed
    at its stage, for the body of the ``with``; a target already opened is checked the same way (and refused when its
    engine contradicts ``opts.stream``). A streamed command writing ``request.out`` holds its resume state from the
    moment the engine is chosen (before any weight is read: a second writer of ``out`` is refused at once) to the
    end of the body, which removes it (``request.state``: its directory; kept for the rerun when the body raises).
    ``prepare(request, target)``: the caller's defaults that depend on the opened model (the command line sizes
    ``--tokens`` to the device), set before the ``on_target`` checks see the options."""
    from depthlab.targets.load import load_target, plan_target, target_for

    for check in checks.before_load:
        check(request)
    stream = getattr(request.opts, "stream", None)
    tower = getattr(request.opts, "tower", "language")
    opened = not isinstance(request.target, (str, Path))
    if opened:
        target = target_for(request.target, stream)
        plan = plan_of(target)
    else:
        plan = plan_target(str(request.target), request.device, request.dtype, request.scheme, stream,
                           request.compute_dtype, tower)
    for check in checks.on_plan:
        check(request, plan)
    with owned_state(request.out if plan.streamed else None) as root:
        request.state = root
        if not opened:
            target = load_target(str(request.target), request.device, request.dtype, request.scheme, request.progress,
                                 stream, request.compute_dtype, plan=plan, tower=tower)
        if prepare is not None:
            prepare(request, target)
        for check in checks.on_target:
            check(request, target)
        yield target


def plan_of(target: Any) -> EnginePlan:
    """The plan a target was opened with; one that says which engine it is on for a target opened directly."""
    plan = getattr(target, "plan", None)
    if plan is not None:
        return plan
    streamed = engine_of(target) == "streamed"
    return EnginePlan(streamed, "streamed, one layer at a time" if streamed else "in memory")


# ---------------------------------------------------------------------------------------------- shared checks
def check_data(request: Request) -> None:
    """``--data`` resolved to its files (none read) before the model is loaded: a missing path, a device such as
    /dev/zero or a FIFO is refused at once, not after the load (:func:`depthlab.data.corpora.check_spec`)."""
    from depthlab.data.corpora import check_spec

    spec = getattr(request.opts, "data", None)
    if spec is not None and getattr(request.opts, "tower", "language") != "vision":  # images: check_vision_data's
        check_spec(spec)


def check_out(request: Request) -> None:
    """``--out`` new or empty (:func:`depthlab.base.fileio.fresh_out`, the one such check; the line says what the
    directory holds) and creatable: before anything is loaded (the output appears whole at the end)."""
    out = request.out
    if out is None:
        return
    try:
        fresh_out(out)
    except DepthlabError:
        raise DepthlabError(f"--out {str(out)!r} {_holds(out)}; give a new or empty directory") from None
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or not _can_create_in(parent):
        raise DepthlabError(f"--out {str(out)!r}: {str(parent)!r} is not a writable directory")


def _can_create_in(folder: Path) -> bool:
    """Whether a directory can really be made in ``folder`` (made and removed at once): ``os.access`` says yes to
    root for /proc or a read-only mount, where publishing the finished output then failed after every pass."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".depthlab-probe-", dir=folder))
    except OSError:
        return False
    return True


def _holds(out: Path) -> str:
    """What an occupied ``out`` is, for the refusal: a file, a run, a model, a report, or other files."""
    if not out.is_dir():
        return "is an existing file, not a directory"
    if (out / "checkpoint").is_dir() or (out / "trainer_state.json").is_file():
        return "is a depthlab run directory"
    if (out / "config.json").is_file():
        return "is a model directory (config.json)"
    for report, command in (("report.json", "diagnose"), ("prune.json", "prune")):
        if (out / report).is_file():
            return f"already holds a {command} report ({report})"
    return "exists and is not empty"
