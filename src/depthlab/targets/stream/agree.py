"""An inferred layout checked before the streamed engine is trusted with it: the layer-by-layer forward of a small
model of the same family and flags equals that model's own forward.

    require_agreement(config, "diagnose")   # one-line DepthlabError naming what did not match, else nothing

A table row was checked by hand and by the tests; a layout read from the model (:mod:`depthlab.hf.inferred`) was
not. What the streamed engine assumes of it (block 1's input is what the embedding modules make of the ids, each
block is called as the model's own forward called it for one row, the final norm and LM head make the logits) is
a property of the family's code and config flags, not of its weights, so it is checked once per distinct config on a
random model built from that config made small (:func:`depthlab.hf.shrink.tiny_overrides`: same code, same flags),
saved and streamed exactly as the real checkpoint will be, on a batch of two rows (a mask or bias recorded for one
row, BLOOM's ALiBi, shows there). No weight of the real checkpoint is read; what depends on the trained weights
(routing, a data-dependent branch) is not checked here but by the export's own check after a prune.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line

#: Largest |Δ logit| allowed, relative to max(1, the largest |logit|) (float32 on the CPU).
RTOL = 1e-4


def _streamed_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the checkpoint in ``path``, computed as the streamed engine computes them (one layer at a time)."""
    from depthlab.targets.stream.hf import HFLayerSource
    from depthlab.targets.stream.safetensors import TensorStore, safetensors_files

    cpu = torch.device("cpu")
    source = HFLayerSource(path, TensorStore(safetensors_files(path)), cpu, torch.float32, torch.float32)
    with torch.no_grad():
        with source.embedding() as embed:
            h = embed(ids)
        calls = source.layer_calls(ids.shape[1])
        for i in range(source.n_layers):
            with source.layer(i) as layer:
                h = calls[i](layer, h, ids)
        with source.head() as head:
            return head(h).float()


@functools.lru_cache(maxsize=32)
def _disagreement(key: str) -> str | None:
    import json

    from depthlab.hf.inferred import as_config
    from depthlab.hf.shrink import small_model

    try:
        model = small_model(as_config(json.loads(key)))
        ids = torch.randint(3, min(300, int(model.config.vocab_size)), (2, 12), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = model(input_ids=ids, use_cache=False).logits.float()
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            got = _streamed_logits(Path(tmp), ids)
    except Exception as err:  # noqa: BLE001 - a family's code may fail anywhere in this check; it then refuses
        return f"the layer-by-layer forward of a small model of its family failed ({first_line(err)[:160]})"
    diff = float((got - ref).abs().max()) if got.shape == ref.shape else float("inf")
    if not diff <= RTOL * max(1.0, float(ref.abs().max())):
        return (f"the layer-by-layer forward of a small model of its family does not reproduce the model's own "
                f"forward (max |delta logit| {diff:.2e})")
    return None


def disagreement(config: Any) -> str | None:
    """Why the streamed engine cannot be trusted with ``config``'s inferred layout (one line), or None; computed once
    per distinct config."""
    from depthlab.hf.inferred import as_config, config_key

    return _disagreement(config_key(as_config(config).to_dict()))


def require_agreement(config: Any, name: str) -> None:
    """A one-line DepthlabError, before any weight of the checkpoint is read, when :func:`disagreement` finds one."""
    why = disagreement(config)
    if why is not None:
        raise DepthlabError(f"depthlab cannot stream {name} (layout inferred): {why}")
