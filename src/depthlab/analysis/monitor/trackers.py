"""Experiment trackers of depthlab runs: TensorBoard, Weights & Biases and trackio, through one code path.

    spec = TrackerSpec(tensorboard=True, wandb="my-project")      # or TrackerSpec.of(train_cfg, "lns")
    trackers = Trackers.open(spec, run_dir, config)               # at the start of a run (rank 0)
    trackers.write({"step": 10, "loss": 2.3, "lr": 1e-3})         # every metrics.jsonl line, as it is written
    trackers.finish(records, report="report.html")                # heatmap, report, close

What a run shows (names: :mod:`depthlab.analysis.monitor.names`): the scalars of its metrics.jsonl lines
(``train/loss``, ``train/lr``, ``train/tokens_per_s``, ``eval/loss``, ``eval/ppl``, ...); the per-block
series (``depth/angular/block_07``, ...) and, as the readable curves, their deepest-third means
(``depth_deepest_third/angular``, ...); at the end a block × step heatmap image of every tracked quantity
(``depth_heatmap``); the run's config (TensorBoard: as text); and, where the run has one (``compare``),
its report.html (W&B / trackio: an HTML panel; TensorBoard: its path and summary as text).

W&B and trackio share their API (``init(project, name, group, config)`` -> a run with ``log(dict, step)``,
``finish()``, ``Image(path)``, ``Html(path)``): one class drives both. W&B writes under
``<run dir>/wandb``; offline runs (``WANDB_MODE=offline``, W&B's own setting) are read there and uploaded
later with ``wandb sync``. A resumed run continues the same W&B run (its id is kept in
``<run dir>/trackers.json``); TensorBoard drops the events after the checkpoint step it resumes from.
The tracker packages are optional: a missing one fails before the run starts, naming its install command.
This module imports no torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import secrets
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import write_json_atomic

#: backend -> (the module it needs, the command that installs it).
PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"),
            "wandb": ("wandb", "pip install wandb"),
            "trackio": ("trackio", "pip install trackio")}
HEATMAP, REPORT = "depth_heatmap", "report"


@dataclass(frozen=True)
class TrackerSpec:
    """Where a run logs besides metrics.jsonl."""

    tensorboard: bool = False  # <run dir>/tensorboard event files
    wandb: str | None = None  # W&B project
    trackio: str | None = None  # trackio project
    group: str | None = None  # W&B / trackio run group
    name: str | None = None  # run name (default: the run directory's name)

    @classmethod
    def of(cls, cfg: Any, name: str | None = None) -> TrackerSpec:
        """The trackers a :class:`~depthlab.train.TrainConfig` asks for."""
        return cls(bool(cfg.tensorboard), cfg.wandb or None, cfg.trackio or None, cfg.run_group or None, name)

    @property
    def backends(self) -> list[str]:
        return [b for b, on in (("tensorboard", self.tensorboard), ("wandb", self.wandb), ("trackio", self.trackio)) if on]

    def require(self) -> None:
        """Raise a one-line DepthlabError naming the install command of each tracker package missing."""
        for backend in self.backends:
            module, install = PACKAGES[backend]
            if importlib.util.find_spec(module) is None:
                raise DepthlabError(f"--{backend} needs the {module} package, which is not installed: {install}")


class _TensorBoard:
    """Event files under ``logdir`` (``purge_step``: events from that step on, left by a crash, are dropped)."""

    def __init__(self, logdir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(logdir), purge_step=purge_step)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def config(self, config: dict[str, Any]) -> None:
        self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def image(self, tag: str, path: Path, step: int) -> None:
        from matplotlib.image import imread

        self.writer.add_image(tag, imread(str(path))[..., :3], step, dataformats="HWC")

    def html(self, tag: str, path: Path, step: int, summary: str = "") -> None:
        self.writer.add_text(tag, f"{summary}\n\nreport: `{path}`".strip(), step)

    def close(self) -> None:
        self.writer.close()


class _WandbAPI:
    """A W&B-style run: ``module`` is ``wandb`` or ``trackio`` (the same calls)."""

    def __init__(self, module: Any, project: str, name: str, group: str | None, config: dict[str, Any],
                 **init: Any) -> None:
        self.module = module
        self.run = module.init(project=project, name=name, group=group, config=config, **init)

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def config(self, config: dict[str, Any]) -> None:
        pass  # given to init()

    def image(self, tag: str, path: Path, step: int) -> None:
        self.run.log({tag: self.module.Image(str(path))}, step=step)

    def html(self, tag: str, path: Path, step: int, summary: str = "") -> None:
        self.run.log({tag: self.module.Html(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The trackers of one run; :meth:`write` mirrors each metrics.jsonl line to all of them."""

    def __init__(self, backends: Sequence[Any], run_dir: Path) -> None:
        self.backends, self.run_dir, self.step = list(backends), run_dir, 0

    @classmethod
    def open(cls, spec: TrackerSpec, run_dir: str | Path, config: dict[str, Any] | None = None,
             resume_step: int | None = None) -> Trackers:
        """Start every tracker ``spec`` names for the run in ``run_dir`` (``resume_step``: the checkpoint
        step a resumed run continues from)."""
        spec.require()
        run_dir, config = Path(run_dir), config or {}
        name = spec.name or run_dir.resolve().name
        backends: list[Any] = []
        if spec.tensorboard:
            backends.append(_TensorBoard(run_dir / "tensorboard", None if resume_step is None else resume_step + 1))
        if spec.wandb:
            run_id = _run_id(run_dir, "wandb")
            backends.append(_WandbAPI(importlib.import_module("wandb"), spec.wandb, name, spec.group, config,
                                      dir=str(run_dir), id=run_id, resume="allow"))
        if spec.trackio:
            backends.append(_WandbAPI(importlib.import_module("trackio"), spec.trackio, name, spec.group, config,
                                      resume="allow" if resume_step is not None else "never"))
        for b in backends:
            b.config(config)
        return cls(backends, run_dir)

    def write(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl line (``step`` + numbers + per-block lists), as named scalars."""
        from depthlab.analysis.monitor.names import record_scalars

        self.step = max(self.step, int(record["step"]))
        scalars = record_scalars(record)
        for b in self.backends:
            b.scalars(scalars, int(record["step"]))

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Named scalars as they are (no metrics.jsonl mapping)."""
        self.step = max(self.step, step)
        for b in self.backends:
            b.scalars(values, step)

    def finish(self, records: Iterable[dict[str, Any]] = (), report: str | Path | None = None,
               summary: str = "", title: str = "") -> None:
        """Log the block × step heatmap of ``records`` (the run's probe lines) and ``report`` (an HTML
        page; ``summary``: its gist as text for TensorBoard), then close every tracker."""
        from depthlab.analysis.monitor.charts import tracking_heatmap

        try:
            with tempfile.TemporaryDirectory() as tmp:
                png = tracking_heatmap(list(records), Path(tmp) / f"{HEATMAP}.png", title or "Depth over training")
                for b in self.backends:
                    if png is not None:
                        b.image(HEATMAP, png, self.step)
                    if report is not None:
                        b.html(REPORT, Path(report), self.step, summary)
                    b.close()  # the trackers copy their media before the files go
        finally:
            self.backends = []


def _run_id(run_dir: Path, backend: str) -> str:
    """The tracker run id of ``run_dir`` (kept in trackers.json, so a resumed run logs to the same run)."""
    path = run_dir / "trackers.json"
    ids = json.loads(path.read_text()) if path.is_file() else {}
    if backend not in ids:
        ids[backend] = secrets.token_hex(4)
        write_json_atomic(path, ids)
    return ids[backend]


def compare_group(cfg: Any, out: str | Path) -> str | None:
    """The tracker group of a compare's runs: ``cfg.run_group`` or the compare's folder name (None: no
    tracker asked for)."""
    spec = TrackerSpec.of(cfg)
    return (spec.group or Path(out).resolve().name) if spec.backends else None


def log_compare(cfg: Any, out: str | Path, result: dict[str, Any]) -> None:
    """A compare's own tracker run (``<out name>-compare``, in the runs' group): its table as scalars
    ``compare/<scheme>/<column>``, its settings as config, and its report.html (TensorBoard: under
    ``<out>/tensorboard``, with summary.md as text). Nothing when ``cfg`` (the compare's TrainConfig)
    names no tracker."""
    out = Path(out)
    group = compare_group(cfg, out)
    if group is None:
        return
    spec = TrackerSpec(cfg.tensorboard, cfg.wandb, cfg.trackio, group, f"{out.resolve().name}-compare")
    trackers = Trackers.open(spec, out, result.get("settings"))
    values = {f"compare/{row['scheme']}/{k}": float(v) for row in result["table"] for k, v in row.items()
              if isinstance(v, int | float) and not isinstance(v, bool)}
    trackers.scalars(values, 0)
    summary = (out / "summary.md").read_text() if (out / "summary.md").is_file() else ""
    trackers.finish(report=out / "report.html", summary=summary)
