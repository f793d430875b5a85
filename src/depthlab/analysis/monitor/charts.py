"""The block × step heatmap of a run's depth probes, from its records (metrics.jsonl lines or
:attr:`DepthMonitor.records`): what trackers show beside the deepest-third curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from depthlab.analysis.diagnostics.probes import TRACKED


def tracking_heatmap(records: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """One heatmap (block × step) per tracked quantity measured at two probes or more, as a PNG at
    ``path`` (:func:`depthlab.analysis.plots.training.depth_tracking`); None when there is nothing to draw."""
    from depthlab.analysis.plots.training import depth_tracking  # matplotlib only when drawing

    series = {}
    for key in TRACKED:
        mine = [r for r in records if isinstance(r.get(key), list)]
        if len(mine) > 1:
            series[key] = ([r["step"] for r in mine], [r[key] for r in mine])
    if not series:
        return None
    return depth_tracking(series, path, title)
