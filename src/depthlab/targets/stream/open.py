"""Opening a model to be read one layer at a time: find the checkpoint, check it whole, build its layer source.

    found = locate("path/to/hf-dir")              # a Located, or the sentence saying why it cannot be streamed
    target = open_streamed("path/to/hf-dir", dtype=torch.bfloat16)   # or a depthlab run directory
    target.source                                 # the LayerSource the sweep reads (depthlab.targets.stream.source)

:func:`locate` reads ``config.json`` and the weight files' headers only (nothing of the weights):
:func:`depthlab.targets.engine.plan_engine` calls it to decide between the engines, and hands what it found to
:func:`open_streamed`, which checks the whole checkpoint (:mod:`depthlab.targets.stream.verify`) before the first
layer is read. A :class:`StreamTarget` says of the model what :class:`~depthlab.targets.Target` says of one loaded in
memory (name, kind, tokenizer, ``info``), so both engines write the same report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from depthlab.base.errors import DepthlabError, first_line
from depthlab.targets.stream.hf import HFLayerSource
from depthlab.targets.stream.run import RunLayerSource
from depthlab.targets.stream.safetensors import TensorStore, safetensors_files, tensor_index
from depthlab.targets.stream.source import LayerSource
from depthlab.targets.stream.verify import check_source


@dataclass
class StreamTarget:
    """What :class:`~depthlab.targets.Target` says of a model, for one read layer by layer (``source``)."""

    source: LayerSource
    name: str
    kind: str  # "hf-causal-lm" | "depthlab"
    tokenizer: Any
    info: dict[str, Any]
    max_seq_len: int | None
    device: torch.device
    path: Path | None = None  # the HF directory or the run's checkpoint directory
    batches_for: Callable[[Any], Any] | None = None
    causal: bool = True
    plan: Any = None  # the EnginePlan that chose to stream it (depthlab.targets.engine), when one did
    tower: str = "language"  # an image-text wrapper's tower measured (its vision tower: kind "hf-image-text")
    processor: Any = None  # an image-text wrapper's processor (depthlab.targets.wrappers.processor_of), once loaded

    @property
    def n_params(self) -> int:
        return self.info["n_params"]


@dataclass(frozen=True)
class Located:
    """A streamable checkpoint found on disk, before anything is built."""

    kind: str  # "hf" | "run"
    path: Path  # HF directory, or the run's checkpoint directory
    files: tuple[Path, ...]
    config: dict[str, Any]  # HF config.json, or the run's config.json
    run: Any = field(default=None, compare=False)  # a run: its checkpoint opened (depthlab.targets.runs.RunCheckpoint)
    tower: str = "language"  # an image-text wrapper's tower to read (depthlab.targets.stream.wrapper)


def locate(name: str, tower: str = "language") -> Located | str:
    """The streamable checkpoint ``name`` designates (``tower``: of an image-text wrapper), or a sentence saying why
    it is not streamable."""
    from depthlab.hf.config_checks import check_model_dir
    from depthlab.hf.wrappers import check_tower

    path = Path(name).expanduser()
    if not path.is_dir():
        return f"{name!r} is not a directory (streaming reads HF safetensors directories and depthlab runs)"
    if (path / "checkpoint").is_dir() or (path / "trainer_state.json").is_file() or path.name == "checkpoint":
        return _locate_run(path)
    if not (path / "config.json").is_file():
        return f"{name!r} holds no config.json"
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        return f"its config.json is unreadable ({first_line(err)[:100]})"
    if not isinstance(config, dict):
        return "its config.json is not a JSON object"
    try:
        check_model_dir(path)  # config.json's sizes and rules (the same for either engine), before anything is built
        fam = check_tower(config, tower, "stream")  # a row, a wrapper's tower or the layout inferred; config limits
        if fam.inferred:  # checked on a small model of the same family and flags, before any weight is read
            from depthlab.targets.stream.agree import require_agreement

            require_agreement(config, config.get("model_type"))
    except DepthlabError as err:
        return first_line(err)
    files = safetensors_files(path)
    if not files:
        return f"{name!r} holds no *.safetensors weights (streaming memory-maps safetensors files)"
    return Located("hf", path, tuple(files), config, tower=tower)


def _locate_run(path: Path) -> Located | str:
    """A run's newest intact checkpoint, opened by the one run loader without reading its tensors."""
    from depthlab.targets.runs import open_run

    try:
        run = open_run(path, weights=False)
    except DepthlabError as err:
        return first_line(err)
    if run.kind.name != "lm":
        return f"a {run.kind.name} run is not streamable (only decoder LM runs are)"
    return Located("run", run.path, (run.path / "model.safetensors",), run.config, run)


