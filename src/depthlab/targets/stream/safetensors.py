"""Safetensors files read on demand: headers checked, tensors indexed by name, read one module at a time, counted.

    files = safetensors_files(Path("hf-dir"))     # what model.safetensors.index.json names, else every *.safetensors
    store = TensorStore(files)                    # every header read and checked; nothing else
    tensors = store.read(["model.norm.weight"], torch.bfloat16, torch.device("cpu"), torch.float32)
    store.meter.bytes_read, store.meter.peak       # bytes read; weight bytes alive at once (their peak)

A damaged file is refused by :func:`read_header` in one line naming it (empty, cut short, not safetensors, a dtype
depthlab cannot read) before any tensor is used. :class:`WeightMeter` counts the bytes read, the reads of every
tensor, and the bytes of weight tensors alive at once (weak references to their storages): what the tests assert
and the benchmarks report.
"""

from __future__ import annotations

import json
import struct
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from depthlab.base.errors import DepthlabError, first_line

INDEX_FILE = "model.safetensors.index.json"
#: Bytes per element of the safetensors dtype names.
ST_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
                  "F8_E4M3": 1, "F8_E5M2": 1}
#: Safetensors dtype names that hold floating weights.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


# ---------------------------------------------------------------------------------------------- headers
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
    _check_entries(path, header, size - 8 - n)
    return header


def _check_entries(path: Path, header: dict[str, Any], data: int) -> None:
    """Every entry of ``header`` readable, inside the ``data`` bytes of the file, its offsets fitting its shape."""
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
    _check_tiling(path, header, data)


def _check_tiling(path: Path, header: dict[str, Any], data: int) -> None:
    """The tensors tile the data section, in order, without gap or overlap, to its end (safetensors' own rule: a file
    that breaks it is refused by ``safe_open`` with "invalid offset", mid-run)."""
    end = 0
    for name, meta in sorted(header.items(), key=lambda kv: (int(kv[1]["data_offsets"][0]), kv[0])):
        begin = int(meta["data_offsets"][0])
        if begin != end:
            raise DepthlabError(f"weight file {str(path)!r} has a damaged header: tensor {name!r} starts at byte "
                                f"{begin} of the data section, where the tensor before it ends at {end} "
                                f"({'an overlap' if begin < end else 'a gap'})")
        end = int(meta["data_offsets"][1])
    if header and end != data:
        raise DepthlabError(f"weight file {str(path)!r} has a damaged header: its tensors end at byte {end} of a data "
                            f"section of {data} bytes")


def check_index(directory: Path, weight_map: Any) -> None:
    """An HF index's ``weight_map``: a mapping of tensor names to weight files that exist, and whose headers hold
    those tensors."""
    index = directory / INDEX_FILE
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


def safetensors_files(path: Path) -> list[Path]:
    """The weight files of an HF directory: those its index names, else every ``*.safetensors``."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DepthlabError(f"{str(index)!r} is damaged: {first_line(err)[:120]}") from None
        check_index(path, weight_map)
        return [path / name for name in dict.fromkeys(weight_map.values())]
    return sorted(path.glob("*.safetensors"))


# ---------------------------------------------------------------------------------------------- the index
@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str  # safetensors name: F32, BF16, ...
    shape: tuple[int, ...]
    offsets: tuple[int, int]  # begin, end within the file's data section

    @property
    def nbytes(self) -> int:
        return self.offsets[1] - self.offsets[0]

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def tensor_index(files: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor of ``files`` by name, from their headers."""
    out: dict[str, TensorInfo] = {}
    for file in files:
        for name, meta in read_header(file).items():
            out[name] = TensorInfo(file, meta["dtype"], tuple(meta["shape"]), tuple(meta["data_offsets"]))
    return out


# ---------------------------------------------------------------------------------------------- reading, counted
@dataclass
class WeightMeter:
    """Bytes read from the checkpoint, reads per tensor, and weight bytes alive at once (their peak)."""

    bytes_read: int = 0
    reads: Counter = field(default_factory=Counter)
    live: int = 0
    peak: int = 0

    def track(self, name: str, stored_nbytes: int, tensor: torch.Tensor) -> None:
        self.bytes_read += stored_nbytes
        self.reads[name] += 1
        nbytes = tensor.untyped_storage().nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(tensor.untyped_storage(), self._freed, nbytes)

    def _freed(self, nbytes: int) -> None:
        self.live -= nbytes


class TensorStore:
    """Tensors of safetensors files, read on demand through ``safe_open`` (memory-mapped: a tensor stored in
    the dtype asked for is not even copied), counted by a :class:`WeightMeter`."""

    def __init__(self, files: list[Path]) -> None:
        self.index = tensor_index(files)
        self.meter = WeightMeter()

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def read(self, names: list[str], dtype: torch.dtype, device: torch.device,
             compute_dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Floating tensors rounded to ``dtype`` (the weights' precision), then held in ``compute_dtype``."""
        from safetensors import safe_open

        missing = [n for n in names if n not in self.index]
        if missing:
            raise DepthlabError(f"the checkpoint lacks tensor(s) {missing[:3]}; it does not match its config")
        out: dict[str, torch.Tensor] = {}
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.index[name].file, []).append(name)
        for file, group in by_file.items():
            with safe_open(str(file), "pt", device="cpu") as f:
                for name in group:
                    t = f.get_tensor(name)
                    if t.is_floating_point():
                        t = t.to(device=device, dtype=dtype).to(compute_dtype or dtype)
                    else:
                        t = t.to(device)
                    self.meter.track(name, self.index[name].nbytes, t)
                    out[name] = t
        return out

    def nbytes(self, names: list[str] | None = None) -> int:
        return sum(self.index[n].nbytes for n in (names if names is not None else self.index))
