"""The whole checkpoint of a streamed model checked before its first layer is read.

    check_source(source, where)          # every tensor the model needs: there, of its shape and a float dtype,
                                         # no layer beyond the config's count, every weight finite

Every header and the index were checked when the store was built (:func:`~depthlab.targets.stream.safetensors.read_header`,
:func:`~depthlab.targets.stream.safetensors.check_index`).

The in-memory engine finds all of this when it loads the model (``depthlab.hf.loading``); the streamed engine
reads one layer at a time, so without these checks a damaged checkpoint surfaced mid-sweep (a raw
``SafetensorError`` after minutes of work) or never (a config.json claiming 3 layers over 4 layers of weights
gave a 3-layer diagnosis; a NaN weight gave ``+nan nats``). Each failure is one line naming the file and the
tensor. The finiteness check reads the checkpoint once, one tensor at a time (in chunks: the memory of one
chunk), without counting in the engine's :class:`~depthlab.targets.stream.safetensors.WeightMeter`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError
from depthlab.targets.stream.safetensors import FLOAT_DTYPES

#: Elements checked for finiteness at a time (memory: that many floats and flags).
CHUNK = 1 << 22


def _layers_of(keys: list[str]) -> list[int]:
    return sorted({int(m.group(1)) for k in keys if (m := re.search(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.", k))})


def check_source(source: Any, where: str, finite: bool = True) -> None:
    """Every tensor the streamed model ``source`` (a :class:`~depthlab.targets.stream.source.LayerSource`) will read:
    present, of the shape its skeleton expects and of a floating dtype where the skeleton holds floats; no
    stored layer the config has no place for; every floating weight finite (``finite``). One line naming
    ``where`` and the tensor."""
    store = source.store
    expected: dict[str, torch.Tensor | None] = {}  # checkpoint key -> the tensor it fills (None: converted on load)
    for module in source.stored_modules():
        state = {k: t for k, t in module.state_dict(keep_vars=True).items() if _persistent(module, k)}
        keys = source.keys_of(module)
        if len(keys) == len(module.state_dict()) and not getattr(source, "sources", None):
            expected.update({key: t for (local, t), key in zip(module.state_dict(keep_vars=True).items(), keys)
                             if local in state})
        else:  # a family whose checkpoint tensors transformers converts (fused, split): presence and values only
            expected.update({key: None for key in keys})
    missing = [k for k in expected if k not in store]
    if missing:
        layers = _layers_of(missing)
        more = f": config.json says {source.n_layers} layers, the weights lack layer(s) {layers[:6]}" if layers else ""
        raise DepthlabError(f"cannot stream {where!r}{more} (missing tensor {missing[0]!r})")
    extra = [k for k in store.index if k not in expected and _layers_of([k])]
    if extra:
        layers = _layers_of(extra)
        raise DepthlabError(f"cannot stream {where!r}: config.json says {source.n_layers} layers, but the weights hold "
                            f"layer(s) {layers[:6]} beyond them (e.g. {extra[0]!r}); fix the layer count or the weights")
    for key, t in expected.items():
        info = store.index[key]
        if t is None:
            continue
        if tuple(info.shape) != tuple(t.shape):
            raise DepthlabError(f"cannot stream {where!r}: tensor {key!r} in {info.file.name!r} is {list(info.shape)}, "
                                f"the config makes it {list(t.shape)}")
        if t.is_floating_point() and info.dtype not in FLOAT_DTYPES:
            raise DepthlabError(f"cannot stream {where!r}: tensor {key!r} in {info.file.name!r} is stored as "
                                f"{info.dtype}, not a floating dtype ({', '.join(FLOAT_DTYPES)})")
    if finite:
        _check_finite(store, sorted(expected, key=lambda k: (str(store.index[k].file), k)), where)


def _persistent(module: torch.nn.Module, local: str) -> bool:
    """Whether ``module``'s state entry ``local`` is stored (a non-persistent buffer such as rotary tables is not)."""
    owner_name, _, leaf = local.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    return leaf not in getattr(owner, "_non_persistent_buffers_set", set())


def _check_finite(store: Any, keys: list[str], where: str) -> None:
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for key in keys:
        by_file.setdefault(store.index[key].file, []).append(key)
    for file, names in by_file.items():
        with safe_open(str(file), "pt", device="cpu") as f:
            for key in dict.fromkeys(names):
                if store.index[key].dtype not in FLOAT_DTYPES:
                    continue
                flat = f.get_tensor(key).reshape(-1)
                for a in range(0, flat.numel(), CHUNK):
                    chunk = flat[a:a + CHUNK]
                    if not bool(torch.isfinite(chunk.float() if chunk.element_size() == 1 else chunk).all()):
                        raise DepthlabError(f"cannot stream {where!r}: it holds NaN/inf weights ({key} in "
                                            f"{file.name!r}); refusing to use it")
                del flat
