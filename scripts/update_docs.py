"""Regenerate the parts of the docs that come from code: README.md's scheme table (from the scheme registry),
its "Supported models" table (from the family registry, depthlab.hf.families) and docs/architecture.md's
layer picture (from the imports, as scripts/check_import_cycles.py sees them).

    python scripts/update_docs.py          # rewrite them in place
    python scripts/update_docs.py --check  # exit 1 if one is stale (the tests do the same check)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import check_import_cycles  # noqa: E402 - a sibling script

from depthlab.hf.families import family_table  # noqa: E402
from depthlab.hf.wrappers import wrapper_row, wrapper_table  # noqa: E402
from depthlab.models.schemes import scheme_table  # noqa: E402


def blocks() -> list[tuple[Path, str, str]]:
    """(file, block name, generated text) for every generated block."""
    return [(ROOT / "README.md", "schemes", scheme_table()),
            (ROOT / "README.md", "families", family_table([wrapper_row()])),
            (ROOT / "docs" / "families.md", "wrappers", wrapper_table()),
            (ROOT / "docs" / "architecture.md", "layers",
             "```\n" + check_import_cycles.draw(check_import_cycles.import_graph()) + "\n```")]


def main() -> int:
    stale = []
    for path, name, generated in blocks():
        text = path.read_text()
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(text):
            print(f"{path.name} has no <!-- {name}:start --> ... <!-- {name}:end --> block", file=sys.stderr)
            return 2
        new = pattern.sub(lambda m, g=generated: m.group(1) + g + "\n" + m.group(2), text)
        if new != text:
            stale.append(path.name)
            if "--check" not in sys.argv:
                path.write_text(new)
    if stale and "--check" in sys.argv:
        print(f"stale: {', '.join(stale)} (run: python scripts/update_docs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
