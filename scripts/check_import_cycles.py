#!/usr/bin/env python3
"""Check that every import in ``depthlab`` points down its layers; exit 1 when one does not.

    python scripts/check_import_cycles.py            # src/depthlab: module cycles, package cycles, layers
    python scripts/check_import_cycles.py --draw     # the layer picture docs/architecture.md shows

Four checks: no cycle among modules; no cycle among packages (``depthlab.train.*`` is one package,
``depthlab.models.config`` another); every import goes to a package of the same or a lower layer of
:data:`LAYERS`, so that the layer picture in docs/architecture.md is the code's (a package missing
from :data:`LAYERS` is an error too); and no ``_private`` name is imported from another package.

Every ``import depthlab.x`` / ``from depthlab.x import y`` / relative import of a module counts,
module-level or inside a function (a late import only hides a circle), except those under
``if TYPE_CHECKING:``. ``from depthlab.x import y`` is an edge to ``depthlab.x.y`` when that is a
module, else to ``depthlab.x``. Importing a submodule also runs its parent packages' ``__init__``;
those implicit edges are left out (each ``__init__``'s own imports are counted).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"


def module_names(root: Path, package: str = "depthlab") -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an Import / ImportFrom node may load (candidates, resolved later)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the package of ``module``
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def imports_of(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The depthlab modules ``module`` (file ``path``) imports anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        names = _imported(node, module, is_package)
        if isinstance(node, ast.ImportFrom):
            base, members = names[0], names[1:]
            subs = [m for m in members if m in modules]
            found.update(subs)
            if len(subs) < len(members) and base in modules:
                found.add(base)
        else:
            found.update(n for n in names if n in modules)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the depthlab modules it imports, for the package under ``root``."""
    modules = module_names(root)
    return {m: imports_of(p, m, modules) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component with more than one module."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def strongconnect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [_shortest_cycle(graph, set(c)) for c in comps]


def _shortest_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle inside one strongly connected component (breadth-first from each node)."""
    best: list[str] | None = None
    for start in sorted(comp):
        prev, frontier = {start: None}, [start]
        while frontier and start not in [w for v in frontier for w in graph[v]]:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w not in prev:
                        prev[w] = v
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in frontier if start in graph[v])
        path = [last]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        path.reverse()
        if best is None or len(path) < len(best):
            best = path
    return best + [best[0]]


#: The folders that group packages: ``depthlab.models.schemes`` is the package ``models.schemes``.
GROUPS = ("base", "models", "analysis")

#: The layers of depthlab, lowest first: a package may import from its own layer and those below it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("depthlab", "base", "base.lazy", "base.errors", "base.metrics", "base.provenance", "base.progress",
                    "base.htmlpage", "base.fileio", "base.extras", "base.devices", "base.precision", "base.paths", "base.memory",
                    "models.presets")),
    ("run directories on disk", ("base.store",)),
    ("modules", ("models.nn",)),
    ("configs and the scheme registry", ("models.config", "models.schemes")),
    ("configure", ("models.configure",)),
    ("models", ("models", "models.decoder", "models.vit")),
    ("model kinds", ("models.kinds",)),
    ("data", ("data",)),
    ("Hugging Face interop", ("hf",)),
    ("figures", ("analysis.plots",)),
    ("loading anything measurable", ("targets",)),
    ("evaluation", ("analysis.evaluate",)),
    ("diagnostics", ("analysis.diagnostics",)),
    ("depth monitoring and experiment trackers", ("analysis.monitor",)),
    ("theory", ("analysis", "analysis.theory")),
    ("training and fine-tuning", ("train",)),
    ("pruning", ("prune",)),
    ("comparison", ("compare",)),
    ("command line", ("cli", "__main__")),
)


def package_of(module: str) -> str:
    """``depthlab.train.loop`` -> ``train``; ``depthlab.models.schemes`` -> ``models.schemes`` (a group's
    member); ``depthlab.models`` -> ``models``; ``depthlab`` -> ``depthlab``."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in GROUPS:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import."""
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        pkg = package_of(module)
        out.setdefault(pkg, set()).update(package_of(d) for d in deps if package_of(d) != pkg)
    return out


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import that goes up the layers (or names a package of no layer), one line each."""
    rank = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
    bad = []
    for module, deps in sorted(graph.items()):
        pkg = package_of(module)
        if pkg not in rank:
            bad.append(f"{module}: package {pkg!r} is in no layer of LAYERS")
            continue
        for dep in sorted(deps):
            target = package_of(dep)
            if target in rank and rank[target] > rank[pkg]:
                bad.append(f"UPWARD: {module} ({LAYERS[rank[pkg]][0]}) imports {dep} ({LAYERS[rank[target]][0]})")
    return bad


def unknown_imports(root: Path = ROOT) -> list[str]:
    """Imports of a ``depthlab`` module that is not in the tree (every import names a module where it is), one
    line each."""
    modules = module_names(root)
    bad = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"UNKNOWN: {module} imports {n}, which is no module of the tree" for n in names
                    if n.startswith("depthlab.") and n not in modules]
    return bad


def private_imports(root: Path = ROOT) -> list[str]:
    """``from depthlab.x import _name`` in a module of another package than ``x``, one line each."""
    bad = []
    for module, path in module_names(root).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("depthlab")):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private and package_of(node.module) != package_of(module):
                bad.append(f"PRIVATE: {module} imports {', '.join(private)} from {node.module}")
    return bad


def draw(graph: dict[str, set[str]]) -> str:
    """The layer picture, top layer first: each package with the lower packages it imports."""
    pkgs = package_graph(graph)
    lines = []
    for name, members in reversed(LAYERS):
        for pkg in members:
            if pkg in pkgs:
                deps = ", ".join(sorted(pkgs[pkg] - {"depthlab", "base.lazy"})) or "-"
                lines.append(f"    {pkg:<20} {name:<32} -> {deps}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="folder holding the depthlab package (default src/)")
    parser.add_argument("--draw", action="store_true", help="print the layer picture (top layer first) and exit")
    args = parser.parse_args(argv)
    graph = import_graph(args.root)
    if args.draw:
        print(draw(graph))
        return 0
    bad = ["CYCLE: " + " -> ".join(c) for c in cycles(graph)]
    bad += ["PACKAGE CYCLE: " + " -> ".join(c) for c in cycles(package_graph(graph))]
    bad += layer_violations(graph) + private_imports(args.root) + unknown_imports(args.root)
    print("\n".join(bad) or f"no import cycles, no package cycles, every import points down {len(LAYERS)} layers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
