"""A depthlab run's checkpoint read one layer at a time: its ``DecoderLM`` (blocks from the scheme registry) on the
meta device, each block materialised from ``model.safetensors`` when the sweep reaches it.

    source = RunLayerSource(run.model_cfg, TensorStore([run.path / "model.safetensors"]), device, dtype, dtype)

The run is opened by the one run loader (:func:`depthlab.targets.runs.open_run`: scheme checked against the
weights' metadata, tokenizer beside the checkpoint); :func:`depthlab.targets.stream.open.open_streamed` builds this
source from it. NaN/inf weights are refused as they are read, as :func:`depthlab.targets.runs.load_run` refuses them.
"""

from __future__ import annotations

from typing import Any

import torch

from depthlab.targets.stream.safetensors import TensorStore
from depthlab.targets.stream.source import LayerSource


class RunLayerSource(LayerSource):
    """A depthlab run's checkpoint: its ``DecoderLM`` (blocks from the scheme registry) on the meta device."""

    def __init__(self, cfg: Any, store: TensorStore, device: torch.device, dtype: torch.dtype,
                 compute_dtype: torch.dtype) -> None:
        from depthlab.models.decoder import DecoderLM

        with torch.device("meta"):
            model = DecoderLM(cfg)
        self.skeleton, self.owner, self.layers_attr = model.eval(), model, "blocks"
        super().__init__(store, device, dtype, compute_dtype, dict.fromkeys(model.tied_keys(), "embed.weight"))
        self.embed_modules = (model.embed, model.embed_norm)
        self.check_finite = True
        self.head_modules = (model.norm, model.lm_head)
        self.final_norm_attr = (model, "norm")
        self.state_width = cfg.d_model

    def _record(self, seq_len: int, rows: int = 1) -> None:
        self.skeleton.run_blocks(torch.zeros(rows, seq_len, self.skeleton.cfg.d_model, dtype=self.compute_dtype,
                                             device=self.device))

