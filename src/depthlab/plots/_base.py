"""What every figure module shares: figure creation, resolution, saving, colours, tick spacing.

Figures are built with :class:`matplotlib.figure.Figure` directly (never pyplot), so drawing needs no
GUI backend and leaves matplotlib's global backend alone; :func:`save` renders through Agg.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

DPI = 130


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kw: Any) -> tuple[Figure, Any]:
    """``(figure, axes)`` like ``pyplot.subplots``, without pyplot: a standalone Figure."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def colormap(name: str) -> Colormap:
    """A registered matplotlib colour map by name (e.g. "viridis", "tab10")."""
    return matplotlib.colormaps[name]


def save(fig: Figure, path: str | Path, layout: bool = True) -> Path:
    """Lay out (unless ``layout=False``, e.g. with a shared colour bar), write ``path`` as PNG
    through the Agg canvas (creating its folder), return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself to the figure: PNG output without any GUI backend
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    return path


def ticks(n: int, max_ticks: int = 16) -> list[int]:
    """1-based tick positions for n layers, at most ``max_ticks`` of them."""
    step = max(1, math.ceil(n / max_ticks))
    return list(range(1, n + 1, step))
