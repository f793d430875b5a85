"""Files written and checked safely: JSON made JSON-ready, written to a temporary sibling then renamed, and a
file's sha256 streamed.

    json_safe({"x": float("nan"), "t": (1, 2)})     # {"x": None, "t": [1, 2]}
    write_json_atomic(path, obj)                     # a crash leaves the old file or the new one, never half
    sha256_file(path)                                # hex digest, read in 4 MiB chunks
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any


def json_safe(x: Any) -> Any:
    """JSON-ready: NaN/inf -> None, tuples -> lists, numpy scalars -> Python numbers, keys -> str."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if type(x).__module__ == "numpy" and hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json_atomic(path: Path, obj: Any, indent: int = 2) -> None:
    """Write ``obj`` as JSON to a temporary file beside ``path``, fsync it, rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w") as f:
            f.write(json.dumps(obj, indent=indent) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