def stored_bytes(located: Located, dtype: torch.dtype) -> int:
    """Bytes the whole model takes in memory in ``dtype`` (floating tensors converted), from the headers."""
    size = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for info in tensor_index(list(located.files)).values():
        total += info.numel * size if info.dtype.startswith(("F", "BF")) else info.nbytes
    return total


def open_streamed(name: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   compute_dtype: torch.dtype | None = None, found: Located | None = None) -> StreamTarget:
    """``name`` (an HF safetensors directory or a depthlab run) as a :class:`StreamTarget`; weights in
    ``dtype``, each layer computed in ``compute_dtype`` (default ``dtype``). ``found``: ``locate(name)`` done."""
    found = found if found is not None else locate(name)
    if isinstance(found, str):
        raise DepthlabError(f"cannot stream {name!r}: {found}")
    device = torch.device(device)
    compute_dtype = compute_dtype or dtype
    store = TensorStore(list(found.files))
    if found.kind == "run":
        target = _run_target(found, name, store, device, dtype, compute_dtype)
        check_source(target.source, str(found.path))  # the whole checkpoint, before the first layer
        return target
    from depthlab.data.tokenizers import model_tokenizer
    from depthlab.hf.wrappers import wrapper_of

    if wrapper_of(found.config) is not None:
        return _wrapper_target(found, name, store, device, dtype, compute_dtype)
    source = HFLayerSource(found.path, store, device, dtype, compute_dtype)
    check_source(source, str(found.path))  # the whole checkpoint, before the first layer
    cfg = source.skeleton.config
    info = {"source": str(found.path), "architecture": type(source.skeleton).__name__, "model_type": cfg.model_type,
            "n_layers": source.n_layers, "d_model": cfg.hidden_size, "n_heads": getattr(cfg, "num_attention_heads", None),
            "n_kv_heads": getattr(cfg, "num_key_value_heads", None), "d_ff": getattr(cfg, "intermediate_size", None),
            "vocab_size": cfg.vocab_size, "n_params": sum(i.numel for i in store.index.values()),
            "layernorm_scaling": getattr(cfg, "layernorm_scaling", None), "depthlab_export": getattr(cfg, "depthlab", None),
            "layout": source.family.name if source.family.inferred else "family table",
            "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    return StreamTarget(source, name, "hf-causal-lm", model_tokenizer(found.path), info,
                        getattr(cfg, "max_position_embeddings", None), device, found.path)


def _wrapper_target(found: Located, name: str, store: TensorStore, device: torch.device, dtype: torch.dtype,
                    compute_dtype: torch.dtype) -> StreamTarget:
    """An image-text-to-text wrapper: its language tower read one layer at a time, on text or on image-text batches
    (the vision tower's measure: :mod:`depthlab.targets.stream.wrapper`)."""
    from depthlab.data.tokenizers import model_tokenizer
    from depthlab.targets.stream.wrapper import WrapperLayerSource
    from depthlab.targets.wrappers import wrapper_info

    source = WrapperLayerSource(found.path, store, device, dtype, compute_dtype)
    check_source(source, str(found.path))  # the whole checkpoint (both towers), before the first layer
    cfg = source.skeleton.config
    n_layers = source.n_layers if found.tower == "language" else len(source.vision_blocks())
    info = {**wrapper_info(cfg, found.path, found.tower, n_layers, sum(i.numel for i in store.index.values())),
            "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    kind = "hf-causal-lm" if found.tower == "language" else "hf-image-text"
    return StreamTarget(source, name, kind, model_tokenizer(found.path), info,
                        getattr(cfg.get_text_config(), "max_position_embeddings", None), device, found.path,
                        tower=found.tower)


def _run_target(found: Located, name: str, store: TensorStore, device: torch.device, dtype: torch.dtype,
                compute_dtype: torch.dtype) -> StreamTarget:
    """A depthlab run, opened by the one run loader (:func:`depthlab.targets.runs.open_run`: scheme checked against the
    weights' metadata, tokenizer beside the checkpoint), its blocks from the scheme registry."""
    run = found.run
    source = RunLayerSource(run.model_cfg, store, device, dtype, compute_dtype)
    n_params = sum(p.numel() for p in {id(p): p for p in source.skeleton.parameters()}.values())
    info = {**run.info(name, n_params), "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
    return StreamTarget(source, name, "depthlab", run.tokenizer, info, run.model_cfg.max_seq_len, device, found.path)
