"""Healing a pruned checkpoint on disk, as the layer-streamed engine of ``prune`` leaves it: only the kept blocks
are ever loaded, once, in the dtype they are stored in, and the healed weights replace the stored ones.

    info, probe = heal_stored(Path("pruned/x"), tokenizer, HealOptions(mode="lora", steps=20), probe_ids)

:func:`load_stored` builds the model from its config on the meta device, allocates its tensors empty and reads
each one from the safetensors files straight into the model's own storage (no memory map kept alive, no second
copy: the process holds the model once, in bf16 for a bf16 checkpoint). :func:`~depthlab.prune.heal.heal` then
trains LoRA adapters (fp32, with their AdamW state) over the frozen weights and merges them; the probe's logits
are taken from the healed model in memory (each linear layer computed in ``compute_dtype``, as the streamed engine
computes), and :func:`write_stored` rewrites each weight file from the model's tensors, tensor by tensor (no
serialised copy of a shard), through :func:`depthlab.base.fileio.publish`. The model is dropped before returning:
the export is then checked by reading the files back layer by layer.
"""

from __future__ import annotations

import gc
import json
import logging
import struct
from pathlib import Path
from typing import Any

import torch
from torch import nn

from depthlab.base.errors import DepthlabError
from depthlab.prune.heal import heal
from depthlab.prune.options import HealOptions
from depthlab.targets.stream.safetensors import read_header, safetensors_files, tensor_index

log = logging.getLogger(__name__)

READ_CHUNK = 256 << 20  # bytes per read() call (a read is capped near 2 GiB)
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool}


def stored_dtype(path: Path) -> torch.dtype:
    """The dtype most of the checkpoint's floating weights are stored in (by bytes)."""
    sizes: dict[str, int] = {}
    for info in tensor_index(safetensors_files(path)).values():
        if info.dtype in ("F32", "F16", "BF16", "F64"):
            sizes[info.dtype] = sizes.get(info.dtype, 0) + info.nbytes
    if not sizes:
        raise DepthlabError(f"{str(path)!r} holds no floating-point weights")
    return ST_DTYPES[max(sizes, key=sizes.__getitem__)]


def _read_into(f: Any, offset: int, t: torch.Tensor) -> None:
    """Fill ``t`` (contiguous) with the bytes at ``offset`` of the open file ``f``."""
    view = memoryview(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else memoryview(b"")
    f.seek(offset)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:done + READ_CHUNK])
        if not n:
            raise DepthlabError(f"{f.name!r} ends early; the checkpoint is damaged")
        done += n


def load_stored(path: Path, device: torch.device | str = "cpu") -> nn.Module:
    """The HF causal LM in ``path`` (a plain HF safetensors directory), its tensors read into place in their
    stored dtype (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=stored_dtype(path))
    model.to_empty(device=device)
    model.tie_weights()  # to_empty gives tied parameters separate storage: tie them again
    base = model.base_model
    rotary = getattr(base, "rotary_emb", None)
    if rotary is not None:
        base.rotary_emb = type(rotary)(config=model.config).to(device)  # computed from the config, not stored
    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    filled = set()
    for file in safetensors_files(path):
        header = read_header(file)
        with open(file, "rb", buffering=0) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            for name, meta in header.items():
                if name not in tensors:
                    raise DepthlabError(f"{str(file)!r} holds {name!r}, which the config has no place for")
                t = tensors[name].data
                stored = torch.empty(meta["shape"], dtype=ST_DTYPES[meta["dtype"]], device="cpu")
                direct = stored.dtype == t.dtype and t.device.type == "cpu" and t.is_contiguous()
                _read_into(f, 8 + n + meta["data_offsets"][0], t if direct else stored)
                if not direct:
                    t.copy_(stored)
                filled.add(name)
    done = {id(tensors[k]) for k in filled}  # a tied head is filled with the embedding it shares
    left = [k for k, t in tensors.items() if id(t) not in done and "rotary_emb" not in k]
    if left:
        raise DepthlabError(f"{str(path)!r} lacks tensor(s) the config needs: {left[:3]}")
    return model.eval()


def write_stored(model: nn.Module, path: Path) -> int:
    """Rewrite every safetensors file of ``path`` with ``model``'s tensors of the same names (same header: names,
    dtypes, shapes and offsets), each file published atomically; returns the bytes written."""
    from depthlab.base.fileio import publish

    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    total = 0
    for file in safetensors_files(path):
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            raw = f.read(n)
        header = json.loads(raw)
        names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])
        with publish(file) as tmp, open(tmp, "wb") as out:
            out.write(struct.pack("<Q", n) + raw)
            for name in names:
                meta = header[name]
                t = tensors[name].detach().to("cpu", ST_DTYPES[meta["dtype"]]).contiguous()
                if list(t.shape) != list(meta["shape"]):
                    raise DepthlabError(f"healed tensor {name} has shape {list(t.shape)}, the file {meta['shape']}")
                data = t.view(torch.uint8).reshape(-1).numpy() if t.numel() else b""
                out.write(memoryview(data))
                total += len(data)
    return total


@torch.no_grad()
def probe_logits(model: nn.Module, ids: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """``model``'s logits on ``ids`` (fp32, CPU), each linear layer computed in ``compute_dtype`` as the streamed
    engine computes it (bf16 weights upcast while they compute, when that is asked)."""
    from depthlab.prune.export import lm_logits
    from depthlab.targets.upcast import upcast_while_computing

    handles = upcast_while_computing(model, compute_dtype) if compute_dtype != next(model.parameters()).dtype else []
    try:
        return lm_logits(model, ids.to(next(model.parameters()).device)).float().cpu()
    finally:
        for h in handles:
            h.remove()


def heal_stored(path: Path, tokenizer: Any, opts: HealOptions, probe_ids: torch.Tensor, device: torch.device | str = "cpu",
                compute_dtype: torch.dtype = torch.float32) -> tuple[dict[str, Any], torch.Tensor]:
    """Heal the HF checkpoint in ``path`` in place (see the module docstring); returns the healing record
    (:func:`~depthlab.prune.heal.heal`'s, plus the load and write) and the healed model's logits on ``probe_ids``."""
    import time

    t0 = time.perf_counter()
    model = load_stored(path, device)
    loaded_s = time.perf_counter() - t0
    log.info("healing: loaded the %d kept blocks of %s in %s (%.1f s)", model.config.num_hidden_layers, path,
             str(next(model.parameters()).dtype).replace("torch.", ""), loaded_s)
    healed, info = heal(model, tokenizer, opts)
    del model
    probe = probe_logits(healed, probe_ids, compute_dtype)
    t1 = time.perf_counter()
    written = write_stored(healed, path)
    info.update(load_seconds=round(loaded_s, 2), write_seconds=round(time.perf_counter() - t1, 2), bytes_written=written,
                loaded="only the kept blocks, from the pruned checkpoint, in their stored dtype")
    del healed
    gc.collect()
    return info, probe
