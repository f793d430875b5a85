"""A TARGET that can only be a local path, and does not exist: refused at once, with the closest existing names.

    check_local_target("runs/lsn")   # DepthlabError: no such file or directory 'runs/lsn' (did you mean runs/lns?)

A name is a local path when it starts with ``./``, ``../``, ``/`` or ``~``, or when its first component is an
existing directory (``runs/lsn`` beside ``runs/``): such a name is never looked up on a model hub, so a typo costs
no network round trips, no retries and no hub log lines. Anything else with one ``/`` (``org/name``) may be a hub id.
No torch, no transformers: the command line calls this before importing them. Here too, as light: whether a path
is a depthlab run (``is_run_path``) and a Hugging Face model directory's config.json (``model_dir_config``).
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from depthlab.base.errors import DepthlabError

LOCAL_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def looks_local(name: str) -> bool:
    """Whether ``name`` can only mean a path on this machine (see the module docstring)."""
    if name.startswith(LOCAL_PREFIXES) or name in (".", ".."):
        return True
    first, sep, _ = name.partition("/")
    return bool(sep) and first not in ("",) and Path(first).expanduser().is_dir()


def closest_paths(name: str, n: int = 3) -> list[str]:
    """Existing paths that differ from ``name`` in its first missing component, closest first (as typed: the
    existing part of ``name`` kept as given)."""
    parts = name.split("/")
    for i in range(len(parts)):
        head = "/".join(parts[:i + 1])
        if head and not Path(head).expanduser().exists():
            break
    else:
        return []
    parent = Path("/".join(parts[:i]) or ("/" if name.startswith("/") else ".")).expanduser()
    try:
        names = sorted(p.name for p in parent.iterdir())
    except OSError:
        return []
    matches = difflib.get_close_matches(parts[i], names, n=n, cutoff=0.6)
    return ["/".join([*parts[:i], m, *parts[i + 1:]]) for m in matches]


def check_local_target(name: str) -> None:
    """Refuse, in one line, a ``name`` that can only be a local path (:func:`looks_local`) and does not exist."""
    if not isinstance(name, str) or not looks_local(name) or Path(name).expanduser().exists():
        return
    near = closest_paths(name)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    raise DepthlabError(f"no such file or directory: {name!r}{hint}; a path that starts with ./, ../, / or an existing "
                        "directory is never looked up on the Hugging Face hub")


def is_run_path(path: Path) -> bool:
    """Whether ``path`` is a depthlab run directory or one of its checkpoints (not a Hugging Face model directory)."""
    return (path / "checkpoint").is_dir() or (path / "trainer_state.json").is_file() or path.name == "checkpoint"


def model_dir_config(target: Any) -> dict[str, Any] | None:
    """config.json of the Hugging Face model directory ``target`` designates (not a depthlab run, a preset, a file or a
    hub id), when it is a JSON object with a ``model_type``; else None (the loader says what is wrong)."""
    if not isinstance(target, (str, Path)) or str(target).startswith("preset:"):
        return None
    path = Path(target).expanduser()
    if not (path / "config.json").is_file() or is_run_path(path):
        return None
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) and isinstance(config.get("model_type"), str) else None
