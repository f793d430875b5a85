"""Reading back what a test logged, with each tracker's own reader: TensorBoard's EventAccumulator,
W&B's transaction-log reader (``wandb leet inspect --json``), trackio's SQLite storage."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def need(module: str):
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module}")


def tb_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value over every event file under ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted({p.parent for p in Path(logdir).rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def tb_tags(logdir: Path) -> dict[str, list[str]]:
    """Every kind of tag (scalars, images, tensors: text) of the event files under ``logdir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: dict[str, list[str]] = {}
    for events in sorted({p.parent for p in Path(logdir).rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"images": 0, "tensors": 0})
        acc.Reload()
        for kind, names in acc.Tags().items():
            if isinstance(names, list):
                tags.setdefault(kind, []).extend(names)
    return tags


def wandb_records(run_dir: Path) -> list[dict]:
    """The records of a W&B run's transaction log (``run-<id>.wandb``), as W&B's own reader prints them."""
    wandb_file = next(Path(run_dir).rglob("run-*.wandb"))
    out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(wandb_file.parent)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows (``log`` calls merged per step) of the W&B run under ``run_dir``."""
    return [r["history"]["item"] | {"_step": r["history"].get("step", {}).get("num", 0)}
            for r in wandb_records(run_dir) if r.get("type") == "history"]
