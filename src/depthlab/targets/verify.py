"""The whole checkpoint of a streamed model checked before its first layer is read.

    check_files(files, index)            # every header readable, every data section whole, the index true
    check_source(source, where)          # every tensor the model needs: there, of its shape and a float dtype,
                                         # no layer beyond the config's count, every weight finite

The in-memory engine finds all of this when it loads the model (``depthlab.hf.loading``); the streamed engine
reads one layer at a time, so without these checks a damaged checkpoint surfaced mid-sweep (a raw
``SafetensorError`` after minutes of work) or never (a config.json claiming 3 layers over 4 layers of weights
gave a 3-layer diagnosis; a NaN weight gave ``+nan nats``). Each failure is one line naming the file and the
tensor. The finiteness check reads the checkpoint once, one tensor at a time (in chunks: the memory of one
chunk), without counting in the engine's :class:`~depthlab.targets.layerwise.WeightMeter`.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line

#: Bytes per element of the safetensors dtype names.
ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                  "F8_E4M3": 1, "F8_E5M2": 1}
#: Safetensors dtype names that hold floating weights.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
#: Elements checked for finiteness at a time (memory: that many floats and flags).
CHUNK = 1 << 22


def read_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data_offsets; ``__metadata__`` dropped),
    after checking that the file is whole: a one-line DepthlabError naming the file when it is empty, cut short,
    or not safetensors."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DepthlabError(f"weight file {str(path)!r} is {'empty' if size == 0 else 'cut short'} "
                                    f"({size} bytes): not a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, 100_000_000):
                raise DepthlabError(f"weight file {str(path)!r} is not a safetensors file or is cut short (a header of "
                                    f"{n} bytes in a file of {size})")
            header = json.loads(f.read(n))
    except DepthlabError:
        raise
    except OSError as err:
        raise DepthlabError(f"cannot read weight file {str(path)!r}: {err.strerror or first_line(err)}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise DepthlabError(f"weight file {str(path)!r} has a damaged header: {first_line(err)[:120]}") from None
    if not isinstance(header, dict):
        raise DepthlabError(f"weight file {str(path)!r} has a damaged header (not a mapping)")
    header.pop("__metadata__", None)
    data = size - 8 - n
    for name, meta in header.items():
        try:
            begin, end = (int(x) for x in meta["data_offsets"])
            count = 1
            for s in meta["shape"]:
                count *= int(s)
            width = ST_DTYPE_BYTES.get(meta["dtype"])
        except (KeyError, TypeError, ValueError):
            raise DepthlabError(f"weight file {str(path)!r} has a damaged header entry for {name!r}") from None
        if width is None:
            raise DepthlabError(f"weight file {str(path)!r}: tensor {name!r} has dtype {meta['dtype']!r}, which "
                                f"depthlab cannot read; {', '.join(ST_DTYPE_BYTES)} are readable")
        if end > data:
            raise DepthlabError(f"weight file {str(path)!r} is cut short: tensor {name!r} ends at byte {end} of a "
                                f"data section of {data} bytes (an interrupted download or copy?)")
        if not 0 <= begin <= end or end - begin != count * width:
            raise DepthlabError(f"weight file {str(path)!r} has a damaged header entry for {name!r} (its offsets "
                                f"do not fit its shape {meta['shape']} and dtype {meta['dtype']})")
    return header


def check_index(directory: Path, weight_map: Any) -> None:
    """An HF index's ``weight_map``: a mapping of tensor names to weight files that exist, and whose headers hold
    those tensors."""
    index = directory / "model.safetensors.index.json"
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise DepthlabError(f"{str(index)!r} is damaged: its 'weight_map' is not a mapping of tensor names to files")
    names_in: dict[str, set[str]] = {}
    for name, file in weight_map.items():
        if file not in names_in:
            path = directory / file
            if not path.is_file():
                raise DepthlabError(f"{str(index)!r} names weight file {file!r}, which does not exist")
            names_in[file] = set(read_header(path))
        if name not in names_in[file]:
            raise DepthlabError(f"{str(index)!r} says tensor {name!r} is in {file!r}, but that file does not hold it")


def _layers_of(keys: list[str]) -> list[int]:
    return sorted({int(m.group(1)) for k in keys if (m := re.search(r"(?:^|\.)(?:layers|blocks)\.(\d+)\.", k))})


def check_source(source: Any, where: str, finite: bool = True) -> None:
    """Every tensor the streamed model ``source`` (a :class:`~depthlab.targets.layerwise.LayerSource`) will read:
    present, of the shape its skeleton expects and of a floating dtype where the skeleton holds floats; no
    stored layer the config has no place for; every floating weight finite (``finite``). One line naming
    ``where`` and the tensor."""
    store = source.store
    expected: dict[str, torch.Tensor | None] = {}  # checkpoint key -> the tensor it fills (None: converted on load)
    for module in (*source.embed_modules, *source.layers, *source.head_modules):
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
