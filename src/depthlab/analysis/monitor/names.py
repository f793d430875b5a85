"""Regular names for what a run logs to a tracker, the same from every loop.

    block_tag("layer_angular", 7, 24)          # "depth/angular/block_07"
    probe_scalars({"layer_angular": [...]})    # {"depth/angular/block_01": ..., "depth_deepest_third/angular": ...}
    record_scalars({"step": 5, "loss": 2.1})   # {"train/loss": 2.1}: a metrics.jsonl line as tracker scalars

Per-block series are ``depth/<quantity>/block_<l>`` with ``l`` 1-based and zero-padded to the width of
``L`` (at least two digits: ``block_07`` of 12, ``block_007`` of 128), so that dashboards sort blocks in
order and a tag names the same block in every run of one depth. The deepest-third mean of each quantity
(:func:`depthlab.analysis.diagnostics.probes.deep_mean`, the paper's "deep layers") is one curve per quantity,
``depth_deepest_third/<quantity>``. A metrics.jsonl line maps key by key: ``loss`` -> ``train/loss``,
``eval_ppl`` -> ``eval/ppl``, ``layer_angular`` -> the per-block tags and the deepest-third curve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from depthlab.analysis.diagnostics.probes import deep_mean

#: metrics.jsonl keys of per-block series -> the quantity's name in a tag.
QUANTITIES = {"layer_angular": "angular", "layer_contribution": "contribution", "layer_variance": "variance",
              "layer_norm_gain": "norm_gain", "layer_removal": "removal"}
DEPTH, DEEP = "depth", "depth_deepest_third"


def pad_width(n_layers: int) -> int:
    """Digits of a block number in a tag: those of ``n_layers``, at least two."""
    return max(2, len(str(n_layers)))


def block_tag(key: str, block: int, n_layers: int) -> str:
    """The tag of block ``block`` (1-based) of series ``key`` (``layer_angular`` or ``angular``)."""
    return f"{DEPTH}/{QUANTITIES.get(key, key)}/block_{block:0{pad_width(n_layers)}d}"


def deep_tag(key: str) -> str:
    """The tag of the deepest-third mean of series ``key``."""
    return f"{DEEP}/{QUANTITIES.get(key, key)}"


def probe_scalars(series: Mapping[str, list[float | None]]) -> dict[str, float]:
    """The scalars of one probe (``{"layer_angular": [L values], ...}``): one per block and series (None
    values, e.g. the norm gain of a block without pre-norms, are left out) and each deepest-third mean."""
    out: dict[str, float] = {}
    for key, values in series.items():
        if not isinstance(values, list):  # e.g. Attention Residuals' depth_attention map: not a per-block series
            continue
        n = len(values)
        for block, v in enumerate(values, 1):
            if v is not None:
                out[block_tag(key, block, n)] = float(v)
        deep = deep_mean(list(values))
        if deep is not None:
            out[deep_tag(key)] = float(deep)
    return out


def record_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics.jsonl line (``step`` plus numbers and per-block lists) as tracker scalars: ``eval_x`` ->
    ``eval/x``, a per-block list -> :func:`probe_scalars`, any other number ``x`` -> ``train/x``."""
    series = {k: v for k, v in record.items() if isinstance(v, list)}
    out = probe_scalars(series) if series else {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"] = float(value)
    return out
