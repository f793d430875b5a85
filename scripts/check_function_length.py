"""Fail when a function is longer than the limit (default 80 lines): code reads on one screen.

    python scripts/check_function_length.py [--max 80] [paths...]     # default: src benchmarks experiments scripts
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{path}:{node.lineno}: {node.name} is {n} lines (limit {limit})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["src", "benchmarks", "experiments", "scripts"])
    parser.add_argument("--max", type=int, default=80)
    args = parser.parse_args()
    found = [msg for root in args.paths for p in sorted(Path(root).rglob("*.py")) for msg in long_functions(p, args.max)]
    print("\n".join(found) or f"no function in {', '.join(args.paths)} is longer than {args.max} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
