"""Figures a person reads at a glance: block labels that never run together, colour scales that show the deep
blocks next to block 1."""

from __future__ import annotations

import numpy as np
import pytest

from depthlab.analysis.plots._base import log_norm, ticks
from depthlab.analysis.plots.training import HEATMAP_SCALES, _norm, depth_tracking


@pytest.mark.parametrize("max_ticks", [8, 10])
def test_block_ticks_start_at_1_end_at_the_last_block_and_stay_few(max_ticks):
    for n in range(1, 201):
        marks = ticks(n, max_ticks)
        assert marks[0] == 1 and marks[-1] == n and marks == sorted(set(marks)), n
        assert len(marks) <= max_ticks + 1, (n, marks)
        inner = np.diff(marks[1:-1]) if len(marks) > 3 else np.array([1])
        assert len(set(inner.tolist())) <= 1, (n, marks)  # evenly spaced between 1 and n
    assert ticks(16) == [1, 2, 4, 6, 8, 10, 12, 14, 16] and ticks(80) == [1, *range(10, 81, 10)]


def test_deep_blocks_get_distinct_colours_next_to_a_dominant_block_1():
    """Block 1 turns the stream 50x more than the deep blocks, which differ 2x from each other: on the heatmaps'
    scales the deep blocks lie far apart in colour (a linear scale put them 0.02 apart: all black)."""
    v = np.array([[1.0, 1.0], [0.02, 0.02], [0.01, 0.01]])  # (blocks, steps)
    for key in ("layer_angular", "layer_contribution", "layer_variance"):
        norm, _ = _norm(key, v)
        assert norm(0.02) - norm(0.01) > 0.15, key
        assert (0.02 - 0.01) / (1.0 - 0.01) < 0.02  # what the linear scale gave
    assert log_norm(v)(0.02) - log_norm(v)(0.01) > 0.15
    norm, _ = _norm("layer_removal", np.array([[0.5, -0.001], [0.002, 0.001]]))
    assert norm(0.002) - norm(0.0) > 0.15 and norm(-0.001) < norm(0.0) < norm(0.001)
    norm, _ = _norm("layer_norm_gain", np.array([[1.0, 1.002], [1.0, 0.999]]))
    assert norm(1.0) == pytest.approx(0.5) and norm(1.002) == pytest.approx(1.0)


def test_the_tracking_figure_names_each_scale_and_labels_every_block_range(tmp_path, monkeypatch):
    import depthlab.analysis.plots.training as T

    figures = []
    monkeypatch.setattr(T, "save", lambda fig, path, **kw: figures.append(fig) or path)
    steps = [0, 5, 10]
    series = {k: (steps, [[1.0, *([0.02] * 47), 0.01]] * 3) for k in HEATMAP_SCALES}
    series["layer_removal"] = (steps[::2], [[0.3, *([0.001] * 47), -0.001]] * 2)
    depth_tracking(series, tmp_path / "t.png")
    axes = [ax for ax in figures[0].axes if ax.get_ylabel() == "block l"]
    assert len(axes) == 5
    for ax in axes:
        assert "colour scale)" in ax.get_title()
        assert list(ax.get_yticks()) == ticks(49) and ax.get_xlim() == (0, 10)
    assert {ax.get_title().split("(")[-1].split(" colour")[0] for ax in axes} == set(HEATMAP_SCALES.values())
