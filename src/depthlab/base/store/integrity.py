"""Integrity checks of a run: finite tensors, file checksums, a cheap fingerprint of local data files.

    bad = first_nonfinite(model_sd, optim_sd)   # "model: blocks.0.attn.wq.weight" or None
    digest = sha256_file(path)                  # hex digest, streamed
    fp = data_fingerprint("corpus.txt")         # {path: [size, mtime_ns, sha256 of the first 64 KiB]} or None
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

HEAD_BYTES = 1 << 16  # the part of each data file hashed by data_fingerprint
MAX_FILES = 2000  # data_fingerprint looks at no more files than this


def _tensors(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}")


def first_nonfinite(*named: tuple[str, Any]) -> str | None:
    """The name of the first floating tensor holding NaN or inf in ``(label, nested state)`` pairs, or None."""
    for label, state in named:
        for name, t in _tensors(state, label):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return name
    return None


def _local_files(spec: str) -> list[Path] | None:
    if not spec or spec == "builtin" or spec.startswith("hf:"):
        return None
    path = Path(spec).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))[:MAX_FILES]
    if any(c in spec for c in "*?["):
        found = sorted(glob.glob(os.path.expanduser(spec), recursive=True))
        return [Path(p) for p in found if Path(p).is_file()][:MAX_FILES]
    return None


def data_fingerprint(spec: str | None) -> dict[str, list] | None:
    """Size, mtime and a hash of the first 64 KiB of each local file ``spec`` names (None for builtin / hf:)."""
    files = _local_files(spec or "")
    if files is None:
        return None
    out = {}
    for p in files:
        st = p.stat()
        with open(p, "rb") as f:
            head = hashlib.sha256(f.read(HEAD_BYTES)).hexdigest()
        out[str(p)] = [st.st_size, st.st_mtime_ns, head]
    return out


def fingerprint_change(saved: dict[str, list], now: dict[str, list] | None) -> str | None:
    """A phrase naming the first file that differs between two fingerprints, or None when they agree."""
    now = now or {}
    for path in sorted(set(saved) | set(now)):
        if path not in now:
            return f"{path!r} is gone"
        if path not in saved:
            return f"{path!r} is new"
        if list(saved[path]) != list(now[path]):
            size, _, head = saved[path]
            what = "size" if size != now[path][0] else "content" if head != now[path][2] else "mtime"
            return f"{path!r} changed ({what})"
    return None
