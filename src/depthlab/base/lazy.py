"""Lazy package exports (PEP 562): ``import depthlab`` and ``import depthlab.x`` stay light.

    __getattr__ = lazy_exports(__name__, {"Name": "depthlab.module.defining.it", "Alias": "depthlab.mod:name"})

A package's public names are listed in its ``__init__`` as usual, but the module defining each is imported
on first use, so importing a package (or one of its light submodules, such as a dataclass of options the
command line reads) never pulls in torch, transformers or matplotlib by itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``names[attr]`` on first access and returns its ``attr``;
    a submodule of ``package`` is importable by name too."""

    def __getattr__(attr: str) -> Any:
        if attr in names:
            where, _, name = names[attr].partition(":")
            module = importlib.import_module(where)
            return module if module.__name__ == f"{package}.{attr}" else getattr(module, name or attr)
        try:
            return importlib.import_module(f"{package}.{attr}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{attr}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {attr!r}")

    return __getattr__
