"""A TARGET that can only be a local path, and does not exist: refused at once, with the closest existing names.

    check_local_target("runs/lsn")   # DepthlabError: no such file or directory 'runs/lsn' (did you mean runs/lns?)

A name is a local path when it starts with ``./``, ``../``, ``/`` or ``~``, or when its first component is an
existing directory (``runs/lsn`` beside ``runs/``): such a name is never looked up on a model hub, so a typo costs
no network round trips, no retries and no hub log lines. Anything else with one ``/`` (``org/name``) may be a hub id.
No torch, no transformers: the command line calls this before importing them.
"""

from __future__ import annotations

import difflib
from pathlib import Path

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
