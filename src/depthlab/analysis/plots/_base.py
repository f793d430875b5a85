"""What every figure module shares: figure creation, resolution, saving, colours, tick spacing.

Every figure colours a scheme with :func:`scheme_color`: one colour per scheme and per scheme variant, the same
in every figure and every report (``pre`` blue and ``lns`` orange everywhere).

Figures are built with :class:`matplotlib.figure.Figure` directly (never pyplot), so drawing needs no
GUI backend and leaves matplotlib's global backend alone; :func:`save` renders through Agg.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

from depthlab.base.errors import DepthlabError
from depthlab.base.fileio import publish

DPI = 130


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], **kw: Any) -> tuple[Figure, Any]:
    """``(figure, axes)`` like ``pyplot.subplots``, without pyplot: a standalone Figure."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def colormap(name: str) -> Colormap:
    """A registered matplotlib colour map by name (e.g. "viridis", "tab10")."""
    return matplotlib.colormaps[name]


#: Fixed colours of the two schemes every report shows; the other registry schemes follow in registry order.
_FIXED = {"pre": "#1f77b4", "lns": "#ff7f0e"}
_PALETTE = tuple(matplotlib.colors.to_hex(c) for c in (*matplotlib.colormaps["tab10"].colors[2:],
                                                       *matplotlib.colormaps["tab20"].colors[1::2]))
#: Variants and names outside the registry: a stable hash into these (tab20b + tab20c).
_HASHED = tuple(h for name in ("tab20b", "tab20c") for h in map(matplotlib.colors.to_hex, matplotlib.colormaps[name].colors)
                if h not in _PALETTE)


def scheme_color(label: str) -> str:
    """The colour of a scheme (``lns``) or variant (``lns:position=after-branch``) in every figure: fixed for
    ``pre`` and ``lns``, by registry position for the other schemes, by a stable hash of the label for a
    variant or any other name (so it is the same in every report)."""
    from depthlab.models.schemes import SCHEMES

    if label in _FIXED:
        return _FIXED[label]
    others = [name for name in SCHEMES if name not in _FIXED]
    if label in others and others.index(label) < len(_PALETTE):
        return _PALETTE[others.index(label)]
    return _HASHED[int(hashlib.md5(label.encode()).hexdigest(), 16) % len(_HASHED)]


def run_color(scheme: str | None) -> str:
    """The colour of one model's lines: its scheme's (:func:`scheme_color`), dark grey when it has none (an HF model
    depthlab did not mark)."""
    return scheme_color(scheme) if scheme else "#404040"


def log_norm(*arrays: Any, floor: float = 1e-4) -> Any:
    """A shared log colour scale over the finite positive values of ``arrays`` (angular distances: block 1's can be
    50x a deep block's, so a linear scale paints every deep block the same colour)."""
    import numpy as np
    from matplotlib.colors import LogNorm

    values = np.concatenate([np.asarray(a, dtype=float).ravel() for a in arrays])
    values = values[np.isfinite(values) & (values > 0)]
    low = max(float(values.min()), floor) if values.size else floor
    high = float(values.max()) if values.size else 1.0
    return LogNorm(vmin=low, vmax=max(high, low * 1.001))


def save(fig: Figure, path: str | Path, layout: bool = True) -> Path:
    """Lay out (unless ``layout=False``, e.g. with a shared colour bar), write ``path`` as PNG
    through the Agg canvas (creating its folder), return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)  # attaches itself to the figure: PNG output without any GUI backend
    if layout:
        fig.tight_layout()
    with publish(path) as tmp:
        fig.savefig(tmp, dpi=DPI, bbox_inches="tight", format="png")
    return path


#: Tick spacings a person reads at a glance (block 1, then every 2nd, 5th, 10th, ... block).
_ROUND_STEPS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000)


def ticks(n: int, max_ticks: int = 10) -> list[int]:
    """1-based tick positions for ``n`` blocks, at most ``max_ticks`` (+1) of them, so that two-digit labels never
    run together: block 1, the multiples of the smallest round spacing that fits (2, 5, 10, ...), and ``n`` itself,
    in place of the last multiple when close to it (16 blocks: 1, 2, 4, ..., 16; 80 blocks: 1, 10, 20, ..., 80)."""
    step = next((s for s in _ROUND_STEPS if len(range(s, n + 1, s)) + (s > 1) <= max_ticks),
                math.ceil(n / max_ticks))
    marks = sorted({1, *range(step, n + 1, step)})
    if marks[-1] != n:  # the last block is always labelled: after the last multiple, or in its place when close
        marks = [*marks[:-1], n] if n - marks[-1] < 0.75 * step and len(marks) > 2 else [*marks, n]
    return marks


def same_lengths(figure: str, **series: Any) -> int:
    """The common length of ``series`` (one value per block, say), or DepthlabError naming each one's length: a
    figure of mismatched inputs would silently misalign its curves or fail deep inside matplotlib."""
    lengths = {name: len(values) for name, values in series.items()}
    if len(set(lengths.values())) != 1 or not next(iter(lengths.values())):
        shown = ", ".join(f"{name} has {n}" for name, n in lengths.items())
        raise DepthlabError(f"{figure}: {shown} values; give one value per block in each, at least one")
    return next(iter(lengths.values()))
