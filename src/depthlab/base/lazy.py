"""Lazy package exports (PEP 562): ``import depthlab`` and ``import depthlab.x`` stay light.

    __getattr__ = lazy_exports(__name__, {"Name": "depthlab.module.defining.it", "Alias": "depthlab.mod:name"})

A package's public names are listed in its ``__init__`` as usual, but the module defining each is imported
on first use, so importing a package (or one of its light submodules, such as a dataclass of options the
command line reads) never pulls in torch, transformers or matplotlib by itself.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
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


class _ModuleAliases(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import ``depthlab.<old>[.sub]`` as the module now at ``<new>[.sub]`` (the same object, not a copy)."""

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def target(self, fullname: str) -> str | None:
        for old, new in self.aliases.items():
            if fullname == old or fullname.startswith(old + "."):
                return new + fullname[len(old):]
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if self.target(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return importlib.import_module(self.target(spec.name))

    def exec_module(self, module: Any) -> None:  # the real module ran when it was first imported
        pass


def alias_modules(aliases: dict[str, str]) -> None:
    """Keep old module paths importable after a move: ``{"depthlab.schemes": "depthlab.models.schemes"}``.

    ``import depthlab.schemes`` (and ``from depthlab.diagnostics.capture import X``) then give the module
    at its new place, the same object, so classes and registries are never duplicated. Only the listed
    names are touched; the finder goes first on ``sys.meta_path`` so a moved package's submodules are
    never loaded a second time under their old names."""
    if not any(isinstance(f, _ModuleAliases) and f.aliases == aliases for f in sys.meta_path):
        sys.meta_path.insert(0, _ModuleAliases(aliases))
