"""``per_layer_config`` ``skip`` entries beside ``prune --unit attn|mlp``'s zeroed projections.

    record = write_skip(out_dir, "attn", [3, 7])  # config.json gains {"per_layer_config": {"2": {"skip": ["attention"]}, ...}}

transformers (5.15 and later) reads a sparse per-layer override schema in ``config.json``: ``per_layer_config`` maps a
0-based layer index to the attributes that differ there, and ``skip`` lists the sublayers a runtime may leave out
(PreTrainedConfig's heterogeneous configs). Its modeling code does not skip them yet (transformers 5.24 keeps and runs
the zeroed projections), so today the entries cost nothing and change nothing, and the export is as fast the day a
runtime reads them. The entries are written only where the family's config class accepts them and they come back
unchanged through ``from_pretrained`` → ``save_pretrained``; otherwise the export stays as it was and the record says
why (an older transformers, a config class that refuses the schema).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: The name of each unit in ``skip`` (transformers' schema names the attention sublayer "attention").
SKIP_NAMES = {"attn": "attention", "mlp": "mlp"}


def skip_entries(unit: str, blocks: Sequence[int], existing: dict[str, Any] | None = None) -> dict[str, Any]:
    """``per_layer_config`` with ``unit`` skipped in ``blocks`` (1-based), merged into ``existing`` entries."""
    out = {str(k): dict(v) for k, v in (existing or {}).items()}
    for b in blocks:
        entry = out.setdefault(str(b - 1), {})
        entry["skip"] = sorted({*entry.get("skip", []), SKIP_NAMES[unit]})
    return out


def _normalised(per_layer: dict[str, Any]) -> dict[int, list[str]]:
    return {int(k): sorted(v.get("skip", [])) for k, v in per_layer.items() if v.get("skip")}


def round_trip(config: dict[str, Any], tmp: Path) -> str | None:
    """Why ``config`` (a config.json's dict with ``per_layer_config``) cannot carry its ``skip`` entries, or None: it
    loads through ``AutoConfig`` and ``save_pretrained`` writes the same entries back."""
    from transformers import AutoConfig

    want = _normalised(config["per_layer_config"])
    probe = tmp / ".skip-probe"
    probe.mkdir(exist_ok=True)
    try:
        (probe / "config.json").write_text(json.dumps(config))
        try:
            cfg = AutoConfig.from_pretrained(str(probe))
        except Exception as err:  # noqa: BLE001 (any refusal of the schema: the export stays as it was)
            return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if not getattr(cfg, "is_heterogeneous", False):
            return f"{type(cfg).__name__} has no per_layer_config (transformers before 5.15?)"
        cfg.save_pretrained(str(probe))
        back = json.loads((probe / "config.json").read_text()).get("per_layer_config") or {}
        return None if _normalised(back) == want else f"save_pretrained wrote {back} back"
    finally:
        for f in probe.iterdir():
            f.unlink()
        probe.rmdir()


def write_skip(out: Path, unit: str, blocks: Sequence[int]) -> dict[str, Any]:
    """Add the ``skip`` entries of ``unit`` in ``blocks`` to ``out``/config.json when its family's config accepts them
    (:func:`round_trip`); returns the record (prune.json's ``export.per_layer_config``)."""
    path = Path(out) / "config.json"
    config = json.loads(path.read_text())
    if not blocks:
        return {"written": False, "why": "no unit removed"}
    entries = skip_entries(unit, blocks, config.get("per_layer_config"))
    candidate = {**config, "per_layer_config": entries}
    why = round_trip(candidate, Path(out))
    if why is not None:
        log.info("per_layer_config skip entries not written: %s", why)
        return {"written": False, "why": why}
    path.write_text(json.dumps(candidate, indent=2, sort_keys=True) + "\n")
    return {"written": True, "entries": entries,
            "note": "runtimes that read per_layer_config skip may leave these sublayers out; transformers 5.24 "
                    "still runs the zeroed projections"}
