"""Files read, written and checked safely: JSON made JSON-ready and written to a temporary sibling then
renamed, record files (a ``.json`` list or JSON Lines) read one way everywhere, a file's sha256 streamed.

    json_safe({"x": float("nan"), "t": (1, 2)})     # {"x": None, "t": [1, 2]}
    write_json_atomic(path, obj)                     # a crash leaves the old file or the new one, never half
    for where, row in read_json_records(path, "task file"): ...   # where = "file:line" or "file[i]"
    sha256_file(path)                                # hex digest, read in 4 MiB chunks
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from depthlab.errors import DepthlabError


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


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of JSON Lines text, blank lines skipped. Lines end at ``\\n`` only (a ``\\r``
    before it is dropped): ``str.splitlines`` would also cut at U+2028, U+0085 and other characters that
    JSON allows unescaped inside strings."""
    for no, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield no, line


def read_json_records(path: str | Path, what: str = "file") -> Iterator[tuple[str, Any]]:
    """``(where, value)`` for every record of ``path``: a ``.json`` file (suffix in any case) holds one JSON list,
    any other file one JSON value per line (``where`` = ``file[i]`` / ``file:line``). DepthlabError, one line
    naming ``what`` and the file (and line), for bytes that are not UTF-8 and for invalid JSON."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DepthlabError(f"{what} {str(path)!r} is not valid UTF-8 (byte {err.start})") from None
    except OSError as err:
        raise DepthlabError(f"{what} {str(path)!r} cannot be read: {err.strerror or err}") from None
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DepthlabError(f"{path}: invalid JSON ({err.msg}, line {err.lineno})") from None
        if not isinstance(rows, list):
            raise DepthlabError(f"{path}: expected a JSON list of records, got {type(rows).__name__}")
        yield from ((f"{path}[{i}]", r) for i, r in enumerate(rows))
        return
    for no, line in jsonl_lines(text):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DepthlabError(f"{path}:{no}: invalid JSON ({err.msg})") from None
        yield f"{path}:{no}", row
